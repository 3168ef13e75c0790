"""What a loader backend is given (:class:`LoaderPlan`, made by ``loader.plan_loader``) and what it yields
(:class:`Batch`): the contract between ``loader.make_loader`` and the DALI and torch loaders."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from memdpc.pipeline.augment import AugmentSpec

__all__ = ["Batch", "LoaderPlan"]


@dataclass
class Batch:
    """One batch of clips.

    ``clips``: float32 (B, N, 3, SL, H, W), normalised; eval with ``crops`` > 1: (B, K, N, 3, SL, H, W).
    ``labels``: int64 (B,). ``keys``: ``<video_id>_<start:05d>`` per clip. ``video_ids``: the clip's video.
    """

    clips: torch.Tensor
    labels: torch.Tensor
    keys: list[str]
    video_ids: list[str]


@dataclass(frozen=True)
class LoaderPlan:
    """What a backend needs: the checked shard list and manifest facts, and the request."""

    shards: list[tuple[Path, Path]]
    shard_samples: list[int]
    stream: str
    frame_sizes: tuple[tuple[int, int], ...]  # (height, width) of the shards' frames; () where not recorded
    encoding: str  # the images' encoding, as recorded in the manifest (e.g. jpeg-q100-planes)
    num_frames: int
    num_blocks: int
    train: bool
    batch_size: int
    size: int
    crops: int
    rank: int
    world_size: int
    seed: int
    num_workers: int
    device: str
    spec: AugmentSpec
    drop_last: bool = False
    shuffle_buffer: int = 256
    clips_per_video: int = (
        0  # windows per video in each epoch, drawn anew per epoch (epoch_draw); 0: every one
    )
    third_channel: int = 128  # flow's third channel, which planes images do not store (the manifest's)

    @property
    def views(self) -> int:
        """Crops per clip: always 1 in training."""
        return 1 if self.train else self.crops
