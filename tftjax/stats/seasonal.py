"""A range EWMA with an hour-of-week profile: the intraday volatility baseline.

Intraday variance follows the clock: the open and the close of a session, the overnight
hours and the weekend each have their own level (Andersen & Bollerslev 1997). A flat EWMA
forecasts the same variance for every decoder step; the TFT sees each step's hour. This
baseline gives the volatility model the hour too:

- the **profile** ``p[h]``: the training rows' mean range variance in hour of the week
  ``h`` (0 = Monday 00:00 of the wall clock in the calendar's zone, 168 hours), over their
  mean of all hours, shrunk toward 1 by :data:`PRIOR_BARS` bars of the average hour (an hour
  with few training bars keeps the average level);
- the EWMA of the **deseasonalised** range variance ``d_t = RV_t / p[h_t]``:
  ``v_t = λ v_{t-1} + (1 - λ) d_t``, ``v_{-1}`` the training rows' mean of ``d``;
- the forecast of step ``k`` made at ``T``: variance ``v_T · p[h(T + k)]``, the hour of the
  ``k``-th calendar slot after ``T`` (known in advance, as the TFT's known inputs are),
  times the empirical quantiles of the training returns standardised by their own one-step
  forecasts ``y_{t+1} / √(v_t p[h_{t+1}])``.

Tested against the recursion by hand (``tests/stats/test_seasonal.py``).
"""

from __future__ import annotations

import numpy as np

from tftjax.stats.volatility import LAMBDA, ewma_variance

HOURS_OF_WEEK = 168
PRIOR_BARS = 10.0
"""The shrinkage of an hour's profile toward the average hour, in bars: an hour with ``n``
training bars gets ``(n · mean_h + PRIOR_BARS · mean) / (n + PRIOR_BARS)``."""
NS_HOUR = 3_600_000_000_000
NS_DAY = 24 * NS_HOUR


def hour_of_week(wall: np.ndarray) -> np.ndarray:
    """Hour of the week, ``0 .. 167`` (Monday 00:00 is 0), of wall-clock times (int64 ns;
    1970-01-01 was a Thursday)."""
    wall = np.asarray(wall, np.int64)
    day = np.floor_divide(wall, NS_DAY)
    return (((day + 3) % 7) * 24 + np.floor_divide(wall - day * NS_DAY, NS_HOUR)).astype(np.int64)


def profile(rv: np.ndarray, hours: np.ndarray, rows: slice) -> np.ndarray:
    """``[168]``: each hour's mean range variance over the mean of all hours, on ``rows``
    (shrunk toward 1 by :data:`PRIOR_BARS`)."""
    v, h = np.asarray(rv, np.float64)[rows], np.asarray(hours)[rows]
    mean = float(np.mean(v))
    total = np.bincount(h, weights=v, minlength=HOURS_OF_WEEK)
    count = np.bincount(h, minlength=HOURS_OF_WEEK)
    return (total + PRIOR_BARS * mean) / (count + PRIOR_BARS) / mean


def quantiles(
    y: np.ndarray,
    rv: np.ndarray,
    hours: np.ndarray,
    future_hours: np.ndarray,
    origins: np.ndarray,
    qs: np.ndarray,
    train_rows: tuple[int, int],
    *,
    cumulative: bool = False,
    lam: float = LAMBDA,
) -> np.ndarray:
    """``[N, D, Q]`` quantile forecasts at ``origins``.

    Args:
      y: the one-bar returns ``[n]`` (target units); rv: :func:`range_variance` in target
        units² ``[n]``.
      hours: each bar's hour of the week ``[n]``; future_hours: the hour of the ``k``-th
        calendar slot after each bar ``[n, D]``.
      train_rows: ``[a, b)``: the profile, the EWMA's start and the standardised quantiles.
      cumulative: the ``k``-bar sum's quantiles: the root of the summed step variances.
    """
    a, b = train_rows
    p = profile(rv, hours, slice(a, b))
    d = np.asarray(rv, np.float64) / p[hours]
    v = ewma_variance(np.sqrt(d), lam, init=float(np.mean(d[a:b])))  # v[t]: of d[t+1], at t
    one_step = np.maximum(v[a : b - 1] * p[hours[a + 1 : b]], 1e-300)
    z = np.quantile(np.asarray(y, np.float64)[a + 1 : b] / np.sqrt(one_step), qs)
    var = v[origins, None] * p[np.asarray(future_hours)[origins]]  # [N, D]
    sigma = np.sqrt(np.cumsum(var, axis=1) if cumulative else var)
    return sigma[..., None] * z[None, None, :]
