"""eval/stats.py against reference calculations: Wilson intervals against scipy and a textbook example, the
percentile bootstrap and the paired bootstrap against scipy.stats.bootstrap, McNemar's exact test against
scipy's binomial test and hand-counted cases, its exact (Clopper–Pearson) interval against scipy's."""

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
    # reference: the same stratified resampling written out, with scipy's percentile interval of the draws
    rng = np.random.default_rng(3)
    per_class = [
        rng.choice(hits[classes == c], size=(20000, np.sum(classes == c))).mean(axis=1) for c in range(3)
    ]
    draws = np.mean(per_class, axis=0)
    lo, hi = interval(stat)[0]
    assert (lo, hi) == pytest.approx(tuple(np.percentile(draws, [2.5, 97.5])), abs=1 / 12 + 1e-9)


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
    assert (same.difference, same.p, same.interval, same.only_a) == (0.0, 1.0, (0.0, 0.0), 0)


def test_the_exact_interval_leaves_out_0_exactly_when_mcnemar_rejects():
    for only_a in range(16):
        for only_b in range(16):
            a = proportion(np.array([1] * only_a + [0] * only_b + [1, 0]))
            b = proportion(np.array([0] * only_a + [1] * only_b + [1, 0]))
            result = paired(a, b)
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
    assert math.isclose(paired(a, a).p, 1.0)
