"""The DALI loader: WebDataset shards → decoded, augmented clips, on the GPU (``mixed`` decode) or the CPU.

Graph (one per epoch, so an epoch is reproducible from ``(seed, epoch)`` alone)::

    readers.webdataset (index files, shard_id/num_shards = rank/world size, pad_last_batch)
      train: 40 × decoders.image (whole frames)
             GPU: stack to (F, H, W, 3) → resize of the crop (a mirrored ROI flips) to crop_size → resize to
             the output size
             CPU: the 40 frames (unstacked) and the draws go to the host, where OpenCV crops, resizes and flips
             them (crop_resize, the torch loader's code) in a thread pool: DALI's CPU resize is slower than its
             decode
             (+ the per-frame colour maps, applied on the target device: DALI's CPU coord_transform costs
             far more than cv2.transform)
      eval:  40 × decoders.image → stack → one slice/resize per crop (+ flip) → stack to (K, F, H, W, 3)

Random parameters come from :mod:`memdpc.pipeline.augment` through an ``external_source``, the same draws
the torch loader uses. The pipeline returns uint8; normalisation to float runs on the target device.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from memdpc.pipeline.augment import (
    apply_colour,
    colour_frames,
    crop_resize,
    eval_boxes,
    flow_flip_map,
    normalise,
    sample_clip,
)
from memdpc.pipeline.plan import Batch, LoaderPlan
from memdpc.pipeline.sample import sample_key, sample_members
from memdpc.preprocess.encode import gpu_decodes_alike


def _dali():
    from nvidia.dali import fn, pipeline, types

    return fn, pipeline, types


class DaliLoader:
    """Iterable over :class:`Batch` for one rank; ``len()`` = batches per epoch; ``set_epoch`` reshuffles.

    ``host_geometry=False`` runs the GPU's graph (DALI crops and resizes) on the CPU too, for comparison.
    """

    def __init__(self, plan: LoaderPlan, host_geometry: bool | None = None) -> None:
        self.plan = plan
        self.epoch = 0
        self._gpu = plan.device.startswith("cuda")
        # On the GPU every JPEG goes to the hardware decoder (A100, H100, H200), faster than DALI's default split
        # between it and the CUDA decoder (README, Loaders). Encodings nvJPEG misreads decode on the CPU and are
        # uploaded (see gpu_decodes_alike).
        mixed = self._gpu and gpu_decodes_alike(plan.encoding)
        self._decode = {"device": "mixed", "hw_decoder_load": 1.0} if mixed else {"device": "cpu"}
        self._upload = self._gpu and not mixed
        # The training crop's two resizes: DALI's on the GPU; on the CPU OpenCV's (crop_resize, as in the torch
        # loader) in a thread pool, since DALI's CPU resize costs more than OpenCV's, more than the decode itself
        # (README, Loaders).
        self._host_geometry = not self._gpu if host_geometry is None else host_geometry
        if self._host_geometry and self._gpu:
            raise ValueError("host_geometry is for the CPU pipeline")
        augment = plan.train and plan.spec.enabled
        colour = augment and (plan.spec.colour_on(plan.stream) or plan.stream == "flow")
        geometry = ("box", "flip") if self._host_geometry else ("roi_start", "roi_end")
        self._draw_names = (geometry + (("colour",) if colour else ())) if augment else ()
        self._host_draws = [n for n in self._draw_names if n not in ("roi_start", "roi_end")]
        self._host_augment = self._host_geometry and augment
        # the host gets the frames unstacked (DALI's CPU stack of 40 frames cost a quarter of the decode graph's
        # time) and the draws it still has to apply
        self._frame_outputs = [f"f{i:02d}" for i in range(plan.num_frames)]
        video = self._frame_outputs if self._host_augment else ["video"]
        self._outputs = [*video, "label", "meta", *self._host_draws]
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
        pool = ThreadPoolExecutor(max(1, self.plan.num_workers)) if self._host_augment else None
        try:
            for i, out in enumerate(it):
                if i >= self._len:
                    break
                yield self._batch(out[0], pool)
        finally:
            if pool is not None:
                pool.shutdown()
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
        exts = sample_members(p.num_frames)
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
            host = []
            if p.train and p.spec.enabled:
                video, host = self._train_ops(outs[: p.num_frames], epoch)
            else:
                video = self._eval_ops(outs[: p.num_frames])
            videos = video if isinstance(video, list) else [video]
            pipe.set_outputs(*videos, outs[p.num_frames], fn.pad(outs[p.num_frames + 1], fill_value=0), *host)
        pipe.build()
        return pipe

    def _device_id(self) -> int | None:
        if not self._gpu:
            return None
        dev = torch.device(self.plan.device)
        return dev.index if dev.index is not None else torch.cuda.current_device()

    def _train_ops(self, encoded: list, epoch: int):
        """Decode whole frames (nvJPEG has no region-of-interest decoding); on the GPU resize the crop (flip =
        a mirrored ROI). Also returns the draws the host applies: the crop box and flip when OpenCV resizes,
        the per-frame colour maps (when the stream gets any) for :func:`apply_colour` on the target device."""
        fn, _, types = _dali()
        p = self.plan
        draws = fn.external_source(
            source=self._draw(epoch), num_outputs=len(self._draw_names), batch=True, batch_info=True
        )
        d = dict(zip(self._draw_names, draws, strict=True))
        frames = [fn.decoders.image(f, output_type=types.RGB, **self._decode) for f in encoded]
        host = [d[name] for name in self._host_draws]
        if self._host_geometry:
            return frames, host
        seq = self._stack(frames)
        first = p.spec.crop_size or p.size
        # the antialiasing filter costs time and only matters when shrinking by more than ~1.25× (256² frames:
        # crops of at most 256 px go to 224, a 1.14× shrink at most)
        shrink = max(p.frame_size) / first
        video = fn.resize(
            seq, roi_start=d["roi_start"], roi_end=d["roi_end"], size=[first, first], antialias=shrink > 1.25
        )
        if first != p.size:
            video = fn.resize(video, size=[p.size, p.size], antialias=True)
        return video, host

    def _draw(self, epoch: int):
        """external_source callback: the augmentation draws of one batch, from (seed, epoch, rank, batch)."""
        p = self.plan
        identity = np.tile(np.eye(3, 4, dtype=np.float32), (p.num_frames, 1, 1))

        def draw(info):
            rng = np.random.default_rng([p.seed, epoch, p.rank, info.iteration])
            cols: dict[str, list[np.ndarray]] = {name: [] for name in self._draw_names}
            for _ in range(p.batch_size):
                c = sample_clip(rng, p.frame_size, p.num_frames, p.stream, p.spec)
                y0, x0, h, w = c.box
                row = {
                    "box": np.array(c.box, np.int32),
                    "flip": np.array([c.flip], np.int32),
                    "roi_start": np.array([y0, x0 + (w if c.flip else 0)], np.float32),
                    "roi_end": np.array([y0 + h, x0 + (0 if c.flip else w)], np.float32),
                    "colour": c.colour if c.colour is not None else identity,
                }
                for name, col in cols.items():
                    col.append(row[name])
            return tuple(cols.values())

        return draw

    def _stack(self, frames: list):
        """The decoded frames as one (F, H, W, 3) sequence, on the GPU when the graph runs there."""
        fn, _, _ = _dali()
        seq = fn.stack(*frames, axis_name="F")
        return seq.gpu() if self._upload else seq

    def _eval_ops(self, encoded: list):
        fn, _, types = _dali()
        p = self.plan
        seq = self._stack([fn.decoders.image(f, output_type=types.RGB, **self._decode) for f in encoded])
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
    def _batch(self, out: dict, pool: ThreadPoolExecutor | None) -> Batch:
        p = self.plan
        device = torch.device(p.device)
        if pool is not None:
            frames = self._host_train(out, pool)
        else:
            frames = out["video"].to(device, non_blocking=True)
            if "colour" in out:
                frames = apply_colour(frames, out["colour"])
        clips = normalise(frames, p.num_blocks, p.spec)
        metas = [json.loads(bytes(row).rstrip(b"\0")) for row in out["meta"].cpu().numpy()]
        return Batch(
            clips=clips,
            labels=out["label"].reshape(-1).long().to(device),
            keys=[sample_key(m["video_id"], m["start"]) for m in metas],
            video_ids=[m["video_id"] for m in metas],
        )

    def _host_train(self, out: dict, pool: ThreadPoolExecutor) -> torch.Tensor:
        """OpenCV's crop, resizes, flip and colour maps on DALI's decoded frames, one clip per pool thread
        (OpenCV releases the GIL)."""
        p = self.plan
        frames = [out[name].numpy() for name in self._frame_outputs]  # F × (B, H, W, 3)
        boxes, flips = out["box"].numpy(), out["flip"].numpy()
        maps = out["colour"].numpy() if "colour" in out else None

        def one(i: int) -> np.ndarray:
            clip = [f[i] for f in frames]
            clip = crop_resize(clip, tuple(int(v) for v in boxes[i]), bool(flips[i, 0]), p.size, p.spec)
            return colour_frames(clip, maps[i]) if maps is not None else np.ascontiguousarray(clip)

        return torch.from_numpy(np.stack(list(pool.map(one, range(len(boxes))))))
