"""Worker processes of the preprocessing that stop when the run is stopped.

A terminal's Ctrl-C sends SIGINT to the whole process group, SIGTERM reaches the parent alone (``kill``) or
every process of the job (a scheduler); either way the parent stops the run: it cancels the queued videos and
terminates the workers. Workers therefore leave both signals to the parent
(:func:`memdpc.common.interrupts.leave_signals_to_parent`), SIGINT from their first instruction
(:func:`spawn_context`: they start with it ignored, before they could print a traceback of their own).

:func:`pool_results` is the per-video path's local pool: each worker sends progress events while a video
runs and keeps what FFmpeg and OpenCV print about it for the video's report entry. Nothing here imports
torch, so the workers stay free of it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.queues import SimpleQueue
from typing import Any

import cv2

from memdpc.common import interrupts
from memdpc.preprocess.decode import StderrCapture
from memdpc.preprocess.job import PreprocessConfig, Progress, process_video
from memdpc.preprocess.video_index import VideoRecord

__all__ = ["STOP_WAIT", "pool_results", "spawn_context"]

POLL = 0.2  # seconds between looks at the workers' progress events
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
_worker: dict[str, Any] = {}  # this worker process's progress queue


def _init_worker(events: SimpleQueue) -> None:
    interrupts.leave_signals_to_parent()  # SIGINT ignored since the start (spawn_context), SIGTERM from now
    cv2.setNumThreads(1)  # one OpenCV thread per worker
    _worker["events"] = events


def _send(kind: str, video_id: str, n: int) -> None:
    _worker["events"].put((kind, video_id, n))


def _job(rec: VideoRecord, cfg: PreprocessConfig) -> dict:
    with StderrCapture() as stderr:  # what FFmpeg prints about this video, for its entry
        return process_video(rec, cfg, _send, stderr.take)


# ------------------------------------------------------------------------------------ in the parent
def _drain(events: SimpleQueue, progress: Progress) -> None:
    while not events.empty():
        progress(*events.get())


def _terminate(ex: ProcessPoolExecutor) -> None:
    """End the workers now: the queued videos go with them (their futures fail as a broken pool; cancelling
    them first makes Python 3.11's pool raise in its own thread), their temporary archives stay for the
    caller or the next run to remove."""
    processes = list((ex._processes or {}).values())  # no public way before Python 3.14's terminate_workers
    for p in processes:
        p.terminate()
    for p in processes:
        p.join(STOP_WAIT)
    ex.shutdown(wait=False)


def pool_results(cfg: PreprocessConfig, todo: list[VideoRecord], progress: Progress) -> Iterator[dict]:
    """Run the per-video jobs of ``todo`` on ``cfg.workers`` spawned processes (one OpenCV thread each)
    and yield their report entries as they finish; ``progress`` gets the workers' events, in this thread.

    At most two videos per worker are queued, so a stop cancels little. Leaving early (an interrupt, an
    error, or the caller closing the generator) cancels the queued videos and terminates the workers.
    """
    workers = min(cfg.workers, len(todo))
    ctx = spawn_context()
    events = ctx.SimpleQueue()
    ex = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(events,))
    queued, pending = iter(todo), set()
    try:
        while True:
            while len(pending) < 2 * workers and (rec := next(queued, None)) is not None:
                pending.add(ex.submit(_job, rec, cfg))
            if not pending:
                break
            done, pending = wait(pending, timeout=POLL, return_when=FIRST_COMPLETED)
            _drain(events, progress)  # a video's events are sent before its entry
            for f in done:
                yield f.result()
    except BaseException:
        _terminate(ex)
        raise
    ex.shutdown()
