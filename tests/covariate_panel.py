"""The covariates issue's panel fixture: three daily series in one long file, each with
columns of its own (docs/covariates.md):

* ``flow``, an observed real with gaps (about 4% missing at random, and in series ``c`` one
  gap of 40 bars, past a window of the tiny preset: stale);
* ``event``, a known categorical: ``opex`` on the month's third Friday, ``qend`` on a
  quarter's last business day, ``none`` otherwise (scheduled: never missing);
* ``sector``, a static categorical, and ``beta``, a static real.

``flow`` carries information about the next bar's return (it is the next return's sign
with noise, published at the bar's close), so a model that reads it can do better than one
that does not; the event days are more volatile.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SERIES = {"a": ("tech", 1.2), "b": ("energy", 0.8), "c": ("tech", 1.0)}
DAYS = 450
LONG_GAP = (300, 340)  # series c's observed gap: 40 bars, past the tiny window of 25


def business_days(n: int, first: str = "2015-01-02") -> np.ndarray:
    days = np.arange(np.datetime64(first), np.datetime64(first) + 2 * n, dtype="datetime64[D]")
    return days[np.is_busday(days)][:n]


def events(days: np.ndarray) -> np.ndarray:
    """``opex`` (third Friday), ``qend`` (a quarter's last business day) or ``none``."""
    dom = (days - days.astype("datetime64[M]")).astype(int) + 1
    friday = (days.astype("datetime64[D]").view("int64") - 1) % 7 == 0  # 1970-01-02: Friday
    third = friday & (dom >= 15) & (dom <= 21)
    month = days.astype("datetime64[M]")
    nxt = np.busday_offset(days, 1, roll="forward").astype("datetime64[M]")
    last_in_month = nxt != month
    quarter_end = last_in_month & ((month.astype(int) % 12) % 3 == 2)
    return np.where(third, "opex", np.where(quarter_end, "qend", "none")).astype(object)


def series_columns(name: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    days = business_days(DAYS)
    ev = events(days)
    vol = 0.01 * np.where(ev == "none", 1.0, 2.0)
    r = rng.normal(0.0, 1.0, DAYS) * vol
    close = 100.0 * np.exp(np.cumsum(r))
    open_ = np.r_[close[0], close[:-1]] * np.exp(rng.normal(0, 1e-3, DAYS))
    high = np.maximum(open_, close) * (1 + rng.exponential(3e-3, DAYS))
    low = np.minimum(open_, close) * (1 - rng.exponential(3e-3, DAYS))
    flow = np.r_[np.sign(r[1:]), 0.0] + rng.normal(0, 0.7, DAYS)  # tomorrow's sign, noisy
    flow[rng.random(DAYS) < 0.04] = np.nan
    if name == "c":
        flow[LONG_GAP[0] : LONG_GAP[1]] = np.nan
    sector, beta = SERIES[name]
    return {
        "ts": days.astype("datetime64[ns]"),
        "symbol": [name] * DAYS,
        "open": open_,
        "high": high,
        "low": low,
        "close": close,
        "volume": rng.lognormal(10, 0.3, DAYS).round(),
        "flow": flow,
        "event": ev,
        "sector": [sector] * DAYS,
        "beta": np.full(DAYS, beta),
    }


def panel_table() -> pa.Table:
    parts = [series_columns(n, i) for i, n in enumerate(SERIES)]
    cols = {
        k: np.concatenate(
            [
                np.asarray(p[k], dtype=object if k in ("symbol", "event", "sector") else None)
                for p in parts
            ]
        )
        for k in parts[0]
    }
    order = np.lexsort((cols["symbol"].astype(str), cols["ts"]))  # by time: a long file
    return pa.table(
        {
            k: pa.array(v[order], type=pa.string()) if v.dtype == object else pa.array(v[order])
            for k, v in cols.items()
        }
    )


def write_panel(path: str | Path) -> str:
    pq.write_table(panel_table(), path)
    return str(path)


COVARIATE_FLAGS = [
    "--observed",
    "flow",
    "--known",
    "event",
    "--static",
    "sector,beta",
    "--categorical",
    "event,sector",
]
