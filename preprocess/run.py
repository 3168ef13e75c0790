"""The preprocessing run: per-video jobs (decode once → RGB frames and/or TV-L1 flow → archives) on an
executor — or, for flow on a batched (GPU) backend, the batched stage of ``batched.py`` — with
resumability, a progress bar and a JSON run report.

A video is one independent, idempotent unit: its archive ``<out>/<stream>/<id>.tar`` is renamed into place
only when complete, so a re-run skips finished videos and a killed run leaves nothing half-written under a
final name. A re-run skips an archive only if it was made with the same settings from the same source file
(``job.archive_differences``); it refuses archives made otherwise, unless ``overwrite`` rewrites them. Bad
videos are recorded in the report with their reason and skipped.

The report (``preprocess-report.json``, one per ``--part``) describes the archives on disk: ``summary`` is
what this run did, ``videos`` every video of the part with the entry of the run that wrote its archives (a
rerun that skips a video keeps the earlier entry) or that last failed on it, and ``failures`` those that
failed. SIGINT or SIGTERM stops the run within seconds: queued videos are cancelled, workers terminated,
the temporary archives of unfinished videos removed, and the report of what was done written
(``interrupted``) before :class:`memdpc.common.interrupts.Interrupted` goes on with a note of what was kept.

A fault of the output (its disk full, a quota, read-only or forbidden: a
:class:`~memdpc.common.errors.ResourceFault`, wherever a video's job meets it) is the run's, not the video's: the
run stops as for a signal (``stopped`` in the report) and the fault goes on with how many videos are done and
that the same command resumes once space is freed. At its start, the run compares the free space with its
estimate of what its archives will take (:func:`memdpc.preprocess.plan.disk_estimate`) and warns when they will
not fit. A worker process that dies does not stop the run (:mod:`memdpc.preprocess.pool`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, as_completed
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import Progress as ProgressBar

from memdpc.common import interrupts
from memdpc.common.atomic import write_json_atomic
from memdpc.common.console import rich_console
from memdpc.common.errors import ResourceFault, UserError
from memdpc.common.progress import progress_bar
from memdpc.preprocess.decode import StderrCapture
from memdpc.preprocess.flow.batched import run_batched
from memdpc.preprocess.job import (
    PreprocessConfig,
    Progress,
    kept_messages,
    process_video,
    read_report_entries,
    remove_temporaries,
    select_part,
)
from memdpc.preprocess.options import config_from_options
from memdpc.preprocess.plan import check_existing, choose_flow, disk_estimate
from memdpc.preprocess.pool import pool_results
from memdpc.preprocess.video_index import VideoRecord, read_index

__all__ = ["PreprocessConfig", "preprocess", "run_preprocess"]

DASK_CONNECT_TIMEOUT = 30  # seconds
OK = ("done", "partial", "skipped")  # statuses of a video whose archives are on disk

Results = Callable[[PreprocessConfig, list[VideoRecord], Progress, Callable[[], list[str]]], Iterator[dict]]


# ------------------------------------------------------------------------------------------ executors
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


def _results(
    cfg: PreprocessConfig, todo: list[VideoRecord], progress: Progress, messages: Callable[[], list[str]]
) -> Iterator[dict]:
    """Run the per-video jobs and yield their report entries as they finish: on a Dask cluster (progress
    as videos finish; FFmpeg's messages stay in the Dask workers' logs), on a local pool of spawned
    processes (:func:`memdpc.preprocess.pool.pool_results`), or in this process when ``workers == 1``."""
    if cfg.dask:
        with _dask_executor(cfg.dask) as ex:
            futures = [ex.submit(process_video, r, cfg) for r in todo]
            try:
                yield from (f.result() for f in as_completed(futures))
            except BaseException:
                ex.shutdown(wait=False)  # cancels the videos not started
                raise
    elif cfg.workers == 1:
        yield from (process_video(r, cfg, progress, messages) for r in todo)
    else:
        yield from pool_results(cfg, todo, progress)


def _batched(devices: list[str], stats: dict[str, dict]) -> Results:
    def results(cfg, todo, progress, messages) -> Iterator[dict]:
        return run_batched(cfg, todo, devices, progress, stats)  # its threads' messages stay the run's

    return results


# ------------------------------------------------------------------------------------------- progress
class _Tracker:
    """The run's progress bar: units (frame pairs when flow is computed, else frames) across all videos,
    with a rate and an ETA, and the videos done and failed.

    A video's header promises its units when it opens; videos not opened yet count as the mean of those
    that were; a finished video counts the units it really had. So the total is an estimate that settles as
    videos open and finish."""

    def __init__(self, bar: ProgressBar, cfg: PreprocessConfig, videos: int, skipped: int, todo: int) -> None:
        self.bar, self.noun = bar, "pairs" if "flow" in cfg.streams else "frames"
        self.videos, self.ok, self.failed, self.todo = videos, skipped, 0, todo
        self.expected: dict[str, int] = {}  # units by video opened: promised, or real once finished
        self.received: dict[str, int] = {}
        self.units, self.t0 = 0, time.perf_counter()
        self.task = bar.add_task(f"preprocess {'+'.join(cfg.streams)}", total=None, info="")
        self._show()

    def event(self, kind: str, video_id: str, n: int) -> None:
        """A :data:`memdpc.preprocess.job.Progress` event."""
        if kind == "start":
            self.expected[video_id] = n
        else:
            self.received[video_id] = self.received.get(video_id, 0) + n
            self.units += n
        self._show()

    def finish(self, entry: dict) -> None:
        """A video's report entry: count it, and its real units."""
        vid = entry["id"]
        got = self.received.get(vid, 0)
        real = _units(entry) if entry["status"] in ("done", "partial") else got
        self.units += real - got
        self.received[vid] = self.expected[vid] = real
        self.ok += entry["status"] in OK
        self.failed += entry["status"] == "failed"
        self._show()

    def _show(self) -> None:
        opened, known = len(self.expected), sum(self.expected.values())
        total = None
        if opened:
            promised = sum(max(n, self.received.get(v, 0)) for v, n in self.expected.items())
            total = max(promised + round(known / opened * max(self.todo - opened, 0)), self.units)
        rate = self.units / max(time.perf_counter() - self.t0, 1e-9)
        failed = f", {self.failed} failed" if self.failed else ""
        info = f"{self.noun} · {rate:.1f} {self.noun}/s · {self.ok}/{self.videos} videos{failed}"
        self.bar.update(self.task, completed=self.units, total=total, info=info)


