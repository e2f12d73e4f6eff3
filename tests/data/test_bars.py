"""Bars: accepted inputs and one clear DataError per bad input."""

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from conftest import bars_columns, random_bars, write_table

from tftjax.data import DataError, default_parquet, read_bars
from tftjax.data.bars import default_min_rows

N = 400


@pytest.fixture()
def cols():
    return bars_columns(random_bars(N, seed=3))


def _write(tmp_path, cols, name="bars.parquet"):
    return write_table(tmp_path / name, cols)


def _error(path, **kw) -> str:
    with pytest.raises(DataError) as e:
        read_bars(path, **kw)
    return str(e.value)


def test_reads_bundled_es():
    bars = read_bars(default_parquet())
    assert len(bars) == 2264
    assert bars.close[0] == 1639.75
    assert np.all(np.diff(bars.ts) > 0)
    assert str(np.datetime64(int(bars.ts[0]), "ns")) == "2013-09-01T17:00:00.000000000"


def test_roundtrip_values(tmp_path, cols):
    bars = read_bars(_write(tmp_path, cols), min_rows=10)
    np.testing.assert_array_equal(bars.close, cols["close"])
    np.testing.assert_array_equal(bars.ts, cols["ts"].cast(pa.int64()).to_numpy())


@pytest.mark.parametrize("time_name", ["ts", "ts_event", "Timestamp", "DATETIME", "date"])
def test_accepts_common_names_any_case(tmp_path, cols, time_name):
    renamed = {time_name: cols.pop("ts"), **{k.upper(): v for k, v in cols.items()}}
    bars = read_bars(_write(tmp_path, renamed), min_rows=10)
    assert len(bars) == N


