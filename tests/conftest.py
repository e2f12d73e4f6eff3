import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiles dominate the suite's time: share them between this process and the
# CLI subprocesses through a persistent compilation cache (fresh per session).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # xdist workers inherit the controller's
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="tftjax-jax-cache-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from tftjax.data.bars import Bars  # noqa: E402


def random_bars(n: int, seed: int = 0, start: str = "2013-09-02T08:00") -> Bars:
    """A random-walk bar table on a 1-minute grid with a 2-hour gap every 400 bars."""
    rng = np.random.default_rng(seed)
    step = np.full(n, 60 * 10**9, dtype=np.int64)
    step[::400] = 2 * 3600 * 10**9
    ts = np.datetime64(start, "ns").astype(np.int64) + np.cumsum(step)
    close = 1000.0 * np.exp(np.cumsum(rng.normal(0, 1e-3, n)))
    open_ = np.concatenate([[close[0]], close[:-1]]) * np.exp(rng.normal(0, 2e-4, n))
    high = np.maximum(open_, close) * (1 + rng.exponential(5e-4, n))
    low = np.minimum(open_, close) * (1 - rng.exponential(5e-4, n))
    volume = np.round(rng.lognormal(5, 1, n))
    volume[rng.random(n) < 0.05] = 0.0
    return Bars("random.parquet", ts, open_, high, low, close, volume)


def write_table(path, columns: dict) -> str:
    pq.write_table(pa.table(columns), path)
    return str(path)


def bars_columns(bars: Bars) -> dict:
    return {
        "ts": pa.array(bars.ts, type=pa.int64()).cast(pa.timestamp("ns")),
        "open": bars.open, "high": bars.high, "low": bars.low,
        "close": bars.close, "volume": bars.volume,
    }  # fmt: skip


@pytest.fixture(scope="session")
def small_bars() -> Bars:
    return random_bars(1500, seed=1)
