"""The preprocessing run: per-video jobs (decode once → RGB frames and/or TV-L1 flow → archives) on an
executor — or, for flow on a batched (GPU) backend, the batched stage of ``batched.py`` — with
resumability, a progress bar and a JSON run report.

A video is one independent, idempotent unit: its archive ``<out>/<stream>/<id>.tar`` is renamed into place
only when complete, so a re-run skips finished videos and a killed run leaves nothing half-written under a
final name. Bad videos are recorded in the report with their reason and skipped.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import cv2
from rich.console import Console

from memdpc.atomic import write_json_atomic
from memdpc.errors import UserError
from memdpc.preprocess.archive import archive_path
from memdpc.preprocess.batched import run_batched
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.encode import DEFAULT_FLOW_ENCODING, FLOW_ENCODINGS, RGB_ENCODING, JpegEncoding
from memdpc.preprocess.flow import BatchedFlowBackend, make_backend, resolve_backend
from memdpc.preprocess.job import (
    PreprocessConfig,
    parse_part,
    process_video,
    select_part,
)
from memdpc.preprocess.tvl1_params import TVL1Params
from memdpc.preprocess.video_index import VideoRecord, read_index
from memdpc.progress import progress_bar

DASK_CONNECT_TIMEOUT = 30  # seconds


# ---------------------------------------------------------------------------------------------- a run
def _is_done(rec: VideoRecord, cfg: PreprocessConfig) -> bool:
    return all(archive_path(cfg.out, s, rec.id).exists() for s in cfg.streams)


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
        executor = ProcessPoolExecutor(
            workers, mp_context=get_context("spawn"), initializer=cv2.setNumThreads, initargs=(1,)
        )  # one OpenCV thread per worker
    with executor as ex:
        yield from (f.result() for f in as_completed([ex.submit(process_video, r, cfg) for r in todo]))


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
    counts, fps, seconds per stage, and the measured flow storage error; for flow, ``flow`` names the
    backend and devices used (``auto`` resolved) and the note of a fallback. A batched backend (torch,
    triton) runs in the batched stage (``memdpc.preprocess.batched``) unless the run goes to Dask; the
    OpenCV backend in per-video jobs.
    """
    cfg.validate()
    used, flow, results = cfg, None, _results
    if "flow" in cfg.streams:
        name, device, note = resolve_backend(cfg.flow_backend, cfg.device)
        devices = device.split(",")
        used = replace(cfg, flow_backend=name, device=device)
        backend = make_backend(name, cfg.tvl1, devices[0])  # an unusable backend or device fails now
        if isinstance(backend, BatchedFlowBackend) and not cfg.dask:
            results = functools.partial(run_batched, devices=devices)
        elif len(devices) > 1:
            raise UserError(
                f"--device {cfg.device}: several devices need the batched flow stage (not --dask)"
            )
        flow = {"backend": name, "devices": devices, "note": note}
        if note:
            Console(stderr=True).print(f"[yellow]note:[/yellow] {note}")
    mine = select_part(records, cfg.part)
    videos = [{"id": r.id, "path": r.path, "status": "skipped"} for r in mine if _is_done(r, cfg)]
    todo = [r for r in mine if not _is_done(r, cfg)]
    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    with progress_bar(
        "videos · {task.fields[fps]:.1f} frames/s",
        bold=True,
        console=Console(stderr=True),
        disable=not progress,
    ) as bar:
        task = bar.add_task(
            f"preprocess {'+'.join(cfg.streams)}", total=len(mine), completed=len(videos), fps=0.0
        )
        frames = 0
        for res in results(used, todo) if todo else ():
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
        **({"flow": flow} if flow else {}),
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
    size: int = DecodeSpec.size,
    square: int = DecodeSpec.square,
    fps: float = DecodeSpec.fps,
    quality: int = RGB_ENCODING.quality,
    flow_encoding: str = DEFAULT_FLOW_ENCODING,
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
