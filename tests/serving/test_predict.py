"""Forecasts (``python -m tftjax.predict``): the scored prediction of the same window bit for
bit, no bar after the origin in them, the times they show against the bars' own, and the
refusals."""

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import call

from tftjax import predict as predict_cli
from tftjax.data import load_dataset, read_bars, to_device, write_bars
from tftjax.serving.forecast import forecast
from tftjax.serving.saved import open_model
from tftjax.training import Trainer

GROUP = pytest.mark.xdist_group("runloop_base")  # the tiny runs' compiled steps


@pytest.fixture
def run(predict_run):
    return predict_run


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@GROUP
def test_a_forecast_is_the_scored_prediction_of_its_window(run):
    saved = open_model(run / "run")
    cfg = saved.cfg
    ds = load_dataset(run / "bars.parquet", cfg.data, **saved.featurisation)
    test = ds.splits.test
    scored, _ = Trainer(cfg, saved.tc, to_device(ds.features)).predict(saved.variables, test)
    e = cfg.data.encoder_steps
    for j in (0, len(test) - 1):
        origin = ds.bars.ts[test[j] + e - 1]
        f = forecast(saved, as_of=str(np.datetime64(int(origin), "ns")))
        assert f.rows.tolist() == [test[j] + e - 1]
        # the same compiled step on the same inputs, but the window sits in another row of
        # the batch: a GEMM may take another kernel path (SIMD remainder, FMA) for that row,
        # a few float32 ulps per layer over ~20 layers; a wrong window is off by O(1)
        np.testing.assert_allclose(
            f.pred[0], scored[j], rtol=1e-5, atol=1e-6 * np.abs(scored[j]).max()
        )
        q = f.table["q50"]  # the file's column is the forecast's own, times the scale
        np.testing.assert_array_equal(
            q, f.pred[0][:, 1].astype(np.float64) * saved.feature_stats.target_scale
        )


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@GROUP
def test_bars_after_the_origin_do_not_move_the_forecast(run, tmp_path):
    saved = open_model(run / "run")
    bars = read_bars(run / "bars.parquet")
    o = len(bars) - 40  # an origin with 39 bars after it
    as_of = str(np.datetime64(int(bars.ts[o]), "ns"))
    a = forecast(saved, run / "bars.parquet", as_of=as_of)
    k = np.arange(len(bars)) > o  # every price and volume after the origin changed
    changed = bars.replace(
        open=np.where(k, bars.open * 1.5, bars.open),
        high=np.where(k, bars.high * 1.5, bars.high),
        low=np.where(k, bars.low * 1.5, bars.low),
        close=np.where(k, bars.close * 1.5, bars.close),
        volume=np.where(k, bars.volume * 3 + 1, bars.volume),
    )
    write_bars(changed, tmp_path / "changed.parquet")
    b = forecast(saved, tmp_path / "changed.parquet", as_of=as_of, instrument="bars")
    assert a.rows.tolist() == b.rows.tolist() == [o]
    np.testing.assert_array_equal(a.pred, b.pred)


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@GROUP
def test_predict_writes_the_documented_file(run, tmp_path, capsys):
    out = tmp_path / "f.parquet"
    assert (
        call(
            predict_cli.main,
            "--checkpoint",
            run / "run",
            "--origins",
            "3",
            "--out",
            out,
            "--plot",
            tmp_path / "fan.png",
        )
        == 0
    )
    assert "| bar | time | q10 (log ret)" in capsys.readouterr().out
    t = pq.read_table(out).to_pydict()
    qs = ["q10", "q50", "q90"]
    # naive bars: naive times and no UTC columns; a per-bar target: no price quantiles
    assert list(t) == [
        "instrument",
        "origin_time",
        "target_time",
        "horizon",
        "bar_expected",
        "split",
        "missing_bars",
        "close_at_origin",
        *qs,
        "realised",
        "loss_q50",
        "loss_q90",
        "stats_from",
        "data_sha256",
    ]
    meta = pq.read_schema(out).metadata
    assert meta[b"tftjax.checkpoint"] == str(run / "run").encode()
    assert meta[b"tftjax.checkpoint_epoch"] == b"1"
    assert meta[b"tftjax.time_zone"].startswith(b"none: naive")
    from tftjax.runner.provenance import tree_sha256

    assert meta[b"tftjax.weights_sha256"].decode() == tree_sha256(open_model(run / "run").variables)
    from tftjax.data.identity import content_hash

    assert set(t["data_sha256"]) == {content_hash(read_bars(run / "bars.parquet"))}
    assert len(t["horizon"]) == 3 * 5 and t["horizon"][:5] == [1, 2, 3, 4, 5]
    # times against the bars' own: the last origin is the file's last bar, and on this
    # gap-free stretch of 1-minute bars bar k is k minutes after it
    bars = read_bars(run / "bars.parquet")
    last = np.datetime64(int(bars.ts[-1]), "ns")
    origins = np.array(t["origin_time"], "datetime64[ns]")
    targets = np.array(t["target_time"], "datetime64[ns]")
    assert origins[-1] == last
    np.testing.assert_array_equal(targets[-5:], last + np.arange(1, 6) * np.timedelta64(1, "m"))
    # the realised target and its loss where the data has it: the last origin has none
    assert np.isnan(t["realised"][-5:]).all() and np.isfinite(t["realised"][0])
    err = t["realised"][0] - t["q90"][0]
    assert t["loss_q90"][0] == pytest.approx(max(0.9 * err, -0.1 * err), rel=1e-12)
    assert (tmp_path / "fan.png").stat().st_size > 1000


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@pytest.mark.parametrize(
    "args,expect",
    [
        (["--origins", "x"], "--origins must be last, all or a number >= 1, got 'x'"),
        (["--out", "f.txt"], "give a .parquet or .csv file"),
        (["--as-of", "yesterday"], "--as-of 'yesterday' is not a time"),
        (["--as-of", "1990-01-01"], "can be an origin at --as-of 1990-01-01"),
    ],
)
@GROUP
def test_bad_predict_flags_exit_2(run, tmp_path, capsys, args, expect):
    rc = call(predict_cli.main, "--checkpoint", run / "run", *args)
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and err.count("\n") == 1 and "Traceback" not in err, err
