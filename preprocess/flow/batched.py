"""The batched flow stage: keeps a GPU busy with the frame pairs of many videos at once.

One process per device (this process when there is one device); the videos are divided between them like
``--part``. Inside a device's process, threads (OpenCV's decode, colour conversion and JPEG coding and
torch's kernels release the GIL):

- ``threads`` decode threads each take the next video, decode it (:class:`VideoStream`), write its RGB
  archive when asked, convert its frames to grey and add its frame pairs to the batch of their frame size;
- one device thread takes full batches (:func:`batch_pairs`: a budget of pixels, so many small frames or
  few large ones; a partial batch when all decoding is over, or when more than ``threads`` frame sizes wait
  with no video of theirs being decoded), maps them to flow codes on the device (``backend.codes``) and
  passes the codes on, split into one chunk per encode thread;
- ``threads`` encode threads JPEG-encode the codes, measure their storage error and append them in order to
  the video's flow archive; the video's last pair commits its archives and reports the video.

Every queue is bounded, so memory does not grow with the length or number of videos. A pair's flow does not
depend on its batch (a promise of :class:`BatchedFlowBackend`), so the archives are those of the per-video
path byte for byte. A video that fails is reported and its archives dropped; the other pairs of its batches
go on. A batch too large for the device's memory is halved until it fits, and that size is kept for its
frame size.

Each video's progress (its pairs as they are written) goes to the run's progress events. A stop (an
interrupt in the parent, or another thread's error) reaches every thread at its next look at a queue, and
the device thread within one solver iteration (the backend's ``checkpoint``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np
import torch

from memdpc import interrupts
from memdpc.errors import UserError
from memdpc.preprocess.archive import ArchiveWriter, archive_path
from memdpc.preprocess.decode import DecodeError, PartialVideo, VideoStream
from memdpc.preprocess.flow.backends import BatchedFlowBackend, batch_pairs, make_backend
from memdpc.preprocess.job import (
    FlowWriter,
    PreprocessConfig,
    Progress,
    Ticker,
    commit_archives,
    encode_flow,
    expected_units,
    failure_reason,
    missing_streams,
    new_entry,
    no_progress,
    select_part,
)
from memdpc.preprocess.pool import STOP_WAIT, spawn_context
from memdpc.preprocess.video_index import VideoRecord

POLL = 0.1  # seconds between checks for an abort while a thread waits on a queue
_END = object()  # closes a queue


class _Aborted(Exception):
    """Another thread failed: stop waiting and leave."""


@dataclass(eq=False)
class _Video:
    """One video in flight: its writers, how many of its pairs are out and back, its report entry."""

    rec: VideoRecord
    entry: dict[str, Any]
    stack: contextlib.ExitStack
    writers: dict[str, ArchiveWriter] = field(default_factory=dict)
    flow: FlowWriter | None = None
    t0: float = field(default_factory=time.perf_counter)
    lock: threading.RLock = field(default_factory=threading.RLock)
    src: VideoStream | None = None
    ticker: Ticker | None = None
    hw: tuple[int, int] = (0, 0)
    pushed: int = 0  # pairs handed to the batches
    settled: int = 0  # pairs appended to the archive (or dropped after a failure)
    decoded: bool = False  # decoding is over: ``pushed`` is final
    failure: str | None = None
    pending: dict[int, tuple[bytes, float, int]] = field(default_factory=dict)  # encoded, out of order
    stages: dict[str, float] = field(default_factory=lambda: {"decode": 0.0, "flow": 0.0, "encode": 0.0})
    cpu: float = 0.0

    def fail(self, reason: str) -> None:
        """Mark the video failed (the first reason counts): its archives will be dropped."""
        with self.lock:
            if self.failure is None:
                self.failure = reason


@dataclass(frozen=True)
class _Pair:
    video: _Video
    seq: int  # pair k is frame k → k + 1
    prev: np.ndarray
    nxt: np.ndarray


def _out_of_memory(e: BaseException) -> bool:
    return isinstance(e, (torch.cuda.OutOfMemoryError, MemoryError)) or "out of memory" in str(e)


class DeviceStage:
    """The threads of one device: videos in, committed archives and report entries out (see module doc).

    ``backend`` is a :class:`BatchedFlowBackend` on one device; ``threads`` the number of decode threads
    and of encode threads; ``progress`` gets the videos' progress events (from any thread).
    """

    def __init__(
        self, backend: BatchedFlowBackend, cfg: PreprocessConfig, threads: int, progress: Progress = no_progress
    ) -> None:
        self.backend, self.cfg, self.threads, self.progress = backend, cfg, threads, progress
        self._ready: queue.Queue = queue.Queue(maxsize=2)  # full batches for the device thread
        self._coded: queue.Queue = queue.Queue(maxsize=2 * threads)  # chunks of codes: two batches
        self._buckets: dict[tuple[int, int], list[_Pair]] = {}  # pairs waiting for a batch, by frame size
        self._producers: Counter[tuple[int, int]] = Counter()  # decode threads on videos of a frame size
        self._idle: dict[tuple[int, int], None] = {}  # buckets without a producer, oldest first
        self._limit: dict[tuple[int, int], int] = {}  # the batch size that fits the device, by frame size
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._open: set[_Video] = set()
        self._records: Iterator[VideoRecord] = iter(())
        self._emit: Callable[[dict], None] = lambda entry: None

    # ------------------------------------------------------------------------------------------ driver
    def run(self, records: list[VideoRecord], emit: Callable[[dict], None]) -> None:
        """Process ``records``, calling ``emit`` with each video's report entry (from any thread) once its
        archives are committed or it failed. Re-raises the first error of a thread, after removing the
        temporary archives of the videos in flight."""
        self._records, self._emit = iter(records), emit
        decoders = [self._thread(self._decode_loop) for _ in range(self.threads)]
        device = self._thread(self._device_loop)
        encoders = [self._thread(self._encode_loop) for _ in range(self.threads)]
        with self._guard():
            for t in decoders:
                t.join()
            for batch in self._take_buckets():  # no more input for any frame size
                self._put(self._ready, batch)
            self._put(self._ready, _END)
            device.join()
            for _ in encoders:
                self._put(self._coded, _END)
        for t in (*decoders, device, *encoders):
            t.join()
        if self._error is not None:
            for video in list(self._open):
                video.stack.close()  # uncommitted: the temporary archives are removed
            raise self._error

    def abort(self) -> None:
        """Make every thread leave at its next wait (``run`` then raises)."""
        self._fail(_Aborted("aborted"))

    def _thread(self, target: Callable[[], None]) -> threading.Thread:
        def body() -> None:
            with self._guard():
                target()

        t = threading.Thread(target=body, daemon=True)
        t.start()
        return t

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except _Aborted:
            pass
        except BaseException as e:
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        with self._lock:
            self._error = self._error or e
        self._stop.set()

    def _checkpoint(self) -> None:
        """Between the device's solver iterations: leave the batch if the run is being stopped."""
        if self._stop.is_set():
            raise _Aborted

    def _put(self, q: queue.Queue, item: Any) -> None:
        while True:
            if self._stop.is_set():
                raise _Aborted
            with contextlib.suppress(queue.Full):
                q.put(item, timeout=POLL)
                return

    def _get(self, q: queue.Queue) -> Any:
        while True:
            if self._stop.is_set():
                raise _Aborted
            with contextlib.suppress(queue.Empty):
                return q.get(timeout=POLL)

    # ------------------------------------------------------------------------------------------ decode
    def _decode_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                rec = next(self._records, None)
            if rec is None:
                return
            self._decode(rec)

    def _decode(self, rec: VideoRecord) -> None:
        """Decode one video into its RGB archive and the batches; its pairs finish it later."""
        cfg, c = self.cfg, time.thread_time()
        todo = missing_streams(rec, cfg)
        if not todo:  # finished meanwhile (by another part sharing ``out``)
            self._emit({**new_entry(rec), "status": "skipped", "seconds": 0.0})
            return
        video = _Video(rec, new_entry(rec), contextlib.ExitStack())
        with self._lock:
            self._open.add(video)
        try:
            for s in todo:
                video.writers[s] = video.stack.enter_context(ArchiveWriter(archive_path(cfg.out, s, rec.id)))
            if "flow" in video.writers:
                video.flow = FlowWriter(video.writers["flow"], cfg.flow_encoding)
            video.src = VideoStream(rec.path, cfg.decode)
            video.ticker = Ticker(self.progress, rec.id, expected_units(video.src, video.flow is not None))
            video.entry.update(source_fps=video.src.source_fps, fps=video.src.fps)
            self._frames(video)
        except PartialVideo as e:
            if cfg.keep_partial:
                video.entry.update(status="partial", reason=str(e))
            else:
                video.fail(failure_reason(e))
        except (DecodeError, cv2.error, OSError) as e:
            video.fail(failure_reason(e))
        if video.flow and video.pushed == 0:
            video.fail("only one frame: no pair to compute flow from")
        with video.lock:
            video.cpu += time.thread_time() - c
            video.stages["decode"] += video.src.seconds if video.src else 0.0
            video.decoded = True
            self._finish_if_done(video)

    def _frames(self, video: _Video) -> None:
        """Decode, write the RGB frames, hand out the grey pairs."""
        prev, rgb, encode_s, grey_s, hw = None, video.writers.get("rgb"), 0.0, 0.0, None
        try:
            for frame in video.src:
                if self._stop.is_set():
                    raise _Aborted
                if video.failure:  # its flow archive failed: stop decoding this video
                    return
                video.hw = frame.shape[:2]
                t = time.perf_counter()
                if rgb:
                    rgb.add(self.cfg.rgb_encoding.encode_bgr(frame))
                    if not video.flow:
                        video.ticker.add()
                t1 = time.perf_counter()
                encode_s += t1 - t
                if video.flow:
                    if hw is None:
                        hw = frame.shape[:2]
                        self._producing(hw, 1)
                    grey = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY)
                    grey_s += time.perf_counter() - t1
                    if prev is not None:
                        with video.lock:
                            seq, video.pushed = video.pushed, video.pushed + 1
                        self._add(_Pair(video, seq, prev, grey))
                    prev = grey
        finally:
            with video.lock:
                video.stages["encode"] += encode_s
                video.stages["flow"] += grey_s
            if hw is not None:
                self._producing(hw, -1)

    def _add(self, pair: _Pair) -> None:
        hw = pair.prev.shape
        with self._lock:
            bucket = self._buckets.setdefault(hw, [])
            bucket.append(pair)
            full = self._buckets.pop(hw) if len(bucket) >= batch_pairs(self.backend, *hw) else None
        if full:
            self._put(self._ready, full)

    def _producing(self, hw: tuple[int, int], delta: int) -> None:
        """Count the decode threads on videos of frame size ``hw``. At most ``threads`` buckets wait
        without one; beyond that the oldest goes to the device as a partial batch, so memory stays bounded
        however many frame sizes the videos have."""
        with self._lock:
            self._producers[hw] += delta
            if self._producers[hw]:
                self._idle.pop(hw, None)
            elif self._buckets.get(hw):
                self._idle[hw] = None
            partial = []
            while len(self._idle) > self.threads:
                oldest = next(iter(self._idle))
                del self._idle[oldest]
                partial.append(self._buckets.pop(oldest))
        for batch in partial:
            self._put(self._ready, batch)

    def _take_buckets(self) -> list[list[_Pair]]:
        with self._lock:
            batches, self._buckets, self._idle = list(self._buckets.values()), {}, {}
        return batches

    # ------------------------------------------------------------------------------------------ device
    def _device_loop(self) -> None:
        while (batch := self._get(self._ready)) is not _END:
            t, c = time.perf_counter(), time.thread_time()
            codes = self._codes(np.stack([p.prev for p in batch]), np.stack([p.nxt for p in batch]))
            share = ((time.perf_counter() - t) / len(batch), (time.thread_time() - c) / len(batch))
            step = -(-len(batch) // self.threads)
            for i in range(0, len(batch), step):
                self._put(self._coded, (batch[i : i + step], codes[i : i + step], share))

    def _codes(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """``backend.codes`` in chunks that fit the device's memory: a chunk that does not is halved, and
        the smaller size is kept for this frame size."""
        hw, out, i = prev.shape[1:], [], 0
        while i < len(prev):
            n = min(self._limit.get(hw, len(prev)), len(prev) - i)
            try:
                out.append(
                    self.backend.codes(prev[i : i + n], nxt[i : i + n], self.cfg.third_channel, self._checkpoint)
                )
                i += n
                continue
            except (MemoryError, RuntimeError) as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
                if not _out_of_memory(e):
                    raise
            if n == 1:
                raise UserError(
                    f"--size: one {hw[1]}×{hw[0]} frame pair does not fit in the flow device's memory "
                    "(try a smaller --size)"
                )
            self._limit[hw] = n // 2
            if torch.cuda.is_available():  # after the except block, which holds the failed call's tensors
                torch.cuda.empty_cache()
        return np.concatenate(out)

    # ------------------------------------------------------------------------------------------ encode
    def _encode_loop(self) -> None:
        while (item := self._get(self._coded)) is not _END:
            pairs, codes, share = item
            for pair, code in zip(pairs, codes, strict=True):
                if self._stop.is_set():
                    raise _Aborted
                self._encode(pair, code, share)

    def _encode(self, pair: _Pair, codes: np.ndarray, share: tuple[float, float]) -> None:
        """JPEG-encode one pair's codes and append them to its video's flow archive in order."""
        flow_s, flow_cpu = share
        video, encoded = pair.video, None
        t, c = time.perf_counter(), time.thread_time()
        if video.failure is None:
            try:
                encoded = encode_flow(codes, self.cfg.flow_encoding)
            except cv2.error as e:
                video.fail(failure_reason(e))
        with video.lock:
            video.stages["flow"] += flow_s
            video.stages["encode"] += time.perf_counter() - t
            video.cpu += flow_cpu + time.thread_time() - c
            if encoded is not None:
                video.pending[pair.seq] = encoded
            self._append_ready(video)
            video.settled += 1
            self._finish_if_done(video)

    def _append_ready(self, video: _Video) -> None:
        """Append the encoded pairs that are next in order (under ``video.lock``)."""
        while video.failure is None and video.flow.writer.num_frames in video.pending:
            try:
                video.flow.append(*video.pending.pop(video.flow.writer.num_frames))
                video.ticker.add()
            except OSError as e:
                video.fail(failure_reason(e))
        if video.failure:
            video.pending.clear()

    # ------------------------------------------------------------------------------------------ finish
    def _finish_if_done(self, video: _Video) -> None:
        """Commit (or drop) the archives of a video whose pairs are all back (under ``video.lock``)."""
        if not video.decoded or video.settled < video.pushed:
            return
        if video.ticker:
            video.ticker.flush()
        entry = video.entry
        try:
            with video.stack:
                if video.failure is None:
                    commit_archives(
                        video.rec, self.cfg, video.src, video.hw, video.writers, video.flow, entry
                    )
        except OSError as e:
            video.fail(failure_reason(e))
        if video.failure is not None:
            entry.update(status="failed", reason=video.failure, streams={})
        elif video.src is not None:
            entry.update(
                height=video.hw[0],
                width=video.hw[1],
                num_frames=video.src.num_decoded,
                stages={k: round(v, 4) for k, v in video.stages.items()},
            )
        entry["seconds"] = round(time.perf_counter() - video.t0, 4)
        entry["cpu_seconds"] = round(video.cpu, 4)  # of the threads, for this video
        with self._lock:
            self._open.discard(video)
        self._emit(entry)


# -------------------------------------------------------------------------------------------- devices
def _serve_process(*args: Any) -> None:
    """:func:`_serve` in a device process of its own, which leaves SIGINT and SIGTERM to the run's process."""
    interrupts.leave_signals_to_parent()
    _serve(*args)


def _serve(
    records: list[VideoRecord],
    cfg: PreprocessConfig,
    device: str,
    threads: int,
    out: Any,
    stage: DeviceStage | None = None,
) -> None:
    """Run one device's stage (``stage``, or a new one on ``device``), sending ``("progress", event)`` as
    videos move and ``("video", entry)`` for each video, then ``("end", device)`` or ``("user"|"error",
    message)``, on ``out``: a queue of this process or one shared with the parent."""
    cv2.setNumThreads(1)  # parallelism comes from the threads
    try:
        if stage is None:
            stage = DeviceStage(make_backend(cfg.flow_backend, cfg.tvl1, device), cfg, threads, _progress_to(out))
        stage.run(records, lambda entry: out.put(("video", entry)))
    except UserError as e:
        out.put(("user", str(e)))
    except Exception as e:
        out.put(("error", f"{device}: {type(e).__name__}: {e}"))
    else:
        out.put(("end", device))


def _progress_to(out: Any) -> Progress:
    def send(*event: Any) -> None:
        out.put(("progress", event))

    return send


def run_batched(
    cfg: PreprocessConfig, records: list[VideoRecord], devices: list[str], progress: Progress = no_progress
) -> Iterator[dict]:
    """Preprocess ``records`` on ``devices`` (one process each; a thread of this process for one device)
    and yield the videos' report entries as they finish; ``progress`` gets their progress events, in this
    thread.

    Leaving early (an interrupt, an error, or the caller closing the generator) stops the device threads at
    their next look at the queues and terminates the device processes; a thread inside a long device call is
    not waited for beyond a few seconds (it is a daemon: it ends with the process)."""
    threads = cfg.threads or max(2, (os.cpu_count() or 1) // len(devices))
    stage = None
    if len(devices) == 1:
        out: Any = queue.Queue()
        stage = DeviceStage(make_backend(cfg.flow_backend, cfg.tvl1, devices[0]), cfg, threads, _progress_to(out))
        workers: list[Any] = [
            threading.Thread(target=_serve, args=(records, cfg, devices[0], threads, out, stage), daemon=True)
        ]
    else:
        ctx = spawn_context()  # device processes leave SIGINT to this one
        out = ctx.Queue()
        workers = [
            ctx.Process(target=_serve_process, args=(select_part(records, (i, len(devices))), cfg, d, threads, out))
            for i, d in enumerate(devices)
        ]
    for w in workers:
        w.start()
    ended = 0
    try:
        while ended < len(workers):
            try:
                kind, value = out.get(timeout=1)
            except queue.Empty:
                if sum(not w.is_alive() for w in workers) > ended:
                    raise RuntimeError("a device process of the flow stage died (killed?)") from None
                continue
            if kind == "progress":
                progress(*value)
            elif kind == "video":
                yield value
            elif kind == "end":
                ended += 1
            elif kind == "user":
                raise UserError(value)
            else:
                raise RuntimeError(f"the batched flow stage failed on {value}")
    finally:
        if ended < len(workers):  # an error here or in a worker, an interrupt, or the caller stopped early
            if stage is not None:
                stage.abort()
            for w in workers:
                if not isinstance(w, threading.Thread) and w.is_alive():
                    w.terminate()
            for w in workers:
                w.join(STOP_WAIT)
        else:
            for w in workers:
                w.join()
