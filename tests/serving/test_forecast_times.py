"""Forecast files a desk can trust (issue 37): ``--as-of`` on the data's clock on both sides
of UTC with no later bar read, zone-aware times, horizons on the calendar's own slots across
a daylight-saving change, weekdays for daily bars without a calendar, ``--split test``
against ``evaluate``, the Python API against the CLI, and the refusals.

The model is the suite's tiny run (``conftest.predict_run``). Where a test needs another
clock (a calendar, daily bars) it swaps the clock saved with the model's statistics: the
weights do not depend on it, and the times written are a function of the clock alone."""

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import call

import tftjax
from tftjax import predict as predict_cli
from tftjax.data import read_bars, to_device, write_bars
from tftjax.data.calendar import day_of_week, make_clock, to_utc, to_wall
from tftjax.data.sessions import NS_DAY, NS_MIN
from tftjax.errors import ConfigError
from tftjax.serving.forecast import forecast
from tftjax.serving.saved import open_model
from tftjax.training import Trainer, evaluate_model
from tftjax.training.evaluation import window_targets

GROUP = pytest.mark.xdist_group("runloop_base")  # the tiny runs' compiled steps


def with_clock(saved, **changes):
    """The model with its saved clock changed (``Clock`` fields)."""
    fz = dict(saved.featurisation)
    fz["stats"] = {
        k: dataclasses.replace(v, clock=dataclasses.replace(v.clock, **changes))
        for k, v in fz["stats"].items()
    }
    return saved._replace(featurisation=fz)


