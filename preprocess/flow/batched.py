"""The batched flow stage: keeps a GPU busy with the frame pairs of many videos at once.

One process per device (this process when there is one device); the videos are divided between them like
``--part``. Inside a device's process, threads (OpenCV's decode, colour conversion and JPEG coding and
torch's copies and kernels release the GIL):

- ``threads`` decode threads each take the next video, decode it (:class:`VideoStream`), write its RGB
  archive when asked, convert its frames to grey and add its frame pairs to the batch of their frame size;
  a batch is full at :func:`batch_pairs` pairs (a budget of pixels, so many small frames or few large
  ones), or partial when all decoding is over, or when more than ``threads`` frame sizes wait with no video
  of theirs being decoded;
- a load thread stacks each full batch's frames into pinned host memory and copies them to the device on a
  stream of its own (:class:`Transfers`);
- one device thread maps the loaded batches to flow codes on the device (``backend.device_codes``, on the
  compute stream, which waits for the batch's copy without the host waiting), has the codes copied back
  on a third stream and passes them on, split into one chunk per encode thread, without waiting for them;
- ``threads`` encode threads wait for their chunk's codes, JPEG-encode them, measure their storage error and
  append them in order to the video's flow archive; the video's last pair commits its archives and reports
  the video.

So the device computes one batch while the next is decoded, stacked and copied in and the codes of the one
before are copied out, encoded and written: two batches in flight (``pipelined``; without it the device
thread loads, computes and unloads one batch at a time, the same archives slower). The device thread's
launches come first: the other threads run at a lower CPU priority (:data:`HOST_NICENESS`), so that the work
of the host, which grows with the pairs, does not delay the device's next kernels.

Every queue is bounded, so memory does not grow with the length or number of videos. A pair's flow does not
depend on its batch (a promise of :class:`BatchedFlowBackend`), so the archives are those of the per-video
path byte for byte. A video that fails is reported and its archives dropped; the other pairs of its batches
go on. A fault of the output (a full disk: :class:`~memdpc.common.errors.ResourceFault`) stops the stage and the
run. A batch too large for the device's memory is halved until it fits, and that size is kept for its
frame size. :attr:`DeviceStage.stats` says where the device's time went (its busy seconds measured on the
device, the seconds it waited for frames and for the encode threads).

Each video's progress (its pairs as they are written) goes to the run's progress events. A stop (an
interrupt in the parent, or another thread's error) reaches every thread at its next look at a queue, and
the device thread within one solver iteration (the backend's ``checkpoint``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np
import torch

from memdpc.common import interrupts
from memdpc.common.errors import ResourceFault, UserError
from memdpc.preprocess.archive import ArchiveWriter, archive_path
from memdpc.preprocess.decode import DecodeError, PartialVideo, VideoStream
from memdpc.preprocess.flow.backends import BatchedFlowBackend, batch_pairs, make_backend
from memdpc.preprocess.job import (
    FlowWriter,
    Progress,
    Ticker,
    commit_archives,
    encode_flow,
    expected_units,
    failure_reason,
    new_entry,
    no_progress,
    select_part,
)
from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.pool import STOP_WAIT, spawn_context
from memdpc.preprocess.reuse import missing_streams
from memdpc.preprocess.video_index import VideoRecord

__all__ = ["DeviceStage", "run_batched"]

POLL = 0.1  # seconds between checks for an abort while a thread waits on a queue
HOST_NICENESS = (
    5  # added to the CPU niceness of the decode, load and encode threads (Linux); not the device's
)
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


@dataclass(eq=False)
class _Batch:
    """A batch on the device: its pairs, their frames there, and the event of their copy (None on the CPU)."""

    pairs: list[_Pair]
    prev: torch.Tensor
    nxt: torch.Tensor
    loaded: torch.cuda.Event | None


@dataclass(eq=False)
class _Codes:
    """Codes of consecutive pairs of a batch on their way to the encode threads: host memory that holds
    them once ``arrived`` (a CUDA event; None: at once), and the batch's device time per pair."""

    pairs: list[_Pair]
    codes: np.ndarray  # (n, H, W, 3) uint8
    arrived: torch.cuda.Event | None
    share: tuple[float, float]  # device seconds and device-thread CPU seconds per pair