def _units(entry: dict) -> int:
    """The units a video's entry reports written: its flow pairs, else its frames (0: none written)."""
    streams = entry.get("streams", {})
    return streams.get("flow", streams.get("rgb", 0))


# --------------------------------------------------------------------------------------------- report
def _summary(videos: list[dict], seconds: float, pending: int) -> dict:
    counts = {s: sum(v["status"] == s for v in videos) for s in ("done", "partial", "skipped", "failed")}
    frames = sum(v.get("num_frames", 0) for v in videos if v["status"] in ("done", "partial"))
    stages = {
        k: round(sum(v.get("stages", {}).get(k, 0.0) for v in videos), 3)
        for k in ("decode", "flow", "encode")
    }
    return {
        **counts,
        "pending": pending,
        "videos": len(videos),
        "frames": frames,
        "seconds": round(seconds, 3),
        "frames_per_s": round(frames / seconds, 3) if seconds > 0 else 0.0,
        "stage_seconds": stages,
    }


def _earlier_entries(path: Path) -> dict[str, dict]:
    """The per-video entries of the report an earlier run wrote at ``path`` (none if there is none)."""
    return read_report_entries(path) if path.exists() else {}


def _merged(mine: list[VideoRecord], entries: dict[str, dict], earlier: dict[str, dict]) -> list[dict]:
    """Every video of the part, in index order, with the entry that describes its archives: this run's,
    except that a video this run skipped keeps the entry of the run that wrote it, and a video this run did
    not reach (interrupted) keeps an earlier failure."""
    videos = []
    for rec in mine:
        new, old = entries.get(rec.id), earlier.get(rec.id)
        same_file = old is not None and old.get("path") == rec.path
        if new is None:
            entry = old if same_file and old["status"] == "failed" else None
        elif new["status"] == "skipped" and same_file and old["status"] in ("done", "partial"):
            entry = old
        else:
            entry = new
        if entry is not None:
            videos.append(entry)
    return videos


# ------------------------------------------------------------------------------------------------ run
def _both(a: Progress, b: Progress) -> Progress:
    def both(*event: Any) -> None:
        a(*event)
        b(*event)

    return both


