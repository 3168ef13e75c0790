"""What every way of running the preprocessing shares: the run's configuration, the choice of this part's
videos, and the per-video pieces (which archives are missing, their metadata, flow codes → JPEG with the
measured storage error, the reason recorded for a failed video).

Both the per-video job (:func:`process_video`, run by ``run.py`` on its executor) and the batched GPU stage
(``batched.py``) build on these, so an archive is the same whichever path wrote it. Nothing here imports
torch, so the per-video worker processes stay free of it.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from memdpc.atomic import TMP_PREFIX
from memdpc.errors import UserError
from memdpc.preprocess.archive import ArchiveWriter, archive_path
from memdpc.preprocess.decode import DecodeError, DecodeSpec, PartialVideo, VideoStream
from memdpc.preprocess.encode import FLOW_ENCODING, RGB_ENCODING, JpegEncoding, code_error
from memdpc.preprocess.flow import AUTO, BACKENDS, BOUND, FlowStage, make_backend
from memdpc.preprocess.tvl1_params import TVL1Params
from memdpc.preprocess.video_index import VideoRecord
from memdpc.streams import STREAMS


@dataclass(frozen=True)
class PreprocessConfig:
    """Everything a run needs; one picklable object sent to every worker.

    ``flow_backend`` and ``device`` may be ``auto``: :func:`memdpc.preprocess.flow.resolve_backend` picks
    the GPU path where CUDA is available, else OpenCV on the CPU. ``workers`` are the processes of the
    per-video path; ``threads`` the decode and the encode threads per device of the batched path (0: the
    CPU cores divided among the devices).
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
        return Path(self.out) / (
            "preprocess-report.json" if n == 1 else f"preprocess-report-part{i}of{n}.json"
        )


def parse_part(text: str) -> tuple[int, int]:
    """``"I/N"`` → (I, N): this run takes videos I, I+N, I+2N, … (0-based, e.g. ``$SLURM_ARRAY_TASK_ID/N``)."""
    m = re.fullmatch(r"\s*(-?\d+)\s*/\s*(-?\d+)\s*", text)
    if not m:
        raise UserError(f"--part must look like I/N (e.g. 0/4), not '{text}'")
    i, n = int(m[1]), int(m[2])
    if not (n >= 1 and 0 <= i < n):
        raise UserError(f"--part I/N needs N ≥ 1 and 0 ≤ I < N, not '{text}'")
    return i, n


def select_part(records: list[VideoRecord], part: tuple[int, int]) -> list[VideoRecord]:
    """Every N-th video starting at I: the parts of 0/N … (N-1)/N are disjoint and cover the index."""
    i, n = part
    return records[i::n]


# ----------------------------------------------------------------------------------------- one video
def new_entry(rec: VideoRecord) -> dict[str, Any]:
    """The report entry of a video before any work."""
    return {"id": rec.id, "path": rec.path, "status": "done", "streams": {}}


def missing_streams(rec: VideoRecord, cfg: PreprocessConfig) -> list[str]:
    """The streams of ``rec`` whose archive is not there yet; deletes their temporary archives left by a
    killed run (only this video's: parts may share ``out`` and run at the same time)."""
    todo = [s for s in cfg.streams if not archive_path(cfg.out, s, rec.id).exists()]
    pattern = re.compile(rf"{re.escape(TMP_PREFIX)}\d+-{re.escape(rec.id)}\.tar")
    for s in todo:
        folder = Path(cfg.out) / s
        if folder.is_dir():
            for p in folder.iterdir():
                if pattern.fullmatch(p.name):
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
    return todo


def failure_reason(e: BaseException) -> str:
    """The one-line reason recorded for a failed video."""
    text = str(e).strip()
    return text.splitlines()[-1] if text else repr(e)


def archive_meta(
    rec: VideoRecord, stream: str, cfg: PreprocessConfig, src: VideoStream, hw: tuple[int, int]
) -> dict:
    """``meta.json`` of a video's archive of ``stream`` (``cfg.flow_backend`` is the backend used)."""
    meta = {
        "video_id": rec.id,
        "stream": stream,
        "fps": src.fps,
        "height": hw[0],
        "width": hw[1],
        "source": rec.path,
        "source_fps": src.source_fps,
        "decode": asdict(cfg.decode),
    }
    if stream == "rgb":
        meta["encoding"] = cfg.rgb_encoding.name
    else:
        meta["encoding"] = cfg.flow_encoding.name
        meta["flow"] = {
            "backend": cfg.flow_backend,
            "pairs": "frame k -> k+1",
            "channels": ["x", "y", "third"],  # R, G, B of the decoded image
            "bound": BOUND,
            "mapping": f"round((clip(f, -{BOUND:g}, {BOUND:g}) + {BOUND:g}) * 255 / {2 * BOUND:g})",
            "third_channel": cfg.third_channel,
            "tvl1": cfg.tvl1.to_dict(),
        }
    return meta