def _out_of_memory(e: BaseException) -> bool:
    return isinstance(e, (torch.cuda.OutOfMemoryError, MemoryError)) or "out of memory" in str(e)


def _yield_to_device() -> None:
    """Lower this thread's CPU priority by :data:`HOST_NICENESS` (Linux, where a thread has its own)."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError):
            tid = threading.get_native_id()
            niceness = os.getpriority(os.PRIO_PROCESS, tid) + HOST_NICENESS
            os.setpriority(os.PRIO_PROCESS, tid, min(19, niceness))


class Transfers:
    """The copies between the host and the device of one stage, and the stream the device computes on.

    On CUDA, a batch's frames are stacked into pinned host memory and copied on a stream of their own; the
    compute stream waits for that copy's event (the host does not); codes are copied back into pinned memory
    on another stream once computed, and their readers wait for that copy's event. So copies in both
    directions overlap the kernels of another batch. On the CPU the same calls stack and hand over.
    """

    def __init__(self, device: torch.device) -> None:
        self.device, self.cuda = device, device.type == "cuda"
        if self.cuda:
            self.compute, self._in, self._out = (torch.cuda.Stream(device) for _ in range(3))

    def load(self, pairs: list[_Pair]) -> _Batch:
        """Stack the pairs' frames and copy them to the device (without waiting on CUDA)."""
        with self._on_device():
            host = torch.empty((2, len(pairs), *pairs[0].prev.shape), dtype=torch.uint8, pin_memory=self.cuda)
            frames = host.numpy()  # (2, B, H, W)
            np.stack([p.prev for p in pairs], out=frames[0])
            np.stack([p.nxt for p in pairs], out=frames[1])
            if not self.cuda:
                return _Batch(pairs, host[0], host[1], None)
            with torch.cuda.stream(self._in):
                on_device = host.to(self.device, non_blocking=True)
                loaded = torch.cuda.Event()
                loaded.record()
            on_device.record_stream(self.compute)  # allocated for the copy stream, read by the compute stream
        return _Batch(pairs, on_device[0], on_device[1], loaded)

    def _on_device(self) -> contextlib.AbstractContextManager:
        """This device as the calling thread's current CUDA device (a thread starts on the first)."""
        return torch.cuda.device(self.device) if self.cuda else contextlib.nullcontext()

    @contextlib.contextmanager
    def computing(self, batch: _Batch) -> Iterator[None]:
        """Run the block's device work on the compute stream, after the batch's copy."""
        if not self.cuda:
            yield
            return
        self.compute.wait_event(batch.loaded)
        with torch.cuda.stream(self.compute):
            yield

    def unload(self, codes: torch.Tensor) -> tuple[np.ndarray, torch.cuda.Event | None]:
        """Copy codes computed on the compute stream back to the host (without waiting on CUDA): the host
        array, and the event after which it holds them."""
        if not self.cuda:
            return codes.numpy(), None
        with self._on_device():
            self._out.wait_stream(self.compute)
            host = torch.empty(codes.shape, dtype=torch.uint8, pin_memory=True)
            with torch.cuda.stream(self._out):
                host.copy_(codes, non_blocking=True)
                arrived = torch.cuda.Event()
                arrived.record()
            codes.record_stream(self._out)
        return host.numpy(), arrived


class _DeviceClock:
    """The device's busy seconds: the spans of the batches' work on the compute stream (CUDA events, read
    once they have passed; on the CPU, the wall time of the device thread's call)."""

    def __init__(self, transfers: Transfers) -> None:
        self.transfers, self.seconds = transfers, 0.0
        self._spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def span(self) -> Iterator[None]:
        """Time the block's device work (inside :meth:`Transfers.computing`)."""
        if not self.transfers.cuda:
            t = time.perf_counter()
            yield
            self.seconds += time.perf_counter() - t
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self._spans.append((start, end))
        self.read(wait=False)

    def read(self, wait: bool) -> float:
        """Add the spans that have passed (all of them with ``wait``); the busy seconds so far."""
        while self._spans and (wait or self._spans[0][1].query()):
            start, end = self._spans.pop(0)
            end.synchronize()
            self.seconds += start.elapsed_time(end) / 1000
        return self.seconds


