"""eval/stats.py against reference calculations: Wilson intervals against scipy and a textbook example (of a class
mean too, on classes of 1, 2 and 3 test videos, with its coverage simulated), the percentile bootstrap and the
paired bootstrap against scipy.stats.bootstrap, McNemar's exact test against scipy's binomial test and
hand-counted cases, its exact (Clopper–Pearson) interval against scipy's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as reference

from memdpc.eval.stats import (
    BOOTSTRAP,
    MCNEMAR,
    PAIRED_BOOTSTRAP,
    WILSON,
    WILSON_EFFECTIVE,
    bootstrap,
    class_mean,
    clopper_pearson,
    interval,
    mcnemar,
    paired,
    proportion,
    ratio,
    ratio_class_mean,
    wilson,
)


def test_wilson_is_the_textbook_interval():
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Statistics in Medicine 17:
    # 81 of 263, the score interval 0.2553 to 0.3662; by hand: p = 0.30798, z = 1.95996, centre
    # (p + z²/2n) / (1 + z²/n) = 0.31075, half-width z √(p(1−p)/n + z²/4n²) / (1 + z²/n) = 0.05546
    lo, hi = wilson(81, 263)
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)
    assert (lo + hi) / 2 == pytest.approx(0.31075, abs=1e-5) and (hi - lo) / 2 == pytest.approx(
        0.05546, abs=1e-5
    )


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (0, 6), (6, 6), (3, 9), (17, 30), (1, 3783), (2500, 3783)])
def test_wilson_matches_scipy(k, n):
    ci = reference.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_a_proportion_gets_wilson_even_at_100_percent():
    """One test video right: 100 %, but the interval says how little that means (a percentile bootstrap
    would say [100–100])."""
    (lo, hi), method = interval(proportion(np.array([1])))
    assert method == WILSON and (lo, hi) == pytest.approx(wilson(1, 1)) and lo < 0.21 and hi == 1.0
    assert bootstrap([proportion(np.ones(3))])[0].min() == 1.0  # what the bootstrap would have said


def test_percentile_bootstrap_matches_scipy():
    x = np.random.default_rng(7).normal(1.0, 2.0, size=60)
    stat = ratio(x, np.ones_like(x))  # Σx / n: the mean
    assert stat.value == pytest.approx(x.mean())
    (lo, hi), method = interval(stat)
    ci = reference.bootstrap(
        (x,), np.mean, n_resamples=20000, method="percentile", random_state=np.random.default_rng(1)
    ).confidence_interval
    assert (
        method == BOOTSTRAP
        and lo == pytest.approx(ci.low, abs=0.05)
        and hi == pytest.approx(ci.high, abs=0.05)
    )
    assert (lo, hi) == interval(stat)[0]  # a fixed seed: the same interval every time


def test_per_class_mean_resamples_within_classes():
    hits = np.array([1, 1, 0, 1, 0, 0, 0, 1, 1, 1])
    classes = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    stat = class_mean(hits, classes)
    assert stat.value == pytest.approx((3 / 4 + 0 + 1) / 3)
    values = bootstrap([stat])[0]
    # class 1 always 0 and class 2 always 1 (every resample keeps 4, 3 and 3 videos of the classes): only
    # class 0's rate, k/4, moves the mean
    assert set(np.round(values * 3 - 1, 9)) <= {k / 4 for k in range(5)}


def _wilson_reference(p: float, n: float) -> tuple[float, float]:
    """The Wilson score interval written out with scipy's normal quantile, for a non-whole ``n``."""
    z = reference.norm.ppf(0.975)
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / (1 + z * z / n)), min(1.0, (centre + half) / (1 + z * z / n))


@pytest.mark.parametrize("per_class", [1, 2, 3])
def test_a_class_mean_of_equal_classes_has_the_proportions_wilson_interval(per_class):
    """With every class holding 1, 2 or 3 test videos the mean over classes is the share of videos right, and
    its interval is that proportion's Wilson interval (scipy's): never a point, unlike a bootstrap within classes,
    which with one video per class resamples the test set itself every time (the issue's 33.3 [33.3–33.3])."""
    classes = np.repeat(np.arange(3), per_class)
    for right in range(len(classes) + 1):
        hits = np.zeros(len(classes))
        hits[:right] = 1
        (lo, hi), method = interval(class_mean(hits, classes))
        ci = reference.binomtest(right, len(classes)).proportion_ci(confidence_level=0.95, method="wilson")
        assert method == WILSON_EFFECTIVE and (lo, hi) == pytest.approx((ci.low, ci.high), abs=1e-12)
        assert hi - lo > 0.2
    one_each = class_mean(np.array([1, 0, 0]), np.arange(3))
    assert np.ptp(bootstrap([one_each])[0]) == 0  # what a bootstrap within classes would have said
    assert interval(one_each)[0] == pytest.approx((0.0615, 0.7923), abs=1e-4)  # top-1's 1 of 3


