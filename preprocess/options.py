"""The options of ``memdpc preprocess frames|flow`` as the command line gives them, each with its default and
help (:class:`PreprocessOptions`), and the run's :class:`PreprocessConfig`, everything a run needs, made from them
(:func:`config_from_options`) and checked before any work starts."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memdpc.common.errors import UserError
from memdpc.common.settings import setting
from memdpc.common.streams import STREAMS
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.encode import (
    DEFAULT_FLOW_ENCODING,
    FLOW_ENCODING,
    FLOW_ENCODINGS,
    RGB_ENCODING,
    JpegEncoding,
)
from memdpc.preprocess.flow.backends import AUTO, BACKENDS
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.report import REPORT, REPORT_OF_PART

__all__ = ["PreprocessConfig", "PreprocessOptions", "PreprocessRun", "config_from_options", "parse_part"]


@dataclass(frozen=True)
class PreprocessConfig:
    """Everything a run needs; one picklable object sent to every worker.

    ``flow_backend`` and ``device`` may be ``auto``: :func:`memdpc.preprocess.flow.backends.resolve_backend`
    picks the GPU path where CUDA is available, else OpenCV on the CPU. ``workers`` are the processes of the
    per-video path; ``threads`` the decode and the encode threads per device of the batched path (0: the
    CPU cores divided among the devices). ``overwrite``: rewrite archives made with other settings or from
    another source (without it the run refuses them).
    """

    out: str
    streams: tuple[str, ...] = ("rgb",)
    decode: DecodeSpec = DecodeSpec()
    rgb_encoding: JpegEncoding = RGB_ENCODING
    flow_encoding: JpegEncoding = FLOW_ENCODING
    third_channel: int = 128
    tvl1: TVL1Params = TVL1Params()
    flow_backend: str = AUTO
    device: str = AUTO
    workers: int = 1
    threads: int = 0
    dask: str | None = None
    part: tuple[int, int] = (0, 1)
    strict: bool = False
    keep_partial: bool = False
    overwrite: bool = False
    report: str | None = None

    def validate(self) -> None:
        """Refuse out-of-range options before any work starts."""
        if (
            not self.streams
            or any(s not in STREAMS for s in self.streams)
            or len(set(self.streams)) != len(self.streams)
        ):
            raise UserError(
                f"--streams must list distinct streams from {', '.join(STREAMS)}, not {self.streams}"
            )
        self.decode.validate()
        self.rgb_encoding.validate("--quality")
        self.flow_encoding.validate("--flow-quality")
        if self.third_channel not in (0, 128):
            raise UserError(f"--third-channel must be 0 or 128, not {self.third_channel}")
        self.tvl1.validate()
        if self.flow_backend not in (AUTO, *BACKENDS):
            raise UserError(
                f"unknown --flow-backend '{self.flow_backend}' (choose from {', '.join((AUTO, *BACKENDS))})"
            )
        if self.workers < 1:
            raise UserError(f"--workers must be ≥ 1, not {self.workers}")
        if self.threads < 0:
            raise UserError(f"--threads must be ≥ 0 (0: one per CPU core), not {self.threads}")
        i, n = self.part
        if not (n >= 1 and 0 <= i < n):
            raise UserError(f"--part I/N needs N ≥ 1 and 0 ≤ I < N, not {i}/{n}")

    @property
    def report_path(self) -> Path:
        if self.report:
            return Path(self.report)
        i, n = self.part
        return Path(self.out) / (REPORT if n == 1 else REPORT_OF_PART.format(i=i, n=n))


def parse_part(text: str) -> tuple[int, int]:
    """``"I/N"`` → (I, N): this run takes videos I, I+N, I+2N, … (0-based, e.g. ``$SLURM_ARRAY_TASK_ID/N``)."""
    m = re.fullmatch(r"\s*(-?\d+)\s*/\s*(-?\d+)\s*", text)
    if not m:
        raise UserError(f"--part must look like I/N (e.g. 0/4), not '{text}'")
    i, n = int(m[1]), int(m[2])
    if not (n >= 1 and 0 <= i < n):
        raise UserError(f"--part I/N needs N ≥ 1 and 0 ≤ I < N, not '{text}'")
    return i, n


_RUN = PreprocessConfig(out="")  # the run's defaults


@dataclass(frozen=True)
class PreprocessOptions:
    """What ``memdpc preprocess`` takes besides the index; the defaults are its options' defaults."""

    out: Path | None = setting(
        None,
        "Output root: writes OUT/rgb/<id>.tar and/or OUT/flow/<id>.tar.",
        required=True,
        path={"file_okay": False},
    )
    streams: str = setting("rgb", "Streams from one decode: rgb, flow or rgb,flow.")
    size: int = setting(
        DecodeSpec.size, "Resize the short side to this, keeping the aspect ratio (0: keep the size)."
    )
    square: int = setting(DecodeSpec.square, "Resize to SQUARE×SQUARE instead (the paper's 256×256; 0: off).")
    fps: float = setting(DecodeSpec.fps, "Resample to this frame rate (0: the native rate).")
    quality: int = setting(RGB_ENCODING.quality, "RGB JPEG quality 1–100.")
    flow_encoding: str = setting(
        DEFAULT_FLOW_ENCODING,
        "Flow JPEG: planes = x and y as greyscale planes of one image (any decoder, no drift), ycc = standard "
        "4:4:4 colour (any decoder), rgb = colour without the colour transform (CPU decoders).",
        choices=tuple(FLOW_ENCODINGS),
    )
    flow_quality: int | None = setting(
        None,
        "Flow JPEG quality 1–100 (default: "
        + ", ".join(f"{enc.quality} for {name}" for name, enc in FLOW_ENCODINGS.items())
        + ").",
    )
    third_channel: str = setting(
        str(_RUN.third_channel),
        "Constant third channel of flow images (128 = zero flow after the mapping).",
        choices=("128", "0"),
    )
    flow_backend: str = setting(
        _RUN.flow_backend,
        "TV-L1 implementation: opencv or native (CPU, one video per worker; native: OpenCV's flow bit for bit, "
        "compiled, faster) or a GPU one, fed batches from many videos at once; auto: the fastest GPU one where "
        "CUDA is available, else native (else opencv, with a note).",
        choices=(AUTO, *sorted(BACKENDS)),
    )
    device: str = setting(
        _RUN.device,
        "Flow device(s): cpu, cuda (every visible GPU), cuda:0,2 (those GPUs; one process each), or auto.",
    )
    workers: int = setting(
        _RUN.workers, "Local worker processes of the per-video (opencv, native) path, one thread each."
    )
    threads: int = setting(
        _RUN.threads,
        "Decode threads and encode threads per device of the batched (GPU) path (0: the CPU cores divided among "
        "the devices).",
    )
    dask: str | None = setting(None, "Run on the Dask cluster at this scheduler address instead.")
    part: str = setting(
        "{}/{}".format(*_RUN.part),
        "Take videos I, I+N, I+2N, … of the index (0 ≤ I < N), e.g. $SLURM_ARRAY_TASK_ID/N.",
    )
    strict: bool = setting(False, "Exit with status 1 if any video failed.")
    keep_partial: bool = setting(
        False, "Keep the frames of a video that decodes only partway (default: a failure)."
    )
    overwrite: bool = setting(
        False,
        "Rewrite archives in OUT made with other settings or from another source file (default: refuse them).",
    )
    report: Path | None = setting(
        None, "Run report, JSON lines appended to (default: OUT/preprocess-report[-partIofN].jsonl)."
    )
    tvl1: TVL1Params = setting(TVL1Params(), nested=True)  # its fields are options of their own


