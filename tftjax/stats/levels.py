"""Baselines of a target that is not a return (``--target-transform level|log|diff``): the
last value and the seasonal naive, each with the empirical quantiles of its own errors on
the training rows. The volatility baselines are for returns only.

For an origin ``t`` and decoder step ``k``, with ``y`` the target in its training scale:

* ``last_value``: ``y[t]``, plus the training rows' quantiles of ``y[s+k] - y[s]``;
* ``seasonal_naive`` (``--season N`` bars): ``y[t + k - N·⌈k/N⌉]``, the same slot one
  season back, plus the training rows' quantiles of that rule's errors at step ``k``.

Errors are read on the calendar grid (``decoder_target[s, k-1]``, NaN where the slot has
no bar), and the quantiles of the training rows whose step lies inside them only.
"""

from __future__ import annotations

import numpy as np


def seasonal_rows(origins: np.ndarray, horizon: int, season: int) -> np.ndarray:
    """``[N, horizon]``: the row one season before each step's slot (``t + k - N·⌈k/N⌉``)."""
    k = np.arange(1, horizon + 1)
    return origins[:, None] + k[None, :] - season * np.ceil(k / season).astype(np.int64)[None, :]


def error_quantiles(
    y: np.ndarray,
    decoder_target: np.ndarray,
    train_rows: tuple[int, int],
    quantiles,
    point_rows: np.ndarray | None = None,
) -> np.ndarray:
    """``[horizon, Q]``: the quantiles of ``decoder_target[s, k] - y[point_rows[s, k]]`` over
    the training origins ``s`` whose step ``k`` lies inside the training rows (``point_rows``
    None: the origin itself, the last value)."""
    a, b = train_rows
    horizon = decoder_target.shape[1]
    origins = np.arange(a, b)
    rows = np.repeat(origins[:, None], horizon, axis=1) if point_rows is None else point_rows
    ok = (rows >= 0) & (origins[:, None] + np.arange(1, horizon + 1)[None, :] < b)
    err = decoder_target[a:b] - y[np.clip(rows, 0, y.size - 1)]
    err = np.where(ok, err, np.nan)
    out = np.nanquantile(err, np.asarray(quantiles, np.float64), axis=0).T  # [horizon, Q]
    return np.nan_to_num(out, nan=0.0)


def forecasts(
    y: np.ndarray,
    decoder_target: np.ndarray,
    origins: np.ndarray,
    quantiles,
    train_rows: tuple[int, int],
    season: int | None = None,
) -> dict[str, np.ndarray]:
    """``{name: [N, horizon, Q]}``: the last value, and with ``season`` the seasonal naive."""
    y = np.asarray(y, np.float64)
    dt = np.asarray(decoder_target, np.float64)
    horizon = dt.shape[1]
    out = {
        "last_value": y[origins][:, None, None]
        + error_quantiles(y, dt, train_rows, quantiles)[None],
    }
    if season:
        a, b = train_rows
        rows = seasonal_rows(origins, horizon, season)
        train = seasonal_rows(np.arange(a, b), horizon, season)
        point = np.where(rows >= 0, y[np.clip(rows, 0, y.size - 1)], y[origins][:, None])
        out["seasonal_naive"] = (
            point[:, :, None] + error_quantiles(y, dt, train_rows, quantiles, train)[None]
        )
    return out
