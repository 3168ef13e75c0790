"""Fused Triton kernels for the batched dual TV-L1 of :mod:`memdpc.preprocess.flow.tvl1_torch`.

Same algorithm, pyramid, rounding choices and per-pair stopping rule as the torch port (which is the
reference these kernels are tested against), but each step is one pass over memory:

- ``_warp_kernel`` (once per warp): the bicubic remap of I1 and its two gradients at x + u (OpenCV's
  ``remap``, A = -0.75, zero outside the image) and the data term's constants I1wx, I1wy, ρ_c;
- ``_median_kernel`` (before every outer iteration): the 3×3 or 5×5 median of u1 and u2 (replicated
  border), by the selection networks of the torch port;
- per inner iteration, ``_u_kernel`` (estimateV, divergence, estimateU, and the squared update of u summed
  per tile) and ``_p_kernel`` (forward gradient of the new u, the dual update, and the pair's stopping
  decision from ``_u_kernel``'s tile sums). Two kernels, because the dual update needs the new u of the
  neighbouring pixels; both update their fields in place.

Stopping is decided on the device: ``_p_kernel`` sums a pair's tile sums in a fixed order and clears the
pair's flag once the update is ≤ ε²·H·W (OpenCV's rule); every kernel skips pairs whose flag is clear, so a
stopped pair is frozen and its flow does not depend on the other pairs of the batch. The host follows the
flags (:class:`Checks`): every ``every`` inner iterations it copies them to the host without waiting, drops
the pairs that stopped from the iteration kernels' grid (they read the list of the pairs still running), so a
batch's last stragglers do not pay for programs of pairs that are done, and leaves the loops once none runs.
It acts on the copy of the check before (lagged), so it never waits for the device's latest iterations and
the device never runs dry while the host decides; acting later launches a few more programs that return at
once, and changes no result.

Products and sums are not contracted into fused multiply-adds (``enable_fp_fusion=False``) except where
OpenCV's remap uses them, and divisions and square roots round to nearest, as in the torch port. Tile sums
are float32 and a pair's total float64, a different summation order than the torch port's, so the two can
differ in the rare iteration whose update lies within rounding of the threshold.

On the CPU the kernels run in Triton's interpreter when ``TRITON_INTERPRET=1`` is set before Triton is first
imported (slowly: for checks on small frames).
"""

from __future__ import annotations

import contextlib
import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl
from triton import knobs

from memdpc.preprocess.flow.tvl1_median import median9, median25
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.flow.tvl1_torch import (
    FLT_EPSILON,
    centered_gradient,
    check_params,
    level_sizes,
    resize_linear,
    scale_flow,
)

# Per device type: the iteration kernels' tile (rows, columns) and warps per program, and the run of pixels
# of the warp and median kernels' programs (bench/flow_e2e.py --tiles times other tiles). In the CPU
# interpreter, where each program costs Python time, large ones.
TILES = {"cuda": (16, 64, 4, 256), "cpu": (64, 64, 4, 4096)}
CHECK_EVERY_CUDA = 10  # inner iterations between the host's checks of the flags on CUDA

_EPS = tl.constexpr(FLT_EPSILON)
_INF = tl.constexpr(float("inf"))


# --------------------------------------------------------------------------------------------- kernels
@triton.jit
def _cubic_weights(t):
    """OpenCV 5's bicubic weights (A = -0.75) of the 4 taps at sub-pixel offsets ``t``, rounded as it does."""
    s = 1.0 - t
    c0 = (t * (s * s)) * -0.75
    c3 = (s * (t * t)) * -0.75
    c1 = tl.fma(tl.fma(tl.full(t.shape, 1.25, tl.float32), t, -2.25), t * t, 1.0)
    return c0, c1, ((1.0 - c0) - c1) - c3, c3


@triton.jit
def _cubic_row(ptr, row, ix, W, ok, c0, c1, c2, c3):
    """One row of 4 taps (zero outside the image) interpolated along x by a chain of fused multiply-adds."""
    t0 = tl.load(ptr + row + ix, mask=ok & (ix >= 0) & (ix < W), other=0.0)
    t1 = tl.load(ptr + row + ix + 1, mask=ok & (ix >= -1) & (ix < W - 1), other=0.0)
    t2 = tl.load(ptr + row + ix + 2, mask=ok & (ix >= -2) & (ix < W - 2), other=0.0)
    t3 = tl.load(ptr + row + ix + 3, mask=ok & (ix >= -3) & (ix < W - 3), other=0.0)
    return tl.fma(t3, c3, tl.fma(t2, c2, tl.fma(t1, c1, t0 * c0)))


