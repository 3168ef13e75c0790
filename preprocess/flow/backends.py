"""TV-L1 optical flow between consecutive frames, and its mapping to uint8 image codes.

A flow *backend* turns a batch of greyscale frame pairs into float flow: ``backend(prev, nxt)`` with
``prev``, ``nxt`` (B, H, W) uint8 returns (B, H, W, 2) float32 (x, y displacement in pixels, frame k → k+1);
``backend.batch_size`` says how many pairs it wants per call. Backends are built by name from
:data:`BACKENDS` (``"module:factory"``, imported on first use); a factory takes ``(params, device)``.
``opencv`` is OpenCV contrib's CPU ``DualTVL1OpticalFlow``; ``native`` the same algorithm compiled by numba
(``memdpc.preprocess.flow.tvl1_native``, bit for bit OpenCV's flow, faster per core); ``torch`` adapts the batched
PyTorch port in ``memdpc.preprocess.flow.tvl1_torch`` (GPU). A new backend is one more entry in :data:`BACKENDS`.

A *batched* backend (:class:`BatchedFlowBackend`) also maps flow to codes on its device,
``backend.device_codes(prev, nxt, third)`` with tensors on ``backend.device``; the run feeds such a backend
from many videos at once (``memdpc.preprocess.flow.batched``). :func:`resolve_backend` turns ``auto`` into
the backend and devices used.
"""

from __future__ import annotations

import functools
import importlib
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import cv2
import numpy as np

from memdpc.common.errors import UserError
from memdpc.preprocess.flow.tvl1_params import TVL1Params

if TYPE_CHECKING:
    import torch

__all__ = [
    "AUTO",
    "BACKENDS",
    "BOUND",
    "BatchedFlowBackend",
    "FlowBackend",
    "FlowStage",
    "OpenCVTVL1",
    "batch_pairs",
    "codes_to_flow",
    "flow_to_codes",
    "make_backend",
    "resolve_backend",
    "to_grey",
]

BOUND = 20.0  # flow is clipped to [-BOUND, BOUND] pixels before the mapping to 0..255
AUTO = "auto"  # --flow-backend and --device: chosen by resolve_backend


