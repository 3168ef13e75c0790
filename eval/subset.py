"""Scarce-label subsets (ARCHITECTURE.md §3.6, scarce labels): a seeded, stratified fraction of the train videos."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from memdpc.common.errors import UserError

__all__ = ["stratified_subset"]


def stratified_subset(
    video_ids: Sequence[str], labels: Sequence[int], fraction: float, seed: int = 0
) -> list[str]:
    """Keep ``fraction`` of the videos of every class (rounded, at least one per class), chosen by ``seed``.

    The choice depends only on the (id, label) pairs, the fraction and the seed, not on their order, so the
    same subset comes back on every rank and every run. Returns the kept ids, sorted.
    """
    if not 0.0 < fraction <= 1.0:
        raise UserError(f"--label-fraction must be in (0, 1], not {fraction}")
    by_class: dict[int, list[str]] = {}
    for vid, label in sorted(set(zip(video_ids, (int(x) for x in labels), strict=True))):
        by_class.setdefault(label, []).append(vid)
    kept: list[str] = []
    for label in sorted(by_class):
        ids = by_class[label]
        n = max(1, int(round(fraction * len(ids))))
        rng = np.random.default_rng([seed, label])
        kept.extend(ids[i] for i in rng.permutation(len(ids))[:n])
    return sorted(kept)
