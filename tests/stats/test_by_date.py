"""Panel inference by date (issue 50): a panel's series move together on a date, so DM and
the bootstrap read dates, every series of a date together, never the stacked windows."""

from collections import defaultdict

import numpy as np
import pytest
from scipy.signal import lfilter

from tftjax.stats import scoring, verdict

SERIES, DATES, PHI = 12, 1950, 0.9  # the referee's simulation: 12 series x 1,950 dates


def panel_differential(rng, rho: float) -> np.ndarray:
    """``[dates, series]`` AR(PHI) loss differentials of mean 0 (a true null), each series'
    innovations correlated ``rho`` with every other's (one common factor)."""
    e = np.sqrt(rho) * rng.standard_normal((DATES, 1))
    e = e + np.sqrt(1 - rho) * rng.standard_normal((DATES, SERIES))
    e[0] /= np.sqrt(1 - PHI**2)  # start in the stationary distribution
    return lfilter([1.0], [1.0, -PHI], e, axis=0)


def stacked(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The windows as a panel stacks them, series by series, and each window's date."""
    dates = np.tile(np.arange(DATES, dtype=np.int64) * 86_400_000_000_000, SERIES)
    return x.T.reshape(-1), dates


def test_by_date_sums_what_a_loop_over_dates_sums():
    rng = np.random.default_rng(0)
    dates = rng.integers(0, 7, size=40)
    x = rng.standard_normal((40, 3))
    want = defaultdict(lambda: np.zeros(3))
    n = defaultdict(int)
    for d, row in zip(dates, x):
        want[d] += row
        n[d] += 1
    sums, counts = scoring.by_date(x, dates)
    keys = sorted(want)
    np.testing.assert_allclose(sums, [want[k] for k in keys], rtol=1e-12, atol=1e-12)
    assert counts.tolist() == [n[k] for k in keys]
    same, ones = scoring.by_date(x, None)  # no dates: each window its own, in order
    assert same is not None and np.array_equal(same, x) and ones.tolist() == [1] * 40


def test_dm_by_date_holds_its_size_where_the_stacked_windows_do_not():
    # A true null at a cross-series correlation of 0.3 (600 draws, ~2 s). The rejection
    # rate at 5% over R draws has a standard error of sqrt(0.05 * 0.95 / R) = 0.9% at
    # R = 600, so 3-8% (the band) is a size within about 2 and 3 errors of 5%;
    # over 2,000 draws DM by date at 2 blocks rejected 6.1% (1 block 6.9%, 4 blocks 5.8%).
    # The stacked windows' DM reads the 12 series of a date as unrelated windows 1,950
    # apart: 36% here (the referee measured 41% with 1 block and Student-t p-values).
    # The stacked DM on the first 150 draws only (it reads 23,400 windows, the by-date DM
    # 1,950 dates): 36% has a standard error of 4% there, far above the 20% asserted.
    rng = np.random.default_rng(0)
    draws, stacked_draws = 600, 150
    by_date = by_window = 0
    for i in range(draws):
        d, dates = stacked(panel_differential(rng, rho=0.3))
        zero = np.zeros_like(d)
        by_date += verdict.dm(d, zero, horizon=10, dates=dates)["p"] < 0.05
        if i < stacked_draws:
            by_window += verdict.dm(d, zero, horizon=10)["p"] < 0.05
    assert 0.03 <= by_date / draws <= 0.08, by_date / draws
    assert by_window / stacked_draws > 0.2, by_window / stacked_draws


def sums_of(loss: np.ndarray, rng) -> np.ndarray:
    """Per-window sums (scoring.SUMS) with ``loss`` as the P90 and mean loss, |y| > 0."""
    n = loss.size
    out = np.ones((n, 6))
    out[:, 0] = out[:, 2] = loss
    out[:, 3] = 1.0 + rng.random(n)
    out[:, 5] = 10
    return out


def test_a_panel_of_three_copies_of_a_series_gives_that_series_statistics():
    rng = np.random.default_rng(1)
    n = 400
    x = lfilter([1.0], [1.0, -0.7], rng.standard_normal(n))
    a, b = sums_of(2.0 + x, rng), sums_of(2.0 + 0.5 * rng.standard_normal(n), rng)
    dates = np.arange(n, dtype=np.int64) * 3_600_000_000_000
    one = verdict.compare(a, b, horizon=10, reps=200, dates=dates)
    # the panel stacks the copies series by series; by date, each date holds three equal
    # windows: their mean and their sums' ratio are the series' own, to a few ulps of
    # float64 (x + x + x and the division by 3 round; ~1e-16 each, summed over 400 terms)
    three = verdict.compare(
        np.tile(a, (3, 1)), np.tile(b, (3, 1)), horizon=10, reps=200, dates=np.tile(dates, 3)
    )
    for key in ("dm_p90", "dm_loss"):
        assert three[key]["stat"] == pytest.approx(one[key]["stat"], rel=1e-12)
        assert three[key]["lags"] == one[key]["lags"] and three[key]["dates"] == n
    assert three["p90_diff"] == pytest.approx(one["p90_diff"], rel=1e-12)
    np.testing.assert_allclose(three["p90_diff_ci95"], one["p90_diff_ci95"], rtol=1e-12)
    # and without dates the copies count as 1,200 windows: a larger, wrong statistic
    stackd = verdict.compare(np.tile(a, (3, 1)), np.tile(b, (3, 1)), horizon=10, reps=200)
    assert abs(stackd["dm_p90"]["stat"]) > 1.3 * abs(one["dm_p90"]["stat"])


def test_the_order_of_a_panels_windows_does_not_move_its_verdict():
    # series by series or interleaved: the same dates, the same statistics
    rng = np.random.default_rng(2)
    x = panel_differential(rng, rho=0.3)[:300, :4]
    d, dates = x.T.reshape(-1), np.tile(np.arange(300, dtype=np.int64), 4)
    perm = rng.permutation(d.size)
    a = verdict.dm(d, np.zeros_like(d), horizon=5, dates=dates)
    b = verdict.dm(d[perm], np.zeros_like(d), horizon=5, dates=dates[perm])
    assert b["stat"] == pytest.approx(a["stat"], rel=1e-12) and b["lags"] == a["lags"]


def test_a_stretch_is_dropped_from_the_test_windows_only():
    day = np.datetime64("2020-01-25T00:00", "ns")
    dates = (day + np.arange(120) * np.timedelta64(1, "D")).astype(np.int64)
    rng = np.random.default_rng(3)
    sums = {"m": sums_of(rng.random(120), rng)}
    fold = verdict.Fold({"m": sums["m"][:10]}, sums, rng.random((120, 2)), {}, dates)
    (kept,) = verdict.without([fold], "2020-02-01", "2020-05-01")
    # Feb 1 .. Apr 30: 29 + 31 + 30 = 90 days of the 120 from Jan 25
    assert kept.dates is not None and kept.dates.size == 30 and kept.y is not None
    inside = (kept.dates >= np.datetime64("2020-02-01", "ns").astype(np.int64)) & (
        kept.dates < np.datetime64("2020-05-01", "ns").astype(np.int64)
    )
    assert not inside.any()
    assert kept.val is fold.val and kept.y.shape == (30, 2) and kept.test["m"].shape == (30, 6)


def test_coverage_by_date_holds_its_size_where_kupiec_over_stacked_hits_does_not():
    # calibrated 10% quantiles (the true ones), 12 series whose outcomes share a common
    # shock on each date (correlation 0.5): Kupiec's binomial over the 12 x 300 stacked hits
    # treats them as independent and rejects far too often; the per-date mean hit rate with
    # DM's machinery does not. 100 draws: at a true 5-7% (fixed-b's small excess, as for DM)
    # the count's standard error is 2.2-2.6%, so <= 12% is two of them above 7%
    from scipy.stats import norm

    rng = np.random.default_rng(4)
    n_dates, rho, draws = 300, 0.5, 100
    dates = np.tile(np.arange(n_dates), SERIES)
    kupiec = by_date = 0
    for _ in range(draws):
        z = np.sqrt(rho) * rng.standard_normal((n_dates, 1))
        z = z + np.sqrt(1 - rho) * rng.standard_normal((n_dates, SERIES))
        y = z.T.reshape(-1, 1)  # stacked series by series, one step
        pred = np.broadcast_to(norm.ppf([0.1, 0.5, 0.9]), (y.shape[0], 1, 3))
        hits = verdict.calibration(y, pred, (0.1, 0.5, 0.9), dates)["hits"]["0.1"]
        kupiec += hits["kupiec"]["p"] < 0.05
        by_date += hits["by_date"]["p"] < 0.05
        assert hits["by_date"]["dates"] == n_dates
    # measured: Kupiec 30 of 100, by date 8 of 100 (each is one fixed set of draws)
    assert kupiec / draws >= 0.2, kupiec  # four times its level
    assert by_date / draws <= 0.12, by_date


def test_coverage_by_date_of_three_copies_is_the_series_own():
    rng = np.random.default_rng(5)
    y = rng.standard_normal((400, 1))
    pred = np.broadcast_to(np.array([-1.2, 0.0, 1.3]), (400, 1, 3))
    qs = (0.1, 0.5, 0.9)
    one = verdict.calibration(y, pred, qs, np.arange(400))["hits"]
    three = verdict.calibration(
        np.tile(y, (3, 1)), np.tile(pred, (3, 1, 1)), qs, np.tile(np.arange(400), 3)
    )["hits"]
    for q in ("0.1", "0.9"):
        assert three[q]["by_date"]["stat"] == pytest.approx(one[q]["by_date"]["stat"], rel=1e-9)
        assert three[q]["by_date"]["rate"] == pytest.approx(one[q]["by_date"]["rate"])
