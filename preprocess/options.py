"""The options of ``memdpc preprocess frames|flow`` as the command line gives them, each with its default and
help (:class:`PreprocessOptions`), and the run's :class:`~memdpc.preprocess.job.PreprocessConfig` made from them
(:func:`config_from_options`), checked before any work starts."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memdpc.common.errors import UserError
from memdpc.common.settings import setting
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.encode import (
    DEFAULT_FLOW_ENCODING,
    FLOW_ENCODINGS,
    RGB_ENCODING,
    JpegEncoding,
)
from memdpc.preprocess.flow.backends import AUTO, BACKENDS
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.job import PreprocessConfig, parse_part

__all__ = ["PreprocessOptions", "config_from_options"]

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
