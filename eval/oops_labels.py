"""Per-time-step labels of the Oops protocol (ARCHITECTURE.md §3.6) and oversampling of the rare class.

A time step is one block of a window (block k of the window at ``start`` covers source frames
``start + 15k + {0, 3, 6, 9, 12}`` and stands for the time until the next block begins,
``[(start + 15k) / fps, (start + 15(k + 1)) / fps)``, so blocks tile the window without gaps). Relative to the
video's failure time t: a block that ends at or before t is *intentional* (0), one that starts after t is
*unintentional* (2), and the block that contains t is *transitional* (1).
"""

from __future__ import annotations

import numpy as np

from memdpc.common.errors import UserError
from memdpc.pipeline.clip import ClipSpec

__all__ = ["CLASSES", "TRANSITIONAL", "oversample", "step_labels"]

INTENTIONAL, TRANSITIONAL, UNINTENTIONAL = 0, 1, 2
DEFAULT_SPEC = ClipSpec()
CLASSES = ["intentional", "transitional", "unintentional"]


def block_times(start: int, fps: float, spec: ClipSpec = DEFAULT_SPEC) -> np.ndarray:
    """(num_blocks, 2) start and end time in seconds of every block of the window at ``start``."""
    if fps <= 0:
        raise UserError(f"the window at {start} has no valid fps ({fps})")
    idx = np.asarray(spec.frame_indices(start)).reshape(spec.num_blocks, spec.block_len)
    return np.stack([idx[:, 0] / fps, (idx[:, -1] + spec.stride) / fps], axis=1)


def step_labels(start: int, fps: float, failure_time: float, spec: ClipSpec = DEFAULT_SPEC) -> np.ndarray:
    """(num_blocks,) int64 labels of the blocks of one window, from the video's failure time in seconds."""
    times = block_times(start, fps, spec)
    labels = np.full(spec.num_blocks, TRANSITIONAL, dtype=np.int64)
    labels[times[:, 1] <= failure_time] = INTENTIONAL
    labels[times[:, 0] > failure_time] = UNINTENTIONAL
    return labels


def oversample(labels: np.ndarray, rare: int = TRANSITIONAL, seed: int = 0) -> np.ndarray:
    """Indices into ``labels`` in which class ``rare`` is repeated until it is as frequent as the
    smallest other class (every original sample kept; extra copies chosen by ``seed``), then shuffled."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    rare_idx = np.flatnonzero(labels == rare)
    others = [np.sum(labels == c) for c in np.unique(labels) if c != rare]
    base = np.arange(len(labels))
    if len(rare_idx) == 0 or not others or min(others) <= len(rare_idx):
        return rng.permutation(base)
    extra = min(others) - len(rare_idx)
    copies = np.concatenate(
        [
            np.tile(rare_idx, extra // len(rare_idx)),
            rng.choice(rare_idx, extra % len(rare_idx), replace=False),
        ]
    )
    return rng.permutation(np.concatenate([base, copies]))
