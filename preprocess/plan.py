"""What a preprocessing run will do, before it starts: which flow backend runs (:func:`choose_flow`), the disk it
will fill (:func:`disk_estimate`, which the run compares with the free space at its start), and, for ``memdpc
preprocess frames|flow --dry-run``, all of it with the videos already done and the time, and nothing written
(:func:`plan`).

The counts come from the index, the videos' headers (frame count, frame rate and size; nothing decoded) and
the archives already in ``--out``, checked as the run checks them (:meth:`memdpc.preprocess.reuse.Rerun.check`:
archives made with other settings are refused the same way). Time and disk come from a short warm-up on the first video to do: a few frames from its
middle decoded, encoded as the run encodes them, and the flow of a few pairs computed by the backend the run
would use (one batch untimed first: compiling, loading). They are scaled to every video by its pixels per
frame: decoding by the source's, flow and encoding by the output's. The archives, the report and temporary
files of a run are not touched.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from memdpc.common.errors import UserError, free_bytes
from memdpc.common.wording import duration_text, name_list, plural, size_text
from memdpc.preprocess.decode import DecodeError, StderrCapture, VideoStream, read_header
from memdpc.preprocess.flow.backends import (
    BatchedFlowBackend,
    FlowBackend,
    FlowStage,
    make_backend,
    resolve_backend,
)
from memdpc.preprocess.job import (
    encode_flow,
    failure_reason,
    select_part,
)
from memdpc.preprocess.options import PreprocessConfig, config_from_options
from memdpc.preprocess.reuse import Rerun, missing_streams
from memdpc.preprocess.video_index import VideoRecord, read_index

__all__ = ["DiskEstimate", "FlowChoice", "choose_flow", "disk_estimate", "plan"]

WARMUP_PAIRS = 4  # timed flow pairs of a per-video backend (a batched one times one batch)
PROBE_THREADS = 8  # threads reading the videos' headers (their latency, on network storage)
# a tar header (512 B), on average half a 512-byte block of padding, and the frame's size in meta.json (~7 B)
TAR_BYTES_PER_MEMBER = 775
# per archive: its meta.json member (about 1.5 kB), the tar's end (1 kB) and, on average, half of the 10 kB record
# that a tar is padded to
TAR_BYTES_PER_ARCHIVE = 7_700
ESTIMATE_VIDEOS = 200  # videos whose headers a run reads for its disk estimate (evenly spaced; all, if fewer)
ESTIMATE_PAIRS = 2  # frame pairs whose flow a run computes for its disk estimate (frames: one more)


# ------------------------------------------------------------------------------------------------ flow
@dataclass(frozen=True)
class FlowChoice:
    """The flow backend a run uses: ``auto`` resolved, built, and the stage that runs it."""

    name: str
    devices: list[str]
    note: str | None  # why ``auto`` took what it took, where that needs saying
    backend: FlowBackend
    batched: bool  # the batched stage (a batched backend, not on Dask); else per-video jobs


def choose_flow(cfg: PreprocessConfig) -> FlowChoice:
    """Resolve and build ``cfg``'s flow backend; UserError where it or its device cannot run, or where several
    devices are given to a path that uses one."""
    name, device, note = resolve_backend(cfg.flow_backend, cfg.device, params=cfg.tvl1)
    devices = device.split(",")
    backend = make_backend(name, cfg.tvl1, devices[0])  # an unusable backend or device fails now
    batched = isinstance(backend, BatchedFlowBackend) and not cfg.dask
    if len(devices) > 1 and not batched:
        raise UserError(f"--device {cfg.device}: several devices need the batched flow stage (not --dask)")
    return FlowChoice(name, devices, note, backend, batched)


# ------------------------------------------------------------------------------------------------ plan


@dataclass(frozen=True)
class Header:
    """One video as its header describes it, and what the run makes of it."""

    id: str
    source_frames: int
    source_pixels: int  # per frame
    frames: int  # output frames (after --fps)
    size: tuple[int, int]  # output (width, height)
    streams: tuple[str, ...]  # the archives to write (those missing, or made otherwise with --overwrite)

    @property
    def pixels(self) -> int:
        return self.size[0] * self.size[1]


@dataclass(frozen=True)
class Rates:
    """What the warm-up measured, per pixel: seconds and bytes."""

    video: str
    pixels: int  # per output frame of that video
    frames: int  # decoded
    pairs: int  # timed flow pairs (0 without flow)
    first_flow_s: float  # the untimed batch of pairs, compiling and loading included
    decode_s: float  # per source pixel
    rgb_s: float  # encoding, per output pixel
    rgb_bytes: float
    flow_s: float  # flow and its encoding, per output pixel of a pair
    flow_bytes: float


def _header_bytes(h: Header, stream: str, r: Rates) -> float:
    """The bytes of ``h``'s archive of ``stream`` at the measured rates (0 when it is not to be written)."""
    if stream not in h.streams:
        return 0.0
    if stream == "rgb":
        return h.frames * (h.pixels * r.rgb_bytes + TAR_BYTES_PER_MEMBER) + TAR_BYTES_PER_ARCHIVE
    return max(h.frames - 1, 0) * (h.pixels * r.flow_bytes + TAR_BYTES_PER_MEMBER) + TAR_BYTES_PER_ARCHIVE


