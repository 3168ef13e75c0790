"""The training step as ``memdpc train`` runs it: placement with the fast defaults, ``--compile`` (one graph
per architecture, equal to the eager step, a one-line fallback where compiling fails), ``--cuda-graphs`` (GPU)
and the one-line error for a batch that does not fit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch._inductor.config as inductor_config
from torch.utils._python_dispatch import TorchDispatchMode

from memdpc.common.errors import UserError
from memdpc.model import create_model
from memdpc.model.names import PRETRAIN_NAMES
from memdpc.train.config import TrainConfig, config_from_dict
from memdpc.train.step import Stepper, make_optimizer, out_of_memory, place_clips, place_model

from ..conftest import TINY_TRAIN, memdpc_command, train_options

CPU = torch.device("cpu")
# the tiny network as a MemDPC (the default architecture), for configs that read no data
TINY = {**TINY_TRAIN, "arch": "memdpc_r18", "mem_size": 16, "shards": "unused", "out": "unused"}
TRAIN = train_options(**TINY_TRAIN, log_every=1, val_split="none")


@pytest.fixture(autouse=True)
def fresh_compiler():
    """torch.compile's caches start empty in every test, as in a new process (its limit of recompilations per
    function would otherwise count the graphs of the tests before)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def stepper(config: TrainConfig, device: torch.device = CPU, backend: str = "inductor", **model_kw):
    """A seeded model and its Stepper as ``memdpc train`` builds them; the warnings it gave."""
    model = place_model(create_model(**{**config.model_kwargs(), **model_kw}, seed=0), config, device).train()
    warnings: list[str] = []
    step = Stepper(
        model,
        make_optimizer(model, config, device),
        torch.amp.GradScaler(device.type, enabled=False),
        config,
        device,
        warnings.append,
        backend=backend,
    )
    return model, step, warnings


