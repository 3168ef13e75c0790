"""One training step on the device, as ``memdpc train``, its ``--dry-run`` and bench/train.py run it
(ARCHITECTURE.md §3.3): the model and batch placement, the optimiser, and :class:`Stepper`, which runs the step
eagerly, compiled (``--compile``) or captured in one CUDA graph (``--cuda-graphs``).

- ``--fast`` (CUDA): the encoder and the clips in channels_last_3d, fused Adam.
- ``--compile``: ``torch.compile`` of the model (forward and backward), as one graph: a graph break is a
  failure. Where compiling fails (no C++ compiler, an unsupported backend, a graph break) the step falls back to
  eager with a one-line warning, as if the run had been eager from its start (the BatchNorm statistics and
  random generators that the failed try touched are restored).
- ``--cuda-graphs`` (CUDA, one process): forward, backward and the optimiser step captured in one CUDA graph
  at the batch's shape, then replayed: one launch per step instead of one per kernel. The first
  :data:`GRAPH_WARMUP` steps at a shape run eagerly on a side stream (cuDNN's autotuning, the optimiser's
  state); a new shape or learning rate captures again. Adam is then ``capturable`` (its step counters on the
  device). The outputs of a replayed step are overwritten by the next step: read or copy them before.

``--compile`` and ``--cuda-graphs`` are off by default until bench/train.py measures them on a GPU
(docs/training.md, *Speed on a GPU*).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from memdpc.common.errors import UserError
from memdpc.common.wording import error_line, size_text
from memdpc.model.memdpc import objective
from memdpc.train.checkpoint import rng_state, set_rng_state
from memdpc.train.config import TrainConfig

__all__ = [
    "COMPILE_BACKEND",
    "GRAPH_WARMUP",
    "Stepper",
    "fused_adam",
    "make_optimizer",
    "out_of_memory",
    "place_clips",
    "place_model",
    "uses_graphs",
]

GRAPH_WARMUP = 3  # eager steps at a new shape before the CUDA graph is captured (the documented minimum)
COMPILE_BACKEND = "inductor"


def uses_fast(config: TrainConfig, device: torch.device) -> bool:
    """Whether the CUDA speed defaults apply: ``--fast`` on a CUDA device. On CPU they are left out, as fused
    Adam's numbers differ from the default Adam's and CPU runs stay bit-identical to earlier versions."""
    return config.fast and device.type == "cuda"


def uses_graphs(config: TrainConfig, device: torch.device) -> bool:
    """Whether the step runs as a CUDA graph: ``--cuda-graphs`` on a CUDA device."""
    return config.cuda_graphs and device.type == "cuda"


def place_model(model: nn.Module, config: TrainConfig, device: torch.device) -> nn.Module:
    """The model on ``device``; with the fast defaults its encoder's 3D convolutions in channels_last_3d, the
    layout in which cuDNN's 3D kernels are fastest (fp32 numbers kept, up to the kernels' summation order)."""
    model = model.to(device)
    if uses_fast(config, device):
        model.backbone.to(memory_format=torch.channels_last_3d)
    return model


def make_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Adam:
    """Adam; with the fast defaults its fused CUDA kernel (one launch for all parameters), else torch's default;
    ``capturable`` (step counters on the device) when the step runs as a CUDA graph."""
    return torch.optim.Adam(
        model.parameters(),
        lr=config.lr,
        weight_decay=config.weight_decay,
        fused=fused_adam(config, device),
        capturable=uses_graphs(config, device),
    )


def fused_adam(config: TrainConfig, device: torch.device) -> bool | None:
    """Adam's ``fused`` setting for this run: True with the fast defaults, else torch's default (None)."""
    return True if uses_fast(config, device) else None


def place_clips(clips: torch.Tensor, config: TrainConfig, device: torch.device) -> torch.Tensor:
    """A (B, N, C, SL, H, W) batch on ``device``; with the fast defaults each block in channels_last_3d, the
    encoder's layout (the encoder sees the blocks as a (B·N, C, SL, H, W) view, which keeps it)."""
    clips = clips.to(device, non_blocking=True)
    if not uses_fast(config, device):
        return clips
    return clips.flatten(0, 1).contiguous(memory_format=torch.channels_last_3d).view(clips.shape)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    clips: torch.Tensor,
    config: TrainConfig,
    autocast_cache: bool = True,
    teacher: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """One optimiser step on a batch already placed (:func:`place_clips`), eagerly; the model's outputs, on the
    device (nothing here waits for the device). ``autocast_cache=False`` inside a CUDA graph capture;
    ``teacher``: the teacher's features of the batch's clips (``--teacher``)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.amp)
    with torch.autocast(
        clips.device.type, dtype=dtype, enabled=dtype is not None, cache_enabled=autocast_cache
    ):
        out = model(clips) if teacher is None else model(clips, teacher)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(objective(out, config.teacher_weight)).backward()
    scaler.step(optimizer)
    scaler.update()
    return out


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    clips: torch.Tensor  # the static input: each batch is copied here before a replay
    out: dict[str, torch.Tensor]  # the static outputs
    lrs: list[float]  # the learning rates baked into the captured optimiser step


class Stepper:
    """``stepper(clips, teacher=None) -> outputs``: one optimiser step of ``model`` as ``config`` asks (module
    docstring); ``teacher``: the teacher's features of the clips, with ``--teacher`` (not in a CUDA graph).

    ``model`` is the module to train (DDP-wrapped under torchrun); ``warn`` prints a one-line warning (a
    compile that failed, CUDA graphs asked for on a CPU). ``backend`` is ``torch.compile``'s.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        config: TrainConfig,
        device: torch.device,
        warn: Callable[[str], None],
        backend: str = COMPILE_BACKEND,
    ):
        self.model, self.optimizer, self.scaler, self.config, self.warn = (
            model,
            optimizer,
            scaler,
            config,
            warn,
        )
        self.graphs = uses_graphs(config, device)
        if config.cuda_graphs and not self.graphs:
            warn(f"--cuda-graphs needs a CUDA device; training on {device} without")
        self.run = model  # the module each step calls: the compiled one, or the model itself
        self.compiled = False  # whether steps run compiled; until the first step ends, whether they try to
        self._trial = False  # the first compiled step is still to come
        if config.compile:
            try:
                self.run = torch.compile(model, backend=backend, fullgraph=not _distributed(model))
                self.compiled = self._trial = True
            except Exception as e:  # noqa: BLE001 — any reason not to compile means eager, said once
                self._fall_back(e)
        self._warm: dict[torch.Size, int] = {}  # eager steps done per shape before capturing
        self._graph: _Graph | None = None

    def __call__(self, clips: torch.Tensor, teacher: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if not self.graphs:
            return self._step(clips, teacher=teacher)
        g = self._graph
        if g is not None and (g.clips.shape != clips.shape or g.lrs != self._lrs()):
            self._graph = g = None  # its memory goes back before the steps at the new shape or rate
        if g is None:
            warm = self._warm.get(clips.shape, 0)
            if warm < GRAPH_WARMUP:
                self._warm[clips.shape] = warm + 1
                return self._on_side_stream(clips)
            self._graph = g = self._capture(clips)
        g.clips.copy_(clips)
        g.graph.replay()
        return g.out

    # ------------------------------------------------------------------------------------------ eager / compiled
    def _step(
        self, clips: torch.Tensor, autocast_cache: bool = True, teacher: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        args = (self.optimizer, self.scaler, clips, self.config, autocast_cache, teacher)
        if not self._trial:
            return train_step(self.run, *args)
        # the first compiled step: compiling happens here; where it fails, undo what the try touched, go eager
        buffers = {name: b.clone() for name, b in self.model.named_buffers()}
        rng = rng_state()
        try:
            out = train_step(self.run, *args)
        except Exception as e:  # noqa: BLE001 — a compile failure can be any exception; memory is not one
            if out_of_memory(e, clips.shape[0], clips.device) is not None:
                raise
            with torch.no_grad():
                for name, b in self.model.named_buffers():
                    b.copy_(buffers[name])
            set_rng_state(rng)
            self._fall_back(e)
            return train_step(self.run, *args)
        self._trial = False
        return out

    def _fall_back(self, error: Exception) -> None:
        self.run, self.compiled, self._trial = self.model, False, False
        self.warn(f"torch.compile failed ({error_line(error)}); training eagerly")

    # ------------------------------------------------------------------------------------------- CUDA graphs
    def _lrs(self) -> list[float]:
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def _on_side_stream(self, clips: torch.Tensor) -> dict[str, torch.Tensor]:
        """An eager (or compiled) step on a side stream, as a capture needs its warm-up to run."""
        side = torch.cuda.Stream(clips.device)
        side.wait_stream(torch.cuda.current_stream(clips.device))
        with torch.cuda.stream(side):
            out = self._step(clips, autocast_cache=False)
        torch.cuda.current_stream(clips.device).wait_stream(side)
        return out

    def _capture(self, clips: torch.Tensor) -> _Graph:
        static = clips.clone()  # keeps the batch's layout (channels_last_3d with the fast defaults)
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(
            set_to_none=True
        )  # the captured backward allocates the gradients in its pool
        with torch.cuda.graph(graph):
            out = self._step(static, autocast_cache=False)
        return _Graph(graph, static, out, self._lrs())


def _distributed(model: nn.Module) -> bool:
    return isinstance(model, nn.parallel.DistributedDataParallel)


_ASKED = re.compile(r"[Tt]ried to allocate (\d+(?:\.\d+)? ?[KMGT]?i?B|\d+ bytes)")
_TOTAL = re.compile(r"total capacity of (\d+(?:\.\d+)? ?[KMGT]?i?B)")


def out_of_memory(error: BaseException, batch_size: int, device: torch.device) -> UserError | None:
    """The one-line error for a batch that does not fit in ``device``'s memory (a CUDA out-of-memory error, or a
    failed CPU allocation), naming the batch size and the memory asked for; None for any other error."""
    text = str(error)
    if not (
        isinstance(error, torch.OutOfMemoryError) or "DefaultCPUAllocator: can't allocate memory" in text
    ):
        return None
    asked = _ASKED.search(text)
    amount = "more" if asked is None else f"{asked.group(1)} more"
    if amount.endswith(" bytes more"):
        amount = f"{size_text(int(amount.split()[0]))} more"
    total = _TOTAL.search(text)
    has = f" (it has {total.group(1)} in all)" if total else ""
    if device.type == "cuda":
        where, smaller = (
            f"{device} ({torch.cuda.get_device_name(device)})",
            "lower --batch-size, or --amp bf16",
        )
    else:
        where, smaller = str(device), "lower --batch-size"
    return UserError(
        f"--batch-size {batch_size} does not fit in the memory of {where}: a step asked for {amount} "
        f"than was free{has}; {smaller}"
    )