@dataclass(frozen=True)
class PreprocessPlan:
    """What ``memdpc preprocess`` will do with a config."""

    out: str
    streams: tuple[str, ...]
    part: tuple[int, int]
    videos: int  # in this part
    finished: int  # archives already there, made with these settings
    todo: list[Header]
    unreadable: list[tuple[str, str]]  # (path, reason): the run records them as failed
    backend: str  # "" without flow
    devices: list[str]
    note: str | None
    parallel: int  # processes (per-video path) or CPU threads (batched path) the run uses; 0 on Dask
    batched: bool
    rates: Rates | None  # None: nothing to do
    free_bytes: int | None  # on --out's file system

    @property
    def frames(self) -> int:
        return sum(h.frames for h in self.todo)

    @property
    def pairs(self) -> int:
        return sum(max(h.frames - 1, 0) for h in self.todo)

    def stream_bytes(self, stream: str) -> float:
        if self.rates is None:
            return 0.0
        return sum(_header_bytes(h, stream, self.rates) for h in self.todo)

    def _seconds(self, h: Header) -> tuple[float, float]:
        """(CPU seconds, flow seconds) of one video: decoding and RGB encoding, then flow and its encoding."""
        r = self.rates
        cpu = h.source_frames * h.source_pixels * r.decode_s
        if "rgb" in h.streams:
            cpu += h.frames * h.pixels * r.rgb_s
        flow = max(h.frames - 1, 0) * h.pixels * r.flow_s if "flow" in h.streams else 0.0
        return cpu, flow

    @property
    def work_s(self) -> float:
        """Seconds of work in all, as one process would spend them."""
        return sum(sum(self._seconds(h)) for h in self.todo) if self.rates else 0.0

    @property
    def wall_s(self) -> float:
        """Wall time: per video on ``parallel`` processes (no shorter than the longest video), or, batched, the
        devices' flow and the CPU threads' decoding and encoding side by side."""
        if not self.rates or not self.parallel:
            return 0.0
        seconds = [self._seconds(h) for h in self.todo]
        if self.batched:
            return max(
                sum(f for _, f in seconds) / len(self.devices), sum(c for c, _ in seconds) / self.parallel
            )
        per_video = [c + f for c, f in seconds]
        return max(sum(per_video) / self.parallel, max(per_video))

    def lines(self) -> list[str]:
        i, n = self.part
        part = f" (part {i}/{n})" if n > 1 else ""
        done = f", {self.finished:,} already done with these settings" if self.finished else ""
        bad = (
            (
                f", {len(self.unreadable):,} unreadable (the run records them as failed): "
                + name_list([f"{Path(p).name}: {why}" for p, why in self.unreadable], 3)
            )
            if self.unreadable
            else ""
        )
        lines = [
            f"plan of preprocess {'+'.join(self.streams)} into {self.out} (a dry run: nothing written)",
            f"videos: {self.videos:,}{part}: {len(self.todo):,} to do{done}{bad}",
        ]
        if not self.todo:
            return [*lines, "nothing to convert: the same command without --dry-run writes the report"]
        sizes = Counter(h.size for h in self.todo)
        common = ", ".join(f"{w}×{h} ({plural(c, 'video')})" for (w, h), c in sizes.most_common(3))
        more = f" and {plural(len(sizes) - 3, 'other size')}" if len(sizes) > 3 else ""
        pairs = f", {plural(self.pairs, 'flow pair')}" if "flow" in self.streams else ""
        lines.append(f"frames: {self.frames:,} out by the headers{pairs}; frame sizes {common}{more}")
        if self.backend:
            where = ",".join(self.devices)
            how = (
                f"batches of pairs from many videos on {where}, {plural(self.parallel, 'CPU thread')} decoding "
                f"and encoding"
                if self.batched
                else f"one video per process on {where}, {plural(self.parallel, 'process')}"
                if self.parallel
                else "one video per task on the Dask cluster"
            )
            lines.append(
                f"flow: TV-L1 {self.backend}, {how}" + (f" (note: {self.note})" if self.note else "")
            )
        parts = [f"{s} {size_text(self.stream_bytes(s))}" for s in self.streams]
        total = sum(self.stream_bytes(s) for s in self.streams)
        free = ""
        if self.free_bytes is not None:
            free = (
                f"; only {size_text(self.free_bytes)} free there"
                if total > self.free_bytes
                else f"; {size_text(self.free_bytes)} free there"
            )
        lines.append(f"disk: about {size_text(total)} in {self.out} ({', '.join(parts)}){free}")
        r = self.rates
        timed = f"{plural(r.frames, 'frame')} of {r.video} decoded and encoded"
        if r.pairs:
            timed += (
                f", {plural(r.pairs, 'flow pair')} timed ({r.flow_s * r.pixels:.3g} s each) after "
                f"{r.first_flow_s:.3g} s for the first batch (compiling, loading)"
            )
        if self.parallel:
            estimate = f"about {duration_text(self.wall_s)}"
        else:
            estimate = f"about {duration_text(self.work_s)} of work in all, spread over the cluster's workers"
        scaled = "scaled to each video by its pixels per frame"
        if self.batched:
            scaled += "; the run's batches are larger than the warm-up's, so it is likely faster"
        lines += [
            f"time: {estimate} — an estimate on this machine from {timed}, {scaled}",
            "next: the same command without --dry-run",
        ]
        return lines


