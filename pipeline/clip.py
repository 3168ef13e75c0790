"""Clip geometry and the window rule: the one source of truth for which source frames form a sample.

A sample is ``num_blocks`` blocks of ``block_len`` frames taken every ``stride`` source frames (the paper:
8 × 5 frames, stride 3, spanning 120 source frames; block k uses ``start + 15k + {0, 3, 6, 9, 12}``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from memdpc.common.errors import UserError
from memdpc.common.settings import Checked, setting

__all__ = ["COLOUR_SPANS", "ClipShape", "ClipSpec", "EVAL_CROPS"]

EVAL_CROPS = (1, 5, 10)  # crops per clip in evaluation: the centre; 4 corners + centre; those and their flips
# what one draw of training's colour jitter and random grey covers: a frame (the paper), a block, the clip
COLOUR_SPANS = ("frame", "block", "clip")


@dataclass(frozen=True)
class ClipShape(Checked):
    """What the model reads of a sample: ``num_blocks`` blocks of ``block_len`` frames (training's clip; the
    shards' :class:`ClipSpec` adds how far apart the frames are taken)."""

    num_blocks: int = setting(8, "Blocks per clip.", flags=("--blocks",), min=1)
    block_len: int = setting(5, "Frames per block.", min=1)

    @property
    def num_frames(self) -> int:
        """Frames per sample (40)."""
        return self.num_blocks * self.block_len


@dataclass(frozen=True)
class ClipSpec(ClipShape):
    """The geometry of a sample: ``num_blocks`` blocks of ``block_len`` frames, ``stride`` source frames apart."""

    stride: int = setting(
        3,
        "Source frames between the frames of a sample (a sample spans blocks × block-len × stride).",
        flags=("--clip-stride",),
        min=1,
    )

    @property
    def span(self) -> int:
        """Source frames a sample covers (120)."""
        return self.num_frames * self.stride

    def frame_indices(self, start: int, num_available: int | None = None) -> list[int]:
        """Source frame indices of the window starting at ``start``; with ``num_available``, indices past
        the end repeat the last frame (padding of short videos)."""
        idx = [start + self.stride * i for i in range(self.num_frames)]
        if num_available is not None:
            idx = [min(i, num_available - 1) for i in idx]
        return idx

    def eval_starts(self, num_available: int) -> list[int]:
        """Evaluation windows *(ref)*: starts 0, span/2 − 1, … while the window fits (0, 59, 118, … ≤ n − 120).

        A video shorter than one span gets the single window 0 (to be padded or dropped by the caller).
        """
        step = max(1, self.span // 2 - 1)
        return list(range(0, max(num_available - self.span, 0) + 1, step))

    def train_starts(self, num_available: int, step: int) -> list[int]:
        """Training windows: every ``step`` source frames while the window fits; 0 for a short video."""
        if step < 1:
            raise UserError(f"--window-step must be ≥ 1, not {step}")
        return list(range(0, max(num_available - self.span, 0) + 1, step))

    def to_dict(self) -> dict[str, int]:
        return asdict(self)
