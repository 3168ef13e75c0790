"""What ``memdpc show`` draws (:class:`ShowOptions`) and what it takes, without torch or matplotlib, so that the
command line reads its defaults from here at start (``show.py`` draws)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memdpc.errors import UserError
from memdpc.train.config import TrainConfig

TAKES = ("a frame archive (FRAMES/<stream>/<id>.tar) or its folder, a shard (.tar) or shard folder, a run folder, "
         "or an eval folder or results file")
"""What ``memdpc show`` takes, for its errors."""


@dataclass(frozen=True)
class ShowOptions:
    """What ``memdpc show`` draws; the defaults are its options' defaults."""

    samples: int = 4  # videos of an archive folder, samples of a shard
    frames: int = 16  # frames on an archive's contact sheet
    split: str | None = None  # a shard folder's split (default: train, else the first there)
    augment: bool = False  # shard samples after the training augmentation
    size: int = TrainConfig.size  # the augmentation's output size, as `memdpc train --size`
    crop_size: int = TrainConfig.crop_size  # as `memdpc train --crop-size`
    jitter_flow: bool = TrainConfig.jitter_flow  # as `memdpc train --jitter-flow`
    seed: int = 0  # the augmentation's draws
    max_flow: float | None = None  # flow's full colour in pixels (None: each picture's own, flowviz.PERCENTILE)
    shards: Path | None = None  # where retrieval strips read frames (default: the shards a result records)

    def __post_init__(self) -> None:
        if self.samples < 1 or self.frames < 1:
            raise UserError(f"--samples and --frames must be ≥ 1, not {self.samples} and {self.frames}")
        if self.max_flow is not None and not self.max_flow > 0:
            raise UserError(f"--max-flow must be a positive number of pixels, not {self.max_flow}")
