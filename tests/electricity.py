"""The covariates issue's non-OHLCV fixture: half-hourly electricity demand with a
temperature and a working-day flag, no prices.

Demand follows a daily profile of 48 half-hours, lower on days off, higher when it is
cold, with noise: a seasonal naive one day back (``--season 48``) is a strong bar, the last
value a weak one. The file ends with a day of rows whose ``demand`` is empty: the
working-day flag known ahead (a forecast's horizon).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DAYS, PER_DAY = 50, 48


def table(ahead: int = PER_DAY) -> pa.Table:
    rng = np.random.default_rng(11)
    n = DAYS * PER_DAY + ahead
    ts = np.datetime64("2021-03-01T00:00", "m") + 30 * np.arange(n)
    day = ts.astype("datetime64[D]")
    working = np.is_busday(day).astype(np.float64)
    slot = np.arange(n) % PER_DAY
    profile = 1.0 + 0.35 * np.sin(2 * np.pi * (slot - 14) / PER_DAY)
    temperature = 12 + 6 * np.sin(2 * np.pi * np.arange(n) / (PER_DAY * 7)) + rng.normal(0, 1, n)
    demand = (
        100 * profile * (0.7 + 0.3 * working)
        + 1.5 * np.maximum(15 - temperature, 0)
        + rng.normal(0, 2, n)
    )
    demand[n - ahead :] = np.nan  # ahead: the flag is known, the demand is not
    temperature[n - ahead :] = np.nan
    return pa.table(
        {
            "timestamp": ts.astype("datetime64[ns]"),
            "demand": demand,
            "temperature": temperature,
            "working_day": working,
        }
    )


def write(path: str | Path, ahead: int = PER_DAY) -> str:
    pq.write_table(table(ahead), path)
    return str(path)


FLAGS = [
    "--inputs",
    "own",
    "--target-column",
    "demand",
    "--target-transform",
    "level",
    "--observed",
    "temperature",
    "--known",
    "working_day",
    "--season",
    "48",
]
