"""The pretext task's own score, for a before/after comparison of a run: the dense predictive loss and top-1 of a
checkpoint on a split of the run's shards, computed as training's validation computes them (eval mode, every
batch of the split, each prediction scored against the batch's targets)."""

from __future__ import annotations

import os

import torch

from memdpc.model.checkpoint import load_model
from memdpc.pipeline.shard_set import open_split
from memdpc.train.config import TrainConfig
from memdpc.train.prepare import split_loader

__all__ = ["pretext_scores"]


@torch.no_grad()
def pretext_scores(checkpoint: str | os.PathLike, config: TrainConfig, split: str) -> dict[str, float]:
    """{"loss", "top1", "chance", "batches"} of ``checkpoint`` on ``split`` of ``config``'s shards, means over
    batches (NaN where the split gives no batch); ``chance`` is the loss of a uniform guess among each
    prediction's candidates, which a model that learnt nothing stays at."""
    model, _ = load_model(checkpoint)
    model.eval()
    clip = open_split(config.loader.shards, config.loader.stream, split).clip
    sums, batches = {"loss": 0.0, "top1": 0.0, "chance": 0.0}, 0
    for batch in split_loader(config, split, clip, train=False):
        out = model(batch.clips)
        for key in sums:
            sums[key] += float(out[key])
        batches += 1
    if not batches:  # a mean of nothing would read as a measured 0
        return {**dict.fromkeys(sums, float("nan")), "batches": 0}
    return {**{k: v / batches for k, v in sums.items()}, "batches": batches}
