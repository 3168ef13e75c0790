"""The preprocessing run: per-video jobs (decode once → RGB frames and/or TV-L1 flow → archives) on an
executor — or, for flow on a batched (GPU) backend, the batched stage of ``batched.py`` — with
resumability, a progress bar and a run report (JSON lines).

A video is one independent, idempotent unit: its archive ``<out>/<stream>/<id>.tar`` is renamed into place
only when complete, so a re-run skips finished videos and a killed run leaves nothing half-written under a
final name. What a rerun may reuse of the archives, report lines and temporary archives earlier runs left is
:mod:`memdpc.preprocess.reuse`'s to say, asked once per video before any work
(:meth:`~memdpc.preprocess.reuse.Rerun.check`): archives made with the same settings from the same source file are skipped, archives made otherwise
refused unless ``overwrite`` rewrites them. Bad videos are recorded in the report with their reason and
skipped.

The report (``preprocess-report.jsonl``, one per ``--part``; :mod:`memdpc.preprocess.report`) is appended to
as the run goes: a line when it starts, one per video converted or failed, one when it ends (what this run did);
a video skipped keeps the line of the run that wrote its archives, so the reports of a folder describe every
archive in it, whichever runs wrote them. SIGINT or SIGTERM stops the run within seconds: queued videos are
cancelled, workers terminated, the temporary archives of unfinished videos removed, and the report's end written
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
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import Progress as ProgressBar

from memdpc.common import interrupts
from memdpc.common.console import rich_console
from memdpc.common.errors import ResourceFault, UserError
from memdpc.common.progress import progress_bar
from memdpc.preprocess.decode import StderrCapture
from memdpc.preprocess.flow.batched import run_batched
from memdpc.preprocess.flow.tvl1_params import opencv_record
from memdpc.preprocess.job import (
    Progress,
    kept_messages,
    process_video,
    select_part,
)
from memdpc.preprocess.options import PreprocessConfig, config_from_options
from memdpc.preprocess.plan import choose_flow, disk_estimate
from memdpc.preprocess.pool import pool_results
from memdpc.preprocess.report import WRITTEN, ReportWriter
from memdpc.preprocess.reuse import Rerun
from memdpc.preprocess.run_report import RunReport, RunSummary
from memdpc.preprocess.video_index import VideoRecord, read_index

__all__ = ["PreprocessConfig", "preprocess", "run_preprocess"]

DASK_CONNECT_TIMEOUT = 30  # seconds
OK = (*WRITTEN, "skipped")  # statuses of a video whose archives are on disk

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
    """The run's progress bar, counted in the videos this run converts: its total is known from the start and
    never moves. A video open counts as the share of its units (frame pairs when flow is computed, else frames)
    written so far, out of those its header promised, so the bar moves within a long video too; beside it, the
    units written and their rate, and the videos already there and failed.

    Each event costs the same however many videos the run has: the tracker holds only the videos open now."""

    def __init__(self, bar: ProgressBar, cfg: PreprocessConfig, skipped: int, todo: int) -> None:
        self.bar, self.noun = bar, "pairs" if "flow" in cfg.streams else "frames"
        self.skipped, self.finished, self.failed = skipped, 0, 0
        self.promised: dict[str, int] = {}  # the videos open now: units promised by the header
        self.received: dict[str, int] = {}  # … and units written so far
        self.share = 0.0  # of the videos open now, the sum of their shares written
        self.units, self.t0 = 0, time.perf_counter()
        self.task = bar.add_task(f"preprocess {'+'.join(cfg.streams)}", total=todo, info="")
        self._show()

    def _part(self, video_id: str) -> float:
        """The share of an open video's promised units written (1 once all are, or none were promised)."""
        promised = self.promised[video_id]
        return min(self.received[video_id] / promised, 1.0) if promised > 0 else 1.0

    def _close(self, video_id: str) -> None:
        if video_id in self.promised:
            self.share -= self._part(video_id)
            del self.promised[video_id], self.received[video_id]
            if not self.promised:
                self.share = 0.0  # no rounding left over from the videos closed

    def event(self, kind: str, video_id: str, n: int) -> None:
        """A :data:`memdpc.preprocess.job.Progress` event."""
        if kind == "start":
            self._close(video_id)  # a video tried again (its worker died) starts over
            self.promised[video_id], self.received[video_id] = n, 0
            self.share += self._part(video_id)
        else:
            if video_id in self.promised:
                self.share -= self._part(video_id)
                self.received[video_id] += n
                self.share += self._part(video_id)
            self.units += n
        self._show()

    def finish(self, entry: dict) -> None:
        """A video's report entry: count it, and its real units."""
        vid = entry["id"]
        got = self.received.get(vid, 0)
        self._close(vid)
        if entry["status"] in WRITTEN:
            self.units += _units(entry) - got
        self.finished += 1
        self.failed += entry["status"] == "failed"
        self._show()

    def _show(self) -> None:
        rate = self.units / max(time.perf_counter() - self.t0, 1e-9)
        info = f"videos · {self.units:,} {self.noun} · {rate:.1f} {self.noun}/s"
        if self.skipped:
            info += f" · {self.skipped:,} done before"
        if self.failed:
            info += f" · {self.failed:,} failed"
        self.bar.update(self.task, completed=self.finished + max(self.share, 0.0), info=info)


