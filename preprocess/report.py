"""The preprocess report: what every run into a folder did, one JSON line per event, appended as it happens.

A run appends to ``<out>/preprocess-report.jsonl`` (``preprocess-report-partIofN.jsonl`` for a ``--part I/N``,
``--report PATH`` elsewhere) and never rewrites it: a rerun that only skips adds two lines, however many videos
the folder holds. Each line is a JSON object with ``kind`` and ``run`` (the run's id: its start in nanoseconds and
its process id, so ids sort by start):

- ``run``: a run begins: ``command``, ``started``, ``config``, and for flow ``flow`` (backend, devices, note);
- ``video``: a video the run converted or failed on: its entry (``id``, ``path``, ``status`` — ``done``,
  ``partial`` or ``failed`` with ``reason`` —, ``streams``: frames per archive written, fps, frame counts,
  seconds per stage, ``messages`` of FFmpeg and OpenCV, ``retried``); a failed one adds the index's ``split``
  and ``label_name`` and ``tried``, the streams whose archives it did not write. A video skipped (its archives there) gets no line: the line of the run that
  wrote its archives still describes them;
- ``end``: the run ends: ``finished``, ``summary`` (what this run did: counts by status, ``pending`` when
  stopped), ``interrupted`` (the signal's name), ``stopped`` (the fault of the output that stopped it), ``stage``
  (the batched flow stage's figures per device), ``messages`` (the run's own). A run killed leaves no ``end``.

Readers merge every report of a folder, run by run in order of start: for each video and stream, the entry of
the last run that wrote that stream's archive or failed to describes it (:func:`read_report`), so a frames run
and then a flow run into one folder leave both streams described; :func:`failed_videos` keeps only the failures,
for readers of large folders. A line that does not parse (a kill or a full disk while it was written) is passed
over. Reports of the earlier format (one JSON file, ``preprocess-report*.json``, holding its ``videos``) are read
too, as one run at the time they were last written.
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memdpc.common.errors import UserError, output_faults
from memdpc.common.streams import STREAMS

__all__ = [
    "REPORT",
    "REPORTS",
    "REPORT_OF_PART",
    "Report",
    "ReportWriter",
    "WRITTEN",
    "failed_videos",
    "read_report",
    "report_files",
]

REPORT = "preprocess-report.jsonl"  # a run's report in --out; a --part I/N run appends to REPORT_OF_PART
REPORT_OF_PART = "preprocess-report-part{i}of{n}.jsonl"
REPORTS = (REPORT, REPORT_OF_PART.format(i="*", n="*"))  # every report a folder may hold, as glob patterns
EARLIER = ("preprocess-report.json", "preprocess-report-part*of*.json")  # the earlier format's names
WRITTEN = ("done", "partial")  # statuses of an entry whose archives the run wrote


def report_files(folder: str | os.PathLike) -> list[Path]:
    """The preprocess reports in ``folder``, of either format."""
    root = Path(folder)
    return sorted({p for pattern in (*REPORTS, *EARLIER) for p in root.glob(pattern) if p.is_file()})


# ----------------------------------------------------------------------------------------------- writing
class ReportWriter:
    """Appends one run's lines to a report (a context manager: it holds the file open until the block ends).
    Each line goes to the file in one ``write`` to a file opened for appending, so the lines of runs that share
    the file (the same command twice on one folder) do not mix. A fault of the output (a full disk) is raised as a
    :class:`~memdpc.common.errors.ResourceFault`."""

    def __init__(self, path: str | os.PathLike, begin: dict[str, Any]) -> None:
        self.path, self.begin = Path(path), begin
        self.run = f"{time.time_ns():020d}-{os.getpid()}"
        self._fd: int | None = None

    def __enter__(self) -> ReportWriter:
        cut = _check_appendable(self.path)
        with output_faults(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if cut:
                self._write(b"\n")  # end the line a kill or a full disk cut short
            self._append("run", self.begin)
        except BaseException:
            self.__exit__()
            raise
        return self

    def video(self, entry: dict[str, Any], tried: Iterable[str] = ()) -> None:
        """The entry of a video this run converted, or failed on (``tried``: the streams it did not write)."""
        self._append("video", {**entry, "tried": list(tried)} if entry.get("status") == "failed" else entry)

    def end(self, fields: dict[str, Any]) -> None:
        """The run's end: its summary and how it ended."""
        self._append("end", fields)

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _append(self, kind: str, fields: dict[str, Any]) -> None:
        self._write((json.dumps({"kind": kind, "run": self.run, **fields}) + "\n").encode())

    def _write(self, data: bytes) -> None:
        with output_faults(self.path):
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]


def _check_appendable(path: Path) -> bool:
    """Whether ``path`` ends in a line cut short; UserError when it is there and not a report of this format."""
    try:
        with open(path, "rb") as f:
            first = f.readline()
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
            last = f.read(1)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise UserError(f"{path}: cannot read the preprocess report ({e.strerror})") from None
    if first and not _is_report(first):
        raise UserError(
            f"{path}: not a preprocess report of this memdpc version (one JSON line per event; an earlier "
            "version wrote one JSON); give another --report, or move it away"
        )
    return bool(size) and last != b"\n"


