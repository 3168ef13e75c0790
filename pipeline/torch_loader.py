"""The torch reference loader: ``webdataset`` + ``DataLoader`` + OpenCV, with the augmentation spec's draws.

Shards are split by rank (``shards[rank::world_size]``, what ``wds.split_by_node`` does, but with the rank
given to :func:`make_loader`, so simulated ranks work without ``torch.distributed``), then by DataLoader
worker (``wds.split_by_worker``); the assignment is fixed, so ``len()`` is known up front, and each worker
of each rank reads at least one shard. Per epoch, train mode shuffles each worker's shard order and its
samples (in a buffer), seeded from ``(seed, epoch, rank, worker)``. Workers batch, so an epoch has no
cross-worker remainder: each worker's last batch may be partial, and each sample comes exactly once.

Workers must not call ``cv2.setNumThreads``: after the parent process has used OpenCV's thread pool, that
call hangs in a forked child (seen with OpenCV 5.0). Workers leave SIGINT and SIGTERM to the main process
(:func:`_leave_signals_to_main`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from functools import partial
from itertools import islice

import cv2
import numpy as np
import torch
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from memdpc import interrupts
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
from memdpc.pipeline.plan import Batch, LoaderPlan
from memdpc.pipeline.sample import INFO, LABEL, decode_label, frame_member, sample_key


def split_by_rank(src, rank: int, world_size: int):
    """``wds.split_by_node`` with an explicit rank."""
    yield from islice(src, rank, None, world_size)


def _to_rgb(frames_bgr: np.ndarray, maps: np.ndarray | None) -> np.ndarray:
    """BGR frames → RGB, through each frame's affine colour map (RGB in, RGB out) when there is one."""
    if maps is None:
        return np.ascontiguousarray(frames_bgr[..., ::-1])
    bgr_in = maps[:, :, [2, 1, 0, 3]]  # the map reads BGR pixels and writes RGB
    return colour_frames(frames_bgr, bgr_in)


class ClipTransform:
    """Decode one sample's 40 JPEGs and apply the spec (train draw or eval crops), with boxes relative to the
    sample's own frame size: uint8 RGB out, ``size`` × ``size``."""

    def __init__(self, plan: LoaderPlan) -> None:
        self.plan = plan

    def __call__(self, sample: dict, rng: np.random.Generator) -> dict:
        p = self.plan
        frames = np.stack(
            [
                cv2.imdecode(np.frombuffer(sample[frame_member(i)], np.uint8), cv2.IMREAD_COLOR)
                for i in range(p.num_frames)
            ]
        )  # (F, H, W, 3) BGR
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
        c = sample_clip(rng, p.num_frames, p.stream, p.spec)
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


def _collate(samples: list[dict]) -> dict:
    return {
        "video": torch.from_numpy(np.stack([s["video"] for s in samples])),
        "label": torch.tensor([s["label"] for s in samples], dtype=torch.int64),
        "key": [s["key"] for s in samples],
        "video_id": [s["video_id"] for s in samples],
    }


class ClipStream(IterableDataset):
    """One rank's samples for one epoch, as batches of uint8 clips (split further by DataLoader worker)."""

    def __init__(self, plan: LoaderPlan, epoch: int) -> None:
        self.plan, self.epoch = plan, epoch

    def __iter__(self) -> Iterator[dict]:
        p = self.plan
        info = get_worker_info()
        worker = info.id if info else 0
        seed = [p.seed, self.epoch, p.rank, worker]
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
        rng = np.random.default_rng(seed)
        transform = ClipTransform(p)
        stages += [
            wds.map(lambda s: transform(s, rng)),
            wds.batched(p.batch_size, collation_fn=_collate, partial=not p.drop_last),
        ]
        yield from wds.DataPipeline(*stages)


def _leave_signals_to_main(worker_id: int) -> None:
    """``worker_init_fn``: the main process stops its workers through the loader (interrupts.py)."""
    interrupts.leave_signals_to_parent()


class TorchLoader:
    """Iterable over :class:`Batch` for one rank; ``len()`` = batches per epoch; ``set_epoch`` reshuffles."""

    def __init__(self, plan: LoaderPlan) -> None:
        self.plan = plan
        self.epoch = 0
        self._len = self._batches()

    def _batches(self) -> int:
        p = self.plan
        workers = max(1, p.num_workers)

        def per_rank(rank: int) -> list[int]:
            mine = p.shard_samples[rank :: p.world_size]
            return [sum(mine[w::workers]) for w in range(workers)]

        if p.drop_last:
            return min(sum(n // p.batch_size for n in per_rank(r)) for r in range(p.world_size))
        return sum(-(-n // p.batch_size) for n in per_rank(p.rank))

    def __len__(self) -> int:
        return self._len

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Batch]:
        p = self.plan
        loader = DataLoader(
            ClipStream(p, self.epoch),
            batch_size=None,
            num_workers=p.num_workers,
            worker_init_fn=_leave_signals_to_main,
            pin_memory=p.device.startswith("cuda"),
        )
        device = torch.device(p.device)
        for i, out in enumerate(loader):
            if i >= self._len:
                break
            yield Batch(
                clips=normalise(out["video"].to(device, non_blocking=True), p.num_blocks, p.spec),
                labels=out["label"].to(device),
                keys=out["key"],
                video_ids=out["video_id"],
            )