def run_preprocess(
    records: list[VideoRecord], cfg: PreprocessConfig, progress: bool = True, observe: Progress | None = None
) -> dict:
    """Preprocess this part of ``records``; write and return the run report.

    Finished videos (all requested archives present, made with these settings from the same source file)
    are skipped without work; archives made otherwise are refused (UserError) unless ``cfg.overwrite``.
    The report lists every video of the part with its status (``done``, ``partial``, ``skipped``,
    ``failed`` + reason), frame counts, fps, seconds per stage, the measured flow storage error and what
    FFmpeg printed about it (``messages``); for flow, ``flow`` names the backend and devices used (``auto``
    resolved) and the note of a fallback. A batched backend (torch, triton) runs in the batched stage
    (``memdpc.preprocess.flow.batched``) unless the run goes to Dask, and ``flow.stage`` then says per device
    where its time went (:attr:`~memdpc.preprocess.flow.batched.DeviceStage.stats`); the OpenCV backend runs
    in per-video jobs. On SIGINT/SIGTERM (KeyboardInterrupt) the report of what was done is written and the
    interrupt re-raised as :class:`memdpc.common.interrupts.Interrupted` with a note of what was kept; a fault
    of the output (a full disk) is re-raised the same way, as :class:`~memdpc.common.errors.ResourceFault`,
    after the report (``stopped``). A warning goes to stderr first when the archives will not fit in the free
    space, by :func:`memdpc.preprocess.plan.disk_estimate`.

    ``observe`` (for callers that time the run) is called in this thread with each progress event of the
    videos (``("start", id, units promised)``, ``("units", id, n)`` as units are written) and with
    ``("done", id, units)`` as a video's entry arrives (its pairs, or frames without flow; 0 if it failed).
    """
    cfg.validate()
    console = rich_console(stderr=True)
    used, flow, results, stage_stats, backend = cfg, None, _results, {}, None
    if "flow" in cfg.streams:
        choice = choose_flow(cfg)
        backend = choice.backend
        used = replace(cfg, flow_backend=choice.name, device=",".join(choice.devices))
        if choice.batched:
            results = _batched(choice.devices, stage_stats)
        flow = {"backend": choice.name, "devices": choice.devices, "note": choice.note}
        if choice.note:
            console.print(f"[yellow]note:[/yellow] {choice.note}")
    mine = select_part(records, cfg.part)
    earlier = _earlier_entries(cfg.report_path)  # before any work: a damaged report stops nothing halfway
    with console.status(f"checking the archives in {cfg.out}") if progress else contextlib.nullcontext():
        done, todo = check_existing(mine, cfg)
        space = disk_estimate(todo, used, backend).warning() if todo else None
    if space:
        console.print(f"[yellow]warning:[/yellow] {escape(space)}", soft_wrap=True)
    remove_temporaries(cfg.out, cfg.streams, {r.id for r in todo})  # of a killed run
    entries = {r.id: {"id": r.id, "path": r.path, "status": "skipped"} for r in done}
    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    stop: interrupts.Interrupted | None = None
    fault: ResourceFault | None = None  # the output's disk full, or the like: the run's, not a video's
    with StderrCapture() as stderr:
        with progress_bar("{task.fields[info]}", bold=True, console=console, disable=not progress) as bar:
            tracker = _Tracker(bar, cfg, len(mine), len(done), len(todo))
            events = tracker.event if observe is None else _both(tracker.event, observe)
            try:
                work = (
                    contextlib.closing(results(used, todo, events, stderr.take))
                    if todo
                    else (contextlib.nullcontext(()))
                )  # nothing to do: no pool, no device process
                with work as videos:
                    for entry in videos:
                        entries[entry["id"]] = entry
                        tracker.finish(entry)
                        if "retried" in entry:  # its worker died (pool.py): done on a second try, alone
                            why = f"{entry['id']}: {entry['retried']}; done on a second try, alone"
                            console.print(f"[yellow]note:[/yellow] {escape(why)}", soft_wrap=True)
                        if observe is not None:
                            observe("done", entry["id"], _units(entry) if entry["status"] in OK else 0)
                interrupts.check()  # a signal whose raise a finaliser swallowed
            except KeyboardInterrupt as e:
                stop = interrupts.as_interrupted(e)
            except ResourceFault as e:
                fault = e
        messages = stderr.take()
    if stop is not None or fault is not None:
        remove_temporaries(cfg.out, cfg.streams, {r.id for r in todo if r.id not in entries})
    this_run = [entries[r.id] for r in mine if r.id in entries]
    videos = _merged(mine, entries, earlier)
    by_id = {r.id: r for r in mine}
    report = {
        "command": "preprocess",
        "config": {**asdict(cfg), "streams": list(cfg.streams), "part": list(cfg.part)},
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **({"interrupted": str(stop)} if stop else {}),
        **({"stopped": str(fault)} if fault else {}),
        **({"flow": {**flow, "stage": stage_stats} if stage_stats else flow} if flow else {}),
        "summary": _summary(this_run, time.perf_counter() - t0, len(mine) - len(this_run)),
        "failures": [
            {
                "id": v["id"],
                "path": v["path"],
                "reason": v["reason"],
                "split": by_id[v["id"]].split,
                "label_name": by_id[v["id"]].label_name,
            }
            for v in videos
            if v["status"] == "failed"
        ],
        **({"messages": kept_messages(messages)} if messages else {}),
        "videos": videos,
    }
    ok = sum(v["status"] in OK for v in this_run)
    failed = sum(v["status"] == "failed" for v in this_run)
    done_note = f"{ok} of {len(mine)} videos done{f', {failed} failed' if failed else ''}"
    if fault is not None:
        fault.keep(f"{done_note}, their archives kept; {fault.resumes}")
        try:
            write_json_atomic(cfg.report_path, report)
        except ResourceFault as again:
            raise fault.keep(f"the report could not be written either ({again})") from None
        raise fault.keep(f"report: {cfg.report_path}")
    write_json_atomic(cfg.report_path, report)
    if stop is not None:
        raise stop.keep(f"{done_note}; the same command resumes").keep(f"report: {cfg.report_path}")
    return report


def preprocess(
    index: str | Path, out: str | Path, streams: str = "rgb", *, progress: bool = True, **options: Any
) -> dict:
    """The library entry of ``memdpc preprocess frames|flow``: options as the CLI gives them
    (:func:`config_from_options`, checked before the index is read) → run report."""
    cfg = config_from_options(out, streams, **options)
    return run_preprocess(read_index(index), cfg, progress=progress)
