"""The torch reference loader: ``webdataset`` + ``DataLoader`` + OpenCV, with the augmentation spec's draws.

Shards are split by rank (``shards[rank::world_size]``, what ``wds.split_by_node`` does, but with the rank
given to :func:`make_loader`, so simulated ranks work without ``torch.distributed``), then by DataLoader
worker (``wds.split_by_worker``); the assignment is fixed, so ``len()`` is known up front, and each worker
of each rank reads at least one shard. Per epoch, train mode shuffles each worker's shard order and its
samples (in a buffer), seeded from ``(seed, epoch, rank, worker)``. Workers batch, so an epoch has no
cross-worker remainder: each worker's last batch may be partial, and each sample comes exactly once.

With ``clips_per_video`` (:mod:`memdpc.pipeline.epoch_draw`), an epoch takes the samples drawn for it instead:
in an order drawn from ``(seed, epoch)``, divided into contiguous parts by rank (as DALI divides them) and
round-robin by worker; each worker reads its samples' byte ranges from the shards, nothing else.

Workers must not call ``cv2.setNumThreads``: after the parent process has used OpenCV's thread pool, that
call hangs in a forked child (seen with OpenCV 5.0). Workers leave SIGINT and SIGTERM to the main process
(:func:`_init_worker`). A worker killed by a signal (the out-of-memory killer's SIGKILL) is found where the
loader waits for its next batch, and the loader raises a :class:`~memdpc.common.errors.ResourceFault` naming
it and the signal, with a hint (:func:`_sigchld_kept`): training stops there, between two steps.
"""

from __future__ import annotations

import contextlib
import gc
import json
import random
import signal
import threading
import time
from collections.abc import Iterator
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

import cv2
import numpy as np
import torch
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from memdpc.common import interrupts
from memdpc.common.errors import ResourceFault, UserError, worker_death
from memdpc.pipeline.augment import (
    colour_frames,
    crop_box,
    crop_resize,
    eval_boxes,
    flow_flip_map,
    normalise,
    resize_frames,
    sample_clip,
)
from memdpc.pipeline.epoch_draw import Catalog, draw, rank_slice, read_catalog, read_sample, shuffled
from memdpc.pipeline.plan import Batch, LoaderPlan
from memdpc.pipeline.sample import INFO, LABEL, decode_label, frame_member, sample_key
from memdpc.preprocess.encode import is_planes, split_planes

__all__ = ["ClipTransform", "TorchLoader"]


def split_by_rank(src, rank: int, world_size: int):
    """``wds.split_by_node`` with an explicit rank."""
    yield from islice(src, rank, None, world_size)


def _to_rgb(frames_bgr: np.ndarray, maps: np.ndarray | None) -> np.ndarray:
    """BGR frames → RGB, through each frame's affine colour map (RGB in, RGB out) when there is one."""
    if maps is None:
        return np.ascontiguousarray(frames_bgr[..., ::-1])
    bgr_in = maps[:, :, [2, 1, 0, 3]]  # the map reads BGR pixels and writes RGB
    return colour_frames(frames_bgr, bgr_in)


def _decode(sample: dict, member: str, planes: int | None = None) -> np.ndarray:
    """One frame member of a sample, decoded to BGR (``planes``: a flow planes image, split into x, y and the
    constant ``planes`` as its third channel); UserError naming the shard, sample and member if its bytes are
    not an image."""
    data = np.frombuffer(sample[member], np.uint8)
    if planes is None:
        frame = cv2.imdecode(data, cv2.IMREAD_COLOR)
    else:
        grey = cv2.imdecode(data, cv2.IMREAD_GRAYSCALE)
        frame = None if grey is None else split_planes(grey, planes, bgr=True)
    if frame is None:
        url = sample.get("__url__")
        verify = f"memdpc shard --verify {Path(url).parent.parent}" if url else "memdpc shard --verify"
        raise UserError(
            f"{url or 'a shard'}: sample {sample.get('__key__', '?')}: {member} is not a decodable JPEG "
            f"(a damaged shard: `{verify}` checks them)"
        )
    return frame


