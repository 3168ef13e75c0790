"""Scarce-label subsets: stratified per class, reproducible for a seed, different across seeds."""

from __future__ import annotations

from collections import Counter

import pytest

from memdpc.common.errors import UserError
from memdpc.eval.subset import stratified_subset

IDS = [f"c{c}_v{i:02d}" for c in range(4) for i in range(10 + 5 * c)]  # 10, 15, 20, 25 videos
LABELS = [int(v[1]) for v in IDS]


@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.5, 1.0])
def test_every_class_keeps_its_fraction(fraction):
    kept = stratified_subset(IDS, LABELS, fraction, seed=3)
    per_class = Counter(int(v[1]) for v in kept)
    assert per_class == {c: max(1, round(fraction * (10 + 5 * c))) for c in range(4)}
    assert set(kept) <= set(IDS) and kept == sorted(kept)


def test_same_seed_same_subset_in_any_order_and_other_seed_differs():
    a = stratified_subset(IDS, LABELS, 0.2, seed=1)
    b = stratified_subset(IDS[::-1], LABELS[::-1], 0.2, seed=1)
    assert a == b
    assert stratified_subset(IDS, LABELS, 0.2, seed=2) != a


def test_fraction_out_of_range_is_refused():
    with pytest.raises(UserError, match="label-fraction"):
        stratified_subset(IDS, LABELS, 0.0)
    with pytest.raises(UserError, match="label-fraction"):
        stratified_subset(IDS, LABELS, 1.5)
