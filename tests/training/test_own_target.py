"""A target of your own on data that is not OHLCV bars (``--inputs own --target-column
demand --target-transform level``): the electricity fixture trains and forecasts, scored
against the last value and the seasonal naive (tftjax.stats.levels, tested by hand); bad
targets are refused in one line."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import call
from electricity import FLAGS, PER_DAY, write
from tiny import TINY_TFT

from tftjax.config import preset
from tftjax.data import load_dataset
from tftjax.errors import DataError
from tftjax.stats import levels


def test_the_level_baselines_by_hand():
    y = np.array([1.0, 4.0, 2.0, 5.0, 3.0, 6.0, 4.0, 7.0, 5.0, 8.0, 6.0, 9.0])
    d = 2
    dt = np.full((y.size, d), np.nan)  # no gaps: step k is row t + k
    for k in (1, 2):
        dt[: y.size - k, k - 1] = y[k:]
    train, qs, origins = (0, 10), (0.5,), np.array([9, 10])
    out = levels.forecasts(y, dt, origins, qs, train, season=2)
    # last value: y[t] + the median of y[s+k] - y[s] over training origins with s + k < 10
    med = [np.median(y[1:10] - y[0:9]), np.median(y[2:10] - y[0:8])]
    np.testing.assert_allclose(out["last_value"][:, :, 0], y[origins][:, None] + med)
    # seasonal naive, season 2: step 1 reads row t - 1, step 2 row t; its errors' medians
    e1 = [y[s + 1] - y[s - 1] for s in range(1, 9)]
    e2 = [y[s + 2] - y[s] for s in range(0, 8)]
    want = np.stack([y[origins - 1] + np.median(e1), y[origins] + np.median(e2)], axis=1)
    np.testing.assert_allclose(out["seasonal_naive"][:, :, 0], want)


def test_bad_targets_are_refused_naming_the_column_and_row(tmp_path):
    path = write(tmp_path / "demand.parquet")
    t = pq.read_table(path)
    bad = t.set_column(1, "demand", pa.array(np.full(t.num_rows, -1.0)))
    neg = tmp_path / "negative.parquet"
    pq.write_table(bad, neg)
    cfg = preset("tiny").override(inputs="own", target_column="demand")
    with pytest.raises(
        DataError,
        match=r"column 'demand' row 0: value -1.0 is zero or less, and --target-transform log_return",
    ):
        load_dataset(str(neg), cfg.data)
    with pytest.raises(DataError, match=r"no column 'load' \(named by"):
        load_dataset(path, preset("tiny").override(inputs="own", target_column="load").data)
    holes = t.column("demand").to_numpy().copy()
    holes[300] = np.nan
    gap = tmp_path / "gap.parquet"
    pq.write_table(t.set_column(1, "demand", pa.array(holes)), gap)
    with pytest.raises(DataError, match=r"column 'demand' row 300: the target is missing"):
        load_dataset(str(gap), cfg.override(target_transform="level").data)


@pytest.mark.slow
def test_electricity_demand_trains_and_forecasts_against_the_level_baselines(tmp_path, capsys):
    from tftjax.predict import main as predict
    from tftjax.train import main as train

    data = write(tmp_path / "demand.parquet")
    run = tmp_path / "run"
    rc = call(train, *TINY_TFT, *FLAGS, "--epochs", "1", "--parquet-file", data, "--workdir", run)
    out = capsys.readouterr()
    assert rc == 0, out.err
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["baselines"]) == {"last_value", "seasonal_naive"}
    test = [b["test"]["q_risk_90"] for b in summary["baselines"].values()]
    assert np.isfinite(test).all() and np.isfinite(summary["model"]["test"]["q_risk_90"])
    assert "seasonal naive (--season)" in out.out and "last value" in out.out
    ds = load_dataset(data, preset("tiny").override(
        inputs="own", target_column="demand", target_transform="level",
        observed=("temperature",), known=("working_day",), season=PER_DAY,
    ).data)  # fmt: skip
    assert ds.features.historical.shape[1] == 1 + 2  # the target itself, temperature, its flag

    fc = tmp_path / "f.parquet"
    assert call(predict, "--checkpoint", run, "--out", fc) == 0, capsys.readouterr().err
    t = pq.read_table(fc)
    np.testing.assert_array_equal(t.column("level_q50").to_numpy(), t.column("q50").to_numpy())
    last = ds.series[0].bars.columns["demand"][-1]  # the origin: the last row with a demand
    assert np.all(t.column("value_at_origin").to_numpy() == last)
    assert "value of column 'demand'" in t.schema.metadata[b"tftjax.target"].decode()
