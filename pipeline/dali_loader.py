"""The DALI loader: WebDataset shards → decoded, augmented clips, on the GPU (``mixed`` decode) or the CPU.

Graph (one per epoch, so an epoch is reproducible from ``(seed, epoch)`` alone)::

    readers.webdataset (index files, shard_id/num_shards = rank/world size, pad_last_batch)
      train: 40 × decoders.image (whole frames; flow planes images in greyscale, then split into x, y, third)
             GPU: stack to (F, H, W, 3) → resize of the crop (a mirrored ROI flips) to crop_size → resize to
             the output size; the crop box is computed in the graph from the draw and the sample's frame size
             CPU: the 40 frames (unstacked; padded to the batch's largest frame where the shards mix sizes),
             their size and the draws go to the host, where OpenCV crops, resizes and flips them
             (crop_box + crop_resize, the torch loader's code) in a thread pool: DALI's CPU resize is slower
             than its decode
             (+ the per-frame colour maps, applied on the target device: DALI's CPU coord_transform costs
             far more than cv2.transform)
      eval:  40 × decoders.image → stack → one resize per crop of the sample's frames (+ flip; a slice
             where all frames have one size and the crops the output's) → stack to (K, F, H, W, 3)

With ``clips_per_video`` (:mod:`memdpc.pipeline.epoch_draw`) the reader of an epoch is given, in a temporary
folder, indexes that list only the samples drawn for the epoch: it reads (and the graph decodes) those alone,
divided among the ranks as any sample sequence.

Random parameters come from :mod:`memdpc.pipeline.augment` through an ``external_source``, the same draws
the torch loader uses. They do not depend on the frame size: a sample's size is known only inside the graph
(from its first JPEG's header, ``peek_image_shape``), where :func:`crop_box_graph` and
:func:`eval_boxes_graph` compute ``augment.crop_box`` and ``augment.eval_boxes`` with DALI's arithmetic.
The pipeline returns uint8; normalisation to float runs on the target device.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memdpc.common.errors import UserError
from memdpc.pipeline.augment import (
    CROP_TRIES,
    AugmentSpec,
    apply_colour,
    colour_frames,
    crop_box,
    crop_resize,
    eval_boxes,
    flow_flip_map,
    normalise,
    sample_clip,
)
from memdpc.pipeline.epoch_draw import draw, read_catalog, write_drawn_indexes
from memdpc.pipeline.plan import Batch, LoaderPlan
from memdpc.pipeline.sample import sample_key, sample_members
from memdpc.preprocess.encode import PLANE_BLOCK, gpu_decodes_alike, is_planes, planes_height, split_planes

__all__ = ["DaliLoader"]


def _dali():
    from nvidia.dali import fn, pipeline, types

    return fn, pipeline, types


# ------------------------------------------------------------------------- boxes in the graph (float64)
def _f64(value: float) -> Any:
    """A float64 constant of an arithmetic expression: only for values float32 holds exactly (DALI keeps a
    scalar constant of an expression as float32); :func:`_spec_constants` carries the others."""
    _, _, types = _dali()
    return types.Constant(float(value), dtype=types.FLOAT64)


def _spec_constants(spec: AugmentSpec) -> tuple[Any, Any, Any]:
    """The spec's numbers the boxes use (crop_aspect, eval_scale), float64 per sample from an external source,
    so that the graph computes with the same float64 values as ``augment``."""
    fn, _, _ = _dali()
    values = np.array([*spec.crop_aspect, spec.eval_scale], np.float64)
    node = fn.external_source(source=lambda info: values, batch=False)
    return node[0], node[1], node[2]


def frame_hw(encoded: Any, planes: bool = False) -> tuple[Any, Any]:
    """(height, width) of each sample's frames, float64 scalars, from the JPEG header of one frame (``planes``:
    of the flow field a planes image holds)."""
    fn, _, types = _dali()
    if planes:
        _, height = _planes_rows(encoded)
        width = fn.peek_image_shape(encoded, dtype=types.INT32)[1]
        return fn.cast(height, dtype=types.FLOAT64), fn.cast(width, dtype=types.FLOAT64)
    shape = fn.peek_image_shape(encoded, dtype=types.FLOAT64)  # (H, W, C)
    return shape[0], shape[1]


def _planes_rows(encoded: Any) -> tuple[Any, Any]:
    """(the y plane's first row, the flow field's height) of each sample's planes images, int32 scalars:
    :func:`memdpc.preprocess.encode.planes_offset` in DALI's arithmetic."""
    fn, _, types = _dali()
    rows = fn.peek_image_shape(encoded, dtype=types.INT32)[0]
    offset = (rows + (2 * PLANE_BLOCK - 1)) // (2 * PLANE_BLOCK) * PLANE_BLOCK
    return offset, rows - offset


