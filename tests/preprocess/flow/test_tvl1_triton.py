"""The fused Triton TV-L1 kernels against the torch port they follow (on the CPU in Triton's interpreter,
which tests/conftest.py turns on where there is no CUDA device), their compiled form for Hopper GPUs, and
on CUDA where there is one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import cv2
import numpy as np
import pytest
import torch

from memdpc.preprocess.examples.synthetic import render_video
from memdpc.preprocess.flow import tvl1_torch, tvl1_triton
from memdpc.preprocess.flow.backends import flow_to_codes
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.flow.tvl1_triton import Checks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the interpreter is slow, and slowest on the median's taps: 3 × 3 here (the 5 × 5 median has a test of its own)
CHEAP = TVL1Params(scales=2, warps=2, outer_iterations=3, inner_iterations=10, median_filtering=3)


@pytest.fixture(scope="module")
def pairs() -> tuple[torch.Tensor, torch.Tensor]:
    """Four real-looking greyscale pairs at 40 px (textured scenes with moving objects), (B, H, W) uint8."""
    rng = np.random.default_rng(5)
    grey = [
        np.stack([cv2.cvtColor(f, cv2.COLOR_BGR2GRAY) for f in render_video(cls, 40, 3, rng)])
        for cls in ("MoveRight", "ZoomIn")
    ]
    prev = np.concatenate([g[:-1] for g in grey])
    nxt = np.concatenate([g[1:] for g in grey])
    return torch.from_numpy(prev).to(DEVICE), torch.from_numpy(nxt).to(DEVICE)


def _both(prev, nxt, params):
    return tvl1_triton.tvl1_flow(prev, nxt, params).cpu(), tvl1_torch.tvl1_flow(prev, nxt, params).cpu()


@pytest.mark.slow
@pytest.mark.skipif(DEVICE != "cpu", reason="the bit-for-bit check is for the interpreter on the CPU")
@pytest.mark.parametrize("median", [5, 3])
def test_kernels_equal_the_torch_port_on_the_cpu(pairs, median):
    """Same operations in the same order: bit for bit in the interpreter (the tile sums of the stopping
    rule are summed in another order, which could only matter on a knife's edge). One pair of each motion."""
    prev, nxt = (a[::2] for a in pairs)
    params = replace(CHEAP, median_filtering=median)
    ours, ref = _both(prev, nxt, params)
    assert ref.abs().max() > 0.5  # there is motion to agree on
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_pairs_flow_does_not_depend_on_its_batch(pairs):
    """One pair stops at once (identical frames), the others run on: each equals its flow alone."""
    prev, nxt = pairs
    prev = torch.cat([prev[::2], nxt[:1]])
    nxt = torch.cat([nxt[::2], nxt[:1]])
    together = tvl1_triton.tvl1_flow(prev, nxt, CHEAP)
    alone = torch.cat([tvl1_triton.tvl1_flow(prev[k : k + 1], nxt[k : k + 1], CHEAP) for k in (0, 2)])
    torch.testing.assert_close(together[[0, 2]], alone, atol=0, rtol=0)
    assert together[2].abs().max() == 0  # identical frames: zero flow, the pair stopped at the first step


STOPPING = replace(CHEAP, epsilon=0.05)  # the pairs stop at different iterations, before the last


@pytest.fixture(scope="module")
def checked_every_iteration(pairs) -> tuple[torch.Tensor, torch.Tensor]:
    return tvl1_triton.tvl1_flow_with_iterations(*(a[:2] for a in pairs), STOPPING, Checks(every=1))


HOST_CHECKS = {
    "rarely": Checks(every=7),
    "waited": Checks(every=1, lagged=False),
    "no-compaction": Checks(every=3, compact=False),
    "waited-no-compaction": Checks(every=2, lagged=False, compact=False),
}


@pytest.mark.slow
@pytest.mark.parametrize("checks", HOST_CHECKS.values(), ids=HOST_CHECKS.keys())
def test_how_the_host_checks_changes_nothing_and_iterations_are_counted(
    pairs, checked_every_iteration, checks
):
    """Checking often or rarely, acting on the newest flags or on the check before, with or without
    compaction: the same flows and iteration counts as checking after every iteration."""
    every, counts = checked_every_iteration
    other, other_counts = tvl1_triton.tvl1_flow_with_iterations(*(a[:2] for a in pairs), STOPPING, checks)
    torch.testing.assert_close(every, other, atol=0, rtol=0)
    assert counts.shape == (2, 2) and torch.equal(counts, other_counts)
    # each level runs 1 to warps × outer × inner iterations per pair; here they stop at several counts
    assert counts.min() >= CHEAP.warps and counts.max() < CHEAP.warps * 3 * 10
    assert len(set(counts.flatten().tolist())) > 1
    same, same_counts = tvl1_triton.tvl1_flow_with_iterations(pairs[1][:2], pairs[1][:2], CHEAP, checks)
    assert torch.equal(same_counts, torch.full_like(same_counts, CHEAP.warps))  # stops at once per warp


@pytest.mark.gpu
def test_on_cuda_the_lagged_checks_and_the_compaction_change_nothing():
    """On the GPU the host's copies of the flags arrive while it launches (the path the interpreter never
    takes): every way of checking gives the flows and iteration counts of waiting at every iteration."""
    rng = np.random.default_rng(1)
    grey = [
        np.stack([cv2.cvtColor(f, cv2.COLOR_BGR2GRAY) for f in render_video(c, 64, 5, rng)])
        for c in ("MoveRight", "ZoomIn", "RotateClockwise")
    ]
    pairs = [np.concatenate([g[s] for g in grey]) for s in (np.s_[:-1], np.s_[1:])]
    prev, nxt = (torch.from_numpy(a).cuda() for a in pairs)
    ref, ref_counts = tvl1_triton.tvl1_flow_with_iterations(prev, nxt, checks=Checks(every=1, lagged=False))
    assert len(set(ref_counts[0].tolist())) > 1  # the pairs stop at different iterations
    for checks in (Checks(), *HOST_CHECKS.values()):
        flow, counts = tvl1_triton.tvl1_flow_with_iterations(prev, nxt, checks=checks)
        assert torch.equal(flow, ref) and torch.equal(counts, ref_counts), checks


def test_available_on_this_device_and_not_on_a_missing_one():
    assert tvl1_triton.unavailable_reason(DEVICE) is None
    if not torch.cuda.is_available():
        assert "no CUDA device" in tvl1_triton.unavailable_reason("cuda")


def test_rejects_pairs_of_two_shapes():
    with pytest.raises(ValueError, match="one shape"):
        tvl1_triton.tvl1_flow(torch.zeros(2, 32, 32), torch.zeros(2, 32, 30))


_COMPILE = """
import json, inspect, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from memdpc.preprocess.flow import tvl1_triton as T

INTS, FLOATS = {"H", "W", "tiles_x", "n_tiles"}, {"l_t", "theta", "scaled_eps", "taut"}
CONSTS = {"_warp_kernel": {"BLOCK": 256}, "_median_kernel": {"K": 5, "BLOCK": 256},
          "_u_kernel": {"BH": 16, "BW": 64}, "_p_kernel": {"BH": 16, "BW": 64, "NT": 16}}
ptx = {}
for name, consts in CONSTS.items():
    kernel = getattr(T, name)
    sig = {}
    for arg in inspect.signature(kernel.fn).parameters:
        sig[arg] = ("constexpr" if arg in consts else "i32" if arg in INTS else "fp32" if arg in FLOATS
                    else "*i32" if arg.startswith(("flag", "count", "active")) else "*fp32")
    compiled = triton.compile(ASTSource(kernel, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                              options={"enable_fp_fusion": False})
    ptx[name] = compiled.asm["ptx"]
json.dump(ptx, sys.stdout)
"""


@pytest.mark.slow
def test_kernels_compile_for_hopper_with_the_intended_rounding():
    """Compiled for an H100 (sm_90) without a GPU: every kernel builds, divisions and square roots round to
    nearest, and only the remap multiplies and adds in one step (as OpenCV's remap does)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    ptx = json.loads(run.stdout)
    assert set(ptx) == {"_warp_kernel", "_median_kernel", "_u_kernel", "_p_kernel"}
    for name, code in ptx.items():
        assert "div.approx" not in code and "div.full" not in code and "sqrt.approx" not in code, name
    assert "div.rn.f32" in ptx["_u_kernel"] and "div.rn.f32" in ptx["_p_kernel"]
    assert "sqrt.rn.f64" in ptx["_p_kernel"]
    assert "fma.rn.f32" not in ptx["_u_kernel"] and "fma.rn.f32" not in ptx["_p_kernel"]
    assert "fma.rn.f32" in ptx["_warp_kernel"]


@pytest.mark.gpu
def test_cuda_kernels_agree_with_the_torch_port_and_opencv(pairs):
    prev, nxt = pairs
    ours = tvl1_triton.tvl1_flow(prev, nxt).cpu()
    ref = tvl1_torch.tvl1_flow(prev, nxt).cpu()
    assert (ours - ref).norm(dim=-1).mean() <= 0.02
    cv = tvl1_torch.opencv_flow(prev.cpu().numpy(), nxt.cpu().numpy())
    assert np.linalg.norm(ours.numpy() - cv, axis=-1).mean() <= 0.02
    assert (flow_to_codes(ours.numpy()) == flow_to_codes(cv)).mean() >= 0.99


def test_checkpoint_runs_before_every_inner_iteration_and_its_exception_abandons_the_batch(pairs):
    prev, nxt = (t[:1] for t in pairs)
    params = TVL1Params(scales=1, warps=1, outer_iterations=2, inner_iterations=2, epsilon=1e-12)
    calls = []
    tvl1_triton.tvl1_flow(prev, nxt, params, checkpoint=lambda: calls.append(1))
    assert len(calls) == 4

    def stop() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tvl1_triton.tvl1_flow(prev, nxt, params, checkpoint=stop)
