"""The preprocessing run: per-video jobs (decode once → RGB frames and/or TV-L1 flow → archives) on an
executor, with resumability, a progress bar and a JSON run report.

A video is one independent, idempotent unit: its archive ``<out>/<stream>/<id>.tar`` is renamed into place
only when complete, so a re-run skips finished videos and a killed run leaves nothing half-written under a
final name. Bad videos are recorded in the report with their reason and skipped.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import cv2
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from memdpc.atomic import TMP_PREFIX, write_json_atomic
from memdpc.errors import UserError
from memdpc.preprocess.archive import ArchiveWriter, archive_path
from memdpc.preprocess.decode import DecodeError, DecodeSpec, PartialVideo, VideoStream
from memdpc.preprocess.encode import FLOW_ENCODING, FLOW_ENCODING_RGB, RGB_ENCODING, JpegEncoding, code_error
from memdpc.preprocess.flow import BACKENDS, BOUND, FlowStage, TVL1Params, make_backend
from memdpc.preprocess.video_index import VideoRecord, read_index

STREAMS = ("rgb", "flow")
FLOW_ENCODINGS = {"ycc": FLOW_ENCODING, "rgb": FLOW_ENCODING_RGB}
DASK_CONNECT_TIMEOUT = 30  # seconds


@dataclass(frozen=True)
class PreprocessConfig:
    """Everything a run needs; one picklable object sent to every worker."""

    out: str
    streams: tuple[str, ...] = ("rgb",)
    decode: DecodeSpec = DecodeSpec()
    rgb_encoding: JpegEncoding = RGB_ENCODING
    flow_encoding: JpegEncoding = FLOW_ENCODING
    third_channel: int = 128
    tvl1: TVL1Params = TVL1Params()
    flow_backend: str = "opencv"
    device: str = "cpu"
    workers: int = 1
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
        if self.flow_backend not in BACKENDS:
            raise UserError(
                f"unknown --flow-backend '{self.flow_backend}' (choose from {', '.join(BACKENDS)})"
            )
        if self.workers < 1:
            raise UserError(f"--workers must be ≥ 1, not {self.workers}")
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
def _remove_stale_tmp(folder: Path, video_id: str) -> None:
    """Delete temporary archives of this video left by a killed run (only this video's: parts may share
    ``out`` and run at the same time)."""
    pattern = re.compile(rf"{re.escape(TMP_PREFIX)}\d+-{re.escape(video_id)}\.tar")
    if folder.is_dir():
        for p in folder.iterdir():
            if pattern.fullmatch(p.name):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()


def _meta(
    rec: VideoRecord, stream: str, cfg: PreprocessConfig, src: VideoStream, hw: tuple[int, int]
) -> dict:
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


class _FlowWriter:
    """Flow codes → JPEG → archive, measuring the storage error of every stored image."""

    def __init__(self, writer: ArchiveWriter, encoding: JpegEncoding) -> None:
        self.writer, self.encoding = writer, encoding
        self.err_sum, self.err_max, self.seconds = 0.0, 0, 0.0

    def add(self, codes_list: list) -> None:
        t = time.perf_counter()
        for codes in codes_list:
            data = self.encoding.encode_rgb(codes)
            mean, mx = code_error(codes, data)
            self.err_sum, self.err_max = self.err_sum + mean, max(self.err_max, mx)
            self.writer.add(data)
        self.seconds += time.perf_counter() - t

    def error(self) -> dict:
        n = max(self.writer.num_frames, 1)
        return {"mean_abs": round(self.err_sum / n, 4), "max_abs": self.err_max}


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
        fw = _FlowWriter(writers["flow"], cfg.flow_encoding) if flow else None
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
        for s, w in writers.items():
            meta = _meta(rec, s, cfg, src, hw)
            if s == "flow":
                meta["code_error"] = fw.error()
                result["flow_code_error"] = fw.error()
            if result.get("status") == "partial":
                meta["partial"] = result["reason"]
            w.commit(meta)
            result["streams"][s] = w.num_frames
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
    """
    cv2.setNumThreads(1)  # parallelism comes from the executor: one OpenCV thread per worker
    t0, c0 = time.perf_counter(), time.process_time()
    result: dict[str, Any] = {"id": rec.id, "path": rec.path, "status": "done", "streams": {}}
    todo = [s for s in cfg.streams if not archive_path(cfg.out, s, rec.id).exists()]
    if not todo:
        return {**result, "status": "skipped", "seconds": 0.0}
    for s in todo:
        _remove_stale_tmp(Path(cfg.out) / s, rec.id)
    try:
        _convert(rec, cfg, todo, result)
    except (DecodeError, cv2.error, OSError) as e:
        result.update(status="failed", reason=str(e).strip().splitlines()[-1] if str(e).strip() else repr(e))
        result["streams"] = {}
    result["seconds"] = round(time.perf_counter() - t0, 4)
    result["cpu_seconds"] = round(time.process_time() - c0, 4)  # of the worker process
    return result


# ---------------------------------------------------------------------------------------------- a run
def _is_done(rec: VideoRecord, cfg: PreprocessConfig) -> bool:
    return all(archive_path(cfg.out, s, rec.id).exists() for s in cfg.streams)


def _init_worker() -> None:
    cv2.setNumThreads(1)