def _probe(rec: VideoRecord, cfg: PreprocessConfig) -> Header | tuple[str, str]:
    try:
        src = read_header(rec.path, cfg.decode)
    except (DecodeError, OSError) as e:
        return rec.path, failure_reason(e)
    w, h = src.source_size
    return Header(
        rec.id,
        src.expected_frames,
        w * h,
        src.expected_output,
        cfg.decode.out_size(w, h),
        tuple(missing_streams(rec, cfg)),
    )


def _frames(rec: VideoRecord, cfg: PreprocessConfig, start: int, count: int) -> tuple[VideoStream, list]:
    """Up to ``count`` frames of ``rec`` from source frame ``start`` on (fewer where the file ends or breaks
    first), and the stream that decoded them (its time and counts)."""
    src = VideoStream(rec.path, cfg.decode)
    if start:
        src.seek(start)
    frames = []
    try:
        for frame in src:
            frames.append(frame)
            if len(frames) == count:
                break
    except DecodeError:
        pass  # a short or damaged video: the frames that did decode
    finally:
        src.close()
    return src, frames


def _warm_up(
    rec: VideoRecord,
    header: Header,
    cfg: PreprocessConfig,
    backend: FlowBackend | None,
    pairs: tuple[int, int] | None = None,
) -> Rates:
    """Decode a few frames of ``rec`` (from its middle, when it is long enough), encode them, and time the flow
    of a few pairs with ``backend`` (None: no flow). ``pairs``: (untimed, timed) pairs, by default a batch of the
    backend untimed (compiling, loading), then a batch or :data:`WARMUP_PAIRS`, whichever is more."""
    flow = backend is not None
    stage = FlowStage(backend, cfg.third_channel) if flow else None
    untimed = stage.backend.batch_size if flow else 0
    timed = max(stage.backend.batch_size, WARMUP_PAIRS) if flow else WARMUP_PAIRS
    if pairs is not None:
        untimed, timed = pairs
    middle = header.source_frames // 2 if header.source_frames > 3 * (untimed + timed + 1) else 0
    src, frames = _frames(rec, cfg, middle, untimed + timed + 1)  # the middle stands for a video better
    if not frames and middle:  # a file that does not seek, or is cut before its middle
        src, frames = _frames(rec, cfg, 0, untimed + timed + 1)
    if not frames:
        raise DecodeError("no frames could be decoded")
    pixels = frames[0].shape[0] * frames[0].shape[1]
    t = time.perf_counter()
    rgb = [cfg.rgb_encoding.encode_bgr(f) for f in frames]
    rgb_s = (time.perf_counter() - t) / (len(frames) * pixels)
    decode_s = src.seconds / (src.num_decoded * header.source_pixels)
    rates = Rates(
        rec.id,
        pixels,
        len(frames),
        0,
        0.0,
        decode_s,
        rgb_s,
        sum(map(len, rgb)) / (len(frames) * pixels),
        0.0,
        0.0,
    )
    if not flow or len(frames) < 2:
        return rates
    split = min(untimed + 1, len(frames) - 1)  # frames of the untimed batch; the timed pairs follow on
    for f in frames[:split]:
        stage.push(f)
    stage.flush()
    first_s, stage.seconds = stage.seconds, 0.0
    codes = [c for f in frames[split:] for c in stage.push(f)] + stage.flush()  # at least one pair
    t = time.perf_counter()
    data = [encode_flow(c, cfg.flow_encoding)[0] for c in codes]
    encode_s = time.perf_counter() - t
    return replace(
        rates,
        pairs=len(codes),
        first_flow_s=first_s,
        flow_s=(stage.seconds + encode_s) / (len(codes) * pixels),
        flow_bytes=sum(map(len, data)) / (len(data) * pixels),
    )


