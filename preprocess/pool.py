"""Worker processes of the preprocessing that stop when the run is stopped, and outlive a killed sibling.

A terminal's Ctrl-C sends SIGINT to the whole process group, SIGTERM reaches the parent alone (``kill``) or
every process of the job (a scheduler); either way the parent stops the run: it cancels the queued videos and
terminates the workers. Workers therefore leave both signals to the parent
(:func:`memdpc.common.interrupts.leave_signals_to_parent`), SIGINT from their first instruction
(:func:`spawn_context`: they start with it ignored, before they could print a traceback of their own).

:func:`pool_results` is the per-video path's local pool: each worker holds one video at a time, sends progress
events while it runs and keeps what FFmpeg and OpenCV print about it for the video's report entry. Each worker
has a pipe of its own, so a worker that dies (the kernel's out-of-memory killer sends SIGKILL) takes nothing
with it but its own video: the other workers go on, a new worker takes its place, and its video is tried again
once the others are done, alone; a second death of that video reports it failed, with the signal and a hint. A
:class:`~memdpc.common.errors.ResourceFault` in a worker (a full disk) stops the run: the queue is cancelled and
the workers terminated. Nothing here imports torch, so the workers stay free of it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import traceback
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

import cv2

from memdpc.common import interrupts
from memdpc.common.atomic import tmp_name
from memdpc.common.errors import ResourceFault, UserError, worker_death
from memdpc.preprocess.archive import archive_path
from memdpc.preprocess.decode import StderrCapture
from memdpc.preprocess.job import Progress, process_video
from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.video_index import VideoRecord

__all__ = ["STOP_WAIT", "pool_results", "spawn_context"]

POLL = 0.2  # seconds between looks at the workers
STOP_WAIT = 2.0  # seconds a stopped worker may take to exit


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored for the block (a process started meanwhile inherits that; only the main thread may
    change handlers, elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _WorkerProcess(SpawnProcess):
    def start(self) -> None:
        with _sigint_ignored():  # only for the fork and exec: a few milliseconds
            super().start()


class _WorkerContext(SpawnContext):
    Process = _WorkerProcess


def spawn_context() -> SpawnContext:
    """A ``spawn`` multiprocessing context whose processes start with SIGINT ignored (an ignored signal stays
    ignored across exec, and Python then installs no KeyboardInterrupt handler)."""
    return _WorkerContext()


# ------------------------------------------------------------------------------------ in a worker
def _serve(conn: Connection, cfg: PreprocessConfig) -> None:
    """A worker's life: videos from ``conn`` until None (or the run's process is gone), each answered with its
    progress events, then its entry or the error that stops the run."""
    interrupts.leave_signals_to_parent()  # SIGINT ignored since the start (spawn_context), SIGTERM from now
    cv2.setNumThreads(1)  # one OpenCV thread per worker

    def send(kind: str, video_id: str, n: int) -> None:
        conn.send(("event", (kind, video_id, n)))

    with contextlib.suppress(EOFError, BrokenPipeError):  # the run's process is gone: leave
        while (rec := conn.recv()) is not None:
            try:
                with StderrCapture() as stderr:  # what FFmpeg prints about this video, for its entry
                    entry = process_video(rec, cfg, send, stderr.take)
            except (ResourceFault, UserError) as e:
                conn.send(("error", e))
            except Exception:  # a bug: the run's process raises it, with this process's traceback
                conn.send(
                    ("error", RuntimeError(f"a worker failed on {rec.path}:\n{traceback.format_exc()}"))
                )
            else:
                conn.send(("entry", entry))


# ------------------------------------------------------------------------------------ in the parent
@dataclass(eq=False)
class _Worker:
    process: SpawnProcess
    conn: Connection
    video: VideoRecord | None = None  # the video it holds
    died_before: str | None = None  # for a video tried again: how its first worker died


def _start(ctx: SpawnContext, cfg: PreprocessConfig) -> _Worker:
    mine, theirs = ctx.Pipe()
    process = ctx.Process(target=_serve, args=(theirs, cfg), daemon=True)
    process.start()
    theirs.close()
    return _Worker(process, mine)


def _terminate(workers: list[_Worker]) -> None:
    """End the workers now: their videos go with them, their temporary archives stay for the caller or the next
    run to remove."""
    for w in workers:
        w.process.terminate()
    for w in workers:
        w.process.join(STOP_WAIT)
        w.conn.close()


def _close(workers: list[_Worker]) -> None:
    """Let idle workers leave (their pipe says None), terminating any that does not within seconds."""
    for w in workers:
        with contextlib.suppress(OSError):
            w.conn.send(None)
    for w in workers:
        w.process.join(STOP_WAIT)
    _terminate([w for w in workers if w.process.is_alive()])
    for w in workers:
        w.conn.close()


def _remove_worker_temporaries(cfg: PreprocessConfig, rec: VideoRecord, pid: int) -> None:
    """The temporary archives a dead worker left of ``rec`` (only its own: another run may share ``out``)."""
    for s in cfg.streams:
        with contextlib.suppress(FileNotFoundError):
            tmp_name(archive_path(cfg.out, s, rec.id), pid).unlink()


def _messages(w: _Worker) -> Iterator[tuple[str, Any]]:
    """What ``w`` has sent so far; ``("died", None)`` last when its pipe is closed (the process is gone)."""
    try:
        while w.conn.poll():
            yield w.conn.recv()
    except (EOFError, OSError):
        yield "died", None


def pool_results(cfg: PreprocessConfig, todo: list[VideoRecord], progress: Progress) -> Iterator[dict]:
    """Run the per-video jobs of ``todo`` on ``cfg.workers`` spawned processes (one OpenCV thread each)
    and yield their report entries as they finish; ``progress`` gets the workers' events, in this thread.

    Each worker holds one video at a time, so a stop cancels little. Leaving early (an interrupt, an error such
    as a worker's :class:`ResourceFault`, or the caller closing the generator) cancels the queued videos and
    terminates the workers. A worker that dies is replaced; its video is tried again after the others, alone,
    and reported failed (``reason``: the signal and a hint) if that worker dies too; an entry done on the second
    try records the first death as ``retried``.
    """
    ctx = spawn_context()
    queued: deque[tuple[VideoRecord, str | None]] = deque((rec, None) for rec in todo)
    again: deque[tuple[VideoRecord, str | None]] = deque()  # videos whose worker died, and how it died
    workers = [_start(ctx, cfg) for _ in range(min(cfg.workers, len(todo)))]
    try:
        while True:
            if not queued and again and all(w.video is None for w in workers):
                queued.append(again.popleft())  # every other video is done: one at a time, alone
                for w in workers[1:]:
                    _close([w])
                workers = workers[:1] or [_start(ctx, cfg)]
            for w in list(workers):
                if w.video is None and queued:
                    try:
                        w.conn.send(queued[0][0])
                    except OSError:  # it died idle: a new one takes the video
                        workers.remove(w)
                        _terminate([w])
                        workers.append(_start(ctx, cfg))
                        continue
                    w.video, w.died_before = queued.popleft()
            busy = [w for w in workers if w.video is not None]
            if not busy:
                break
            wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=POLL)
            for w in busy:
                for kind, value in _messages(w):
                    if kind == "event":
                        progress(*value)
                    elif kind == "error":
                        raise value
                    elif kind == "entry":
                        if w.died_before is not None:
                            value["retried"] = f"its first worker was {w.died_before}"
                        w.video = None
                        yield value
                    else:  # died
                        workers.remove(w)
                        w.process.join(STOP_WAIT)
                        w.conn.close()
                        if w.video is not None:
                            _remove_worker_temporaries(cfg, w.video, w.process.pid)
                            if w.died_before is None:
                                again.append((w.video, worker_death(w.process.exitcode)))
                            else:
                                yield _killed_twice(w.video, w.process.exitcode)
                        if queued or again:
                            workers.append(_start(ctx, cfg))
    except BaseException:
        _terminate(workers)
        raise
    _close(workers)


def _killed_twice(rec: VideoRecord, exitcode: int | None) -> dict:
    """The entry of a video whose worker died on both tries."""
    reason = worker_death(exitcode, " twice, the second time alone")
    return {
        "id": rec.id,
        "path": rec.path,
        "status": "failed",
        "reason": f"its worker was {reason}",
        "streams": {},
    }