def test_a_class_mean_of_classes_of_1_2_and_3_videos_uses_the_effective_number_of_videos():
    """Classes of 1, 2 and 3 test videos: each video weighs 1 / (classes · its class's size); the interval is
    Wilson's with Kish's effective number of videos, (Σ w)² / Σ w², as written out with scipy here, and it covers
    the true mean of the classes' rates in at least 93 % of simulated test sets (a nominal 95 %)."""
    sizes = [1, 2, 3] * 3
    classes = np.repeat(np.arange(len(sizes)), sizes)
    weights = 1 / (len(sizes) * np.array(sizes)[classes])
    n_eff = weights.sum() ** 2 / (weights**2).sum()
    assert n_eff == pytest.approx(81 / (3 * (1 + 1 / 2 + 1 / 3))) and n_eff < len(classes)
    rng = np.random.default_rng(5)
    rates = rng.uniform(0.1, 0.9, len(sizes))
    covered = 0
    for _ in range(400):
        hits = (rng.random(len(classes)) < rates[classes]).astype(float)
        stat = class_mean(hits, classes)
        (lo, hi), method = interval(stat)
        assert method == WILSON_EFFECTIVE and (lo, hi) == pytest.approx(_wilson_reference(stat.value, n_eff))
        covered += lo <= rates.mean() <= hi
    assert covered / 400 >= 0.93


def test_a_ratio_is_a_weighted_proportion_where_every_video_is_all_right_or_all_wrong():
    """Oops' ratios: all steps right in every video is not a point interval either (Wilson with the videos'
    effective number, weighted by their steps); where one video holds all there is to count, or the videos'
    fractions are all alike, the bootstrap shows no spread: no interval, and why."""
    (lo, hi), method = interval(ratio(np.array([4.0, 2.0]), np.array([4.0, 2.0])))
    assert (
        method == WILSON_EFFECTIVE and hi == 1.0 and lo == pytest.approx(_wilson_reference(1.0, 36 / 20)[0])
    )
    assert lo < 0.5
    lo_hi, why = interval(ratio(np.array([1.0, 0.0]), np.array([2.0, 0.0])))  # only the first video counts
    assert lo_hi is None and why.startswith("1 test video holds all there is to count")
    lo_hi, why = interval(ratio(np.array([1.0, 2.0]), np.array([2.0, 4.0])))
    assert lo_hi is None and why.startswith("all 2 test videos have the same value")
    assert interval(ratio(np.array([1.0, 3.0, 0.0]), np.array([2.0, 4.0, 1.0])))[1] == BOOTSTRAP


def test_ratio_class_mean_skips_classes_with_nothing_to_count():
    num = np.array([[1, 0, 2], [0, 0, 1]])  # per unit and class: correct steps
    den = np.array([[2, 0, 2], [1, 0, 3]])  # steps: class 1 never occurs
    stat = ratio_class_mean(num, den)
    assert stat.value == pytest.approx((1 / 3 + 3 / 5) / 2)
    assert not np.isnan(bootstrap([stat])[0]).any()


@pytest.mark.parametrize("only_a,only_b", [(0, 0), (1, 5), (0, 6), (7, 2), (30, 12), (3, 3)])
def test_mcnemar_exact_matches_the_binomial_test(only_a, only_b):
    both, neither = 4, 2
    a = np.array([1] * both + [1] * only_a + [0] * only_b + [0] * neither)
    b = np.array([1] * both + [0] * only_a + [1] * only_b + [0] * neither)
    p, got_a, got_b = mcnemar(a, b)
    assert (got_a, got_b) == (only_a, only_b)
    expected = 1.0 if only_a + only_b == 0 else reference.binomtest(only_a, only_a + only_b, 0.5).pvalue
    assert p == pytest.approx(expected, rel=1e-12)


def test_mcnemar_by_hand():
    a = np.array([1, 0, 0, 0, 0, 0, 1, 1])
    b = np.array([0, 1, 1, 1, 1, 1, 1, 0])  # videos 0 and 7: only A right; 1 to 5: only B; 6: both
    p, only_a, only_b = mcnemar(a, b)
    assert (only_a, only_b) == (2, 5)
    assert p == 2 * (1 + 7 + 21) / 128  # 2 · P(X ≤ 2), X ~ Binomial(7, 1/2)
    p, only_a, only_b = mcnemar(a[1:], b[1:])
    assert (only_a, only_b, p) == (1, 5, 2 * (1 + 6) / 64)


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (3, 10), (0, 7), (7, 7), (1, 15), (40, 100), (1234, 3000)])
def test_clopper_pearson_matches_scipy(k, n):
    ci = reference.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert clopper_pearson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)