def clips(config: TrainConfig, device: torch.device = CPU, batch: int = 2, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(
        batch, config.clip.num_blocks, 3, config.clip.block_len, config.size, config.size, generator=g
    )
    return place_clips(x, config, device)


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights, gradients and buffers (BatchNorm statistics), by name."""
    out = {f"w.{n}": p.detach().clone() for n, p in model.named_parameters()}
    out |= {f"g.{n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out | {f"b.{n}": b.clone() for n, b in model.named_buffers()}


def test_fast_defaults_change_nothing_on_cpu():
    config = config_from_dict(TINY)
    model = place_model(create_model("dpc_r18", widths=(4, 8, 16, 16), input_size=32), config, CPU)
    assert model.backbone.conv1.weight.is_contiguous()
    assert make_optimizer(model, config, CPU).defaults["fused"] is None  # torch's default Adam, as before
    x = torch.randn(2, 5, 3, 3, 32, 32)
    assert place_clips(x, config, CPU) is x


@pytest.mark.parametrize("arch", PRETRAIN_NAMES)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_every_pretraining_step_is_one_graph_and_steps_as_eager(arch, bidirectional, one_thread):
    """torch.compile's tracer (the eager backend: no code generation) takes each architecture's whole forward
    pass, loss included, as one graph (a graph break would fail it and fall back with a warning), and the step
    it runs is the eager step bit for bit."""
    config = config_from_dict({**TINY, "arch": arch, "bidirectional": bidirectional, "compile": True})
    eager_config = config_from_dict({**config.to_dict(), "compile": False})
    results = []
    for cfg in (config, eager_config):
        model, step, warnings = stepper(cfg, backend="eager")
        torch.manual_seed(3)  # the GRU's dropout
        out = step(clips(cfg))
        results.append((out, state(model)))
        assert warnings == [] and step.compiled is cfg.compile
    (compiled, after), (eager, eager_after) = results
    assert all(torch.equal(compiled[k], eager[k]) for k in eager)
    assert all(torch.equal(after[k], eager_after[k]) for k in eager_after)


def test_the_channels_last_bf16_step_is_one_graph_too(one_thread):
    """The CUDA fast path's layout (channels_last_3d encoder and clips) under bf16 autocast, traced on the CPU:
    one graph, at each of three batch sizes (the third as a dynamic shape). (The values are not checked: this
    torch's CPU bf16 3D-convolution weight gradients are not deterministic, sometimes not finite.)"""
    config = config_from_dict({**TINY, "size": 64, "bidirectional": True, "compile": True, "amp": "bf16"})
    model, step, warnings = stepper(config, backend="eager")
    model.backbone.to(memory_format=torch.channels_last_3d)
    for batch in (2, 3, 4):
        x = clips(config, batch=batch)
        step(x.flatten(0, 1).contiguous(memory_format=torch.channels_last_3d).view(x.shape))
    assert warnings == [] and step.compiled


class _Dtypes(TorchDispatchMode):
    """Counts the convolutions and matrix products a step runs, by the dtypes of their floating inputs."""

    OPS = ("convolution", "convolution_backward", "mm", "bmm", "addmm", "_log_softmax")

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[tuple[str, tuple[str, ...]]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.OPS:
            dtypes = {
                str(a.dtype).removeprefix("torch.")
                for a in args
                if isinstance(a, torch.Tensor) and a.is_floating_point()
            }
            self.seen[(name, tuple(sorted(dtypes)))] += 1
        return func(*args, **(kwargs or {}))


def test_bf16_autocast_reaches_every_convolution_and_matrix_product(one_thread):
    """--amp bf16: the encoder's, the GRU's and the predictor's convolutions (forward and backward), the memory
    read's and the loss's matrix products all run in bf16; only the loss's log-softmax stays in fp32."""
    config = config_from_dict({**TINY, "bidirectional": True, "amp": "bf16"})
    _, step, _ = stepper(config)
    with _Dtypes() as dtypes:
        step(clips(config))
    # 20 encoder convolutions; per direction 3 GRU gates × (3 + 1) steps and 2 predictor convolutions × 2
    convolutions = 20 + 2 * (3 * 4 + 2 * 2)
    assert dtypes.seen == {
        ("convolution", ("bfloat16",)): convolutions,
        ("convolution_backward", ("bfloat16",)): convolutions,
        # the memory read per prediction, the loss's scores per direction: each and its two gradients
        ("bmm", ("bfloat16",)): 2 * 2 * 3,
        ("mm", ("bfloat16",)): 2 * 3,
        ("_log_softmax", ("float32",)): 2,
    }


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "bidirectional"), [("memdpc_r18", True), ("dpc_r18", False)])
def test_compiled_step_equals_the_eager_step(arch, bidirectional, one_thread):
    """--compile's code (inductor's, on the CPU) computes the eager step: the same outputs, gradients and BatchNorm
    statistics up to the summation order (dropout drawn as eager draws it), and the same Adam update. With and
    without the memory, in both directions; ResNet-34 adds only blocks of the same code (and each inductor compile
    is slow on a CPU: its C++ is generated without SIMD, less to compile, the same graph and fusions)."""
    config = config_from_dict({**TINY, "arch": arch, "bidirectional": bidirectional, "compile": True})
    results = []
    for cfg in (config, config_from_dict({**config.to_dict(), "compile": False})):
        model, step, warnings = stepper(cfg)
        torch.manual_seed(3)
        with inductor_config.patch({"fallback_random": True, "cpp.simdlen": 1}):
            out = step(clips(cfg))
        results.append((out, state(model)))
        assert warnings == [] and step.compiled is cfg.compile
    (compiled, after), (eager, eager_after) = results
    for k in eager:
        torch.testing.assert_close(
            compiled[k], eager[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}"
        )
    # gradients against the largest one (a sum that nearly cancels has a large relative error in any order)
    scale = max(float(v.abs().max()) for k, v in eager_after.items() if k.startswith("g."))
    for k, v in eager_after.items():
        if k.startswith("g."):
            torch.testing.assert_close(
                after[k], v, rtol=1e-3, atol=1e-4 * scale, msg=lambda m, k=k: f"{k}: {m}"
            )
        elif k.startswith("b."):
            torch.testing.assert_close(after[k], v, rtol=1e-4, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
        else:  # Adam's first step moves each weight by about lr, whichever way a near-zero gradient points
            torch.testing.assert_close(
                after[k], v, rtol=0, atol=2.1 * config.lr, msg=lambda m, k=k: f"{k}: {m}"
            )
    assert any(
        not torch.equal(after[k], v) for k, v in eager_after.items() if k.startswith("g.")
    )  # really compiled


def test_a_backend_that_cannot_compile_falls_back_to_the_eager_step_with_one_warning(one_thread):
    config = config_from_dict({**TINY, "bidirectional": True, "compile": True})
    model, step, warnings = stepper(config, backend="no_such_backend")
    eager_model, eager_step, _ = stepper(config_from_dict({**config.to_dict(), "compile": False}))
    for seed in (1, 2):
        torch.manual_seed(seed)
        out = step(clips(config, seed=seed))
        torch.manual_seed(seed)
        expected = eager_step(clips(config, seed=seed))
        assert all(torch.equal(out[k], expected[k]) for k in expected)
    assert not step.compiled
    assert len(warnings) == 1 and warnings[0].startswith("torch.compile failed (InvalidBackend: ")
    assert "'no_such_backend'" in warnings[0] and warnings[0].endswith("; training eagerly")
    assert all(
        torch.equal(a, b) for a, b in zip(state(model).values(), state(eager_model).values(), strict=True)
    )


def test_cuda_graphs_on_a_cpu_warn_and_train_eagerly():
    config = config_from_dict({**TINY, "cuda_graphs": True})
    _, step, warnings = stepper(config)
    assert not step.graphs and step(clips(config))["loss"].isfinite()
    assert warnings == ["--cuda-graphs needs a CUDA device; training on cpu without"]


def test_cuda_graphs_refuse_fp16():
    with pytest.raises(UserError, match="cuda_graphs does not go with amp fp16"):
        config_from_dict(dict(shards="unused", out="unused", cuda_graphs=True, amp="fp16"))


def _train(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        memdpc_command("train", *args),
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        timeout=600,
    )


def _losses(run: Path) -> list[float]:
    return [
        r["loss"]
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ]


@pytest.mark.slow
def test_train_compile_without_a_cxx_compiler_warns_once_and_trains_as_eager(train_shards, tmp_path):
    """`memdpc train --compile` where inductor finds no C++ compiler: one warning, then the eager run's very
    losses (the failed try left the BatchNorm statistics and random generators as they were)."""
    runs = {}
    for name, extra, env in (
        (
            "compiled",
            ["--compile"],
            {
                "CXX": str(tmp_path / "no-such-g++"),
                "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
            },
        ),
        ("eager", [], {}),
    ):
        runs[name] = _train(
            [*TRAIN, "--shards", str(train_shards), "--out", str(tmp_path / name), "--epochs", "1", *extra],
            env,
        )
        assert runs[name].returncode == 0, runs[name].stderr
    warnings = [ln for ln in runs["compiled"].stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "warning: torch.compile failed (" in warnings[0], runs["compiled"].stderr
    assert "No working C++ compiler" in warnings[0] and warnings[0].endswith("; training eagerly")
    assert _losses(tmp_path / "compiled") == _losses(tmp_path / "eager") and _losses(tmp_path / "eager")


def test_a_batch_that_does_not_fit_is_a_one_line_error_naming_its_size(train_shards, tmp_path):
    """A real failed allocation (the process's address space capped just above what it holds before training):
    `memdpc train` ends with one line naming the batch size and the memory the step asked for, exit 2."""
    script = (
        "import os, resource, sys\n"
        "import torch\n"
        "from memdpc.cli import main\n"
        "import memdpc.train.loop\n"
        "held = int(open('/proc/self/statm').read().split()[0]) * os.sysconf('SC_PAGE_SIZE')\n"
        "resource.setrlimit(resource.RLIMIT_AS, (held + (600 << 20), resource.RLIM_INFINITY))\n"
        "sys.argv = ['memdpc', 'train', *sys.argv[1:]]\n"
        "main()\n"
    )
    args = [
        *TRAIN,
        "--widths",
        "64,128,256,256",
        "--size",
        "128",
        "--shards",
        str(train_shards),
        "--out",
        str(tmp_path / "run"),
        "--epochs",
        "1",
    ]
    res = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert re.fullmatch(
        r"Error: --batch-size 4 does not fit in the memory of cpu: a step asked for [\d.]+ [kMG]B "
        r"more than was free; lower --batch-size",
        lines[0],
    ), lines[0]


def test_out_of_memory_reads_cuda_s_message():
    """The words of a CUDA out-of-memory error (as torch raises it) give the amount asked for and the card's
    total; other errors are not memory errors."""
    error = torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 3.12 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.05 GiB "
        "is free. Of the allocated memory 75.30 GiB is allocated by PyTorch."
    )
    message = str(out_of_memory(error, 64, CPU))
    assert message == (
        "--batch-size 64 does not fit in the memory of cpu: a step asked for 3.12 GiB more than was "
        "free (it has 79.19 GiB in all); lower --batch-size"
    )
    assert out_of_memory(RuntimeError("shapes do not match"), 64, CPU) is None


# ------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_fast_defaults_place_the_encoder_and_clips_channels_last():
    config = config_from_dict(dict(shards="unused", out="unused"))
    cuda = torch.device("cuda")
    model = place_model(create_model("dpc_r18", widths=(4, 8, 16, 16), input_size=32), config, cuda)
    assert model.backbone.conv1.weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert make_optimizer(model, config, cuda).defaults["fused"] is True
    x = place_clips(torch.randn(2, 5, 3, 3, 32, 32), config, cuda)
    assert x.shape == (2, 5, 3, 3, 32, 32)
    assert x.flatten(0, 1).is_contiguous(memory_format=torch.channels_last_3d)  # the encoder's view


@pytest.mark.gpu
@pytest.mark.parametrize("amp", ["none", "bf16"])
def test_gpu_cuda_graph_steps_follow_the_eager_steps(amp):
    """Warm-up steps, the capture, replays, and a new capture after the learning rate changes: every step's loss
    and the final weights as the eager steps give them (no dropout: its draws differ inside a graph)."""
    cuda = torch.device("cuda")
    config = config_from_dict(
        {
            **TINY,
            "widths": [16, 32, 64, 64],
            "size": 64,
            "bidirectional": True,
            "amp": amp,
            "cuda_graphs": True,
        }
    )
    runs = []
    for cfg in (config, config_from_dict({**config.to_dict(), "cuda_graphs": False})):
        model, step, warnings = stepper(cfg, cuda, gru_dropout=0.0)
        losses = []
        for i in range(8):
            if i == 6:
                for group in step.optimizer.param_groups:
                    group["lr"] = 1e-4
            losses.append(step(clips(cfg, cuda, batch=4, seed=i))["loss"].item())
        runs.append((losses, state(model), step))
        assert warnings == []
    (losses, after, graphed), (eager_losses, eager_after, _) = runs
    assert graphed.graphs and graphed._graph is not None and graphed._graph.lrs == [1e-4]
    assert losses == pytest.approx(eager_losses, rel=1e-4 if amp == "none" else 2e-2)
    for k, v in eager_after.items():
        if k.startswith("w."):
            torch.testing.assert_close(after[k], v, rtol=1e-3, atol=1e-3 if amp == "none" else 1e-2)


@pytest.mark.gpu
def test_gpu_a_batch_that_does_not_fit_names_its_size_and_the_memory_asked_for():
    cuda = torch.device("cuda")
    config = config_from_dict({**TINY, "widths": [64, 128, 256, 256], "size": 512})
    _, step, _ = stepper(config, cuda)
    batch = 64  # 3 GB of input: it fits, its activations (GBs per clip) do not
    with pytest.raises(torch.OutOfMemoryError) as caught:
        step(place_clips(torch.empty(batch, 5, 3, 3, 512, 512, device=cuda).normal_(), config, cuda))
    message = str(out_of_memory(caught.value, batch, cuda))
    assert message.startswith(f"--batch-size {batch} does not fit in the memory of cuda")
    assert "GiB more than was free (it has " in message
