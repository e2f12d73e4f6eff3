"""The comparison statistics against hand computations and an independent implementation."""

import math

import numpy as np
import pytest
from scipy import stats

from tftjax.stats import scoring


def test_diebold_mariano_by_hand():
    a = np.array([1.0, 2.0, 0.5, 3.0, 1.5, 2.5])
    b = np.array([0.5, 2.5, 0.5, 1.0, 1.0, 0.5])
    d = a - b  # [0.5, -0.5, 0, 2, 0.5, 2]
    n, dbar = 6, 4.5 / 6
    e = d - dbar
    g0 = np.sum(e * e) / n
    g1 = np.sum(e[:-1] * e[1:]) / n
    v = g0 + 2 * 0.5 * g1  # Bartlett weight 1 - 1/2 at lag 1
    hln = math.sqrt((n + 1 - 2 * 2 + 2 * 1 / n) / n)  # horizon 2
    stat = dbar / math.sqrt(v / n) * hln
    out = scoring.diebold_mariano(a, b, horizon=2, lags=1)
    assert out["stat"] == pytest.approx(stat, rel=1e-12)
    assert out["p"] == pytest.approx(2 * stats.t.sf(abs(stat), n - 1), rel=1e-12)
    assert scoring.default_lags(100, 10) == 9 and scoring.default_lags(1000, 1) == 6


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.04 x (3, 2, 1) = 0.03, 0.04, 0.04; in input order
    np.testing.assert_allclose(scoring.holm([0.04, 0.01, 0.02]), [0.04, 0.03, 0.04])
    np.testing.assert_allclose(scoring.holm([0.5, 0.001]), [0.5, 0.002])


def test_kupiec_and_christoffersen_by_hand():
    hits = np.array([0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0], bool)
    n, x, p = 20, 4, 0.1
    lr = -2 * (
        (n - x) * math.log(1 - p)
        + x * math.log(p)
        - ((n - x) * math.log(1 - x / n) + x * math.log(x / n))
    )
    k = scoring.kupiec(hits, p)
    assert (k["n"], k["hits"]) == (20, 4)
    assert k["lr"] == pytest.approx(lr) and k["p"] == pytest.approx(stats.chi2.sf(lr, 1))
    # transitions: 0→0 12, 0→1 3, 1→0 3, 1→1 1
    n00, n01, n10, n11 = 12, 3, 3, 1
    pi0, pi1, pi = 3 / 15, 1 / 4, 4 / 19
    lr = -2 * (
        (n00 + n10) * math.log(1 - pi)
        + (n01 + n11) * math.log(pi)
        - (
            n00 * math.log(1 - pi0)
            + n01 * math.log(pi0)
            + n10 * math.log(1 - pi1)
            + n11 * math.log(pi1)
        )
    )
    c = scoring.christoffersen(hits)
    assert (c["n00"], c["n01"], c["n10"], c["n11"]) == (n00, n01, n10, n11)
    assert c["lr"] == pytest.approx(lr) and c["p"] == pytest.approx(stats.chi2.sf(lr, 1))


def test_circular_bootstrap_weighs_every_window_alike_and_wraps():
    idx = scoring.circular_bootstrap_index(10, 4, reps=20000, seed=1)
    assert idx.shape == (20000, 10)
    freq = np.bincount(idx.ravel(), minlength=10) / idx.size
    np.testing.assert_allclose(freq, 0.1, atol=0.004)  # the ends too (a moving block: ~1/3)
    first = idx[:, :4]
    np.testing.assert_array_equal((first - first[:, :1]) % 10, np.tile(np.arange(4), (20000, 1)))


def test_block_length_matches_arch():
    arch = pytest.importorskip("arch.bootstrap")
    rng = np.random.default_rng(0)
    for phi in (0.0, 0.5, 0.9):
        e = rng.normal(size=500)
        x = np.zeros(500)
        for t in range(1, 500):
            x[t] = phi * x[t - 1] + e[t]
        want = arch.optimal_block_length(x)["circular"].iloc[0]
        assert abs(scoring.block_length(x) - want) <= 0.5 + 1e-9


def test_scores_of_quantile_forecasts_by_hand():
    y = np.array([0.0, 2.0, -3.0])
    lo, up = np.array([-1.0, -1.0, -1.0]), np.array([1.0, 1.0, 1.0])
    np.testing.assert_allclose(scoring.interval_score(y, lo, up, 0.2), [2.0, 2 + 10.0, 2 + 20.0])
    qs = (0.25, 0.5, 0.75)
    pred = np.array([[-1.0, 0.0, 1.0]])
    # pinball at y = 2: 0.25·3, 0.5·2, 0.75·1; widths 0.375, 0.25, 0.375
    want = 2 * (0.75 * 0.375 + 1.0 * 0.25 + 0.75 * 0.375)
    assert scoring.crps_from_quantiles(np.array([2.0]), pred, qs)[0] == pytest.approx(want)
    assert scoring.crossing_rate(np.array([[0.0, 1.0, 2.0], [0.0, 2.0, 1.0]])) == 0.5
    counts, expected = scoring.pit_counts(
        np.array([-2.0, -0.5, 0.5, 0.5, 3.0]), np.tile(pred, (5, 1)), qs
    )
    np.testing.assert_array_equal(counts, [1, 1, 2, 1])
    np.testing.assert_allclose(expected, [1.25, 1.25, 1.25, 1.25])


def test_quantile_levels_are_exact_never_the_nearest():
    qs = (0.05, 0.5, 0.9)
    assert scoring.level(qs, 0.9) == 2
    with pytest.raises(ValueError, match="do not include 0.1"):
        scoring.level(qs, 0.1)
    y = np.array([[0.0, 1.0]])
    pred = np.array([[[-1.0, 0.0, 1.0], [-1.0, 0.0, 1.0]]])
    s = scoring.window_sums(y, pred, qs)
    assert np.isnan(s[0, 4])  # no 10% quantile: no 10-90% coverage (the 5% one is not it)
    assert np.isnan(scoring.from_sums(s)["coverage_80"])
    sq = scoring.step_q_risk(y, pred, qs)  # y - q90 = -1, 0: pinball 0.1, 0
    np.testing.assert_allclose(sq[0], [[0.1, 0.0], [0.0, 1.0]])