def commit_archives(
    rec: VideoRecord,
    cfg: PreprocessConfig,
    src: VideoStream,
    hw: tuple[int, int],
    writers: dict[str, ArchiveWriter],
    flow: FlowWriter | None,
    result: dict[str, Any],
) -> None:
    """Write ``meta.json`` into each archive of the video (renamed into place when its writer closes)
    and record the frame counts and the flow storage error in the report entry ``result``."""
    for s, w in writers.items():
        meta = archive_meta(rec, s, cfg, src, hw)
        if s == "flow":
            meta["code_error"] = flow.error()
            result["flow_code_error"] = flow.error()
        if result.get("status") == "partial":
            meta["partial"] = result["reason"]
        w.commit(meta)
        result["streams"][s] = w.num_frames


def encode_flow(codes: np.ndarray, encoding: JpegEncoding) -> tuple[bytes, float, int]:
    """Flow codes (H, W, 3) uint8 → JPEG bytes, with the mean and max absolute code error of the JPEG."""
    data = encoding.encode_rgb(codes)
    mean, mx = code_error(codes, data)
    return data, mean, mx


class FlowWriter:
    """Flow JPEGs → archive, in order, summing the storage error of every stored image."""

    def __init__(self, writer: ArchiveWriter, encoding: JpegEncoding) -> None:
        self.writer, self.encoding = writer, encoding
        self.err_sum, self.err_max, self.seconds = 0.0, 0, 0.0

    def add(self, codes_list: list) -> None:
        """Encode and append code images (the per-video path; ``seconds`` counts the time)."""
        t = time.perf_counter()
        for codes in codes_list:
            self.append(*encode_flow(codes, self.encoding))
        self.seconds += time.perf_counter() - t

    def append(self, data: bytes, mean: float, mx: int) -> None:
        """Append one image encoded by :func:`encode_flow`."""
        self.err_sum, self.err_max = self.err_sum + mean, max(self.err_max, mx)
        self.writer.add(data)

    def error(self) -> dict:
        n = max(self.writer.num_frames, 1)
        return {"mean_abs": round(self.err_sum / n, 4), "max_abs": self.err_max}


# ------------------------------------------------------------------------------------- the video job
def _convert(rec: VideoRecord, cfg: PreprocessConfig, todo: list[str], result: dict) -> None:
    """Decode ``rec`` once and write the archives of the streams in ``todo``; fills ``result``."""
    src = VideoStream(rec.path, cfg.decode)
    result.update(source_fps=src.source_fps, fps=src.fps)
    out = Path(cfg.out)
    with contextlib.ExitStack() as stack:
        writers = {s: stack.enter_context(ArchiveWriter(archive_path(out, s, rec.id))) for s in todo}
        flow = (
            FlowStage(make_backend(cfg.flow_backend, cfg.tvl1, cfg.device), cfg.third_channel)
            if ("flow" in writers)
            else None
        )
        fw = FlowWriter(writers["flow"], cfg.flow_encoding) if flow else None
        rgb_seconds, hw = 0.0, (0, 0)
        try:
            for frame in src:
                hw = frame.shape[:2]
                if "rgb" in writers:
                    t = time.perf_counter()
                    writers["rgb"].add(cfg.rgb_encoding.encode_bgr(frame))
                    rgb_seconds += time.perf_counter() - t
                if flow:
                    fw.add(flow.push(frame))
        except PartialVideo as e:
            if not cfg.keep_partial:
                raise
            result.update(status="partial", reason=str(e))
        if flow:
            fw.add(flow.flush())
            if fw.writer.num_frames == 0:
                raise DecodeError("only one frame: no pair to compute flow from")
        commit_archives(rec, cfg, src, hw, writers, fw, result)
    result.update(
        height=hw[0],
        width=hw[1],
        num_frames=src.num_decoded,
        stages={
            "decode": round(src.seconds, 4),
            "flow": round(flow.seconds, 4) if flow else 0.0,
            "encode": round(rgb_seconds + (fw.seconds if fw else 0.0), 4),
        },
    )


def process_video(rec: VideoRecord, cfg: PreprocessConfig) -> dict:
    """The per-video job: write the missing archives of ``rec``; return its report entry.

    Problems with the video (:class:`DecodeError`, OpenCV errors, unreadable files) are recorded as
    ``status: failed`` with the reason; nothing is left under a final name for a failed video.
    ``cfg.flow_backend`` and ``cfg.device`` name one backend and device (``run.run_preprocess`` resolves
    ``auto``).
    """
    cv2.setNumThreads(1)  # parallelism comes from the executor: one OpenCV thread per worker
    t0, c0 = time.perf_counter(), time.process_time()
    result = new_entry(rec)
    todo = missing_streams(rec, cfg)
    if not todo:
        return {**result, "status": "skipped", "seconds": 0.0}
    try:
        _convert(rec, cfg, todo, result)
    except (DecodeError, cv2.error, OSError) as e:
        result.update(status="failed", reason=failure_reason(e))
        result["streams"] = {}
    result["seconds"] = round(time.perf_counter() - t0, 4)
    result["cpu_seconds"] = round(time.process_time() - c0, 4)  # of the worker process
    return result