@dataclass(frozen=True)
class DiskEstimate:
    """The bytes a run's archives will take, from the headers of ``videos`` of the ``todo`` videos to do and the
    JPEG sizes of a few frames (and flow pairs) of ``measured``; ``low`` and ``high`` bound the 95 % interval of
    the sampling of the headers (equal to ``bytes`` when every header was read)."""

    out: str
    bytes: float
    low: float
    high: float
    videos: int
    todo: int
    measured: str
    free: int | None  # on ``out``'s file system

    def warning(self) -> str | None:
        """What to say when the archives will not fit in the free space (None when they will, or it is unknown)."""
        if self.free is None or self.bytes <= self.free:
            return None
        sampled = (
            f"95 % interval {size_text(self.low)}–{size_text(self.high)}, from the headers of {self.videos:,} "
            f"of the {self.todo:,} videos"
            if self.videos < self.todo
            else f"from the headers of the {plural(self.todo, 'video')}"
        )
        return (
            f"this run's archives will take about {size_text(self.bytes)} in {self.out} ({sampled} and the JPEG "
            f"sizes of frames of {self.measured}), but only {size_text(self.free)} is free there: it will stop "
            "when the disk is full; the same command then resumes once space is freed"
        )


def _spaced(todo: list[VideoRecord], n: int) -> list[VideoRecord]:
    """``n`` videos spread evenly over ``todo`` (all of them where there are no more)."""
    if len(todo) <= n:
        return todo
    return [todo[i * len(todo) // n] for i in range(n)]


def disk_estimate(
    todo: list[VideoRecord], cfg: PreprocessConfig, backend: FlowBackend | None
) -> DiskEstimate:
    """The bytes the archives of ``todo`` will take, as the run estimates them at its start: the headers of up
    to :data:`ESTIMATE_VIDEOS` of them, and the JPEG sizes of a few frames of the first that decodes (and the
    flow of :data:`ESTIMATE_PAIRS` pairs, by ``backend``). Sampled headers add the sampling's 95 % interval (a
    normal interval of the mean over the videos, finite-population corrected)."""
    sample = _spaced(todo, ESTIMATE_VIDEOS)
    with StderrCapture():  # FFmpeg's complaints about the files: the run's report keeps them
        with ThreadPoolExecutor(PROBE_THREADS) as ex:
            probed = list(ex.map(lambda r: _probe(r, cfg), sample))
        rates, measured = None, ""
        for rec, header in zip(sample, probed, strict=True):
            if isinstance(header, Header):
                try:
                    rates, measured = _warm_up(rec, header, cfg, backend, (0, ESTIMATE_PAIRS)), rec.id
                    break
                except DecodeError:
                    continue
    free = free_bytes(Path(cfg.out))
    if rates is None:
        return DiskEstimate(cfg.out, 0.0, 0.0, 0.0, len(sample), len(todo), "", free)
    # a video whose header does not open writes nothing: the run records it as failed
    per_video = [
        sum(_header_bytes(h, s, rates) for s in cfg.streams) if isinstance(h, Header) else 0.0 for h in probed
    ]
    n, total = len(per_video), len(todo)
    mean = sum(per_video) / n
    half = 0.0
    if 1 < n < total:
        sd = math.sqrt(sum((b - mean) ** 2 for b in per_video) / (n - 1))
        half = 1.96 * total * sd / math.sqrt(n) * math.sqrt(1 - n / total)
    return DiskEstimate(
        cfg.out, mean * total, max(mean * total - half, 0.0), mean * total + half, n, total, measured, free
    )


def plan_preprocess(records: list[VideoRecord], cfg: PreprocessConfig) -> PreprocessPlan:
    """The plan of ``cfg``'s run over this part of ``records``: the run's own checks (a backend or device that
    cannot run, archives made otherwise), the videos' headers and a timed warm-up. Writes nothing."""
    cfg.validate()
    choice = choose_flow(cfg) if "flow" in cfg.streams else None
    name, devices, note = (choice.name, choice.devices, choice.note) if choice else ("", ["cpu"], None)
    backend, batched = (choice.backend, choice.batched) if choice else (None, False)
    mine = select_part(records, cfg.part)
    rerun = Rerun.check(mine, cfg)
    done, todo = rerun.done, rerun.todo
    rates = None
    with StderrCapture():  # FFmpeg's complaints about the files: the run's report keeps them
        with ThreadPoolExecutor(PROBE_THREADS) as ex:
            probed = list(ex.map(lambda r: _probe(r, cfg), todo))
        headers = [(r, h) for r, h in zip(todo, probed, strict=True) if isinstance(h, Header)]
        unreadable = [h for h in probed if not isinstance(h, Header)]
        for rec, header in list(headers):  # the first video whose frames decode
            try:
                rates = _warm_up(rec, header, cfg, backend)
                break
            except DecodeError as e:
                unreadable.append((rec.path, failure_reason(e)))
                headers.remove((rec, header))
    cores = os.cpu_count() or 1
    parallel = (
        0 if cfg.dask else (cfg.threads * len(devices) or cores) if batched else min(cfg.workers, cores)
    )
    return PreprocessPlan(
        out=cfg.out,
        streams=cfg.streams,
        part=cfg.part,
        videos=len(mine),
        finished=len(done),
        todo=[h for _, h in headers],
        unreadable=unreadable,
        backend=name,
        devices=devices,
        note=note,
        parallel=parallel,
        batched=batched,
        rates=rates,
        free_bytes=free_bytes(Path(cfg.out)),
    )


def plan(index: str | Path, out: str | Path, streams: str = "rgb", **options) -> PreprocessPlan:
    """The library entry of ``memdpc preprocess frames|flow --dry-run``: options as :func:`memdpc.preprocess.run.
    preprocess` takes them → the plan of that run."""
    cfg = config_from_options(out, streams, **options)
    return plan_preprocess(read_index(index), cfg)
