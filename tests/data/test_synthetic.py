"""Synthetic ES-like bars: deterministic, valid, calibrated on the bundled ES file."""

import subprocess
import sys

import numpy as np
import pytest

from tftjax.data import default_parquet, read_bars
from tftjax.data.bars import validate
from tftjax.data.synthetic import SESSION_MINUTES, TICK, calibrate, generate


@pytest.fixture(scope="module")
def cal():
    return calibrate()


def test_deterministic_and_valid(cal):
    a = generate(3, seed=5, calibration=cal)
    b = generate(3, seed=5, calibration=cal)
    c = generate(3, seed=6, calibration=cal)
    assert len(a) == 3 * SESSION_MINUTES
    np.testing.assert_array_equal(a.close, b.close)
    np.testing.assert_array_equal(a.volume, b.volume)
    assert not np.array_equal(a.close, c.close)
    validate(a, min_rows=1)  # OHLC consistent, positive, sorted unique timestamps
    assert np.allclose(np.round(a.close / TICK) * TICK, a.close)


def test_sessions_and_weekends(cal):
    bars = generate(6, calibration=cal)  # Mon..Fri, then Monday again
    gaps = np.diff(bars.ts) // (60 * 10**9)
    big = gaps[gaps > 1]
    assert list(big) == [61, 61, 61, 61, 2941]  # daily 16:00→17:00 break, one weekend
    first = np.datetime64(int(bars.ts[0]), "ns")
    assert str(first) == "2013-09-01T17:00:00.000000000"


def test_calibrated_on_es(cal):
    es = read_bars(default_parquet())
    bars = generate(20, calibration=cal)
    r = np.diff(np.log(bars.close))
    es_r = np.diff(np.log(es.close))
    assert 0.5 < r.std() / es_r.std() < 2.0
    assert 0.5 < bars.volume.mean() / es.volume.mean() < 2.0
    # Volatility clusters: |r| is autocorrelated at lag 1.
    a = np.abs(r)
    assert np.corrcoef(a[:-1], a[1:])[0, 1] > 0.05


@pytest.mark.slow  # the CLI in a subprocess
def test_cli_writes_parquet(tmp_path):
    out = tmp_path / "syn.parquet"
    proc = subprocess.run(
        [sys.executable, "-m", "tftjax.data.synthetic", "--days", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(read_bars(out)) == 2 * SESSION_MINUTES
    bad = subprocess.run(
        [sys.executable, "-m", "tftjax.data.synthetic", "--days", "0", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--days" in bad.stderr