def planes_graph(seq: Any, encoded: Any, third: int) -> Any:
    """Decoded planes images (F, H', W, 1), of one JPEG header ``encoded`` per sample → flow codes (F, H, W, 3):
    x, y and the constant ``third`` (:func:`memdpc.preprocess.encode.split_planes` in the graph)."""
    fn, _, types = _dali()
    offset, height = _planes_rows(encoded)
    x = fn.slice(seq, start=[0], shape=fn.stack(height), axes=[1])
    y = fn.slice(seq, start=fn.stack(offset), shape=fn.stack(height), axes=[1])
    return fn.coord_transform(fn.cat(x, y, axis=3), M=[1, 0, 0, 1, 0, 0], T=[0, 0, third], dtype=types.UINT8)


def crop_box_graph(h: Any, w: Any, draw: Any, spec: AugmentSpec) -> tuple[Any, Any, Any, Any]:
    """:func:`memdpc.pipeline.augment.crop_box` as DALI arithmetic on each sample's (h, w) (float64 scalars)
    and its draw (float64, the layout of ``augment.draw_crop``): (y0, x0, height, width) as float64 scalars.
    The same float64 operations in the same order, so the boxes are the same; the first fitting try is found
    without branching, as the largest of ``fits × (CROP_TRIES − try)``."""
    from nvidia.dali import math

    fn, _, types = _dali()
    half = _f64(0.5)
    target = (h * w) * draw[0:CROP_TRIES]
    aspect = draw[CROP_TRIES : 2 * CROP_TRIES]
    cws = math.floor(math.sqrt(target * aspect) + half)
    chs = math.floor(math.sqrt(target / aspect) + half)
    fits = (cws > _f64(0)) & (cws <= w) & (chs > _f64(0)) & (chs <= h)
    rank = fits * types.Constant(np.arange(CROP_TRIES, 0, -1, dtype=np.int64))  # 0 where it does not fit
    best = fn.reductions.max(rank)
    first = rank == best  # with best == 0 (none fits) every try matches: masked by `found` below

    def pick(values):  # the first fitting try's value (float64 reductions are not supported: via int64)
        chosen = fn.reductions.max(fn.cast(values, dtype=types.INT64) * first)
        return fn.cast(chosen, dtype=types.FLOAT64)

    found = best > 0
    lo, hi, _ = _spec_constants(spec)
    ratio = w / h
    narrow, wide = ratio < lo, ratio > hi
    fallback_cw = narrow * w + wide * math.floor(h * hi + half) + (1 - narrow - wide) * w
    fallback_ch = narrow * math.floor(w / lo + half) + wide * h + (1 - narrow - wide) * h
    cw = found * pick(cws) + (1 - found) * fallback_cw
    ch = found * pick(chs) + (1 - found) * fallback_ch
    pos_y, pos_x = draw[2 * CROP_TRIES], draw[2 * CROP_TRIES + 1]
    y0 = found * math.floor(pos_y * (h - ch + _f64(1))) + (1 - found) * math.floor((h - ch) / _f64(2))
    x0 = found * math.floor(pos_x * (w - cw + _f64(1))) + (1 - found) * math.floor((w - cw) / _f64(2))
    return y0, x0, ch, cw