class ClipTransform:
    """Decode one sample's 40 JPEGs and apply the spec (train draw or eval crops), with boxes relative to the
    sample's own frame size: uint8 RGB out, ``size`` × ``size``."""

    def __init__(self, plan: LoaderPlan) -> None:
        self.plan = plan
        self._planes = plan.third_channel if is_planes(plan.encoding) else None

    def __call__(self, sample: dict, rng: np.random.Generator) -> dict:
        p = self.plan
        frames = np.stack(  # (F, H, W, 3) BGR
            [_decode(sample, frame_member(i), self._planes) for i in range(p.num_frames)]
        )
        if p.train and p.spec.enabled:
            video = self._train(frames, rng)
        else:
            views = [
                self._view(frames, box, flipped)
                for box, flipped in eval_boxes(*frames.shape[1:3], p.views, p.spec)
            ]
            video = views[0] if len(views) == 1 else np.stack(views)
        meta = json.loads(sample[INFO])
        return {
            "video": video,
            "label": decode_label(sample[LABEL]),
            "key": sample_key(meta["video_id"], meta["start"]),
            "video_id": meta["video_id"],
        }

    def _train(self, frames: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        p = self.plan
        c = sample_clip(rng, p.num_frames, p.stream, p.spec, p.num_blocks)
        box = crop_box(*frames.shape[1:3], c.crop, p.spec)
        return _to_rgb(crop_resize(frames, box, c.flip, p.size, p.spec), c.colour)

    def _view(self, frames: np.ndarray, box, flipped: bool) -> np.ndarray:
        y0, x0, h, w = box
        video = resize_frames(frames[:, y0 : y0 + h, x0 : x0 + w], self.plan.size)
        if flipped:
            video = video[:, :, ::-1]
        maps = None
        if flipped and self.plan.stream == "flow":
            maps = np.tile(flow_flip_map().astype(np.float32), (len(video), 1, 1))
        return _to_rgb(video, maps)


ERROR = "error"  # the key of the item that ends a stream with a damaged sample's message


def _collate(samples: list[dict]) -> dict:
    return {
        "video": torch.from_numpy(np.stack([s["video"] for s in samples])),
        "label": torch.tensor([s["label"] for s in samples], dtype=torch.int64),
        "key": [s["key"] for s in samples],
        "video_id": [s["video_id"] for s in samples],
    }


class ClipStream(IterableDataset):
    """One rank's samples for one epoch, as batches of uint8 clips (split further by DataLoader worker).
    ``drawn``: the rank's drawn samples in order, as (tar, byte range), where the epoch takes those only."""

    def __init__(
        self, plan: LoaderPlan, epoch: int, drawn: list[tuple[str, tuple[int, int]]] | None = None
    ) -> None:
        self.plan, self.epoch, self.drawn = plan, epoch, drawn

    def __iter__(self) -> Iterator[dict]:
        """The batches; a damaged sample ends the stream with ``{ERROR: message}`` (DataLoader would turn its
        UserError into a traceback of the worker)."""
        try:
            yield from self._batches()
        except UserError as e:
            yield {ERROR: str(e)}

    def _batches(self) -> Iterator[dict]:
        p = self.plan
        info = get_worker_info()
        worker = info.id if info else 0
        seed = [p.seed, self.epoch, p.rank, worker]
        rng = np.random.default_rng(seed)
        transform = ClipTransform(p)
        batched = wds.batched(p.batch_size, collation_fn=_collate, partial=not p.drop_last)
        if self.drawn is not None:
            mine = self.drawn[worker :: info.num_workers if info else 1]
            yield from wds.DataPipeline(
                partial(_read_drawn, mine), wds.map(lambda s: transform(s, rng)), batched
            )
            return
        stages = [
            wds.SimpleShardList([str(t) for t, _ in p.shards]),
            partial(split_by_rank, rank=p.rank, world_size=p.world_size),
            wds.split_by_worker,
        ]
        if p.train:
            stages += [wds.shuffle(1000, initial=1000, rng=random.Random(str(seed + [0])))]
        stages += [wds.tarfile_to_samples()]
        if p.train:
            buf = max(1, p.shuffle_buffer)
            stages += [wds.shuffle(buf, initial=buf, rng=random.Random(str(seed + [1])))]
        stages += [wds.map(lambda s: transform(s, rng)), batched]
        yield from wds.DataPipeline(*stages)


def _read_drawn(samples: list[tuple[str, tuple[int, int]]]) -> Iterator[dict]:
    """The given samples, each read by its byte range (one open file per shard)."""
    files: dict[str, BinaryIO] = {}
    try:
        for tar, span in samples:
            if tar not in files:
                files[tar] = open(tar, "rb")  # noqa: SIM115 — closed below
            yield {**read_sample(files[tar], span), "__url__": tar}  # the shard, as webdataset names it
    finally:
        for f in files.values():
            f.close()


def _init_worker(worker_id: int) -> None:
    """``worker_init_fn``. The objects a forked worker inherits are frozen out of its garbage collector: one may
    be a DALI pipeline the parent no longer references (freed only by a collection, a reference cycle), whose
    destructor aborts or hangs in a process without the pipeline's threads. The worker starts with its collector
    off (:func:`_start_workers`), so nothing is collected before this runs; it is turned on after the freeze.
    The main process stops its workers through the loader (interrupts.py)."""
    gc.freeze()
    gc.enable()
    interrupts.leave_signals_to_parent()


def _start_workers(loader: DataLoader) -> Iterator[Any]:
    """The loader's iterator, its worker processes forked with the garbage collector off: a worker allocates
    (torch seeds itself, formatting a stack) before its ``worker_init_fn`` runs, and a collection there could
    destroy an inherited DALI pipeline (a hang, seen under load)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        return iter(loader)
    finally:
        if was_on:
            gc.enable()


class TorchLoader:
    """Iterable over :class:`Batch` for one rank; ``len()`` = batches per epoch; ``set_epoch`` reshuffles."""

    def __init__(self, plan: LoaderPlan) -> None:
        self.plan = plan
        self.epoch = 0
        self._catalog: Catalog | None = read_catalog(plan.shards) if plan.clips_per_video else None
        self._len = self._batches()

    def _batches(self) -> int:
        p = self.plan
        workers = max(1, p.num_workers)

        def per_rank(rank: int) -> list[int]:
            if self._catalog is not None:
                n = self._catalog.drawn_count(p.clips_per_video)
                mine = range(n)[rank_slice(n, rank, p.world_size)]
                return [len(mine[w::workers]) for w in range(workers)]
            mine = p.shard_samples[rank :: p.world_size]
            return [sum(mine[w::workers]) for w in range(workers)]

        if p.drop_last:
            return min(sum(n // p.batch_size for n in per_rank(r)) for r in range(p.world_size))
        return sum(-(-n // p.batch_size) for n in per_rank(p.rank))

    def __len__(self) -> int:
        return self._len

    @property
    def samples_per_epoch(self) -> int:
        """The samples an epoch reads, over all ranks."""
        if self._catalog is not None:
            return self._catalog.drawn_count(self.plan.clips_per_video)
        return sum(self.plan.shard_samples)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _drawn(self) -> list[tuple[str, tuple[int, int]]] | None:
        """This rank's part of the epoch's drawn samples, in the epoch's order (None: every sample)."""
        c, p = self._catalog, self.plan
        if c is None:
            return None
        order = shuffled(draw(c, p.clips_per_video, p.seed, self.epoch), p.seed, self.epoch)
        mine = order[rank_slice(len(order), p.rank, p.world_size)]
        return [(str(c.shards[c.shard[i]][0]), (int(c.span[i, 0]), int(c.span[i, 1]))) for i in mine]

    def __iter__(self) -> Iterator[Batch]:
        p = self.plan
        loader = DataLoader(
            ClipStream(p, self.epoch, self._drawn()),
            batch_size=None,
            num_workers=p.num_workers,
            worker_init_fn=_init_worker,
            pin_memory=p.device.startswith("cuda"),
        )
        device = torch.device(p.device)
        batches = None
        try:
            with _sigchld_kept():
                batches = _start_workers(loader)
            for i, out in enumerate(batches):
                if i >= self._len:
                    break
                if ERROR in out:
                    raise UserError(out[ERROR])
                yield Batch(
                    clips=normalise(out["video"].to(device, non_blocking=True), p.num_blocks, p.spec),
                    labels=out["label"].to(device),
                    keys=out["key"],
                    video_ids=out["video_id"],
                )
        except UserError:  # a damaged sample, which a worker sent
            raise
        except Exception:
            # A SIGINT or SIGTERM sent to the whole process group can reach a worker that has not yet left it to
            # this process (worker_init_fn). The loader then fails in whatever it was doing with that worker:
            # "worker … exited unexpectedly" (RuntimeError), or a batch in flight whose shared memory the dead
            # worker held (ConnectionResetError, EOFError). With a stop signal waiting, that is the interrupt
            interrupts.check()
            killed = _killed_worker(batches)
            if killed is not None:  # else a worker's own error, which DataLoader re-raises with its traceback
                raise ResourceFault(
                    f"a data loader worker (pid {killed[0]}) was {worker_death(killed[1])}"
                ) from None
            raise


@contextlib.contextmanager
def _sigchld_kept() -> Iterator[None]:
    """Keep this process's SIGCHLD handler across the block. DataLoader installs one (once per process) that
    raises "worker killed" wherever the main thread then is, halfway through an optimiser step or a checkpoint's
    write; without it a dead worker is found where the loader waits for its next batch (:func:`_killed_worker`),
    between two steps. A no-op outside the main thread, where handlers cannot change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGCHLD)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGCHLD, previous)


WORKER_REAPED = 1.0  # seconds a worker whose pipe broke may take to be seen dead


def _killed_worker(batches) -> tuple[int, int] | None:
    """(pid, exit code) of a worker of the DataLoader iterator ``batches`` that a signal killed (SIGKILL first:
    the out-of-memory killer's), or None. A worker whose pipe broke is given a moment to be seen dead."""
    workers = getattr(batches, "_workers", [])  # no public way to see DataLoader's worker processes
    deadline = time.monotonic() + WORKER_REAPED
    while True:
        dead = sorted(
            (code != -signal.SIGKILL, w.pid, code) for w in workers if (code := w.exitcode or 0) < 0
        )
        if dead:
            return dead[0][1], dead[0][2]
        if not workers or time.monotonic() > deadline:
            return None
        time.sleep(0.05)
