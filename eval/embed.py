"""Features of a checkpoint's encoder for Python users (a notebook, their own training loop): per video, of one
split of a shard folder (:func:`shard_features`) or of video files (:func:`video_features`), computed exactly as
``memdpc eval retrieve`` computes them (the encoder's pooled output of every evaluation window, averaged per
video)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memdpc.common import distenv as dd
from memdpc.common.errors import UserError
from memdpc.eval.data import EvalData
from memdpc.eval.features import run_windows, video_mean
from memdpc.eval.pretrained import default_size, load_encoder
from memdpc.model.checkpoint import read_checkpoint, resolve_stream
from memdpc.pipeline.backends import LoaderSettings
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard import run_shard
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.run import preprocess
from memdpc.preprocess.video_index import VideoRecord, video_id, write_index

__all__ = ["VideoFeatures", "shard_features", "video_features"]


@dataclass
class VideoFeatures:
    """One row per video, in the order of ``video_ids`` (sorted)."""

    video_ids: list[str]
    labels: np.ndarray  # (V,) int64; -1 for videos without a class
    features: np.ndarray  # (V, C) float32, not normalised


def shard_features(
    checkpoint: str | os.PathLike,
    shards: str | os.PathLike,
    split: str = "test",
    *,
    stream: str | None = None,
    size: int | None = None,
    batch_size: int = LoaderSettings.batch_size,
    backend: str = LoaderSettings.backend,
    workers: int | None = None,
    device: str = "auto",
) -> VideoFeatures:
    """Per-video features of ``split`` of the shard folder ``shards`` (``<shards>/<stream>/…``) by the encoder
    of ``checkpoint`` (trained, ``init.pt`` or converted). ``stream`` None: the checkpoint's; ``size`` None: the
    size it was trained at. One process (no torchrun)."""
    if size is None:
        size = default_size(read_checkpoint(checkpoint))
    loader = LoaderSettings(str(shards), stream, batch_size=batch_size, backend=backend, num_workers=workers)
    data = EvalData(loader, size=size)
    env = dd.DistEnv(0, 1, 0, dd.pick_device(device, 0))
    model, _, stream = load_encoder(checkpoint, data, env)
    data = data.with_loader(stream=stream)
    windows = run_windows(model.features, data, split, env, desc="features")
    ids, labels, feats = video_mean(windows)
    return VideoFeatures(ids, labels, feats.astype(np.float32))


def video_features(
    checkpoint: str | os.PathLike,
    videos: Sequence[str | os.PathLike],
    *,
    frame_size: int = DecodeSpec.size,
    clip_stride: int = ClipSpec.stride,
    work: str | os.PathLike | None = None,
    **options: Any,
) -> VideoFeatures:
    """Per-video features of video files: each is decoded (frames resized so the short side is
    ``frame_size``, as ``memdpc preprocess --size``), its flow computed for a flow checkpoint, cut into the
    evaluation windows of the checkpoint's blocks (``clip_stride`` source frames apart, as ``memdpc shard
    --clip-stride``) and encoded as :func:`shard_features` (``options``) does. The intermediate archives and
    shards go to ``work`` (default: a temporary folder, removed after). A video that does not decode is a
    :class:`UserError` naming it."""
    paths = [Path(v).resolve() for v in videos]
    if not paths:
        raise UserError("video_features: no videos given")
    ckpt = read_checkpoint(checkpoint)
    stream, _ = resolve_stream(ckpt, checkpoint, options.get("stream"))
    ids = [video_id(p.name) for p in paths]
    if len(set(ids)) != len(ids):
        raise UserError("video_features: two videos have the same file name; give them distinct names")
    records = [VideoRecord(i, str(p), -1, "", "test") for i, p in zip(ids, paths, strict=True)]
    with tempfile.TemporaryDirectory(prefix="memdpc-features-") as tmp:
        root = Path(work) if work is not None else Path(tmp)
        index = root / "index.jsonl"
        write_index(records, index)
        report = preprocess(index, root / "frames", stream, size=frame_size, workers=1, progress=False)
        if report.failures:
            bad = report.failures[0]
            raise UserError(f"{bad['path']}: {bad['reason']}")
        model = ckpt["model_config"]
        clip = ClipSpec(
            model.get("num_blocks", ClipSpec.num_blocks),
            model.get("block_len", ClipSpec.block_len),
            clip_stride,
        )
        run_shard(
            root / "frames",
            records,
            stream,
            root / "shards",
            "test",
            ShardSettings(clip=clip),
            overwrite=True,
        )
        with torch.inference_mode():
            return shard_features(checkpoint, root / "shards", "test", **{**options, "stream": stream})