def _units(entry: dict) -> int:
    """The units a video's entry reports written: its flow pairs, else its frames (0: none written)."""
    streams = entry.get("streams", {})
    return streams.get("flow", streams.get("rgb", 0))


# ------------------------------------------------------------------------------------------------ run
def _both(a: Progress, b: Progress) -> Progress:
    def both(*event: Any) -> None:
        a(*event)
        b(*event)

    return both


def run_preprocess(
    records: list[VideoRecord], cfg: PreprocessConfig, progress: bool = True, observe: Progress | None = None
) -> RunReport:
    """Preprocess this part of ``records``; write the run's report and return what it did.

    Finished videos (all requested archives present, made with these settings from the same source file)
    are skipped without work; archives made otherwise are refused (UserError) unless ``cfg.overwrite``.
    The report (:class:`~memdpc.preprocess.report.ReportWriter`) gets a line per video converted or failed as
    it finishes; the returned :class:`~memdpc.preprocess.run_report.RunReport` holds its ``summary``,
    ``failures`` (this run's, with their split and class) and ``videos``: every video of the part this run
    reached, with its status (``done``, ``partial``, ``skipped``, ``failed`` + reason), frame counts, fps, seconds
    per stage, the measured flow storage error and what FFmpeg printed about it (``messages``); for flow,
    ``flow`` names the backend and devices used (``auto`` resolved) and the note of a fallback. A batched backend (torch, triton) runs in the batched stage
    (``memdpc.preprocess.flow.batched``) unless the run goes to Dask, and ``flow.stage`` then says per device
    where its time went (:attr:`~memdpc.preprocess.flow.batched.DeviceStage.stats`); the OpenCV backend runs
    in per-video jobs. On SIGINT/SIGTERM (KeyboardInterrupt) the report's end is written and the
    interrupt re-raised as :class:`memdpc.common.interrupts.Interrupted` with a note of what was kept; a fault
    of the output (a full disk) is re-raised the same way, as :class:`~memdpc.common.errors.ResourceFault`,
    after the report's end (``stopped``). A warning goes to stderr first when the archives will not fit in the
    free space, by :func:`memdpc.preprocess.plan.disk_estimate`.

    ``observe`` (for callers that time the run) is called in this thread with each progress event of the
    videos (``("start", id, units promised)``, ``("units", id, n)`` as units are written) and with
    ``("done", id, units)`` as a video's entry arrives (its pairs, or frames without flow; 0 if it failed).
    """
    cfg.validate()
    console = rich_console(stderr=True)
    plan = _plan(records, cfg, console, progress)
    with ReportWriter(cfg.report_path, plan.begin) as log:
        drained = _drain(plan, cfg, log, console, progress, observe)
        return _report(plan, drained, cfg, log)


@dataclass
class _Plan:
    """What a run does, decided before any video is converted: this part's videos, those already finished
    (``reused``: skipped without work) and those to convert, the config the videos are converted with (the
    flow's ``auto`` resolved), how (``results``: per-video jobs or the batched stage) and the report's start."""

    mine: list[VideoRecord]
    rerun: Rerun
    reused: list[VideoRecord]
    todo: list[VideoRecord]
    used: PreprocessConfig
    results: Callable[..., Iterator[dict]]
    flow: dict[str, Any] | None
    stage_stats: dict[str, dict]
    begin: dict[str, Any]


def _plan(records: list[VideoRecord], cfg: PreprocessConfig, console, progress: bool) -> _Plan:
    """Check what ``cfg.out`` holds, choose the flow backend (saying why a fallback was taken), warn where the
    archives will not fit, and write nothing."""
    mine = select_part(records, cfg.part)
    with console.status(f"checking the archives in {cfg.out}") if progress else contextlib.nullcontext():
        rerun = Rerun.check(mine, cfg)  # what the run may reuse of its --out: each video asked once
        rerun.clear_temporaries()  # those killed runs left
        used, flow, results, stage_stats, backend = cfg, None, _results, {}, None
        if "flow" in cfg.streams:
            choice = choose_flow(cfg)
            backend = choice.backend
            used = replace(cfg, flow_backend=choice.name, device=",".join(choice.devices))
            if choice.batched:
                results = _batched(choice.devices, stage_stats)
            opencv = opencv_record()
            flow = {"backend": choice.name, "devices": choice.devices, "note": choice.note, "opencv": opencv}
            for note in (choice.note, opencv["note"]):
                if note:
                    console.print(f"[yellow]note:[/yellow] {note}")
        space = disk_estimate(rerun.todo, used, backend).warning() if rerun.todo else None
    if space:
        console.print(f"[yellow]warning:[/yellow] {escape(space)}", soft_wrap=True)
    begin = {
        "command": "preprocess",
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {**asdict(cfg), "streams": list(cfg.streams), "part": list(cfg.part)},
        **({"flow": flow} if flow else {}),
    }
    return _Plan(mine, rerun, rerun.done, rerun.todo, used, results, flow, stage_stats, begin)


