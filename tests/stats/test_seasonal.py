"""The range EWMA with an hour-of-week profile (issue 50's intraday baseline) against the
recursion by hand, and its hour of the week against the calendar."""

import numpy as np
import pandas as pd

from tftjax.stats import seasonal

HOUR = 3_600_000_000_000


def test_hour_of_week_is_the_calendars():
    wall = pd.date_range("2024-03-01", periods=400, freq="37min")  # naive wall clock
    want = wall.dayofweek * 24 + wall.hour
    got = seasonal.hour_of_week(wall.as_unit("ns").asi8)
    np.testing.assert_array_equal(got, want)
    early = pd.DatetimeIndex(["1969-12-29 05:30"])  # a Monday before the epoch
    assert seasonal.hour_of_week(early.as_unit("ns").asi8)[0] == 5


def by_hand(y, rv, hours, future_hours, origins, qs, a, b, lam, cumulative):
    """The docstring's model with loops and dictionaries."""
    mean = sum(rv[a:b]) / (b - a)
    sums, counts = {}, {}
    for t in range(a, b):
        sums[hours[t]] = sums.get(hours[t], 0.0) + rv[t]
        counts[hours[t]] = counts.get(hours[t], 0) + 1

    def p(h):
        k = seasonal.PRIOR_BARS
        return (sums.get(h, 0.0) + k * mean) / (counts.get(h, 0) + k) / mean

    d = [rv[t] / p(hours[t]) for t in range(len(y))]
    v, prev = [], sum(d[a:b]) / (b - a)
    for t in range(len(y)):
        prev = lam * prev + (1 - lam) * d[t]
        v.append(prev)
    z = np.quantile([y[t + 1] / np.sqrt(v[t] * p(hours[t + 1])) for t in range(a, b - 1)], qs)
    out = np.empty((len(origins), future_hours.shape[1], len(qs)))
    for i, o in enumerate(origins):
        total = 0.0
        for k in range(future_hours.shape[1]):
            var = v[o] * p(future_hours[o, k])
            total += var
            out[i, k] = np.sqrt(total if cumulative else var) * z
    return out


def test_the_forecasts_are_the_model_by_hand():
    rng = np.random.default_rng(0)
    n, steps = 900, 5
    times = pd.Timestamp("2024-01-01 00:00").value + HOUR * np.arange(n)  # hourly, 24/7
    hours = seasonal.hour_of_week(times)
    level = 1.0 + 3.0 * ((hours % 24) >= 14)  # afternoons four times as volatile
    y = np.sqrt(level) * rng.standard_normal(n)
    rv = level * rng.chisquare(2, n) / 2
    future = seasonal.hour_of_week(times[:, None] + HOUR * np.arange(1, steps + 1))
    qs = np.array([0.02, 0.1, 0.5, 0.9, 0.98])
    origins = np.array([100, 400, 650, 890])
    for cumulative in (False, True):
        got = seasonal.quantiles(
            y, rv, hours, future, origins, qs, (24, 600), cumulative=cumulative, lam=0.9
        )
        want = by_hand(y, rv, hours, future, origins, qs, 24, 600, 0.9, cumulative)
        np.testing.assert_allclose(got, want, rtol=1e-10)


def test_an_hour_without_training_bars_keeps_the_average_level():
    rv = np.array([1.0, 3.0, 1.0, 3.0])
    hours = np.array([0, 1, 0, 1])
    p = seasonal.profile(rv, hours, slice(0, 4))
    assert p[5] == 1.0  # no bars: the prior alone
    k = seasonal.PRIOR_BARS  # two bars of 3 against a mean of 2: (6 + 2k) / (2 + k) / 2
    assert abs(p[1] - (6 + 2 * k) / (2 + k) / 2) < 1e-15