def test_paired_proportions_use_mcnemar_and_its_exact_interval():
    a = proportion(np.array([1] * 18 + [0] * 2))
    b = proportion(np.array([0] * 12 + [1] * 6 + [0] * 2))
    result = paired(a, b)
    assert result.test == MCNEMAR and (result.only_a, result.only_b) == (12, 0)
    assert result.difference == pytest.approx(0.6) and result.p == pytest.approx(2 / 2**12)
    # A gets all 12 discordant videos right: the share's exact interval is [0.7354, 1], A − B = 12/20 (2s − 1)
    share = clopper_pearson(12, 12)
    assert result.interval == pytest.approx((0.6 * (2 * share[0] - 1), 0.6)) and share[0] == pytest.approx(
        0.7354, abs=1e-4
    )
    same = paired(a, a)
    assert (same.difference, same.p, same.interval, same.only_a, same.only_b) == (0.0, None, None, 0, 0)
    assert same.note.startswith("no discordant video")


def test_the_exact_interval_leaves_out_0_exactly_when_mcnemar_rejects():
    for only_a in range(16):
        for only_b in range(16):
            a = proportion(np.array([1] * only_a + [0] * only_b + [1, 0]))
            b = proportion(np.array([0] * only_a + [1] * only_b + [1, 0]))
            result = paired(a, b)
            if only_a + only_b == 0:
                assert result.interval is None and result.p is None
                continue
            lo, hi = result.interval
            assert (lo > 0 or hi < 0) == (result.p < 0.05), (only_a, only_b, result)


def test_paired_bootstrap_matches_scipy_and_its_p_value_agrees_with_its_interval():
    rng = np.random.default_rng(11)
    x = rng.normal(0.5, 1.0, size=40)
    y = x - 0.4 + rng.normal(0, 0.5, size=40)
    a, b = ratio(x, np.ones(40)), ratio(y, np.ones(40))
    result = paired(a, b)
    ci = reference.bootstrap(
        (x, y),
        lambda u, v, axis: u.mean(axis=axis) - v.mean(axis=axis),
        paired=True,
        n_resamples=20000,
        method="percentile",
        random_state=np.random.default_rng(2),
    ).confidence_interval
    assert result.test == PAIRED_BOOTSTRAP and result.difference == pytest.approx(np.mean(x - y))
    assert result.interval == pytest.approx((ci.low, ci.high), abs=0.03)
    assert result.interval[0] > 0 and result.p < 0.05  # the interval leaves out 0: so does the test
    close = paired(a, ratio(x + rng.normal(0, 0.5, size=40), np.ones(40)))
    assert close.interval[0] < 0 < close.interval[1] and close.p >= 0.05
    assert paired(a, a).interval is None and "no spread" in paired(a, a).note


@pytest.mark.parametrize("per_class", [1, 2, 3])
def test_a_paired_class_mean_on_classes_of_1_2_and_3_videos(per_class):
    """A − B of the mean over classes: no interval or test where a class has one test video (a bootstrap within
    classes resamples it as itself: the issue's +0.0 to +0.0), none either without a discordant video; else the
    paired bootstrap within classes, as the same stratified resampling written out with numpy gives it."""
    classes = np.repeat(np.arange(4), per_class)
    a_hits = np.zeros(len(classes))
    b_hits = np.zeros(len(classes))
    a_hits[::2], b_hits[1::3] = 1, 1
    a, b = class_mean(a_hits, classes), class_mean(b_hits, classes)
    result = paired(a, b)
    assert result.difference == pytest.approx(a.value - b.value) and result.only_a + result.only_b > 0
    same = paired(a, a)
    assert same.interval is None and same.p is None and same.note.startswith("no discordant video")
    if per_class == 1:
        assert result.interval is None and result.p is None and "a class has 1 test video" in result.note
        return
    lo, hi = result.interval
    assert lo < hi and result.test == PAIRED_BOOTSTRAP
    rng = np.random.default_rng(4)
    draws = np.zeros(20000)
    for c in range(4):
        rows = rng.integers(0, per_class, size=(20000, per_class)) + c * per_class
        draws += (a_hits[rows] - b_hits[rows]).mean(axis=1) / 4
    assert (lo, hi) == pytest.approx(tuple(np.percentile(draws, [2.5, 97.5])), abs=1 / (4 * per_class) + 1e-9)