@dataclass
class _Drained:
    """What converting the videos gave: every entry by id (the reused ones as ``skipped``), the signal or the
    fault that stopped it (None: it ran to the end), FFmpeg's messages not tied to a video, and its seconds."""

    entries: dict[str, dict]
    stop: interrupts.Interrupted | None
    fault: ResourceFault | None
    messages: list[str]
    seconds: float


def _drain(
    plan: _Plan, cfg: PreprocessConfig, log: ReportWriter, console, progress: bool, observe: Progress | None
) -> _Drained:
    """Convert the videos to do, writing each one's line to the report as it finishes; a signal or a fault of
    the output ends it (recorded here, raised by :func:`_report` once the report's end is written)."""
    entries = {r.id: {"id": r.id, "path": r.path, "status": "skipped"} for r in plan.reused}
    by_id = {r.id: r for r in plan.todo}
    t0 = time.perf_counter()
    stop: interrupts.Interrupted | None = None
    fault: ResourceFault | None = None  # the output's disk full, or the like: the run's, not a video's
    with StderrCapture() as stderr:
        with progress_bar("{task.fields[info]}", bold=True, console=console, disable=not progress) as bar:
            tracker = _Tracker(bar, cfg, len(plan.reused), len(plan.todo))
            events = tracker.event if observe is None else _both(tracker.event, observe)
            try:
                work = (
                    contextlib.closing(plan.results(plan.used, plan.todo, events, stderr.take))
                    if plan.todo
                    else (contextlib.nullcontext(()))
                )  # nothing to do: no pool, no device process
                with work as videos:
                    for entry in videos:
                        entries[entry["id"]] = entry
                        if entry["status"] == "failed":  # the index's split and class: what a split lost
                            rec = by_id[entry["id"]]
                            entry.update(split=rec.split, label_name=rec.label_name)
                        if plan.rerun.gets_line(entry):
                            log.video(entry, plan.rerun.tried(entry))
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
        plan.rerun.clear_temporaries(finished=entries)
    return _Drained(entries, stop, fault, messages, time.perf_counter() - t0)


def _report(plan: _Plan, drained: _Drained, cfg: PreprocessConfig, log: ReportWriter) -> RunReport:
    """End the report (its summary, what stopped the run) and return what the run did; a signal or a fault is
    raised now, with what was kept."""
    this_run = [drained.entries[r.id] for r in plan.mine if r.id in drained.entries]
    stop, fault, messages = drained.stop, drained.fault, drained.messages
    summary = RunSummary.of(this_run, drained.seconds, len(plan.mine) - len(this_run))
    finished = datetime.now(timezone.utc).isoformat(timespec="seconds")
    end = {
        "finished": finished,
        **({"interrupted": str(stop)} if stop else {}),
        **({"stopped": str(fault)} if fault else {}),
        "summary": asdict(summary),
        **({"stage": plan.stage_stats} if plan.stage_stats else {}),
        **({"messages": kept_messages(messages)} if messages else {}),
    }
    with_archives = summary.written + summary.skipped
    failed = f", {summary.failed} failed" if summary.failed else ""
    progress_note = f"{with_archives} of {len(plan.mine)} videos done{failed}"
    if fault is not None:
        fault.keep(f"{progress_note}, their archives kept; {fault.resumes}")
        try:
            log.end(end)
        except ResourceFault as again:
            raise fault.keep(f"the report could not be written either ({again})") from None
        raise fault.keep(f"report: {cfg.report_path}")
    log.end(end)
    if stop is not None:
        raise stop.keep(f"{progress_note}; the same command resumes").keep(f"report: {cfg.report_path}")
    flow, stats = plan.flow, plan.stage_stats
    return RunReport(
        config=cfg,
        started=plan.begin["started"],
        finished=finished,
        summary=summary,
        videos=this_run,
        failures=[
            {k: v[k] for k in ("id", "path", "reason", "split", "label_name")}
            for v in this_run
            if v["status"] == "failed"
        ],
        flow=({**flow, "stage": stats} if stats else flow) if flow else None,
        messages=end.get("messages", []),
    )


def preprocess(
    index: str | Path, out: str | Path, streams: str = "rgb", *, progress: bool = True, **options: Any
) -> RunReport:
    """The library entry of ``memdpc preprocess frames|flow``: options as the CLI gives them
    (:func:`config_from_options`, checked before the index is read) → what the run did."""
    cfg = config_from_options(out, streams, **options)
    return run_preprocess(read_index(index), cfg, progress=progress)