class FlowBackend(Protocol):
    batch_size: int

    def __call__(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class BatchedFlowBackend(FlowBackend, Protocol):
    """A backend that runs large batches on a device and maps flow to codes there.

    ``device_codes(prev, nxt, third)``: (B, H, W) uint8 tensors ×2 on ``device`` → (B, H, W, 3) uint8 on
    ``device``, equal to ``flow_to_codes(backend(prev, nxt), third)``, so the caller moves frames in and
    codes out when it suits it (its own streams, while the device computes another batch). It is called on
    the caller's current CUDA stream and returns without waiting for the device. A pair's result must not
    depend on the other pairs of its batch. A batch too large for the device's memory raises
    ``torch.cuda.OutOfMemoryError`` (or ``MemoryError``, or a ``RuntimeError`` saying "out of memory");
    the caller then splits it. ``checkpoint`` is called often during the batch (every solver iteration); an
    exception it raises abandons the batch, so a run can stop within a fraction of a second.
    """

    batch_pixels: int  # the batched path's batch: this many pixels, i.e. batch_pixels // (H·W) pairs
    device: torch.device

    def device_codes(
        self, prev: torch.Tensor, nxt: torch.Tensor, third: int, checkpoint: Callable[[], None] = ...
    ) -> torch.Tensor: ...


def batch_pairs(backend: BatchedFlowBackend, height: int, width: int) -> int:
    """The pairs of ``height``×``width`` frames in one batch of the batched path: a budget of pixels, so
    small frames come in large batches (the kernels' per-launch overhead spread over more pairs) and large
    ones in batches that still fit the device."""
    return max(1, backend.batch_pixels // (height * width))


class OpenCVTVL1:
    """OpenCV contrib's CPU Dual TV-L1 (one pair at a time; run one OpenCV thread per worker process)."""

    batch_size = 1

    def __init__(self, params: TVL1Params = TVL1Params(), device: str = "cpu") -> None:
        if device != "cpu":
            raise UserError(f"the opencv flow backend runs on the CPU only, not on '{device}'")
        self._tv, self._scales = params.to_opencv(), params.scales

    def __call__(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        # (B, H, W) uint8 ×2 -> (B, H, W, 2) float32
        return np.stack([self._calc(a, b) for a, b in zip(prev, nxt, strict=True)])

    def _calc(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        # OpenCV lowers the object's scale count for good after a frame too small for the full pyramid;
        # restoring it makes every video's flow independent of the videos this worker saw before.
        self._tv.setScalesNumber(self._scales)
        return self._tv.calc(a, b, None)


class TorchTVL1:
    """Adapter to the batched PyTorch port (``memdpc.preprocess.flow.tvl1_torch``): NumPy batches in and out,
    ``batch_size`` pairs per call on ``device`` (a GPU, or the CPU for checks)."""

    batch_size = 32
    batch_pixels = 32 * 256 * 256
    kernels = "memdpc.preprocess.flow.tvl1_torch"  # the module whose ``tvl1_flow`` runs the batch

    def __init__(self, params: TVL1Params = TVL1Params(), device: str = "cuda") -> None:
        import torch

        from memdpc.preprocess.flow import tvl1_torch

        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"--device {device}: no CUDA device is available for the torch flow backend")
        try:
            tvl1_torch.check_params(params)
        except ValueError as e:
            raise UserError(f"flow backend torch: {e}") from None
        self._params = params
        self._flow = importlib.import_module(self.kernels).tvl1_flow
        self._torch, self.device = torch, torch.device(device)

    def __call__(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        # (B, H, W) uint8 ×2 -> (B, H, W, 2) float32
        to = self._torch.from_numpy
        return self._flow(to(prev).to(self.device), to(nxt).to(self.device), self._params).cpu().numpy()

    def device_codes(
        self,
        prev: torch.Tensor,
        nxt: torch.Tensor,
        third: int,
        checkpoint: Callable[[], None] = lambda: None,
    ) -> torch.Tensor:
        # (B, H, W) uint8 ×2 -> (B, H, W, 3) uint8, on the device
        return flow_to_codes_torch(self._flow(prev, nxt, self._params, checkpoint=checkpoint), third)


class TritonTVL1(TorchTVL1):
    """The same batched TV-L1 with the fused Triton kernels (``memdpc.preprocess.flow.tvl1_triton``): CUDA, or the
    CPU under ``TRITON_INTERPRET=1`` for checks."""

    batch_size = 128
    batch_pixels = (
        512 * 256 * 256
    )  # chosen from the kernel table of bench/flow_e2e.py (docs/benchmarks.md, Flow)
    kernels = "memdpc.preprocess.flow.tvl1_triton"

    def __init__(self, params: TVL1Params = TVL1Params(), device: str = "cuda") -> None:
        reason = importlib.import_module(self.kernels).unavailable_reason(device)
        if reason:
            raise UserError(f"flow backend triton on '{device}': {reason}")
        super().__init__(params, device)


BACKENDS: dict[str, str] = {
    "opencv": "memdpc.preprocess.flow.backends:OpenCVTVL1",
    "native": "memdpc.preprocess.flow.tvl1_native:NativeTVL1",
    "torch": "memdpc.preprocess.flow.backends:TorchTVL1",
    "triton": "memdpc.preprocess.flow.backends:TritonTVL1",
}
CPU_BACKENDS = ("opencv", "native")  # --device auto means the CPU for these


@functools.lru_cache(maxsize=4)
def make_backend(name: str, params: TVL1Params = TVL1Params(), device: str = "cpu") -> FlowBackend:
    """Build (once per process) the flow backend ``name`` for ``params`` on ``device``."""
    if name not in BACKENDS:
        raise UserError(f"unknown flow backend '{name}' (choose from {', '.join(BACKENDS)})")
    module, factory = BACKENDS[name].split(":")
    try:
        make: Callable[[TVL1Params, str], FlowBackend] = getattr(importlib.import_module(module), factory)
    except (ImportError, AttributeError, OSError) as e:  # OSError: a compiled dependency that fails to load
        raise UserError(
            f"flow backend '{name}' is not available ({str(e).strip().splitlines()[0]})"
        ) from None
    return make(params, device)


def parse_devices(text: str, gpus: int) -> list[str]:
    """The devices named by ``--device``, checked against the ``gpus`` CUDA devices visible here.

    ``cpu``; ``cuda`` (every visible GPU); ``cuda:0,2`` or ``cuda:0,cuda:2`` (those GPUs); ``auto``
    (every visible GPU, else the CPU). Returns e.g. ``["cuda:0", "cuda:2"]``; bad text → UserError.
    """
    spec = text.strip().lower()
    if spec == AUTO:
        spec = "cuda" if gpus else "cpu"
    if spec == "cpu":
        return ["cpu"]
    m = re.fullmatch(r"cuda(?::(\d+(?:\s*,\s*(?:cuda:)?\d+)*))?", spec)
    if not m:
        raise UserError(f"--device must be {AUTO}, cpu, cuda or cuda:I[,J…], not '{text}'")
    if not gpus:
        raise UserError(f"--device {text}: no CUDA device is available on this machine")
    if m[1] is None:
        return [f"cuda:{i}" for i in range(gpus)]
    ids = [int(x.strip().removeprefix("cuda:")) for x in m[1].split(",")]
    if len(set(ids)) != len(ids) or max(ids) >= gpus:
        raise UserError(
            f"--device {text}: need distinct GPUs among the {gpus} visible here (cuda:0 … cuda:{gpus - 1})"
        )
    return [f"cuda:{i}" for i in ids]


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _triton_unavailable(device: str) -> str | None:
    """Why the Triton kernels cannot run on ``device`` (None: they can)."""
    if "triton" not in BACKENDS:
        return "no triton flow backend in this installation"
    try:
        from memdpc.preprocess.flow.tvl1_triton import unavailable_reason
    except ImportError as e:
        return str(e)
    return unavailable_reason(device)


def _native_unavailable(params: TVL1Params) -> str | None:
    """Why the native CPU TV-L1 cannot run here with ``params`` (None: it can)."""
    try:
        from memdpc.preprocess.flow.tvl1_native import unavailable_reason
    except (ImportError, OSError) as e:  # numba missing, no build of it for this platform, or a broken one
        return str(e).strip().splitlines()[0]
    return unavailable_reason(params)


def resolve_backend(
    requested: str, device: str, gpus: int | None = None, params: TVL1Params = TVL1Params()
) -> tuple[str, str, str | None]:
    """The flow backend and devices a run uses: ``(backend, devices, note)``.

    ``devices`` is a comma-separated list (``cpu``, ``cuda:0,cuda:1``). ``auto`` takes the GPU path where
    CUDA is available and ``device`` is not ``cpu``: the Triton kernels, else the torch backend with a
    ``note`` saying why not Triton; on the CPU it takes the native TV-L1, else OpenCV with a ``note`` saying
    why not the native one. An explicit backend keeps
    ``device`` (``auto``: the GPUs for a GPU backend where there are any, else the CPU). ``gpus``: the
    number of visible CUDA devices (default: ask torch); ``params``: the run's TV-L1 parameters, which the
    native backend's check runs with.
    """
    if requested not in (AUTO, *BACKENDS):
        raise UserError(f"unknown --flow-backend '{requested}' (choose from {', '.join((AUTO, *BACKENDS))})")
    if requested in CPU_BACKENDS:
        return requested, "cpu" if device == AUTO else device, None
    gpus = _visible_gpus() if gpus is None else gpus
    devices = parse_devices(device, gpus)
    if requested != AUTO:
        return requested, ",".join(devices), None
    if devices == ["cpu"]:
        reason = _native_unavailable(params)
        if reason is None:
            return "native", "cpu", None
        return "opencv", "cpu", f"native TV-L1 unavailable ({reason}); using OpenCV"
    reason = _triton_unavailable(devices[0])
    if reason is None:
        return "triton", ",".join(devices), None
    return "torch", ",".join(devices), f"Triton TV-L1 kernels unavailable ({reason}); using the torch backend"


def flow_to_codes(flow: np.ndarray, third: int = 128, bound: float = BOUND) -> np.ndarray:
    """Map flow (..., H, W, 2) float to a (..., H, W, 3) uint8 image (x, y, third).

    Clip to [-bound, bound], then ``round((f + bound) · 255 / (2 · bound))`` (half up), so zero flow is 128.
    """
    f = np.clip(flow, -bound, bound)
    codes = np.floor((f + bound) * (255.0 / (2 * bound)) + 0.5).astype(np.uint8)
    return np.concatenate([codes, np.full(codes.shape[:-1] + (1,), third, np.uint8)], axis=-1)


def flow_to_codes_torch(flow: torch.Tensor, third: int = 128, bound: float = BOUND) -> torch.Tensor:
    """:func:`flow_to_codes` for a float32 tensor, on its device: the same uint8 codes, bit for bit (the
    same float32 operations in the same order)."""
    codes = ((flow.clamp(-bound, bound) + bound) * (255.0 / (2 * bound)) + 0.5).floor().byte()
    out = codes.new_full((*codes.shape[:-1], 3), third)
    out[..., :2] = codes
    return out


def codes_to_flow(codes: np.ndarray, bound: float = BOUND) -> np.ndarray:
    """Inverse of :func:`flow_to_codes` for the x, y channels: (..., 3) uint8 -> (..., 2) float32 pixels."""
    return codes[..., :2].astype(np.float32) * (2 * bound / 255.0) - bound


def to_grey(frame: np.ndarray) -> np.ndarray:
    """The frame TV-L1 reads: a BGR frame (H, W, 3) uint8 in OpenCV's greyscale (H, W) uint8."""
    return cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY)


class FlowStage:
    """Consecutive frames in, flow code images out (n frames give n − 1 flows, frame k → k + 1).

    ``push`` takes BGR frames in order and returns the code images that became ready (the backend runs
    once ``batch_size`` pairs wait); ``flush`` returns the rest. At most ``batch_size`` pairs are held.
    ``seconds`` accumulates the time spent in greyscale conversion and the backend.
    """

    def __init__(self, backend: FlowBackend, third: int = 128) -> None:
        self.backend, self.third = backend, third
        self.seconds = 0.0
        self._prev: np.ndarray | None = None
        self._pairs: list[tuple[np.ndarray, np.ndarray]] = []

    def push(self, frame: np.ndarray) -> list[np.ndarray]:
        t = time.perf_counter()
        grey = to_grey(frame)
        if self._prev is not None:
            self._pairs.append((self._prev, grey))
        self._prev = grey
        self.seconds += time.perf_counter() - t
        return self._run() if len(self._pairs) >= self.backend.batch_size else []

    def flush(self) -> list[np.ndarray]:
        return self._run() if self._pairs else []

    def _run(self) -> list[np.ndarray]:
        t = time.perf_counter()
        prev, nxt = (np.stack(x) for x in zip(*self._pairs, strict=True))
        self._pairs.clear()
        flow = self.backend(prev, nxt)  # (B, H, W, 2)
        codes = flow_to_codes(flow, self.third)
        self.seconds += time.perf_counter() - t
        return list(codes)