def restamped(bars, ts, tz=None):
    return dataclasses.replace(bars, ts=np.asarray(ts, np.int64), tz=tz)


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@pytest.mark.parametrize("zone,offset", [("America/New_York", "-04:00"), ("Asia/Tokyo", "+09:00")])
@GROUP
def test_as_of_is_read_in_the_data_zone_and_no_later_bar_is_read(
    predict_run, tmp_path, zone, offset
):
    saved = open_model(predict_run / "run")
    bars = read_bars(predict_run / "bars.parquet")  # naive: the wall clock of `zone` below
    aware = restamped(bars, to_utc(bars.ts, zone), zone)
    path = tmp_path / "bars.parquet"  # the model's series, with its zone
    write_bars(aware, path)
    o = len(bars) - 40
    wall = np.datetime64(int(bars.ts[o]), "ns") + np.timedelta64(30, "s")  # bar o's wall clock
    a = forecast(saved, path, as_of=str(wall))
    # read as UTC, the naive as-of would pick a bar 4 hours early in New York (stale) and 9
    # hours late in Tokyo (look-ahead); on the data's clock it picks bar o on either side
    assert a.rows.tolist() == [o]
    b = forecast(saved, path, as_of=str(wall.astype("datetime64[s]")) + offset)
    assert b.rows.tolist() == [o]  # the same instant given with its offset
    k = np.arange(len(bars)) > o  # every bar after the as-of instant changed
    changed = aware.replace(
        close=np.where(k, aware.close * 1.5, aware.close),
        high=np.where(k, aware.high * 1.5, aware.high),
        volume=np.where(k, aware.volume * 3 + 1, aware.volume),
    )
    (tmp_path / "changed").mkdir()
    write_bars(changed, tmp_path / "changed" / "bars.parquet")
    c = forecast(saved, tmp_path / "changed" / "bars.parquet", as_of=str(wall))
    np.testing.assert_array_equal(a.pred, c.pred)
    # naive training bars, zone-aware bars now: read on their zone's wall clock, and said so;
    # that is the naive file's own clock, so the forecast is the naive file's
    naive = forecast(saved, predict_run / "bars.parquet", as_of=str(wall))
    np.testing.assert_array_equal(a.pred, naive.pred)
    assert any(f"carry the zone {zone}, and are read on its wall clock" in w for w in a.warnings)
    t = a.to_arrow()
    assert t.schema.field("origin_time").type == pa.timestamp("ns", tz=zone)
    assert t.schema.field("target_time_utc").type == pa.timestamp("ns", tz="UTC")
    assert t.column("origin_time_utc")[0].value == aware.ts[o]
    assert t.column("target_time_utc")[0].value == aware.ts[o] + NS_MIN
    assert t.schema.metadata[b"tftjax.time_zone"] == zone.encode()


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@GROUP
def test_target_times_are_the_calendars_slots_across_a_dst_change(predict_run, tmp_path):
    pytest.importorskip("exchange_calendars")
    from tftjax.data.sessions import sessions, slots

    chicago = "America/Chicago"
    saved = with_clock(open_model(predict_run / "run"), calendar="XCME", zone=chicago)
    # naive Chicago 1-minute bars of the Globex sessions up to Friday 2024-03-08 16:59 CST;
    # the clocks go forward on Sunday 2024-03-10, before Globex reopens at 17:00 CDT
    last = int(
        to_utc(np.array([np.datetime64("2024-03-08T16:59", "ns").astype(np.int64)]), chicago)[0]
    )
    grid = slots(sessions("XCME", last - 10 * NS_DAY, last), NS_MIN)
    bars = read_bars(predict_run / "bars.parquet")
    ts = to_wall(grid[grid <= last][-len(bars) :], chicago)
    write_bars(restamped(bars, ts), tmp_path / "bars.parquet")
    f = forecast(saved, tmp_path / "bars.parquet")
    target = np.array(f.table["target_time"], "datetime64[ns]")
    # the origin: Friday's last Globex minute, 16:59 CST, or 15:59 since exchange_calendars
    # 4.13.3 (it closes the session at 16:00 CT); the test reads it from the calendar
    friday = np.datetime64(int(ts[-1]), "ns")
    assert friday in (np.datetime64("2024-03-08T16:59"), np.datetime64("2024-03-08T15:59"))
    assert np.array(f.table["origin_time"], "datetime64[ns]")[0] == friday
    # the calendar's slots, on the bars' own (Chicago) clock: 17:00, 17:01, … on Sunday,
    # not 16:00 (the elapsed 47 hours added to a clock that moved an hour)
    np.testing.assert_array_equal(
        target, np.datetime64("2024-03-10T17:00") + np.arange(5) * np.timedelta64(1, "m")
    )


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@GROUP
def test_daily_bars_without_a_calendar_forecast_weekdays(predict_run, tmp_path):
    bars = read_bars(predict_run / "bars.parquet")
    days = np.arange(np.datetime64("2016-01-04"), np.datetime64("2019-01-01"))
    days = days[np.is_busday(days)][: len(bars)]
    ns = days.astype("datetime64[ns]").astype(np.int64)
    # the clock a run fits: weekday bars → weekday slots; bars on every day → calendar days
    assert make_clock(ns, None, (0, ns.size)).weekdays
    every = np.arange(ns.size) * NS_DAY + ns[0]
    assert not make_clock(every, None, (0, every.size)).weekdays
    write_bars(restamped(bars, ns), tmp_path / "bars.parquet")
    saved = open_model(predict_run / "run")
    for weekdays in (True, False):
        f = forecast(
            with_clock(saved, interval=NS_DAY, weekdays=weekdays),
            tmp_path / "bars.parquet",
            origins="all",
        )
        target = np.array(f.table["target_time"], "datetime64[ns]").astype(np.int64)
        weekend = day_of_week(target) >= 5
        if weekdays:  # no weekend target; a Friday's first step is the next Monday
            assert not weekend.any() and f.table["bar_expected"].all()
            fri = np.flatnonzero(
                (day_of_week(f.table["origin_time"]) == 4) & (f.table["horizon"] == 1)
            )[0]
            assert target[fri] - f.table["origin_time"][fri] == 3 * NS_DAY
        else:  # a model of calendar days (saved before the weekday grid): marked
            assert weekend.any()
            np.testing.assert_array_equal(f.table["bar_expected"], ~weekend)


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@GROUP
def test_a_stale_last_bar_is_flagged_and_a_range_is_not(predict_run):
    saved = open_model(predict_run / "run")
    bars = read_bars(predict_run / "bars.parquet")
    last = np.datetime64(int(bars.ts[-1]), "ns")
    # 3 minutes after the last 1-minute bar: the slots :00, :01 and :02 have no bar
    f = forecast(saved, as_of=str(last + np.timedelta64(3, "m")))
    assert f.table["missing_bars"].tolist() == [3] * 5
    assert any("is 3 calendar slots old" in w for w in f.warnings)
    # a range of origins up to the as-of: the earlier ones had their bars, none is missing
    g = forecast(saved, as_of=str(last), start=str(last - np.timedelta64(10, "m")))
    assert (
        g.rows.size == 11
        and not g.table["missing_bars"].any()
        and not any("calendar slots old" in w for w in g.warnings)
    )


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@GROUP
def test_split_test_rows_are_evaluates_windows_and_losses(predict_run):
    saved = open_model(predict_run / "run")
    f = forecast(saved, split="test")
    ds, e, d = f.dataset, saved.cfg.data.encoder_steps, saved.cfg.data.decoder_steps
    test = ds.splits.test
    assert f.rows.tolist() == (test + e - 1).tolist() and set(f.table["split"]) == {"test"}
    # evaluate's eval step on the same windows; forecasts run the fused forward (the same
    # function, tftjax.training.trainer.inference_config): float32 rounding over ~20 layers,
    # a few ulps each; a wrong window is off by O(1)
    scored, _ = Trainer(saved.cfg, saved.tc, to_device(ds.features)).predict(saved.variables, test)
    np.testing.assert_allclose(f.pred, scored, rtol=1e-5, atol=1e-6 * np.abs(scored).max())
    scale = ds.series[0].features.stats.target_scale
    y = window_targets(ds, test).astype(np.float64) * scale
    np.testing.assert_array_equal(f.table["realised"], y.reshape(-1))
    assert f.table["horizon"].size == test.size * d
    m = evaluate_model(saved, split="test", log=lambda *a: None)["model"]["test"]
    ok = np.isfinite(f.table["realised"])
    absy = np.abs(f.table["realised"][ok]).sum()
    # evaluate sums float32 pinball terms on the device, batch by batch (64 windows × 5 steps
    # a batch, 2 batches): its relative error is below (terms per sum) × 2^-24 ≈ 2e-5 in the
    # worst case; the file's float64 sums are exact to 1e-15. A wrong window or target is off
    # by far more.
    for level in (50, 90):
        q_risk = 2 * f.table[f"loss_q{level}"][ok].sum() / absy
        assert q_risk == pytest.approx(m[f"q_risk_{level}"], rel=2e-5)


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@GROUP
def test_the_api_and_the_cli_write_the_same_file(predict_run, tmp_path):
    run = predict_run / "run"
    assert (
        call(
            predict_cli.main,
            "--checkpoint",
            run,
            "--origins",
            "4",
            "--out",
            tmp_path / "cli.parquet",
        )
        == 0
    )
    model = tftjax.load(run)
    model.run(origins=4).write(tmp_path / "api.parquet")
    a, b = pq.read_table(tmp_path / "cli.parquet"), pq.read_table(tmp_path / "api.parquet")
    assert a.schema == b.schema and a.schema.metadata == b.schema.metadata
    assert a.to_pandas().equals(b.to_pandas())  # NaN where both have NaN (no realised yet)
    # a pandas table in, a pandas table out, the same forecasts
    df = pq.read_table(predict_run / "bars.parquet").to_pandas()
    out = model.forecast(df, origins=2, instrument="bars")
    assert type(out).__name__ == "DataFrame" and out.attrs["tftjax"]["checkpoint"] == str(run)
    np.testing.assert_array_equal(out["q50"].to_numpy(), a.column("q50").to_numpy()[-10:])
    # issue 50: a one-instrument model reads a table without a symbol column as its own
    # instrument, unnamed; pandas on every path; the quantiles in order
    assert "symbol" not in df.columns and model.series == ("bars",)
    unnamed = model.forecast(df, origins=2)
    assert unnamed.equals(out)
    scored = model.forecast(split="test")
    assert type(scored).__name__ == "DataFrame" and len(scored) > 0
    q = scored[[f"q{x * 100:g}" for x in model.quantiles]].to_numpy()
    assert (np.diff(q, axis=1) >= 0).all()
    # the API's errors name its arguments, not the command line's flags
    with pytest.raises(ConfigError) as e:
        model.forecast(as_of="2013-09-02 5pm")
    assert str(e.value).startswith("as_of '2013-09-02 5pm' is not a time"), e.value
    with pytest.raises(ConfigError) as e:
        model.forecast(origins="x")
    assert "--" not in str(e.value) and str(e.value).startswith("origins must be"), e.value


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@pytest.mark.parametrize(
    "args,expect",
    [
        (
            ["--start", "2013-09-02T10:00", "--end", "2013-09-02T09:00"],
            "--start 2013-09-02T10:00 is after --end 2013-09-02T09:00",
        ),
        (["--as-of", "2013-09-02 5pm"], "--as-of '2013-09-02 5pm' is not a time"),
        (["--series", "nope"], "--series nope: not a series of this data (bars; the model knows"),
        (["--split", "test", "--parquet-file", "OTHER"], "--split test: these bars are not the"),
        (["--as-of", "2013-09-02T08:00+09:00", "--parquet-file", "OTHER"], "has a UTC offset, but"),
        (["--checkpoint", "CKS"], "is a run's folder of checkpoints; give the run folder"),
    ],
)
@GROUP
def test_bad_forecast_requests_exit_2_with_one_line(predict_run, tmp_path, capsys, args, expect):
    bars = read_bars(predict_run / "bars.parquet")
    other = tmp_path / "bars.parquet"  # the model's series, other (shorter) data
    write_bars(bars.slice(0, 600), other)
    args = [
        str(other)
        if a == "OTHER"
        else str(predict_run / "run" / "checkpoints")
        if a == "CKS"
        else a
        for a in args
    ]
    if "--checkpoint" not in args:
        args = ["--checkpoint", str(predict_run / "run"), *args]
    rc = call(predict_cli.main, *args, "--out", tmp_path / "f.parquet")
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "f.parquet").exists()