@triton.jit
def _cubic_sample(ptr, base, ix, iy, H, W, inside, cx0, cx1, cx2, cx3, cy0, cy1, cy2, cy3):
    """Bicubic value of one image at the 4×4 windows whose top-left taps are (iy, ix)."""
    r0 = _cubic_row(ptr, base + iy * W, ix, W, inside & (iy >= 0) & (iy < H), cx0, cx1, cx2, cx3)
    r1 = _cubic_row(ptr, base + (iy + 1) * W, ix, W, inside & (iy >= -1) & (iy < H - 1), cx0, cx1, cx2, cx3)
    r2 = _cubic_row(ptr, base + (iy + 2) * W, ix, W, inside & (iy >= -2) & (iy < H - 2), cx0, cx1, cx2, cx3)
    r3 = _cubic_row(ptr, base + (iy + 3) * W, ix, W, inside & (iy >= -3) & (iy < H - 3), cx0, cx1, cx2, cx3)
    return tl.fma(r3, cy3, tl.fma(r2, cy2, tl.fma(r1, cy1, r0 * cy0)))


@triton.jit
def _warp_kernel(
    i0_ptr, i1_ptr, i1x_ptr, i1y_ptr, u1_ptr, u2_ptr, wx_ptr, wy_ptr, rc_ptr, H, W, BLOCK: tl.constexpr
):
    """I1 and its gradients warped by u (bicubic), then I1wx, I1wy and ρ_c = I1w − I1wx·u1 − I1wy·u2 − I0."""
    blk, b = tl.program_id(0), tl.program_id(1)
    p = blk * BLOCK + tl.arange(0, BLOCK)
    inside = p < H * W
    base = b.to(tl.int64) * H * W
    u1 = tl.load(u1_ptr + base + p, mask=inside, other=0.0)
    u2 = tl.load(u2_ptr + base + p, mask=inside, other=0.0)
    mx = (p % W).to(tl.float32) + u1
    my = (p // W).to(tl.float32) + u2
    fx, fy = tl.floor(mx), tl.floor(my)
    cx0, cx1, cx2, cx3 = _cubic_weights(mx - fx)
    cy0, cy1, cy2, cy3 = _cubic_weights(my - fy)
    # top-left tap of the 4×4 window; clamped far outside the image, where every tap reads zero anyway
    ix = tl.minimum(tl.maximum(fx, -8.0), W + 8.0).to(tl.int32) - 1
    iy = tl.minimum(tl.maximum(fy, -8.0), H + 8.0).to(tl.int32) - 1
    i1w = _cubic_sample(i1_ptr, base, ix, iy, H, W, inside, cx0, cx1, cx2, cx3, cy0, cy1, cy2, cy3)
    wx = _cubic_sample(i1x_ptr, base, ix, iy, H, W, inside, cx0, cx1, cx2, cx3, cy0, cy1, cy2, cy3)
    wy = _cubic_sample(i1y_ptr, base, ix, iy, H, W, inside, cx0, cx1, cx2, cx3, cy0, cy1, cy2, cy3)
    i0 = tl.load(i0_ptr + base + p, mask=inside, other=0.0)
    tl.store(wx_ptr + base + p, wx, mask=inside)
    tl.store(wy_ptr + base + p, wy, mask=inside)
    tl.store(rc_ptr + base + p, ((i1w - wx * u1) - wy * u2) - i0, mask=inside)


@triton.jit
def _median_kernel(
    src1_ptr, src2_ptr, dst1_ptr, dst2_ptr, flag_ptr, H, W, K: tl.constexpr, BLOCK: tl.constexpr
):
    """K×K median (K = 3 or 5) of u1 and u2 into dst; pairs that have stopped are copied unchanged."""
    blk, b = tl.program_id(0), tl.program_id(1)
    p = blk * BLOCK + tl.arange(0, BLOCK)
    inside = p < H * W
    base = b.to(tl.int64) * H * W
    if tl.load(flag_ptr + b) == 0:
        tl.store(dst1_ptr + base + p, tl.load(src1_ptr + base + p, mask=inside), mask=inside)
        tl.store(dst2_ptr + base + p, tl.load(src2_ptr + base + p, mask=inside), mask=inside)
    else:
        y, x = p // W, p % W
        if K == 3:
            m1 = median9(src1_ptr, base, y, x, H, W, inside)
            m2 = median9(src2_ptr, base, y, x, H, W, inside)
        else:
            m1 = median25(src1_ptr, base, y, x, H, W, inside)
            m2 = median25(src2_ptr, base, y, x, H, W, inside)
        tl.store(dst1_ptr + base + p, m1, mask=inside)
        tl.store(dst2_ptr + base + p, m2, mask=inside)


@triton.jit
def _divergence(p1_ptr, p2_ptr, off, W, xs, ys, inside):
    """OpenCV's divergence: backward differences, zeros before the first column / row, and
    ``(p1 + p2) − p2[y − 1]`` in the first column."""
    a = tl.load(p1_ptr + off, mask=inside, other=0.0)
    a_left = tl.load(p1_ptr + off - 1, mask=inside & (xs > 0), other=0.0)
    c = tl.load(p2_ptr + off, mask=inside, other=0.0)
    c_up = tl.load(p2_ptr + off - W, mask=inside & (ys > 0), other=0.0)
    div = tl.where(xs > 0, a - a_left, a) + tl.where(ys > 0, c - c_up, c)
    return tl.where((xs == 0) & (ys > 0), (a + c) - c_up, div)


@triton.jit
def _u_kernel(
    u1_ptr,
    u2_ptr,
    p11_ptr,
    p12_ptr,
    p21_ptr,
    p22_ptr,
    wx_ptr,
    wy_ptr,
    rc_ptr,
    flag_ptr,
    part_ptr,
    active_ptr,
    H,
    W,
    tiles_x,
    n_tiles,
    l_t,
    theta,
    BH: tl.constexpr,
    BW: tl.constexpr,
):
    """estimateV + divergence + estimateU in place; the tile's summed squared update into ``part``."""
    tile, b = tl.program_id(0), tl.load(active_ptr + tl.program_id(1))
    if tl.load(flag_ptr + b) == 0:
        return
    ys = (tile // tiles_x) * BH + tl.arange(0, BH)[:, None]
    xs = (tile % tiles_x) * BW + tl.arange(0, BW)[None, :]
    inside = (ys < H) & (xs < W)
    off = b.to(tl.int64) * H * W + ys * W + xs
    u1 = tl.load(u1_ptr + off, mask=inside, other=0.0)
    u2 = tl.load(u2_ptr + off, mask=inside, other=0.0)
    wx = tl.load(wx_ptr + off, mask=inside, other=0.0)
    wy = tl.load(wy_ptr + off, mask=inside, other=0.0)
    rho = tl.load(rc_ptr + off, mask=inside, other=0.0) + (wx * u1 + wy * u2)
    grad = wx * wx + wy * wy
    lg = l_t * grad
    neg_grad = tl.where(grad > _EPS, -grad, _INF)
    fi = tl.where(rho < -lg, l_t, tl.where(rho > lg, -l_t, tl.math.div_rn(rho, neg_grad)))
    n1 = (u1 + fi * wx) + theta * _divergence(p11_ptr, p12_ptr, off, W, xs, ys, inside)
    n2 = (u2 + fi * wy) + theta * _divergence(p21_ptr, p22_ptr, off, W, xs, ys, inside)
    d1, d2 = n1 - u1, n2 - u2
    tl.store(part_ptr + b * n_tiles + tile, tl.sum(tl.where(inside, d1 * d1 + d2 * d2, 0.0)))
    tl.store(u1_ptr + off, n1, mask=inside)
    tl.store(u2_ptr + off, n2, mask=inside)


@triton.jit
def _hypot(x, y):
    """float32 hypot, through float64 (where the squares are exact)."""
    x64, y64 = x.to(tl.float64), y.to(tl.float64)
    return tl.sqrt(x64 * x64 + y64 * y64).to(tl.float32)


@triton.jit
def _dual_update(u_ptr, pa_ptr, pb_ptr, off, H, W, xs, ys, inside, taut):
    """OpenCV's forwardGradient of u and estimateDualVariables for one flow component, in place."""
    u = tl.load(u_ptr + off, mask=inside, other=0.0)
    u_right = tl.load(u_ptr + off + 1, mask=inside & (xs < W - 1), other=0.0)
    u_down = tl.load(u_ptr + off + W, mask=inside & (ys < H - 1), other=0.0)
    ux = tl.where(xs < W - 1, u_right - u, 0.0)
    uy = tl.where(ys < H - 1, u_down - u, 0.0)
    ng = _hypot(ux, uy) * taut + 1.0
    pa = tl.load(pa_ptr + off, mask=inside, other=0.0)
    pb = tl.load(pb_ptr + off, mask=inside, other=0.0)
    tl.store(pa_ptr + off, tl.math.div_rn(ux * taut + pa, ng), mask=inside)
    tl.store(pb_ptr + off, tl.math.div_rn(uy * taut + pb, ng), mask=inside)


@triton.jit
def _p_kernel(
    u1_ptr,
    u2_ptr,
    p11_ptr,
    p12_ptr,
    p21_ptr,
    p22_ptr,
    part_ptr,
    flag_in_ptr,
    flag_out_ptr,
    count_ptr,
    active_ptr,
    H,
    W,
    tiles_x,
    n_tiles,
    scaled_eps,
    taut,
    BH: tl.constexpr,
    BW: tl.constexpr,
    NT: tl.constexpr,
):
    """The dual update of a running pair; tile 0 also writes whether the pair runs on (update > ε²·H·W)
    and counts the pair's iterations."""
    tile, b = tl.program_id(0), tl.load(active_ptr + tl.program_id(1))
    running = tl.load(flag_in_ptr + b) != 0
    if tile == 0:
        t = tl.arange(0, NT)
        error = tl.sum(tl.load(part_ptr + b * n_tiles + t, mask=t < n_tiles, other=0.0).to(tl.float64))
        tl.store(flag_out_ptr + b, (running & (error > scaled_eps)).to(tl.int32))
        tl.store(count_ptr + b, tl.load(count_ptr + b) + running.to(tl.int32))
    if running:
        ys = (tile // tiles_x) * BH + tl.arange(0, BH)[:, None]
        xs = (tile % tiles_x) * BW + tl.arange(0, BW)[None, :]
        inside = (ys < H) & (xs < W)
        off = b.to(tl.int64) * H * W + ys * W + xs
        _dual_update(u1_ptr, p11_ptr, p12_ptr, off, H, W, xs, ys, inside, taut)
        _dual_update(u2_ptr, p21_ptr, p22_ptr, off, H, W, xs, ys, inside, taut)


# ------------------------------------------------------------------------------------------ the solver
_NO_FMA = {"enable_fp_fusion": False}


@dataclass(frozen=True)
class Checks:
    """How the host follows the pairs that stop (speed only: no setting changes a flow or an iteration count).

    Attributes:
        every: inner iterations between the host's checks of the pairs' flags (None: 10 on CUDA, 1 on the
            CPU).
        compact: drop the pairs that stopped from the iteration kernels' grid at each check; else the grid
            keeps every pair of the batch until the warp ends (a stopped pair's programs return at once).
        lagged: at each check, act on the flags of the check before (on CUDA also on this check's, where they
            have arrived), so the host does not wait for the iterations it just launched; else wait for them.
    """

    every: int | None = None
    compact: bool = True
    lagged: bool = True


class _Flags:
    """The host's view of which pairs of a batch still run: each check's flags, copied to the host without
    waiting (into pinned memory, with an event, on CUDA), read when the rule of :class:`Checks` needs them."""

    def __init__(self, lagged: bool) -> None:
        self.lagged = lagged
        self._copies: deque[tuple[torch.Tensor, torch.cuda.Event | None]] = deque()

    def check(self, flags: torch.Tensor) -> torch.Tensor | None:
        """Note the flags of this check; return the newest flags to act on (None: none yet)."""
        if flags.is_cuda:
            host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
            host.copy_(flags, non_blocking=True)
            arrived = torch.cuda.Event()
            arrived.record()
            self._copies.append((host, arrived))
        else:
            self._copies.append((flags.clone(), None))
        newest = None
        while self._copies and (
            len(self._copies) > self.lagged or (self._copies[0][1] is not None and self._copies[0][1].query())
        ):
            host, arrived = self._copies.popleft()
            if arrived is not None:
                arrived.synchronize()
            newest = host
        return newest


def _solve_level(i0, i1, u1, u2, params: TVL1Params, checks: Checks, checkpoint):
    """OpenCV's ``procOneScale`` for a batch: all warps at one pyramid level; returns (u1, u2) and each
    pair's number of inner iterations (B,)."""
    b, h, w = i0.shape
    scaled_eps = float(np.float32(params.epsilon * params.epsilon * h * w))
    l_t = float(np.float32(params.lambda_ * params.theta))
    taut = float(np.float32(params.tau / params.theta))
    th, tw, warps, run = TILES[i0.device.type]
    tiles_x = triton.cdiv(w, tw)
    n_tiles = tiles_x * triton.cdiv(h, th)
    pixels = (triton.cdiv(h * w, run), b)
    i1x, i1y = (g.contiguous() for g in centered_gradient(i1))
    u1, u2 = u1.contiguous().clone(), u2.contiguous().clone()
    p11, p12, p21, p22 = (torch.zeros_like(i0) for _ in range(4))
    wx, wy, rc, m1, m2 = (torch.empty_like(i0) for _ in range(5))
    part = torch.empty(b, n_tiles, dtype=torch.float32, device=i0.device)
    flags = [torch.empty(b, dtype=torch.int32, device=i0.device) for _ in range(2)]
    count = torch.zeros(b, dtype=torch.int32, device=i0.device)
    ksize = params.median_filtering
    for _ in range(params.warps):
        _warp_kernel[pixels](i0, i1, i1x, i1y, u1, u2, wx, wy, rc, h, w, BLOCK=run, **_NO_FMA)
        flags[0].fill_(1)  # every pair runs again at each warp (OpenCV resets its error)
        active = torch.arange(b, dtype=torch.int32, device=i0.device)  # the pairs the iteration kernels visit
        seen = _Flags(checks.lagged)  # this warp's checks
        n, running = 0, True
        for _ in range(params.outer_iterations):
            if ksize > 1:
                _median_kernel[pixels](u1, u2, m1, m2, flags[n % 2], h, w, K=ksize, BLOCK=run)
                u1, m1, u2, m2 = m1, u1, m2, u2
            for _ in range(params.inner_iterations):
                checkpoint()
                flag_in, flag_out = flags[n % 2], flags[(n + 1) % 2]
                level = _Level(u1, u2, p11, p12, p21, p22, wx, wy, rc, part, count, h, w, tiles_x, n_tiles)
                _inner_iteration(
                    level, flag_in, flag_out, active, l_t, params.theta, scaled_eps, taut, th, tw, warps
                )
                n += 1
                if n % checks.every == 0:
                    # Both flag buffers clear the stopped pairs (for the median kernel and once they leave
                    # the grid); a pair stopped at a check stays stopped, so acting later changes nothing
                    flag_in.copy_(flag_out)
                    runs = seen.check(flag_out)
                    if runs is None:
                        continue
                    if not runs.any():
                        running = False
                        break
                    if checks.compact:
                        ids = runs.nonzero().flatten().to(torch.int32)
                        active = ids.pin_memory().to(i0.device, non_blocking=True) if i0.is_cuda else ids
            if not running:
                break
    return u1, u2, count


@dataclass
class _Level:
    """One pyramid level's fields of a batch and how they are cut into tiles."""

    u1: torch.Tensor
    u2: torch.Tensor
    p11: torch.Tensor
    p12: torch.Tensor
    p21: torch.Tensor
    p22: torch.Tensor
    wx: torch.Tensor
    wy: torch.Tensor
    rc: torch.Tensor
    part: torch.Tensor  # per pair and tile: the tile's sum of squared updates
    count: torch.Tensor  # per pair: inner iterations run
    h: int
    w: int
    tiles_x: int
    n_tiles: int


def _inner_iteration(
    lv: _Level, flag_in, flag_out, active, l_t, theta, scaled_eps, taut, th, tw, warps
) -> None:
    """One inner iteration of the pairs in ``active``: the primal update (``_u_kernel``), then the dual update and
    each pair's stopping rule (``_p_kernel``), ``flag_in`` read and ``flag_out`` written."""
    tiles = (lv.n_tiles, len(active))
    fields = (lv.u1, lv.u2, lv.p11, lv.p12, lv.p21, lv.p22)
    _u_kernel[tiles](
        *fields, lv.wx, lv.wy, lv.rc, flag_in, lv.part, active, lv.h, lv.w, lv.tiles_x, lv.n_tiles, l_t, theta,
        BH=th, BW=tw, num_warps=warps, **_NO_FMA,
    )  # fmt: skip
    _p_kernel[tiles](
        *fields, lv.part, flag_in, flag_out, lv.count, active, lv.h, lv.w, lv.tiles_x, lv.n_tiles, scaled_eps,
        taut, BH=th, BW=tw, NT=triton.next_power_of_2(lv.n_tiles), num_warps=warps, **_NO_FMA,
    )  # fmt: skip


@torch.no_grad()
def tvl1_flow(
    prev: torch.Tensor,
    next: torch.Tensor,
    params: TVL1Params | None = None,
    checks: Checks = Checks(),
    checkpoint: Callable[[], None] = lambda: None,
) -> torch.Tensor:
    """Dual TV-L1 flow from ``prev`` to ``next`` for a batch of pairs, with the fused kernels.

    Args:
        prev, next: (B, H, W) greyscale frames, values in [0, 255] (uint8 or float), on a CUDA device (or
            the CPU under ``TRITON_INTERPRET=1``).
        params: the TV-L1 parameters (default: OpenCV's defaults).
        checks: how the host follows the pairs that stop (speed only).
        checkpoint: called before every inner iteration's launches; an exception it raises abandons the
            batch (a run being stopped does so within one iteration).

    Returns:
        (B, H, W, 2) float32 flow (x, y) in pixels, on the input's device.
    """
    return tvl1_flow_with_iterations(prev, next, params, checks, checkpoint)[0]


@torch.no_grad()
def tvl1_flow_with_iterations(
    prev: torch.Tensor,
    next: torch.Tensor,
    params: TVL1Params | None = None,
    checks: Checks = Checks(),
    checkpoint: Callable[[], None] = lambda: None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tvl1_flow`, and the inner iterations each pair ran per pyramid level: (levels, B) int32,
    finest level first (summed over its warps)."""
    if prev.shape != next.shape or prev.dim() != 3:
        raise ValueError(
            f"tvl1_flow: need two (B, H, W) tensors of one shape, got {prev.shape} and {next.shape}"
        )
    params = params or TVL1Params()
    check_params(params)
    if checks.every is None:
        checks = Checks(CHECK_EVERY_CUDA if prev.is_cuda else 1, checks.compact, checks.lagged)
    # Triton launches on the current CUDA device: make it the frames' one (cuda:1 in a second GPU's process)
    with torch.cuda.device(prev.device) if prev.is_cuda else contextlib.nullcontext():
        return _flow(prev, next, params, checks, checkpoint)


def _flow(prev, next, params: TVL1Params, checks: Checks, checkpoint) -> tuple[torch.Tensor, torch.Tensor]:
    sizes = level_sizes(prev.shape[1], prev.shape[2], params)
    step = 1.0 / params.scale_step
    i0s, i1s = [prev.float().contiguous()], [next.float().contiguous()]
    for size in sizes[1:]:
        i0s.append(resize_linear(i0s[-1], size, (step, step)).contiguous())
        i1s.append(resize_linear(i1s[-1], size, (step, step)).contiguous())
    u1 = torch.zeros_like(i0s[-1])
    u2 = torch.zeros_like(i0s[-1])
    up = params.flow_scale()
    counts = [None] * len(sizes)
    for s in range(len(sizes) - 1, -1, -1):
        u1, u2, counts[s] = _solve_level(i0s[s], i1s[s], u1, u2, params, checks, checkpoint)
        if s > 0:
            u1 = scale_flow(resize_linear(u1, sizes[s - 1]), up)
            u2 = scale_flow(resize_linear(u2, sizes[s - 1]), up)
    return torch.stack([u1, u2], dim=-1), torch.stack(counts)


@functools.cache
def unavailable_reason(device: str) -> str | None:
    """Why the kernels cannot run on ``device`` (None: they can), found by running them once on a small
    pair (a compile or launch failure is a reason too)."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device is available"
    if dev.type == "cpu" and not knobs.runtime.interpret:
        return "the Triton kernels run on CUDA devices (on the CPU only under TRITON_INTERPRET=1, for checks)"
    if dev.type not in ("cuda", "cpu"):
        return f"the Triton kernels do not run on '{device}'"
    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (2, 1, 20, 20), generator=g, dtype=torch.uint8).to(dev)
    try:
        tvl1_flow(frames[0], frames[1], TVL1Params(scales=1, warps=1, inner_iterations=2, outer_iterations=1))
    except Exception as e:  # any failure to compile or launch means: not usable here
        return f"the Triton kernels failed on {device}: {type(e).__name__}: {str(e).strip().splitlines()[0]}"
    return None


__all__ = ["Checks", "tvl1_flow", "tvl1_flow_with_iterations", "unavailable_reason"]
