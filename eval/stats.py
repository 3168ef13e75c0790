"""Intervals and paired tests over test videos (ARCHITECTURE.md §2.5), numpy only.

A metric is a :class:`Statistic`: per-unit arrays (one row per test video) and the rule that turns any
resample of the units into the metric's value, so that one rule gives the value, its bootstrap interval and
a paired comparison of two results on the same units. Intervals:

* a proportion of the units (a classifier's top-k, a retrieval's R@k, of one stream or fused): the Wilson
  score interval. A percentile bootstrap of a proportion shrinks to a point at 0 % and 100 % (R@1 of 3 out of
  3 queries would read [100–100]), exactly where a small test set needs a wide interval;
* a weighted proportion — a mean over classes of per-class hit rates, or a ratio of sums whose every unit
  scores all or nothing (an Oops video with all its steps right or all wrong) —: the Wilson interval with Kish's
  effective number of units, (Σ w)² / Σ w² for the units' weights w (1 / the size of its class for a class
  mean; its steps for a ratio). With classes of one size it is the plain proportion's Wilson interval (the
  value is then that proportion). A bootstrap within classes would resample a class of one test video as that
  video every time: with one video per class, every resample is the test set itself, an interval of width 0;
* anything else (Oops' ratios of per-video fractions): the percentile bootstrap over the units,
  :data:`RESAMPLES` resamples drawn from :data:`SEED` (deterministic). Where that shows no spread (one unit
  holds all there is to count, or every unit has the same value) there is no interval: n/a, with the reason.

Paired comparison of two results on the same units (:func:`paired`), A − B with an interval and a test that
agree (the interval leaves out 0 when p < 1 − confidence; for the bootstrap, up to its resampling):

* a proportion: McNemar's exact test on the discordant units (those only one of the two gets right), and the
  exact interval conditional on them: Clopper–Pearson for the share A gets right, b / (b + c), turned into
  A − B = (b + c) / n · (2 · share − 1). Being conditional, it takes the number of discordant units as given;
  with none, A and B are right on the same units: no interval and no test, said so (:attr:`Paired.note`);
* anything else: the paired bootstrap (the same resampled units for both), its percentile interval and the
  two-sided p-value that goes with it; a class mean resamples within each class, so a class of one test video
  (resampled as itself every time) leaves it without an interval or a test, said so; without a discordant unit
  (a mean over classes of hits on the same units), as for a proportion.
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
    "WILSON_EFFECTIVE",
    "Paired",
    "Statistic",
    "bootstrap",
    "class_mean",
    "clopper_pearson",
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
WILSON_EFFECTIVE = "wilson, effective n"  # of a weighted proportion
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


def wilson(successes: float, n: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of the proportion ``successes / n`` (``n`` may be an effective number of units,
    not a whole one)."""
    if n <= 0:
        raise ValueError("a proportion of no units has no interval")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X ≤ k) for X ~ Binomial(n, p), summed in log space (no overflow for large n)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    i = np.arange(k + 1)
    log_comb = math.lgamma(n + 1) - np.array([math.lgamma(j + 1) + math.lgamma(n - j + 1) for j in i])
    return float(np.exp(log_comb + i * math.log(p) + (n - i) * math.log1p(-p)).sum())


def _solve(f, target: float) -> float:
    """The p in [0, 1] where the decreasing function ``f`` crosses ``target``, by bisection."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
    return (lo + hi) / 2


def clopper_pearson(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The exact (Clopper–Pearson) interval of the proportion ``successes / n``: the proportions for which
    neither binomial tail of the observed count falls below (1 − confidence) / 2."""
    if n <= 0:
        raise ValueError("a proportion of no units has no interval")
    tail = (1 - confidence) / 2
    lo = 0.0 if successes == 0 else _solve(lambda p: _binomial_cdf(successes - 1, n, p), 1 - tail)
    hi = 1.0 if successes == n else _solve(lambda p: _binomial_cdf(successes, n, p), tail)
    return lo, hi


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


def _weights(stat: Statistic) -> tuple[np.ndarray, np.ndarray] | None:
    """A statistic that is a weighted proportion, as (each unit's 0/1 outcome, its weight), the weights summing to
    1: a class mean of hits (each unit weighs 1 / (classes · its class's size)), or a ratio whose every unit
    with something to count scores all or nothing (weighing its share of the count); None otherwise."""
    if stat.rule == _CLASS_MEAN:
        hits, classes = stat.parts
        _, inverse, sizes = np.unique(classes, return_inverse=True, return_counts=True)
        return hits, 1.0 / (len(sizes) * sizes[inverse])
    if stat.rule == _RATIO:
        num, den = stat.parts
        counted = den > 0
        if counted.any() and np.all((num[counted] == 0) | (num[counted] == den[counted])):
            return (num[counted] > 0).astype(np.float64), den[counted] / den[counted].sum()
    return None


