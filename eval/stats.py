"""Intervals and paired tests over test videos (ARCHITECTURE.md §2.5), numpy only.

A metric is a :class:`Statistic`: per-unit arrays (one row per test video) and the rule that turns any
resample of the units into the metric's value, so that one rule gives the value, its bootstrap interval and
a paired comparison of two results on the same units. Intervals:

* a proportion of the units (a classifier's top-k, a retrieval's R@k, of one stream or fused): the Wilson
  score interval. A percentile bootstrap of a proportion shrinks to a point at 0 % and 100 % (R@1 of 3 out of
  3 queries would read [100–100]), exactly where a small test set needs a wide interval;
* anything else (a mean over classes; Oops, counted in time steps that belong to videos): the percentile
  bootstrap over the units, :data:`RESAMPLES` resamples drawn from :data:`SEED` (deterministic); a
  per-class mean resamples within each class, so that every resample has every class.

Paired comparison of two results on the same units (:func:`paired`): the difference and its paired bootstrap
interval (the same resampled units for both); the test is McNemar's exact test on the discordant units for a
proportion, the paired bootstrap's two-sided p-value otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

__all__ = [
    "BOOTSTRAP",
    "CONFIDENCE",
    "MCNEMAR",
    "PAIRED_BOOTSTRAP",
    "RESAMPLES",
    "SEED",
    "WILSON",
    "Paired",
    "Statistic",
    "bootstrap",
    "class_mean",
    "interval",
    "mcnemar",
    "paired",
    "proportion",
    "ratio",
    "ratio_class_mean",
    "wilson",
]

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
CHUNK = 100  # resamples drawn and scored at once (memory: CHUNK × units)
WILSON, BOOTSTRAP = "wilson", "bootstrap"  # a result's interval
MCNEMAR, PAIRED_BOOTSTRAP = "mcnemar exact", "paired bootstrap"  # a comparison's test

_PROPORTION, _CLASS_MEAN, _RATIO, _RATIO_CLASS_MEAN = "proportion", "class mean", "ratio", "ratio class mean"


@dataclass(frozen=True)
class Statistic:
    """A metric as a function of its units (test videos).

    ``rule`` names how the per-unit ``parts`` (first axis: the units) make the value: the mean of 0/1 hits
    (a proportion), the mean over classes of the per-class hit rates (``strata``: each unit's class), a ratio
    of per-unit sums (e.g. correct time steps / time steps), or the mean over classes of such ratios.
    """

    rule: str
    parts: tuple[np.ndarray, ...]
    strata: np.ndarray | None = None

    @property
    def units(self) -> int:
        return len(self.parts[0])

    @property
    def is_proportion(self) -> bool:
        return self.rule == _PROPORTION

    def of(self, idx: np.ndarray) -> np.ndarray:
        """The value on each row of resampled unit indices: (R, n) -> (R,); NaN where a row leaves it
        undefined (a ratio whose units hold nothing to count)."""
        return _RULES[self.rule](idx, *self.parts)

    @property
    def value(self) -> float:
        return float(self.of(np.arange(self.units)[None])[0])

    def take(self, order: np.ndarray) -> Statistic:
        """The same metric with its units in ``order`` (to pair two results unit by unit)."""
        strata = None if self.strata is None else self.strata[order]
        return Statistic(self.rule, tuple(p[order] for p in self.parts), strata)


def proportion(hits: np.ndarray) -> Statistic:
    """The fraction of units that hit (``hits``: one 0/1 per unit)."""
    return Statistic(_PROPORTION, (np.asarray(hits, dtype=np.float64),))


def class_mean(hits: np.ndarray, classes: np.ndarray) -> Statistic:
    """The mean over the classes present of each class's fraction of hits (bootstrapped within classes)."""
    classes = np.asarray(classes, dtype=np.int64)
    return Statistic(_CLASS_MEAN, (np.asarray(hits, dtype=np.float64), classes), strata=classes)


def ratio(num: np.ndarray, den: np.ndarray) -> Statistic:
    """Σ num / Σ den over the units (e.g. correct time steps / time steps, per video)."""
    return Statistic(_RATIO, (np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)))


def ratio_class_mean(num: np.ndarray, den: np.ndarray) -> Statistic:
    """The mean over classes of Σ num[:, c] / Σ den[:, c] (``num``, ``den``: (units, classes)), over the
    classes with something to count."""
    return Statistic(
        _RATIO_CLASS_MEAN, (np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64))
    )


def _proportion(idx: np.ndarray, hits: np.ndarray) -> np.ndarray:
    return hits[idx].mean(axis=1)