@contextlib.contextmanager
def _dask_executor(address: str) -> Iterator[Executor]:
    try:
        from distributed import Client
    except ImportError:
        raise UserError("--dask needs the 'distributed' package (pip install memdpc[cluster])") from None
    try:
        client = Client(address, timeout=DASK_CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as e:
        raise UserError(f"--dask {address}: cannot connect to the Dask scheduler ({e})") from None
    try:
        with client.get_executor(pure=False) as ex:  # pure=False: never reuse a cached result
            yield ex
    finally:
        client.close()


def _results(cfg: PreprocessConfig, todo: list[VideoRecord]) -> Iterator[dict]:
    """Run the per-video jobs and yield their report entries as they finish: on a Dask cluster, on a
    local pool of spawned processes (one OpenCV thread each), or in this process when ``workers == 1``."""
    if not cfg.dask and cfg.workers == 1:
        yield from (process_video(r, cfg) for r in todo)
        return
    if cfg.dask:
        executor = _dask_executor(cfg.dask)
    else:
        workers = min(cfg.workers, len(todo))
        executor = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker)
    with executor as ex:
        yield from (f.result() for f in as_completed([ex.submit(process_video, r, cfg) for r in todo]))


def _progress(show: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("videos · {task.fields[fps]:.1f} frames/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not show,
    )


def _summary(videos: list[dict], seconds: float) -> dict:
    counts = {s: sum(v["status"] == s for v in videos) for s in ("done", "partial", "skipped", "failed")}
    frames = sum(v.get("num_frames", 0) for v in videos if v["status"] in ("done", "partial"))
    stages = {
        k: round(sum(v.get("stages", {}).get(k, 0.0) for v in videos), 3)
        for k in ("decode", "flow", "encode")
    }
    return {
        **counts,
        "videos": len(videos),
        "frames": frames,
        "seconds": round(seconds, 3),
        "frames_per_s": round(frames / seconds, 3) if seconds > 0 else 0.0,
        "stage_seconds": stages,
    }


def run_preprocess(records: list[VideoRecord], cfg: PreprocessConfig, progress: bool = True) -> dict:
    """Preprocess this part of ``records``; write and return the run report.

    Finished videos (all requested archives present) are skipped without work. The report lists every
    video of the part with its status (``done``, ``partial``, ``skipped``, ``failed`` + reason), frame
    counts, fps, seconds per stage, and the measured flow storage error.
    """
    cfg.validate()
    if "flow" in cfg.streams:
        make_backend(cfg.flow_backend, cfg.tvl1, cfg.device)  # an unusable backend or device fails now
    mine = select_part(records, cfg.part)
    videos = [{"id": r.id, "path": r.path, "status": "skipped"} for r in mine if _is_done(r, cfg)]
    todo = [r for r in mine if not _is_done(r, cfg)]
    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    with _progress(progress) as bar:
        task = bar.add_task(
            f"preprocess {'+'.join(cfg.streams)}", total=len(mine), completed=len(videos), fps=0.0
        )
        frames = 0
        for res in _results(cfg, todo) if todo else ():
            videos.append(res)
            frames += res.get("num_frames", 0)
            bar.update(task, advance=1, fps=frames / max(time.perf_counter() - t0, 1e-9))
    order = {r.id: i for i, r in enumerate(mine)}
    videos.sort(key=lambda v: order[v["id"]])
    report = {
        "command": "preprocess",
        "config": {**asdict(cfg), "streams": list(cfg.streams), "part": list(cfg.part)},
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "summary": _summary(videos, time.perf_counter() - t0),
        "failures": [
            {"id": v["id"], "path": v["path"], "reason": v["reason"]}
            for v in videos
            if v["status"] == "failed"
        ],
        "videos": videos,
    }
    write_json_atomic(cfg.report_path, report)
    return report


def preprocess(
    index: str | Path,
    out: str | Path,
    streams: str = "rgb",
    *,
    size: int = 256,
    square: int = 0,
    fps: float = 0.0,
    quality: int = RGB_ENCODING.quality,
    flow_encoding: str = "ycc",
    flow_quality: int | None = None,
    tvl1: dict[str, Any] | None = None,
    part: str = "0/1",
    progress: bool = True,
    **kw: Any,
) -> dict:
    """The library entry of ``memdpc preprocess frames|flow``: options as the CLI gives them → run report.

    ``streams`` is a comma-separated list (``rgb``, ``flow``); ``flow_encoding`` is ``ycc`` (standard JPEG
    4:4:4, default quality 100) or ``rgb`` (JPEG without colour transform, default quality 90); ``tvl1``
    holds :class:`TVL1Params` fields; the other keywords are :class:`PreprocessConfig` fields. Options are
    checked before any work.
    """
    if flow_encoding not in FLOW_ENCODINGS:
        raise UserError(f"--flow-encoding must be one of {', '.join(FLOW_ENCODINGS)}, not {flow_encoding}")
    flow_enc = FLOW_ENCODINGS[flow_encoding]
    cfg = PreprocessConfig(
        out=str(out),
        streams=tuple(s.strip() for s in streams.split(",") if s.strip()),
        decode=DecodeSpec(size=size, square=square, fps=fps),
        rgb_encoding=JpegEncoding(quality, RGB_ENCODING.sampling),
        flow_encoding=JpegEncoding(flow_quality or flow_enc.quality, flow_enc.sampling),
        tvl1=TVL1Params(**(tvl1 or {})),
        part=parse_part(part),
        **kw,
    )
    cfg.validate()
    return run_preprocess(read_index(index), cfg, progress=progress)
