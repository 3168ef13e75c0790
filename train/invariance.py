"""Whether the direction of a clip's global motion tells its class: the rule behind ``--motion-invariance auto``.

The flow's motion augmentation (``--flow-shift``, ``--flow-gain``) moves and scales every block's flow codes by a
random amount, so that a clip's mean motion does not tell it apart from the other clips of the contrastive loss:
the encoder learns to ignore the clip's global motion. Where the classes are kinds of motion whose direction is
drawn at random (a pan to any side, an object's path), that takes a shortcut away and pretraining pays; where a
class *is* the direction of the global motion (a pan left against a pan right), it takes the class away and
pretraining ends below random weights.

``auto`` asks labelled videos before training, for each training video the direction of its mean flow (the
clips' x and y codes, less the code of no motion, averaged): told apart by their nearest neighbour among the
others (leave one out), how often do they get their class? At :data:`DIRECTION_TELLS` times chance or more the
direction tells the class, and the augmentation is off; below, it is on. The rule and its threshold were chosen
on the validation draws of the three example families (docs/pretraining.md).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from memdpc.common.errors import UserError
from memdpc.pipeline.augment import AugmentSpec
from memdpc.pipeline.shard_set import open_split
from memdpc.train.config import TrainConfig
from memdpc.train.prepare import recorded_setting, split_loader

__all__ = ["DIRECTION_TELLS", "MotionDirection", "motion_direction", "resolve_motion_invariance"]

DIRECTION_TELLS = 3.0  # the direction tells the class at this many times chance (1 / classes) or more
NO_MOTION = 128.0  # the flow code of zero displacement


@dataclass(frozen=True)
class MotionDirection:
    """How well the direction of the labelled training videos' global motion tells their class."""

    shards: str  # the labelled shards asked
    videos: int
    classes: int
    accuracy: float  # leave-one-out nearest neighbour on the direction of each video's mean flow

    @property
    def chance(self) -> float:
        return 1.0 / self.classes

    @property
    def tells_class(self) -> bool:
        return self.accuracy >= DIRECTION_TELLS * self.chance

    def words(self) -> str:
        verdict = (
            "tells their class: the flow's global shift and gain are off"
            if self.tells_class
            else "does not tell their class: the flow's global shift and gain are on"
        )
        return (
            f"motion invariance (auto): the direction of the global motion of {self.videos} labelled videos in "
            f"{self.shards} finds the class of {100 * self.accuracy:.0f} % of them by their nearest neighbour "
            f"(chance {100 * self.chance:.0f} %; the rule: {DIRECTION_TELLS:g} times chance) — it {verdict}"
        )

    def record(self) -> dict:
        return {
            "kind": "invariance",
            "shards": self.shards,
            "videos": self.videos,
            "classes": self.classes,
            "accuracy": self.accuracy,
            "chance": self.chance,
            "augmentation": not self.tells_class,
        }


def motion_direction(config: TrainConfig, device: str = "cpu") -> MotionDirection:
    """:class:`MotionDirection` of the labelled training videos of ``config``'s flow shards: ``--knn-shards``
    where given (the labelled videos of a run that pretrains on unlabelled ones), else ``--shards``. UserError
    where they are not flow shards or have no labels."""
    shards = config.knn_shards or config.loader.shards
    split = config.loader.train_split
    if config.loader.stream != "flow":
        raise UserError("--motion-invariance auto decides the flow's augmentation: train --stream flow")
    labelled = open_split(shards, "flow", split)
    if not labelled.classes:
        raise UserError(
            f"{labelled.path}: --motion-invariance auto asks labelled videos, and these are "
            "unlabelled: give the shards of labelled ones (--knn-shards)"
        )
    spec = AugmentSpec()  # the loaders' normalisation (an evaluation's clips are not augmented)
    asked = dataclasses.replace(config, loader=dataclasses.replace(config.loader, shards=str(shards)))
    loader = split_loader(asked, split, labelled.clip, train=False, device=device)
    mean = torch.tensor(spec.mean[:2]) * 255
    scale = torch.tensor(spec.std[:2]) * 255
    sums: dict[str, np.ndarray] = {}
    labels: dict[str, int] = {}
    for batch in loader:
        codes = batch.clips[:, :, :2].float().mean(dim=(1, 3, 4, 5)).cpu() * scale + mean  # (B, 2) x, y
        for video, label, xy in zip(batch.video_ids, batch.labels.tolist(), codes.numpy(), strict=True):
            sums[video] = sums.get(video, np.zeros(3)) + np.append(xy - NO_MOTION, 1.0)
            labels[video] = label
    videos = sorted(sums)
    mean_flow = np.stack([sums[v][:2] / sums[v][2] for v in videos])
    direction = mean_flow / np.linalg.norm(mean_flow, axis=1, keepdims=True).clip(min=1e-9)
    classes = len(labelled.classes)
    return MotionDirection(str(shards), len(videos), classes, _leave_one_out(direction, labels, videos))


def _leave_one_out(points: np.ndarray, labels: dict[str, int], videos: list[str]) -> float:
    """How often a point's nearest other point has its label."""
    if len(videos) < 2:
        return math.nan
    y = np.array([labels[v] for v in videos])
    distance = ((points[:, None] - points[None]) ** 2).sum(-1)
    np.fill_diagonal(distance, np.inf)
    return float((y[distance.argmin(1)] == y).mean())


def resolve_motion_invariance(config: TrainConfig, fresh: bool = False) -> tuple[TrainConfig, str | None]:
    """``--motion-invariance auto`` made concrete, as ``--val-split auto`` is: what the run directory's config
    recorded (a resume keeps what its start decided; not when the run starts ``fresh``), else the rule of
    this module on the labelled videos, with its words (None where nothing was decided now)."""
    if config.motion_invariance != "auto":
        return config, None
    decided = recorded_setting(config, "motion_invariance", fresh)
    if decided in ("on", "off"):
        return dataclasses.replace(config, motion_invariance=decided), None
    found = motion_direction(config)
    return dataclasses.replace(config, motion_invariance="off" if found.tells_class else "on"), found.words()