def eval_boxes_graph(h: Any, w: Any, crops: int, spec: AugmentSpec) -> list[tuple[tuple, bool]]:
    """:func:`memdpc.pipeline.augment.eval_boxes` as DALI arithmetic on each sample's (h, w) (float64
    scalars): [((y0, x0, side, side) as float64 scalars, flipped)]."""
    from nvidia.dali import math

    short = math.min(h, w)
    if crops == 1:
        side = short
    else:
        side = math.max(math.floor(short * _spec_constants(spec)[2] + _f64(0.5)), _f64(1))
    y_end, x_end = h - side, w - side
    y_mid, x_mid = math.floor(y_end / _f64(2)), math.floor(x_end / _f64(2))
    if crops == 1:
        return [((y_mid, x_mid, side, side), False)]
    # the corners as end × 0 or 1: a lone float64 constant cannot be a DALI node, only part of an expression
    corners = [(y_end * _f64(a), x_end * _f64(b)) for a, b in ((0, 0), (0, 1), (1, 0), (1, 1))]
    corners.append((y_mid, x_mid))
    boxes = [((y, x, side, side), False) for y, x in corners]
    return boxes + [(b, True) for b, _ in boxes] if crops == 10 else boxes


def roi(box: tuple, flip: Any) -> tuple[Any, Any]:
    """A box as fn.resize's (roi_start, roi_end), float32 (y, x); mirrored (x from right to left) where
    ``flip`` (a bool, or a 0/1 float64 scalar per sample)."""
    fn, _, types = _dali()
    y0, x0, h, w = box
    if isinstance(flip, bool):
        x_a, x_b = (x0 + w, x0) if flip else (x0, x0 + w)
    else:
        x_a, x_b = x0 + w * flip, x0 + w * (1 - flip)
    start, end = fn.stack(y0, x_a), fn.stack(y0 + h, x_b)
    return fn.cast(start, dtype=types.FLOAT), fn.cast(end, dtype=types.FLOAT)


