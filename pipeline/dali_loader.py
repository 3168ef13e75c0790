"""The DALI loader: WebDataset shards → decoded, augmented clips, on the GPU (``mixed`` decode) or the CPU.

Graph (one per epoch, so an epoch is reproducible from ``(seed, epoch)`` alone)::

    readers.webdataset (index files, shard_id/num_shards = rank/world size, pad_last_batch)
      train: 40 × decoders.image_slice (only the clip's crop box is decoded) → stack to (F, h, w, 3)
             → resize (a mirrored ROI flips) to crop_size → resize to the output size
             (+ the per-frame colour maps, applied on the target device by apply_colour: DALI's CPU
             coord_transform costs ~25× cv2.transform, ~35 ms per clip)
      eval:  40 × decoders.image → stack → one slice/resize per crop (+ flip) → stack to (K, F, H, W, 3)

Random parameters come from :mod:`memdpc.pipeline.augment` through an ``external_source``, the same draws
the torch loader uses. The pipeline returns uint8; normalisation to float runs on the target device.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import torch

from memdpc.pipeline.augment import apply_colour, eval_boxes, flow_flip_map, normalise, sample_clip
from memdpc.pipeline.loader import Batch, LoaderPlan


def _dali():
    from nvidia.dali import fn, pipeline, types

    return fn, pipeline, types


class DaliLoader:
    """Iterable over :class:`Batch` for one rank; ``len()`` = batches per epoch; ``set_epoch`` reshuffles."""

    def __init__(self, plan: LoaderPlan) -> None:
        self.plan = plan
        self.epoch = 0
        self._gpu = plan.device.startswith("cuda")
        # All JPEGs to the hardware decoder where the GPU has one (A100, H100, H200): on an H200, 698 clips/s
        # against 600 with DALI's default split (0.65) and 524 with none (bench loader shards, batch 64).
        self._decode = {"device": "mixed", "hw_decoder_load": 1.0} if self._gpu else {"device": "cpu"}
        colour = (
            plan.train and plan.spec.enabled and (plan.spec.colour_on(plan.stream) or plan.stream == "flow")
        )
        self._outputs = ["video", "label", "meta"] + (["colour"] if colour else [])
        total = sum(plan.shard_samples)
        lo, hi = (total * plan.rank) // plan.world_size, (total * (plan.rank + 1)) // plan.world_size
        self._rank_samples = hi - lo  # DALI's own split of the sample sequence into num_shards parts
        smallest = total // plan.world_size
        if plan.drop_last:
            self._len = smallest // plan.batch_size
        else:
            self._len = -(-self._rank_samples // plan.batch_size)

    def __len__(self) -> int:
        return self._len

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Batch]:
        from nvidia.dali.plugin.base_iterator import LastBatchPolicy
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        pipe = self._build(self.epoch)
        policy = LastBatchPolicy.DROP if self.plan.drop_last else LastBatchPolicy.PARTIAL
        it = DALIGenericIterator(
            [pipe],
            self._outputs,
            reader_name="reader",
            last_batch_policy=policy,
            auto_reset=False,
        )
        try:
            for i, out in enumerate(it):
                if i >= self._len:
                    break
                yield self._batch(out[0])
        finally:
            del it, pipe

    # ------------------------------------------------------------------------------------------ graph
    def _paths(self, epoch: int) -> list:
        """Train: the shard order changes every epoch, the same on every rank (so ranks still partition)."""
        shards = list(self.plan.shards)
        if self.plan.train:
            order = np.random.default_rng([self.plan.seed, epoch, 7]).permutation(len(shards))
            shards = [shards[i] for i in order]
        return shards

    def _build(self, epoch: int):
        fn, pipeline, types = _dali()
        p = self.plan
        pipe = pipeline.Pipeline(
            batch_size=p.batch_size,
            num_threads=max(1, p.num_workers),
            device_id=self._device_id(),
            seed=int(np.random.default_rng([p.seed, epoch, p.rank]).integers(2**31)),
            prefetch_queue_depth=2,
        )
        shards = self._paths(epoch)
        exts = [f"f{i:02d}.jpg" for i in range(p.num_frames)] + ["cls", "json"]
        with pipe:
            outs = fn.readers.webdataset(
                paths=[str(t) for t, _ in shards],
                index_paths=[str(i) for _, i in shards],
                ext=exts,
                dtypes=[types.UINT8] * p.num_frames + [types.INT32, types.UINT8],
                missing_component_behavior="error",
                shard_id=p.rank,
                num_shards=p.world_size,
                random_shuffle=p.train,
                initial_fill=max(1, min(p.shuffle_buffer, sum(p.shard_samples))),
                pad_last_batch=True,
                name="reader",
            )
            colour = []
            if p.train and p.spec.enabled:
                video, colour = self._train_ops(outs[: p.num_frames], epoch)
            else:
                video = self._eval_ops(outs[: p.num_frames])
            pipe.set_outputs(video, outs[p.num_frames], fn.pad(outs[p.num_frames + 1], fill_value=0), *colour)
        pipe.build()
        return pipe

    def _device_id(self) -> int | None:
        if not self._gpu:
            return None
        dev = torch.device(self.plan.device)
        return dev.index if dev.index is not None else torch.cuda.current_device()

    def _train_ops(self, encoded: list, epoch: int):
        """Decode only each frame's crop (one box per clip), resize (flip = a mirrored ROI); also return the
        per-frame colour maps (when the stream gets any) for :func:`apply_colour` on the target device."""
        fn, _, types = _dali()
        p = self.plan
        colour = "colour" in self._outputs
        draws = fn.external_source(
            source=self._draw(epoch), num_outputs=5 if colour else 4, batch=True, batch_info=True
        )
        anchor, shape, roi_start, roi_end = draws[:4]
        frames = [
            fn.decoders.image_slice(
                f,
                anchor,
                shape,
                output_type=types.RGB,
                axis_names="HW",
                normalized_anchor=False,
                normalized_shape=False,
                **self._decode,
            )
            for f in encoded
        ]
        seq = fn.stack(*frames, axis_name="F")  # (F, h, w, 3): the crop of every frame
        first = p.spec.crop_size or p.size
        # DALI's CPU resize is ~20 % faster without its antialiasing filter, which only matters when shrinking
        # by more than ~1.25× (256² frames: crops of at most 256 px go to 224, a 1.14× shrink at most)
        shrink = max(p.frame_size) / first
        video = fn.resize(seq, roi_start=roi_start, roi_end=roi_end, size=[first, first], antialias=shrink > 1.25)
        if first != p.size:
            video = fn.resize(video, size=[p.size, p.size], antialias=True)
        return video, list(draws[4:])

    def _draw(self, epoch: int):
        """external_source callback: the augmentation draws of one batch, from (seed, epoch, rank, batch)."""
        p = self.plan
        colour = "colour" in self._outputs
        identity = np.tile(np.eye(3, 4, dtype=np.float32), (p.num_frames, 1, 1))

        def draw(info):
            rng = np.random.default_rng([p.seed, epoch, p.rank, info.iteration])
            cols: list[list[np.ndarray]] = [[], [], [], [], []]
            for _ in range(p.batch_size):
                c = sample_clip(rng, p.frame_size, p.num_frames, p.stream, p.spec)
                y0, x0, h, w = c.box
                cols[0].append(np.array([y0, x0], np.float32))
                cols[1].append(np.array([h, w], np.float32))
                cols[2].append(np.array([0, w if c.flip else 0], np.float32))
                cols[3].append(np.array([h, 0 if c.flip else w], np.float32))
                cols[4].append(c.colour if c.colour is not None else identity)
            return tuple(cols) if colour else tuple(cols[:4])

        return draw

    def _eval_ops(self, encoded: list):
        fn, _, types = _dali()
        p = self.plan
        frames = [fn.decoders.image(f, output_type=types.RGB, **self._decode) for f in encoded]
        seq = fn.stack(*frames, axis_name="F")  # (F, H, W, 3)
        views = []
        for (y0, x0, h, w), flipped in eval_boxes(*p.frame_size, p.views, p.spec):
            if (h, w) == (p.size, p.size):
                v = fn.slice(seq, start=[y0, x0], shape=[h, w], axis_names="HW")
                v = fn.flip(v, horizontal=1) if flipped else v
            else:
                x_a, x_b = (x0 + w, x0) if flipped else (x0, x0 + w)
                v = fn.resize(
                    seq, roi_start=[y0, x_a], roi_end=[y0 + h, x_b], size=[p.size, p.size], antialias=True
                )
            if flipped and p.stream == "flow":
                v = fn.coord_transform(
                    v, MT=flow_flip_map().astype(np.float32).ravel().tolist(), dtype=types.UINT8
                )
            views.append(v)
        return views[0] if len(views) == 1 else fn.stack(*views, axis_name="K")

    # ------------------------------------------------------------------------------------------ batch
    def _batch(self, out: dict) -> Batch:
        p = self.plan
        device = torch.device(p.device)
        frames = out["video"].to(device, non_blocking=True)
        if "colour" in out:
            frames = apply_colour(frames, out["colour"])
        clips = normalise(frames, p.num_blocks, p.spec)
        metas = [json.loads(bytes(row).rstrip(b"\0")) for row in out["meta"].cpu().numpy()]
        return Batch(
            clips=clips,
            labels=out["label"].reshape(-1).long().to(device),
            keys=[f"{m['video_id']}_{m['start']:05d}" for m in metas],
            video_ids=[m["video_id"] for m in metas],
        )