# ----------------------------------------------------------------------------------------------- reading
_START = b'{"kind": "run", '  # how every report of this format begins: the line of its first run


def _is_report(first: bytes) -> bool:
    """Whether a file whose first line is ``first`` is a report of this format (that line perhaps cut short)."""
    return first.startswith(_START) or _parse(first) is not None


def _parse(line: bytes) -> dict[str, Any] | None:
    """A line of a report, or None when it is none (cut short, or another file)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("run"), str) and "kind" in obj else None


# one event of a report: (order key, kind, fields, the streams a video's entry concerns)
Event = tuple[str, str, dict[str, Any], tuple[str, ...]]


def _concerns(entry: dict[str, Any], streams: Iterable[str]) -> tuple[str, ...]:
    """The streams whose archives a video's entry describes: those it wrote, or those it failed to write."""
    if entry.get("status") in WRITTEN and isinstance(entry.get("streams"), dict) and entry["streams"]:
        return tuple(entry["streams"])
    return tuple(entry.get("tried", streams))


def _events(path: Path) -> Iterator[Event]:
    """The events of one report file, in file order; UserError for a file that is no report."""
    try:
        f = open(path, "rb")  # noqa: SIM115 — closed below, as the generator ends
    except OSError as e:
        raise UserError(f"{path}: unreadable preprocess report ({e.strerror})") from None
    with f:
        first = f.readline()
        if first and not _is_report(first):
            yield from _earlier_events(path, first + f.read())
            return
        streams: dict[str, tuple[str, ...]] = {}  # run → its streams
        for raw in itertools.chain([first], f):
            line = _parse(raw)
            if line is None:
                continue  # cut short
            kind, run = line.pop("kind"), line["run"]
            if kind == "run":
                streams[run] = tuple((line.get("config") or {}).get("streams", STREAMS))
            yield run, kind, line, _concerns(line, streams.get(run, STREAMS)) if kind == "video" else ()


def _earlier_events(path: Path, data: bytes) -> Iterator[Event]:
    """The events of a report of the earlier format: one run, at the time the file was last written."""
    try:
        report = json.loads(data)
        videos = [v for v in report["videos"] if "status" in v]
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"{path}: unreadable preprocess report ({e}); delete it or run preprocess again"
        ) from None
    run = f"{path.stat().st_mtime_ns:020d}-0"
    config = report.get("config") if isinstance(report.get("config"), dict) else {}
    streams = tuple(config.get("streams", STREAMS))
    fields = {k: v for k, v in report.items() if k not in ("videos", "failures", "command")}
    yield run, "run", {"run": run, "command": "preprocess", **fields}, ()
    for v in videos:
        yield run, "video", {"run": run, **v}, _concerns(v, streams)


def _merged(paths: Iterable[Path]) -> Iterator[Event]:
    """The events of several reports, run by run in order of start (a file's own order within a run)."""
    return heapq.merge(*(_events(p) for p in paths), key=lambda e: e[0])


def _paths(where: str | os.PathLike) -> list[Path]:
    where = Path(where)
    return report_files(where) if where.is_dir() else [where] if where.exists() else []


@dataclass
class Report:
    """What the reports of a folder (or one report) say: ``runs``, each run's first line with its end's fields
    (none for a run killed), in order of start; ``videos``: per video id, per stream, the entry that describes
    its archive (that of the last run that wrote it or failed to)."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    videos: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def entries(self, stream: str) -> dict[str, dict[str, Any]]:
        """Video id → the entry that describes its ``stream`` archive."""
        return {vid: by[stream] for vid, by in self.videos.items() if stream in by}


def read_report(where: str | os.PathLike) -> Report:
    """The merged report of every preprocess report in the folder ``where``, or of the report file ``where``
    (empty where there is none). UserError for a file that is no preprocess report."""
    out, runs = Report(), {}
    for run, kind, line, streams in _merged(_paths(where)):
        if kind == "run":
            runs[run] = dict(line)
            out.runs.append(runs[run])
        elif kind == "end":
            runs.setdefault(run, {"run": run}).update({k: v for k, v in line.items() if k != "run"})
        elif kind == "video":
            by = out.videos.setdefault(line["id"], {})
            for s in streams:
                by[s] = line
    return out


def failed_videos(folder: str | os.PathLike, stream: str | None = None) -> dict[str, str]:
    """Video id → the reason it failed, of the videos whose ``stream`` archive (any stream's, with None) the last
    run to try it failed to write, by the preprocess reports in ``folder``. Reads the reports line by line and
    keeps only the failures, so a folder of many videos costs little memory."""
    failed: dict[tuple[str, str], str] = {}
    for _, kind, line, streams in _merged(_paths(folder)):
        if kind != "video":
            continue
        for s in streams:
            if stream is not None and s != stream:
                continue
            if line.get("status") == "failed":
                failed[line["id"], s] = line.get("reason", "no reason given")
            else:
                failed.pop((line["id"], s), None)
    return {vid: reason for (vid, _), reason in failed.items()}