class DaliLoader:
    """Iterable over :class:`Batch` for one rank; ``len()`` = batches per epoch; ``set_epoch`` reshuffles.

    ``host_geometry=False`` runs the GPU's graph (DALI crops and resizes) on the CPU too, for comparison.
    """

    def __init__(self, plan: LoaderPlan, host_geometry: bool | None = None) -> None:
        self.plan = plan
        self.epoch = 0
        self._gpu = plan.device.startswith("cuda")
        # On the GPU every JPEG goes to the hardware decoder (A100, H100, H200), faster than DALI's default split
        # between it and the CUDA decoder (docs/benchmarks.md, Loaders). Encodings nvJPEG misreads decode on the CPU and are
        # uploaded (see gpu_decodes_alike).
        mixed = self._gpu and gpu_decodes_alike(plan.encoding)
        self._decode = {"device": "mixed", "hw_decoder_load": 1.0} if mixed else {"device": "cpu"}
        # flow planes images decode to greyscale, then split into the (x, y, third) image every later step reads
        self._planes = is_planes(plan.encoding)
        types = _dali()[2]
        self._decode["output_type"] = types.GRAY if self._planes else types.RGB
        self._upload = self._gpu and not mixed
        # The training crop's two resizes: DALI's on the GPU; on the CPU OpenCV's (crop_resize, as in the torch
        # loader) in a thread pool, since DALI's CPU resize costs more than OpenCV's, more than the decode itself
        # (docs/loaders.md).
        self._host_geometry = not self._gpu if host_geometry is None else host_geometry
        if self._host_geometry and self._gpu:
            raise ValueError("host_geometry is for the CPU pipeline")
        augment = plan.train and plan.spec.enabled
        colour = augment and (plan.spec.colour_on(plan.stream) or plan.stream == "flow")
        self._draw_names = (("crop", "flip") + (("colour",) if colour else ())) if augment else ()
        self._host_augment = self._host_geometry and augment
        self._host_draws = [n for n in self._draw_names if self._host_augment or n == "colour"]
        # the host gets the frames unstacked (DALI's CPU stack of 40 frames cost a quarter of the decode graph's
        # time), their size, and the draws it still has to apply; frames of several sizes in one batch are
        # padded to the largest (a batch leaves DALI as one tensor per output), the size says where they end
        self._pad = len(plan.frame_sizes) != 1
        self._frame_outputs = [f"f{i:02d}" for i in range(plan.num_frames)]
        video = [*self._frame_outputs, "shape"] if self._host_augment else ["video"]
        self._outputs = [*video, "label", "meta", *self._host_draws]
        self._catalog = read_catalog(plan.shards) if plan.clips_per_video else None
        total = (
            sum(plan.shard_samples)
            if self._catalog is None
            else self._catalog.drawn_count(plan.clips_per_video)
        )
        self.samples_per_epoch = total  # the samples an epoch reads, over all ranks
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
        if self._catalog is None:
            yield from self._epoch(list(self.plan.shards))
            return
        p = self.plan
        with tempfile.TemporaryDirectory(prefix="memdpc-drawn-") as folder:
            drawn = draw(self._catalog, p.clips_per_video, p.seed, self.epoch)
            yield from self._epoch(write_drawn_indexes(self._catalog, drawn, folder))

    def _epoch(self, shards: list[tuple]) -> Iterator[Batch]:
        """One epoch over the (tar, index) pairs ``shards``."""
        from nvidia.dali.plugin.base_iterator import LastBatchPolicy
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        pipe = self._build(self.epoch, shards)
        policy = LastBatchPolicy.DROP if self.plan.drop_last else LastBatchPolicy.PARTIAL
        pool = ThreadPoolExecutor(max(1, self.plan.num_workers)) if self._host_augment else None
        it = None
        try:
            with self._damaged_frames_are_user_errors():
                it = DALIGenericIterator(  # runs the pipeline ahead: it can meet a damaged frame too
                    [pipe],
                    self._outputs,
                    reader_name="reader",
                    last_batch_policy=policy,
                    auto_reset=False,
                )
                for i, out in enumerate(it):
                    if i >= self._len:
                        break
                    yield self._batch(out[0], pool)
        finally:
            if pool is not None:
                pool.shutdown()
            del it, pipe

    @contextlib.contextmanager
    def _damaged_frames_are_user_errors(self) -> Iterator[None]:
        """DALI's decoder names no file when a frame is not an image; the shards' checksums find the shard."""
        try:
            yield
        except RuntimeError as e:
            if "decoders.image" not in str(e):
                raise
            folder = Path(self.plan.shards[0][0]).parent
            raise UserError(
                f"{folder}: a frame of these shards is not a decodable JPEG (a damaged shard: "
                f"`memdpc shard --verify {folder.parent}` names it)"
            ) from None

    # ------------------------------------------------------------------------------------------ graph
    def _paths(self, epoch: int, shards: list[tuple]) -> list:
        """Train: the shard order changes every epoch, the same on every rank (so ranks still partition)."""
        if self.plan.train:
            order = np.random.default_rng([self.plan.seed, epoch, 7]).permutation(len(shards))
            shards = [shards[i] for i in order]
        return shards

    def _build(self, epoch: int, shards: list[tuple]):
        fn, pipeline, types = _dali()
        p = self.plan
        pipe = pipeline.Pipeline(
            batch_size=p.batch_size,
            num_threads=max(1, p.num_workers),
            device_id=self._device_id(),
            seed=int(np.random.default_rng([p.seed, epoch, p.rank]).integers(2**31)),
            prefetch_queue_depth=2,
        )
        shards = self._paths(epoch, shards)
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
                initial_fill=max(1, min(p.shuffle_buffer, self.samples_per_epoch)),
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
        a mirrored ROI; the box from the draw and the sample's frame size). Also returns what the host applies
        when OpenCV resizes: the frames, their size, the crop's draw and the flip; and the per-frame colour
        maps (when the stream gets any) for :func:`apply_colour` on the target device."""
        fn, _, types = _dali()
        p = self.plan
        draws = fn.external_source(
            source=self._draw(epoch), num_outputs=len(self._draw_names), batch=True, batch_info=True
        )
        d = dict(zip(self._draw_names, draws, strict=True))
        frames = [fn.decoders.image(f, **self._decode) for f in encoded]
        host = [d[name] for name in self._host_draws]
        if self._host_geometry:
            if self._pad:
                frames = [fn.pad(f, axis_names="HW") for f in frames]
            return [*frames, fn.peek_image_shape(encoded[0])], host
        seq = self._stack(frames, encoded[0])
        first = p.spec.crop_size or p.size
        box = crop_box_graph(*frame_hw(encoded[0], self._planes), d["crop"], p.spec)
        start, end = roi(box, fn.cast(d["flip"][0], dtype=types.FLOAT64))
        # the antialiasing filter costs time and only matters when shrinking by more than ~1.25× (256² frames:
        # crops of at most 256 px go to 224, a 1.14× shrink at most); the largest frame of the shards decides
        largest = max((max(hw) for hw in p.frame_sizes), default=None)
        antialias = largest is None or largest / first > 1.25
        video = fn.resize(seq, roi_start=start, roi_end=end, size=[first, first], antialias=antialias)
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
                c = sample_clip(rng, p.num_frames, p.stream, p.spec, p.num_blocks)
                row = {
                    "crop": c.crop,
                    "flip": np.array([c.flip], np.int32),
                    "colour": c.colour if c.colour is not None else identity,
                }
                for name, col in cols.items():
                    col.append(row[name])
            return tuple(cols.values())

        return draw

    def _stack(self, frames: list, encoded: Any):
        """The decoded frames as one (F, H, W, 3) sequence, on the GPU when the graph runs there (planes images
        split into x, y, third; ``encoded``: a frame's JPEG, whose header gives the planes' rows)."""
        fn, _, _ = _dali()
        seq = fn.stack(*frames, axis_name="F")
        seq = seq.gpu() if self._upload else seq
        return planes_graph(seq, encoded, self.plan.third_channel) if self._planes else seq

    def _eval_ops(self, encoded: list):
        fn, _, types = _dali()
        p = self.plan
        seq = self._stack([fn.decoders.image(f, **self._decode) for f in encoded], encoded[0])
        # Shards of one frame size whose crops have the output's size are sliced (a copy): DALI's CPU resize
        # costs as much at scale 1, where it moves no pixel value, as at any other scale.
        one_size = p.frame_sizes[0] if len(p.frame_sizes) == 1 else None
        copy = one_size is not None and {b[2] for b, _ in eval_boxes(*one_size, p.views, p.spec)} == {p.size}
        views = []
        for box, flipped in eval_boxes_graph(*frame_hw(encoded[0], self._planes), p.views, p.spec):
            if copy:
                start = fn.cast(fn.stack(box[0], box[1]), dtype=types.INT32)
                v = fn.slice(seq, start=start, shape=[p.size, p.size], axis_names="HW")
                v = fn.flip(v, horizontal=1) if flipped else v
            else:
                start, end = roi(box, flipped)
                v = fn.resize(seq, roi_start=start, roi_end=end, size=[p.size, p.size], antialias=True)
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
        (OpenCV releases the GIL); each clip's box from its draw and its own frame size."""
        p = self.plan
        frames = [out[name].numpy() for name in self._frame_outputs]  # F × (B, H, W, 3), padded
        shapes, crops, flips = out["shape"].numpy(), out["crop"].numpy(), out["flip"].numpy()
        maps = out["colour"].numpy() if "colour" in out else None

        def one(i: int) -> np.ndarray:
            h, w = int(shapes[i, 0]), int(shapes[i, 1])
            clip = [f[i] for f in frames]
            if self._planes:  # (H', W, 1) images, padded to the batch's largest: cut, then split
                clip, h = split_planes(np.stack([f[:h, :w] for f in clip]), p.third_channel), planes_height(h)
            box = crop_box(h, w, crops[i], p.spec)
            clip = crop_resize(clip, box, bool(flips[i, 0]), p.size, p.spec)
            return colour_frames(clip, maps[i]) if maps is not None else np.ascontiguousarray(clip)

        return torch.from_numpy(np.stack(list(pool.map(one, range(len(crops))))))