def config_from_options(
    out: str | Path, streams: str = "rgb", *, tvl1: dict[str, Any] | TVL1Params | None = None, **options: Any
) -> PreprocessConfig:
    """The run's config from the options as the CLI gives them (:class:`PreprocessOptions`' fields: ``streams``
    comma-separated, ``part`` as ``I/N``, ``tvl1`` as :class:`TVL1Params` or its fields), checked before any
    work."""
    if not isinstance(tvl1, TVL1Params):
        tvl1 = TVL1Params(**(tvl1 or {}))
    o = PreprocessOptions(out=Path(out), streams=streams, tvl1=tvl1, **options)
    if o.flow_encoding not in FLOW_ENCODINGS:
        raise UserError(f"--flow-encoding must be one of {', '.join(FLOW_ENCODINGS)}, not {o.flow_encoding}")
    flow_enc = FLOW_ENCODINGS[o.flow_encoding]
    plain = {
        k: v
        for k, v in asdict(o).items()
        if k
        in ("flow_backend", "device", "workers", "threads", "dask", "strict", "keep_partial", "overwrite")
    }
    cfg = PreprocessConfig(
        out=str(out),
        streams=tuple(s.strip() for s in o.streams.split(",") if s.strip()),
        decode=DecodeSpec(size=o.size, square=o.square, fps=o.fps),
        rgb_encoding=JpegEncoding(o.quality, RGB_ENCODING.sampling),
        flow_encoding=JpegEncoding(o.flow_quality or flow_enc.quality, flow_enc.sampling),
        third_channel=int(o.third_channel),
        tvl1=o.tvl1,
        part=parse_part(o.part),
        report=str(o.report) if o.report else None,
        **plain,
    )
    cfg.validate()
    return cfg


@dataclass(frozen=True)
class PreprocessRun:
    """Whether ``memdpc preprocess`` runs or only says what it would do."""

    dry_run: bool = setting(
        False,
        "Print what the run will do (videos, frames, disk, and the time from a short timed warm-up) and write "
        "nothing.",
    )
