"""What ``memdpc show`` draws (:class:`ShowOptions`) and what it takes, without torch or matplotlib, so that the
command line reads its defaults from here at start (``show.py`` draws)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from pathlib import Path

from memdpc.common.errors import UserError
from memdpc.common.settings import setting
from memdpc.train.config import TrainConfig

__all__ = ["ReportOut", "ShowOptions", "ShowOut", "TAKES"]

TAKES = (
    "a frame archive (FRAMES/<stream>/<id>.tar) or its folder, a shard (.tar) or shard folder, a run folder, "
    "or an eval folder or results file"
)
"""What ``memdpc show`` takes, for its errors."""


@dataclass(frozen=True)
class ShowOut:
    """Where ``memdpc show`` writes its pictures."""

    out: Path = setting(
        MISSING, "Folder for the pictures (PNG, GIF).", required=True, path={"file_okay": False}
    )


@dataclass(frozen=True)
class ReportOut:
    """Where ``memdpc report`` writes its page."""

    out: Path | None = setting(
        None,
        "Folder for the page (index.html) and its pictures [default: FOLDER/report].",
        path={"file_okay": False},
    )


@dataclass(frozen=True)
class ShowOptions:
    """What ``memdpc show`` draws; the defaults are its options' defaults."""

    samples: int = setting(4, "Videos of a folder of frame archives; samples of a shard or split.", min=1)
    frames: int = setting(16, "Frames on a video's contact sheet.", min=1)
    split: str | None = setting(None, "A shard folder's split [default: train, else the first].")
    augment: bool = setting(False, "Shard samples after the training augmentation (torch loader).")
    size: int = setting(
        TrainConfig.size, "With --augment: the training size, as `memdpc train --size`.", min=1
    )
    # None: the short side of the shards' most common frame size. The option keeps train's default as its value
    # (the command line's snapshot), which the verb leaves out when it is not given.
    crop_size: int | None = setting(
        None,
        "With --augment: as `memdpc train --crop-size` (0: straight to --size) [default: the short side of the "
        "shards' frames].",
        min=0,
        option_default=TrainConfig.crop_size,
    )
    # Off: the colour jitter moves flow's zero by more than small motions move it, so jittered flow shows as flat
    # squares; README's recipes train without it. `memdpc train`'s default is the paper's (on).
    jitter_flow: bool = setting(
        False,
        "With --augment: colour jitter on flow too, as `memdpc train --jitter-flow` (its default, the paper's; "
        "README's recipes train with --no-jitter-flow).",
        flags=("--jitter-flow/--no-jitter-flow",),
    )
    seed: int = setting(0, "With --augment: the random draws.")
    # None: each picture's own scale, its speed at flow_colours.PERCENTILE
    max_flow: float | None = setting(
        None, "Flow speed in pixels drawn in full colour [default: each picture's own scale]."
    )
    shards: Path | None = setting(
        None, "Eval results: the shard folder they were evaluated on [default: the one they record]."
    )

    def __post_init__(self) -> None:
        if self.samples < 1 or self.frames < 1:
            raise UserError(f"--samples and --frames must be ≥ 1, not {self.samples} and {self.frames}")
        if self.max_flow is not None and not self.max_flow > 0:
            raise UserError(f"--max-flow must be a positive number of pixels, not {self.max_flow}")
