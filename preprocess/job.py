"""What every way of running the preprocessing shares: the choice of this part's videos and the per-video pieces
(the archives' metadata, flow codes → JPEG with the measured storage error, progress events, the reason recorded
for a failed video). Which archives a video still needs is :mod:`memdpc.preprocess.reuse`'s answer.

Both the per-video job (:func:`process_video`, run by ``run.py`` on its executor) and the batched GPU stage
(``batched.py``) build on these, so an archive is the same whichever path wrote it. Nothing here imports
torch, so the per-video worker processes stay free of it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from memdpc.preprocess.archive import ArchiveWriter, archive_path
from memdpc.preprocess.decode import DecodeError, PartialVideo, VideoStream
from memdpc.preprocess.encode import JpegEncoding, code_error
from memdpc.preprocess.flow.backends import FlowStage, make_backend
from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.reuse import archive_settings, missing_streams
from memdpc.preprocess.video_index import VideoRecord

__all__ = [
    "FlowWriter",
    "Progress",
    "Ticker",
    "commit_archives",
    "encode_flow",
    "expected_units",
    "failure_reason",
    "kept_messages",
    "new_entry",
    "no_progress",
    "process_video",
    "select_part",
]


def select_part(records: list[VideoRecord], part: tuple[int, int]) -> list[VideoRecord]:
    """Every N-th video starting at I: the parts of 0/N … (N-1)/N are disjoint and cover the index."""
    i, n = part
    return records[i::n]


# ----------------------------------------------------------------------------------------- one video
def new_entry(rec: VideoRecord) -> dict[str, Any]:
    """The report entry of a video before any work."""
    return {"id": rec.id, "path": rec.path, "status": "done", "streams": {}}


def failure_reason(e: BaseException) -> str:
    """The one-line reason recorded for a failed video."""
    text = str(e).strip()
    return text.splitlines()[-1] if text else repr(e)


def archive_meta(
    rec: VideoRecord, stream: str, cfg: PreprocessConfig, src: VideoStream, hw: tuple[int, int]
) -> dict:
    """``meta.json`` of a video's archive of ``stream``: what it holds, the settings it was made with, and
    its source's identity (path, size, modification time and SHA-256: :mod:`memdpc.preprocess.source`)."""
    return {
        "video_id": rec.id,
        "fps": src.fps,
        "height": hw[0],
        "width": hw[1],
        "source": rec.path,
        "source_size": src.file_size,
        "source_mtime_ns": src.file_mtime_ns,
        "source_sha256": src.file_sha256,
        "source_fps": src.source_fps,
        **archive_settings(stream, cfg),
    }


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


# ----------------------------------------------------------------------------------------- progress
Progress = Callable[[str, str, int], None]
"""A run's progress events, ``(kind, video_id, n)``: ``("start", id, units)`` when a video is opened, with
the units its header promises, then ``("units", id, n)`` as ``n`` more are written. A unit is a frame pair of
a video whose flow is computed, else a frame."""

TICK = 0.25  # seconds between a video's progress events


def no_progress(kind: str, video_id: str, n: int) -> None:
    """The :data:`Progress` of a run that shows none."""


class Ticker:
    """One video's progress: sends ``start`` at once, then the units added, at most every :data:`TICK`
    seconds (and on :meth:`flush`), so a worker process sends a few messages a second, not one per frame."""

    def __init__(self, progress: Progress, video_id: str, expected: int) -> None:
        self.progress, self.video_id = progress, video_id
        self._unsent, self._sent_at = 0, time.monotonic()
        progress("start", video_id, max(0, expected))

    def add(self, n: int = 1) -> None:
        self._unsent += n
        if time.monotonic() - self._sent_at >= TICK:
            self.flush()

    def flush(self) -> None:
        if self._unsent:
            self.progress("units", self.video_id, self._unsent)
        self._unsent, self._sent_at = 0, time.monotonic()


def expected_units(src: VideoStream, flow: bool) -> int:
    """The units (:data:`Progress`) a video's header promises: its frames, or its pairs when ``flow``."""
    return src.expected_output - 1 if flow else src.expected_output


MAX_MESSAGES = 20  # lines of FFmpeg/OpenCV messages kept per video (and per run) in the report


def kept_messages(lines: list[str]) -> list[str]:
    """At most :data:`MAX_MESSAGES` lines, the last saying how many more there were."""
    if len(lines) <= MAX_MESSAGES:
        return lines
    return [*lines[: MAX_MESSAGES - 1], f"… and {len(lines) - MAX_MESSAGES + 1} more lines"]


# ------------------------------------------------------------------------------------- the video job
def _convert(
    rec: VideoRecord, cfg: PreprocessConfig, todo: list[str], result: dict, progress: Progress
) -> None:
    """Decode ``rec`` once and write the archives of the streams in ``todo``; fills ``result``."""
    src = VideoStream(rec.path, cfg.decode)
    result.update(source_fps=src.source_fps, fps=src.fps)
    out = Path(cfg.out)
    ticker = Ticker(progress, rec.id, expected_units(src, "flow" in todo))
    with contextlib.ExitStack() as stack:
        stack.callback(ticker.flush)
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
                    codes = flow.push(frame)
                    fw.add(codes)
                    ticker.add(len(codes))
                else:
                    ticker.add()
        except PartialVideo as e:
            if not cfg.keep_partial:
                raise
            result.update(status="partial", reason=str(e))
        if flow:
            codes = flow.flush()
            fw.add(codes)
            ticker.add(len(codes))
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


def process_video(
    rec: VideoRecord,
    cfg: PreprocessConfig,
    progress: Progress = no_progress,
    messages: Callable[[], list[str]] | None = None,
) -> dict:
    """The per-video job: write the missing archives of ``rec``; return its report entry.

    Problems with the video (:class:`DecodeError`, OpenCV errors, unreadable files) are recorded as
    ``status: failed`` with the reason; nothing is left under a final name for a failed video. A fault of the
    output (its disk full, read-only, …) is the run's: the :class:`~memdpc.common.errors.ResourceFault` that
    the archive writer raises goes on to the run, which stops.
    ``cfg.flow_backend`` and ``cfg.device`` name one backend and device (``run.run_preprocess`` resolves
    ``auto``). ``progress`` gets the video's :data:`Progress` events; ``messages`` (e.g.
    :meth:`StderrCapture.take <memdpc.preprocess.decode.StderrCapture.take>`) returns what FFmpeg and
    OpenCV printed meanwhile, kept in the entry as ``messages``.
    """
    cv2.setNumThreads(1)  # parallelism comes from the executor: one OpenCV thread per worker
    t0, c0 = time.perf_counter(), time.process_time()
    result = new_entry(rec)
    todo = missing_streams(rec, cfg)  # asked again: another run, or a first try, may have written one since
    if not todo:
        return {**result, "status": "skipped", "seconds": 0.0}
    try:
        _convert(rec, cfg, todo, result, progress)
    except (DecodeError, cv2.error, OSError) as e:
        result.update(status="failed", reason=failure_reason(e))
        result["streams"] = {}
    result["seconds"] = round(time.perf_counter() - t0, 4)
    result["cpu_seconds"] = round(time.process_time() - c0, 4)  # of the worker process
    if messages is not None and (lines := messages()):
        result["messages"] = kept_messages(lines)
    return result