@pytest.mark.parametrize("unit,scale", [("s", 10**9), ("ms", 10**6), ("us", 10**3), ("ns", 1)])
def test_integer_epoch_times(tmp_path, cols, unit, scale):
    ns = cols["ts"].cast(pa.int64()).to_numpy()
    cols["ts"] = (ns // scale).astype(np.int64)
    bars = read_bars(_write(tmp_path, cols), min_rows=10)
    np.testing.assert_array_equal(bars.ts, (ns // scale) * scale)


def test_string_and_date_times(tmp_path, cols):
    ns = cols["ts"].cast(pa.int64()).to_numpy()
    cols["ts"] = pa.array([str(np.datetime64(int(t), "ns")) for t in ns])
    assert read_bars(_write(tmp_path, cols), min_rows=10).ts[5] == ns[5]
    days = np.datetime64("2000-01-03") + np.arange(N)
    cols["ts"] = pa.array(days.astype("datetime64[D]"))
    assert read_bars(_write(tmp_path, cols, "d.parquet"), min_rows=10).ts[1] == (
        days[1].astype("datetime64[ns]").astype(np.int64)
    )


def test_missing_file(tmp_path):
    msg = _error(tmp_path / "nope.parquet")
    assert "nope.parquet" in msg and "not found" in msg


def test_corrupt_file(tmp_path):
    p = tmp_path / "bad.parquet"
    p.write_bytes(b"PAR1 this is not parquet at all")
    msg = _error(p)
    assert "bad.parquet" in msg and "not a readable parquet" in msg


def test_truncated_file(tmp_path, cols):
    p = _write(tmp_path, cols)
    data = open(p, "rb").read()
    open(p, "wb").write(data[: len(data) // 2])
    assert "not a readable parquet" in _error(p)


@pytest.mark.parametrize("missing", ["open", "high", "low", "close", "volume"])
def test_missing_column(tmp_path, cols, missing):
    cols[f"{missing}_renamed"] = cols.pop(missing)
    msg = _error(_write(tmp_path, cols))
    assert f"missing column '{missing}'" in msg and "bars.parquet" in msg


def test_missing_time_column(tmp_path, cols):
    cols["when"] = cols.pop("ts")
    msg = _error(_write(tmp_path, cols))
    assert "no time column" in msg and "when" in msg


def test_non_numeric_column(tmp_path, cols):
    cols["close"] = pa.array([str(x) for x in cols["close"]])
    msg = _error(_write(tmp_path, cols))
    assert "column 'close'" in msg and "expected a number" in msg


def test_unparseable_time(tmp_path, cols):
    cols["ts"] = pa.array(["yesterday"] * N)
    assert "column 'ts' cannot be read as timestamps" in _error(_write(tmp_path, cols))


@pytest.mark.parametrize(
    "column,row,value,expect",
    [
        ("close", 7, np.nan, "column 'close' row 7: value is NaN"),
        ("volume", 11, np.inf, "column 'volume' row 11: value is infinite"),
        ("open", 13, -np.inf, "column 'open' row 13: value is infinite"),
        ("volume", 5, -3.0, "column 'volume' row 5: negative volume -3.0"),
        ("low", 9, 0.0, "column 'low' row 9: price 0.0 is not positive"),
    ],
)
def test_bad_values(tmp_path, cols, column, row, value, expect):
    cols[column] = cols[column].copy()
    cols[column][row] = value
    assert expect in _error(_write(tmp_path, cols))


def test_null_is_reported_as_missing(tmp_path, cols):
    close = cols["close"].tolist()
    close[4] = None
    cols["close"] = pa.array(close, type=pa.float64())
    assert "column 'close' row 4: value is NaN or missing" in _error(_write(tmp_path, cols))


def test_high_below_body(tmp_path, cols):
    cols["high"] = cols["high"].copy()
    cols["high"][21] = min(cols["open"][21], cols["close"][21]) * 0.999
    msg = _error(_write(tmp_path, cols))
    assert "column 'high' row 21" in msg and "below max(open, close)" in msg


def test_low_above_body(tmp_path, cols):
    cols["low"] = cols["low"].copy()
    cols["low"][30] = max(cols["open"][30], cols["close"][30]) * 1.001
    msg = _error(_write(tmp_path, cols))
    assert "column 'low' row 30" in msg and "above min(open, close)" in msg


def test_unsorted_timestamps(tmp_path, cols):
    ts = cols["ts"].cast(pa.int64()).to_numpy().copy()
    ts[50], ts[51] = ts[51], ts[50]
    cols["ts"] = pa.array(ts).cast(pa.timestamp("ns"))
    msg = _error(_write(tmp_path, cols))
    assert "column 'ts' row 51: unsorted timestamp" in msg


def test_duplicate_timestamps(tmp_path, cols):
    ts = cols["ts"].cast(pa.int64()).to_numpy().copy()
    ts[80] = ts[79]
    cols["ts"] = pa.array(ts).cast(pa.timestamp("ns"))
    assert "column 'ts' row 80: duplicate timestamp" in _error(_write(tmp_path, cols))


def test_too_few_rows(tmp_path, cols):
    need = default_min_rows()
    short = {k: v[: need - 1] for k, v in cols.items()}
    msg = _error(_write(tmp_path, short))
    assert f"{need - 1} rows, need at least {need}" in msg


def test_cli_reports_data_error_with_exit_2(tmp_path, cols):
    cols["close"][3] = np.nan
    path = _write(tmp_path, cols)
    proc = subprocess.run(
        [sys.executable, "-m", "tftjax.data", path], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "column 'close' row 3" in lines[0]


def test_every_bundled_set_reads_and_nasdaq_is_arch_s():
    from tftjax.data.bundled import DATASETS, bundled_path

    for name in DATASETS:
        assert len(read_bars(bundled_path(name))) > 2000, name
    import arch.data.nasdaq

    src = arch.data.nasdaq.load()  # the source SOURCES.md names
    b = read_bars(bundled_path("nasdaq"))
    np.testing.assert_array_equal(b.close, src["Close"].to_numpy(np.float64))
    np.testing.assert_array_equal(b.volume, src["Volume"].to_numpy(np.float64))
    assert np.datetime64(int(b.ts[0]), "ns") == np.datetime64("1999-01-04")
