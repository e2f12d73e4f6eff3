"""Giacomini and Komunjer's quantile encompassing test (issue 50): the regression against
statsmodels, the size under a true null and the power where the second forecast is the
truth, by-hand pieces, and a panel of copies."""

import numpy as np
import pytest
from scipy.stats import norm

from tftjax.stats import encompassing as gk

Q = 0.9


def draw(n: int, seed: int):
    """A return with an AR(1) log variance; the true 0.9 quantile, a noisy copy of it, and
    a forecast with no information (noise around the mean level)."""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(n)
    lv = np.zeros(n)
    for t in range(1, n):
        lv[t] = 0.95 * lv[t - 1] + 0.3 * e[t]
    s = np.exp(lv / 2)
    y = s * rng.standard_normal(n)
    true = norm.ppf(Q) * s
    noisy = true * np.exp(0.3 * rng.standard_normal(n))
    blind = norm.ppf(Q) * s.mean() * np.exp(0.3 * rng.standard_normal(n))
    return y, true, noisy, blind


def test_the_regression_is_statsmodels_quantile_regression():
    sm = pytest.importorskip("statsmodels.api")
    y, true, _, blind = draw(2000, 0)
    x = np.column_stack([np.ones(y.size), true, blind])
    ref = sm.QuantReg(y, x).fit(q=Q, max_iter=5000, p_tol=1e-10).params
    # statsmodels' IRLS stops within p_tol of a vertex the exact LP lands on (1e-7 here)
    np.testing.assert_allclose(gk.quantile_regression(x, y, Q), ref, atol=1e-5)


def test_size_under_a_true_null_and_power_against_a_worse_forecast():
    # H0 true (the truth encompasses a blind forecast): 6.9% at 5% over 1,000 draws of
    # 1,000 dates (Powell's density estimate and the fixed-b reference, as DM's 6-7%); here
    # 300 draws, whose binomial standard error at 7% is 1.5%: 2.5-11% is three of them
    rejects = [gk.encompasses(y, t, b, Q)["p"] < 0.05 for y, t, _, b in map(draw_1000, range(300))]
    assert 0.025 <= np.mean(rejects) <= 0.11, np.mean(rejects)
    # H0 false (a noisy forecast does not encompass the truth): rejected every time
    for seed in range(20):
        y, true, noisy, _ = draw(1000, seed)
        out = gk.encompasses(y, noisy, true, Q)
        assert out["p"] < 0.01 and out["theta"][2] > 0, out


def draw_1000(seed):
    return draw(1000, seed)


def test_the_scores_long_run_variance_by_hand():
    g = np.random.default_rng(2).standard_normal((30, 3))
    lags = 3
    want = sum(np.outer(g[t], g[t]) for t in range(30))
    for lag in range(1, lags + 1):
        w = 1 - lag / (lags + 1)
        for t in range(lag, 30):
            want = want + w * (np.outer(g[t], g[t - lag]) + np.outer(g[t - lag], g[t]))
    np.testing.assert_allclose(gk.newey_west(g, lags), want, rtol=1e-12)


def test_three_copies_of_a_series_on_the_same_dates_give_its_own_statistic(monkeypatch):
    # copies triple H and every date's score sum, so H⁻¹ΩH⁻¹ is unchanged: the same θ, t, p
    # (at one density bandwidth: Hall-Sheather's shrinks with the rows, n^(-1/3))
    y, true, noisy, _ = draw(800, 3)
    one = gk.encompasses(y, noisy, true, Q, dates=np.arange(800))
    h = gk.bandwidth(y - np.column_stack([np.ones(800), noisy, true]) @ one["theta"], Q)
    monkeypatch.setattr(gk, "bandwidth", lambda u, q: h)
    three = gk.encompasses(
        np.tile(y, 3), np.tile(noisy, 3), np.tile(true, 3), Q, dates=np.tile(np.arange(800), 3)
    )
    np.testing.assert_allclose(three["theta"], one["theta"], atol=1e-9)
    assert three["stat"] == pytest.approx(one["stat"], rel=1e-9)
    assert three["dates"] == one["dates"] == 800


def test_a_windows_steps_share_its_date_and_missing_outcomes_are_left_out():
    y, true, noisy, _ = draw(600, 4)
    steps = np.stack([y, np.roll(y, -1)], axis=1)  # [n, 2]: two steps of each window
    steps[-1, 1] = np.nan
    f1 = np.stack([noisy, np.roll(noisy, -1)], axis=1)
    f2 = np.stack([true, np.roll(true, -1)], axis=1)
    out = gk.encompasses(steps, f1, f2, Q, dates=np.arange(600), horizon=2)
    assert out["dates"] == 600 and out["lags"] >= 1 and np.isfinite(out["stat"])


def test_a_constant_forecast_is_not_identified_and_says_so():
    y, true, _, _ = draw(300, 5)
    out = gk.encompasses(y, true, np.full(300, 1.3), Q)
    assert out["theta"] is None and np.isnan(out["p"]) and "collinear" in out["note"]