def _no_spread(stat: Statistic) -> str:
    """Why a bootstrap over ``stat``'s units shows no spread."""
    den = stat.parts[1]
    holding = int(np.sum(den.reshape(len(den), -1).sum(axis=1) > 0))
    if holding <= 1:
        return f"{holding} test video holds all there is to count: a bootstrap over videos shows no spread"
    return f"all {holding} test videos have the same value: a bootstrap over videos shows no spread"


def interval(stat: Statistic, confidence: float = CONFIDENCE) -> tuple[tuple[float, float] | None, str]:
    """The metric's interval and its method: Wilson for a proportion, Wilson with the effective number of units
    for a weighted proportion (:func:`_weights`), the percentile bootstrap otherwise; (None, why) where the
    bootstrap shows no spread."""
    if stat.is_proportion:
        (hits,) = stat.parts
        return wilson(int(round(hits.sum())), stat.units, confidence), WILSON
    weighted = _weights(stat)
    if weighted is not None:
        hits, w = weighted
        n = 1.0 / float(np.sum(w * w))  # Kish: (Σ w)² / Σ w², Σ w = 1
        return wilson(float(np.sum(w * hits)) * n, n, confidence), WILSON_EFFECTIVE
    lo, hi = _percentiles(bootstrap([stat])[0], confidence)
    if lo == hi:
        return None, _no_spread(stat)
    return (lo, hi), BOOTSTRAP


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
    """A − B on the same units: the difference, its interval, the test and its p-value; for hits (McNemar's test,
    a class mean) the discordant units (``only_a``: A hits and B misses; ``only_b``: the reverse). ``interval``
    and ``p`` are None where nothing can be said beyond the difference: ``note`` says why (no discordant unit; a
    class of one test video)."""

    a: float
    b: float
    difference: float
    interval: tuple[float, float] | None
    test: str
    p: float | None
    only_a: int | None = None
    only_b: int | None = None
    note: str | None = None


NO_DISCORDANT = "no discordant video: A and B are right on the same test videos"


def paired(a: Statistic, b: Statistic, confidence: float = CONFIDENCE) -> Paired:
    """Compare two results' metric on the same units (row i of both is the same test video)."""
    if a.rule != b.rule or a.units != b.units:
        raise ValueError(f"cannot pair a {a.rule} of {a.units} units with a {b.rule} of {b.units}")
    common = dict(a=a.value, b=b.value, difference=a.value - b.value)
    if a.is_proportion or a.rule == _CLASS_MEAN:
        _, only_a, only_b = mcnemar(a.parts[0], b.parts[0])
        common.update(only_a=only_a, only_b=only_b)
        test = MCNEMAR if a.is_proportion else PAIRED_BOOTSTRAP
        if only_a + only_b == 0:
            return Paired(**common, interval=None, test=test, p=None, note=NO_DISCORDANT)
    if a.is_proportion:
        p, only_a, only_b = mcnemar(a.parts[0], b.parts[0])
        discordant = only_a + only_b
        share = clopper_pearson(only_a, discordant, confidence)
        lo_hi = tuple(discordant / a.units * (2 * s - 1) for s in share)
        return Paired(**common, interval=lo_hi, test=MCNEMAR, p=p)
    if a.strata is not None:
        smallest = int(np.unique(a.strata, return_counts=True)[1].min())
        if smallest < 2:
            note = (
                "a class has 1 test video, which a bootstrap within classes resamples as itself every time: "
                "no interval or test (compare top1)"
            )
            return Paired(**common, interval=None, test=PAIRED_BOOTSTRAP, p=None, note=note)
    a_values, b_values = bootstrap([a, b])
    diffs = a_values - b_values
    diffs = diffs[~np.isnan(diffs)]
    lo, hi = _percentiles(diffs, confidence)
    if lo == hi:
        note = "the paired bootstrap shows no spread (every resample gives the same difference): no interval or test"
        return Paired(**common, interval=None, test=PAIRED_BOOTSTRAP, p=None, note=note)
    # the smallest level at which the percentile interval leaves out 0 (+1: the observed resample itself)
    below, above = np.sum(diffs <= 0), np.sum(diffs >= 0)
    p = min(1.0, 2 * (min(below, above) + 1) / (len(diffs) + 1))
    return Paired(**common, interval=(lo, hi), test=PAIRED_BOOTSTRAP, p=float(p))