def _class_mean(idx: np.ndarray, hits: np.ndarray, classes: np.ndarray) -> np.ndarray:
    rows, width = idx.shape
    num_classes = int(classes.max()) + 1
    key = (np.arange(rows)[:, None] * num_classes + classes[idx]).ravel()  # (row, class) of each drawn unit
    sums = np.bincount(key, weights=hits[idx].ravel(), minlength=rows * num_classes).reshape(rows, -1)
    counts = np.bincount(key, minlength=rows * num_classes).reshape(rows, -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nanmean(np.where(counts > 0, sums / counts, np.nan), axis=1)


def _ratio(idx: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    total = den[idx].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, num[idx].sum(axis=1) / total, np.nan)


def _ratio_class_mean(idx: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    total = den[idx].sum(axis=1)  # (R, C)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.where(total > 0, num[idx].sum(axis=1) / total, np.nan)
        return np.nanmean(per_class, axis=1)


_RULES = {
    _PROPORTION: _proportion,
    _CLASS_MEAN: _class_mean,
    _RATIO: _ratio,
    _RATIO_CLASS_MEAN: _ratio_class_mean,
}


def wilson(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of the proportion ``successes / n``."""
    if n <= 0:
        raise ValueError("a proportion of no units has no interval")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _resamples(units: int, strata: np.ndarray | None, resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Chunks of resampled unit indices (rows: resamples), drawn with replacement from all units or, with
    ``strata``, within each stratum (every resample keeps each stratum's size)."""
    rng = np.random.default_rng(seed)
    groups = (
        [np.arange(units)] if strata is None else [np.flatnonzero(strata == s) for s in np.unique(strata)]
    )
    for lo in range(0, resamples, CHUNK):
        rows = min(CHUNK, resamples - lo)
        yield np.concatenate([g[rng.integers(0, len(g), size=(rows, len(g)))] for g in groups], axis=1)


def bootstrap(stats: Sequence[Statistic], resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """The values of every statistic on the same resamples of their units: (len(stats), resamples). The
    statistics must share their units (and strata: the first one's are used)."""
    units, strata = stats[0].units, stats[0].strata
    if any(s.units != units for s in stats):
        raise ValueError("paired statistics need the same units")
    chunks = [np.stack([s.of(idx) for s in stats]) for idx in _resamples(units, strata, resamples, seed)]
    return np.concatenate(chunks, axis=1)


def _percentiles(values: np.ndarray, confidence: float) -> tuple[float, float]:
    values = values[~np.isnan(values)]  # resamples that leave the metric undefined do not count
    lo, hi = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


def interval(stat: Statistic, confidence: float = CONFIDENCE) -> tuple[tuple[float, float], str]:
    """The metric's interval and its method: Wilson for a proportion, the percentile bootstrap otherwise."""
    if stat.is_proportion:
        (hits,) = stat.parts
        return wilson(int(round(hits.sum())), stat.units, confidence), WILSON
    return _percentiles(bootstrap([stat])[0], confidence), BOOTSTRAP


def mcnemar(a_hits: np.ndarray, b_hits: np.ndarray) -> tuple[float, int, int]:
    """McNemar's exact test of paired 0/1 outcomes: (two-sided p, units only A hits, units only B hits).

    Under no difference each discordant unit is A's or B's with probability 1/2: p = 2 · P(Binomial(b + c,
    1/2) ≤ min(b, c)), at most 1; 1 without a discordant unit."""
    a, b = np.asarray(a_hits) > 0.5, np.asarray(b_hits) > 0.5
    only_a, only_b = int(np.sum(a & ~b)), int(np.sum(b & ~a))
    n = only_a + only_b
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail / 2**n), only_a, only_b


@dataclass(frozen=True)
class Paired:
    """A − B on the same units: the difference, its paired bootstrap interval, the test and its p-value;
    for McNemar's test the discordant units (``only_a``: A hits and B misses; ``only_b``: the reverse)."""

    a: float
    b: float
    difference: float
    interval: tuple[float, float]
    test: str
    p: float
    only_a: int | None = None
    only_b: int | None = None


def paired(a: Statistic, b: Statistic, confidence: float = CONFIDENCE) -> Paired:
    """Compare two results' metric on the same units (row i of both is the same test video)."""
    if a.rule != b.rule:
        raise ValueError(f"cannot pair a {a.rule} with a {b.rule}")
    a_values, b_values = bootstrap([a, b])
    diffs = a_values - b_values
    lo_hi = _percentiles(diffs, confidence)
    common = dict(a=a.value, b=b.value, difference=a.value - b.value, interval=lo_hi)
    if a.is_proportion:
        p, only_a, only_b = mcnemar(a.parts[0], b.parts[0])
        return Paired(**common, test=MCNEMAR, p=p, only_a=only_a, only_b=only_b)
    diffs = diffs[~np.isnan(diffs)]
    # the smallest level at which the percentile interval leaves out 0 (+1: the observed resample itself)
    below, above = np.sum(diffs <= 0), np.sum(diffs >= 0)
    p = min(1.0, 2 * (min(below, above) + 1) / (len(diffs) + 1))
    return Paired(**common, test=PAIRED_BOOTSTRAP, p=float(p))