class DeviceStage:
    """The threads of one device: videos in, committed archives and report entries out (see module doc).

    ``backend`` is a :class:`BatchedFlowBackend` on one device; ``threads`` the number of decode threads
    and of encode threads; ``progress`` gets the videos' progress events (from any thread); ``pipelined``:
    two batches in flight (else one at a time, for comparison: the same archives).
    """

    def __init__(
        self,
        backend: BatchedFlowBackend,
        cfg: PreprocessConfig,
        threads: int,
        progress: Progress = no_progress,
        pipelined: bool = True,
    ) -> None:
        self.backend, self.cfg, self.threads, self.progress = backend, cfg, threads, progress
        self.pipelined = pipelined
        self.transfers = Transfers(torch.device(backend.device))
        self._clock = _DeviceClock(self.transfers)
        self.stats: dict[str, float] = {
            "batches": 0,
            "pairs": 0,
            "device_busy_seconds": 0.0,  # the compute stream's spans (CUDA events)
            "waited_for_frames_seconds": 0.0,  # the device thread, for a loaded batch
            "waited_for_encoders_seconds": 0.0,  # the device thread, to hand codes on
        }
        self._ready: queue.Queue = queue.Queue(maxsize=2)  # full batches of pairs for the load thread
        self._loaded: queue.Queue = queue.Queue(maxsize=1)  # a batch on the device, next to compute
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
        host = self._host_thread
        decoders = [host(self._decode_loop) for _ in range(self.threads)]
        loader = [host(self._load_loop)] if self.pipelined else []
        device = self._thread(self._device_loop)
        encoders = [host(self._encode_loop) for _ in range(self.threads)]
        with self._guard():
            for t in decoders:
                t.join()
            for batch in self._take_buckets():  # no more input for any frame size
                self._put(self._ready, batch)
            self._put(self._ready, _END)
            device.join()
            for _ in encoders:
                self._put(self._coded, _END)
        for t in (*decoders, *loader, device, *encoders):
            t.join()
        self.stats["device_busy_seconds"] = self._clock.read(wait=self._error is None)
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

    def _host_thread(self, target: Callable[[], None]) -> threading.Thread:
        """A thread of the host's work, which yields the CPU to the device thread."""

        def body() -> None:
            _yield_to_device()
            target()

        return self._thread(body)

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

    def _put(self, q: queue.Queue, item: Any, waited: str | None = None) -> None:
        """Put ``item`` on ``q`` once there is room; the seconds it waited go to ``stats[waited]``."""
        t = time.perf_counter()
        while True:
            if self._stop.is_set():
                raise _Aborted
            with contextlib.suppress(queue.Full):
                q.put(item, timeout=POLL)
                break
        if waited:
            self.stats[waited] += time.perf_counter() - t

    def _get(self, q: queue.Queue, waited: str | None = None) -> Any:
        """The next item of ``q``; the seconds it waited go to ``stats[waited]``."""
        t = time.perf_counter()
        while True:
            if self._stop.is_set():
                raise _Aborted
            with contextlib.suppress(queue.Empty):
                item = q.get(timeout=POLL)
                break
        if waited:
            self.stats[waited] += time.perf_counter() - t
        return item

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
    def _load_loop(self) -> None:
        """Pipelined: load each full batch while the device computes the one before."""
        while (pairs := self._get(self._ready)) is not _END:
            self._put(self._loaded, self.transfers.load(pairs))
        self._put(self._loaded, _END)

    def _next_batch(self) -> _Batch | object:
        if self.pipelined:
            return self._get(self._loaded, "waited_for_frames_seconds")
        pairs = self._get(self._ready, "waited_for_frames_seconds")
        return pairs if pairs is _END else self.transfers.load(pairs)

    def _device_loop(self) -> None:
        while (batch := self._next_batch()) is not _END:
            t, c = time.perf_counter(), time.thread_time()
            with self.transfers.computing(batch), self._clock.span():
                codes = self._codes(batch.prev, batch.nxt)
            host, arrived = self.transfers.unload(codes)
            if not self.pipelined and arrived is not None:
                arrived.synchronize()
            n = len(batch.pairs)
            share = ((time.perf_counter() - t) / n, (time.thread_time() - c) / n)
            self.stats["batches"] += 1
            self.stats["pairs"] += n
            step = -(-n // self.threads)
            for i in range(0, n, step):
                chunk = _Codes(batch.pairs[i : i + step], host[i : i + step], arrived, share)
                self._put(self._coded, chunk, "waited_for_encoders_seconds")

    def _codes(self, prev: torch.Tensor, nxt: torch.Tensor) -> torch.Tensor:
        """``backend.device_codes`` in chunks that fit the device's memory: a chunk that does not is halved,
        and the smaller size is kept for this frame size."""
        hw, out, i = tuple(prev.shape[1:]), [], 0
        while i < len(prev):
            n = min(self._limit.get(hw, len(prev)), len(prev) - i)
            try:
                out.append(
                    self.backend.device_codes(
                        prev[i : i + n], nxt[i : i + n], self.cfg.third_channel, self._checkpoint
                    )
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
        return out[0] if len(out) == 1 else torch.cat(out)

    # ------------------------------------------------------------------------------------------ encode
    def _encode_loop(self) -> None:
        while (chunk := self._get(self._coded)) is not _END:
            if chunk.arrived is not None:
                chunk.arrived.synchronize()
            for pair, code in zip(chunk.pairs, chunk.codes, strict=True):
                if self._stop.is_set():
                    raise _Aborted
                self._encode(pair, code, chunk.share)

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
    videos move and ``("video", entry)`` for each video, then ``("end", (device, stage.stats))``,
    ``("fault", ResourceFault)`` or ``("user"|"error", message)``, on ``out``: a queue of this process or one shared with the parent."""
    cv2.setNumThreads(1)  # parallelism comes from the threads
    try:
        if stage is None:
            stage = DeviceStage(
                make_backend(cfg.flow_backend, cfg.tvl1, device), cfg, threads, _progress_to(out)
            )
        stage.run(records, lambda entry: out.put(("video", entry)))
    except ResourceFault as e:  # the output's disk full, or the like: the run stops
        out.put(("fault", e))
    except UserError as e:
        out.put(("user", str(e)))
    except Exception as e:
        out.put(("error", f"{device}: {type(e).__name__}: {e}"))
    else:
        out.put(("end", (device, stage.stats)))


def _progress_to(out: Any) -> Progress:
    def send(*event: Any) -> None:
        out.put(("progress", event))

    return send


def run_batched(
    cfg: PreprocessConfig,
    records: list[VideoRecord],
    devices: list[str],
    progress: Progress = no_progress,
    stats: dict[str, dict] | None = None,
) -> Iterator[dict]:
    """Preprocess ``records`` on ``devices`` (one process each; a thread of this process for one device)
    and yield the videos' report entries as they finish; ``progress`` gets their progress events, in this
    thread. ``stats`` gets each device's :attr:`DeviceStage.stats` as it ends, by device.

    Leaving early (an interrupt, an error, or the caller closing the generator) stops the device threads at
    their next look at the queues and terminates the device processes; a thread inside a long device call is
    not waited for beyond a few seconds (it is a daemon: it ends with the process)."""
    threads = cfg.threads or max(2, (os.cpu_count() or 1) // len(devices))
    stage = None
    if len(devices) == 1:
        out: Any = queue.Queue()
        stage = DeviceStage(
            make_backend(cfg.flow_backend, cfg.tvl1, devices[0]), cfg, threads, _progress_to(out)
        )
        workers: list[Any] = [
            threading.Thread(target=_serve, args=(records, cfg, devices[0], threads, out, stage), daemon=True)
        ]
    else:
        ctx = spawn_context()  # device processes leave SIGINT to this one
        out = ctx.Queue()
        workers = [
            ctx.Process(
                target=_serve_process, args=(select_part(records, (i, len(devices))), cfg, d, threads, out)
            )
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
                if stats is not None:
                    stats[value[0]] = value[1]
            elif kind == "fault":
                raise value
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
