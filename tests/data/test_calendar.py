"""Calendar-true known inputs, time zones, input checks and outliers (issue 11).

References are hand computations from the calendar (the exchange's published
hours) and the wall clock; the causality tests compare a window's inputs with
those computed after the bars behind its forecast time were changed, added or
deleted.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from conftest import bars_columns, random_bars, write_table

from tftjax import train as train_cli
from tftjax.config import DataConfig
from tftjax.data import (
    Bars,
    DataError,
    build_features,
    bundled_path,
    default_parquet,
    gather,
    quality_warnings,
    read_bars,
    to_device,
)
from tftjax.data.calendar import (
    NS_DAY,
    NS_MIN,
    Clock,
    Timeline,
    calendar_features,
    make_clock,
    parse_interval,
)
from tftjax.data.features import HISTORICAL_NAMES, KNOWN_NAMES, WARMUP, known_inputs
from tftjax.errors import ConfigError

pytest.importorskip("exchange_calendars")

E, D = 20, 5
NY = "America/New_York"


def ns(text: str) -> int:
    return int(np.datetime64(text, "ns").astype(np.int64))


def feat(row, name):
    return float(row[KNOWN_NAMES.index(name)])


# ------------------------------------------------------------------ intervals and zones
@pytest.mark.parametrize(
    "text,want",
    [
        ("1min", NS_MIN),
        ("5m", 5 * NS_MIN),
        ("1h", 60 * NS_MIN),
        ("1d", NS_DAY),
        ("30s", 30 * 10**9),
        ("2hours", 120 * NS_MIN),
        ("500ms", 5 * 10**8),
        ("1T", NS_MIN),
    ],
)
def test_parse_interval(text, want):
    assert parse_interval(text) == want


@pytest.mark.parametrize("bad", ["", "5", "fast", "-1min", "0h", "3 parsecs", "1M"])
def test_bad_interval_and_zone_are_config_errors(bad):
    with pytest.raises(ConfigError, match="--bar-interval"):
        parse_interval(bad)
    with pytest.raises(ConfigError, match="--timezone"):
        DataConfig(timezone="Mars/Olympus_Mons")


def _dst_bars(zone_of_column):
    """9:30 New York on the Friday before and the Monday after the 2021-03-14 DST change,
    stored as UTC instants (14:30Z before, 13:30Z after)."""
    ts = np.array(
        [
            ns("2021-03-12T14:30"),
            ns("2021-03-12T14:31"),
            ns("2021-03-15T13:30"),
            ns("2021-03-15T13:31"),
        ]
    )
    one = np.ones(4)
    return Bars("dst.parquet", ts, one, one, one, one, one, tz=zone_of_column)


@pytest.mark.parametrize("how", ["utc_data_with_timezone_flag", "zone_of_the_data"])
def test_dst_week_wall_clock(tmp_path, how):
    bars, flag = _dst_bars("UTC"), NY
    if how == "zone_of_the_data":  # a column typed timestamp[ns, America/New_York], no flag
        path = write_table(
            tmp_path / "ny.parquet",
            {
                **bars_columns(bars),
                "ts": pa.array(bars.ts, pa.int64()).cast(pa.timestamp("ns", tz=NY)),
            },
        )
        bars, flag = read_bars(path, min_rows=1), None
        assert bars.tz == NY
    clock = make_clock(bars.ts, bars.tz, (0, 4), timezone=flag)
    assert clock.zone == NY and clock.interval == NS_MIN
    fs = FeatureView(*known_inputs(bars.ts, clock, 2)[:2])
    tod = 9.5 / 24
    want = [np.sin(2 * np.pi * tod), np.cos(2 * np.pi * tod)]
    # the 9:30 open has the same time of day on both sides of the change
    np.testing.assert_allclose(fs.known[0, :2], want, atol=1e-6)
    np.testing.assert_allclose(fs.known[2, :2], want, atol=1e-6)
    # and the next slots of a Monday bar are 9:31 and 9:32 New York
    nxt = 9.5 / 24 + np.array([1, 2]) / 1440
    np.testing.assert_allclose(fs.future[2, :, 0], np.sin(2 * np.pi * nxt), atol=1e-6)
    # without the zone, the UTC clock shifts by one hour across the change
    plain = known_inputs(bars.ts, dataclasses.replace(clock, zone="UTC"), 2)[0]
    assert clock.data_zone == bars.tz and abs(plain[0, 0] - plain[2, 0]) > 0.1


class FeatureView:
    def __init__(self, known, future):
        self.known, self.future = known, future


# ------------------------------------------------------------------ an exchange calendar, by hand
def test_xnys_early_close_holiday_and_weekend_by_hand():
    # Thanksgiving week 2013: closed Thu 28 Nov, Fri 29 Nov closes at 13:00 (early).
    wall = np.array([ns("2013-11-27T15:59"), ns("2013-11-29T12:58")])
    tl = Timeline(wall, Clock(NS_MIN, NY, None, "XNYS"), future=3)
    utc, fut_wall = tl.future(3)
    want = [
        [ns("2013-11-29T09:30"), ns("2013-11-29T09:31"), ns("2013-11-29T09:32")],
        [ns("2013-11-29T12:59"), ns("2013-12-02T09:30"), ns("2013-12-02T09:31")],
    ]
    np.testing.assert_array_equal(fut_wall, want)
    f = calendar_features(utc, fut_wall, tl)
    # Friday's first slot comes after a closed Thursday: scheduled gap 15:59 Wed → 9:30 Fri
    gap_min = (ns("2013-11-29T09:30") - ns("2013-11-27T15:59")) // NS_MIN
    assert feat(f[0, 0], "sched_gap") == pytest.approx(np.log(gap_min), rel=1e-6)
    assert feat(f[0, 1], "sched_gap") == 0.0
    # the early close: at 12:59 one minute is left (a normal day would leave 3 h 1 min)
    assert feat(f[1, 0], "session_left") == pytest.approx(1 / 1440, rel=1e-4)
    assert feat(f[1, 0], "session_elapsed") == pytest.approx((3 * 60 + 29) / 1440, rel=1e-5)
    gap_min = (ns("2013-12-02T09:30") - ns("2013-11-29T12:59")) // NS_MIN
    assert feat(f[1, 1], "sched_gap") == pytest.approx(np.log(gap_min), rel=1e-6)
    assert feat(f[1, 1], "session_left") == pytest.approx(6.5 / 24, rel=1e-5)


def test_a_session_break_restarts_the_grid():
    # Hong Kong, 2020-01-06: 09:30-12:00 and 13:00-16:00 local (01:30-04:00, 05:00-08:00 UTC)
    utc = np.array([ns("2020-01-06T03:30")])
    tl = Timeline(utc, Clock(60 * NS_MIN, "Asia/Hong_Kong", "UTC", "XHKG"), future=3)
    _, wall = tl.future(3)
    np.testing.assert_array_equal(
        wall[0], [ns("2020-01-06T13:00"), ns("2020-01-06T14:00"), ns("2020-01-06T15:00")]
    )


def test_xnys_daily_sessions_by_hand():
    wall = np.array([ns("2013-11-26"), ns("2013-11-27")])
    tl = Timeline(wall, Clock(NS_DAY, NY, None, "XNYS"), future=3)
    utc, fut = tl.future(3)
    np.testing.assert_array_equal(fut[1], [ns("2013-11-29"), ns("2013-12-02"), ns("2013-12-03")])
    f = calendar_features(utc, fut, tl)
    assert feat(f[1, 0], "session_left") == pytest.approx(3.5 / 24)  # early close
    assert feat(f[1, 1], "session_left") == pytest.approx(6.5 / 24)
    assert feat(f[1, 0], "sched_gap") == pytest.approx(np.log(2))  # Thanksgiving skipped
    assert feat(f[1, 1], "sched_gap") == pytest.approx(np.log(3))  # the weekend
    assert feat(f[1, 2], "sched_gap") == 0.0


def test_without_calendar_decoder_steps_are_interval_steps():
    bars = random_bars(401, seed=2)
    fs = build_features(bars, DataConfig(encoder_steps=E, decoder_steps=D), train_rows=(0, 300))
    assert fs.stats.clock.interval == NS_MIN and fs.stats.clock.calendar is None
    t = 399  # the bar before a 2-hour gap: its decoder steps are still the next minutes
    assert bars.ts[t + 1] - bars.ts[t] == 120 * NS_MIN
    tod = (bars.ts[t] % NS_DAY + np.arange(1, D + 1) * NS_MIN) / NS_DAY
    np.testing.assert_allclose(fs.future[t, :, 0], np.sin(2 * np.pi * tod), atol=1e-6)
    fixed = build_features(
        bars, DataConfig(encoder_steps=E, decoder_steps=D, bar_interval="5min"), train_rows=(0, 300)
    )
    assert fixed.stats.clock.interval == 5 * NS_MIN


# ------------------------------------------------------------------ causality, end to end
def _gappy_bars(n=1500, seed=4):
    """1-minute bars with 30% of minutes missing (quiet minutes of a trade-built series)."""
    b = random_bars(int(n / 0.7) + 50, seed=seed)
    keep = np.random.default_rng(seed).random(len(b)) > 0.3
    return dataclasses.replace(
        b, **{f: getattr(b, f)[keep][:n] for f in ("ts", "open", "high", "low", "close", "volume")}
    )


def _window(fs, s):
    batch = gather(to_device(fs), jnp.asarray([s], jnp.int32), E, D)
    # every model input, and the volatility a --vol-target forecast is scaled by
    return [np.asarray(x)[0] for x in (batch.static, batch.historical, batch.known, batch.scale)]


def _edits(bars, t, rng):
    """Three changed series: a later bar changed, one added, one deleted (all after row t)."""
    n, cols = len(bars), ("ts", "open", "high", "low", "close", "volume")
    j = int(rng.integers(t + 1, n))
    changed = bars.replace(
        close=np.where(np.arange(n) == j, bars.close * 1.03, bars.close),
        high=np.where(np.arange(n) == j, bars.high * 1.05, bars.high),
        volume=np.where(np.arange(n) >= j, bars.volume * 7 + 1, bars.volume),
    )
    k = int(rng.integers(t + 1, n))  # add a bar half-way between bars k-1 and k
    new_ts = (bars.ts[k - 1] + bars.ts[k]) // 2
    if new_ts in (bars.ts[k - 1], bars.ts[k]):
        new_ts = bars.ts[k - 1] + 1
    added = bars.replace(
        **{
            c: np.insert(getattr(bars, c), k, new_ts if c == "ts" else getattr(bars, c)[k - 1])
            for c in cols
        }
    )
    deleted = bars.replace(**{c: np.delete(getattr(bars, c), j) for c in cols})
    return {"changed": changed, "added": added, "deleted": deleted}


@pytest.mark.parametrize(
    "source,calendar", [("es", None), ("es", "XCME"), ("gappy", None), ("gappy", "XCME")]
)
def test_no_input_of_a_window_depends_on_bars_after_its_forecast_time(source, calendar):
    bars = read_bars(default_parquet()) if source == "es" else _gappy_bars()
    steps = np.diff(bars.ts)
    assert np.count_nonzero(steps > NS_MIN) >= 30  # many gaps (the ES file has 34)
    cfg = DataConfig(encoder_steps=E, decoder_steps=D, calendar=calendar)
    n = len(bars)
    ref = build_features(bars, cfg, train_rows=(0, n // 2))
    stats = ref.stats
    rng = np.random.default_rng(11)
    starts = rng.integers(WARMUP, n - E - D - 2, size=6)
    # include windows whose decoder spans a gap, where realised bars would differ most
    gap_rows = np.flatnonzero(steps > NS_MIN)
    starts = np.concatenate([starts, gap_rows[gap_rows > WARMUP + E][:3] - E + 1])
    for s in starts:
        t = int(s) + E - 1  # the forecast time is bar t
        want = _window(ref, int(s))
        for what, other in _edits(bars, t, rng).items():
            got = _window(build_features(other, cfg, stats=stats), int(s))
            for name, a, b in zip(("static", "historical", "known", "scale"), want, got):
                np.testing.assert_array_equal(a, b, err_msg=f"{name} of window {s}, {what}")


@pytest.fixture(scope="module")
def spx_xnys():
    bars = read_bars(bundled_path("spx"))
    cfg = DataConfig(encoder_steps=E, decoder_steps=10, calendar="XNYS")
    return bars, build_features(bars, cfg, train_rows=(0, 3000))


@pytest.mark.parametrize(
    "origin", ["2001-09-10", "2004-06-10", "2012-10-26", "2018-11-26", "2018-12-04"]
)
def test_decoder_slots_are_the_exchange_rules_known_at_the_origin(origin, spx_xnys):
    """S&P 500 daily with XNYS: closures decided after the fact (9/11, Reagan's funeral,
    hurricane Sandy, G. H. W. Bush's funeral announced on 2018-11-30) are not in the decoder
    slots of an earlier origin. Reference: numpy's business days (no regular NYSE holiday
    falls within these ten days)."""
    bars, fs = spx_xnys
    t = int(np.flatnonzero(bars.ts == ns(origin))[0])
    _, wall = fs.timeline.future(10)
    days = wall[t].astype("datetime64[ns]").astype("datetime64[D]")
    want = np.busday_offset(np.datetime64(origin, "D"), np.arange(1, 11), roll="forward")
    np.testing.assert_array_equal(days, want)
    gaps = fs.future[t][:, KNOWN_NAMES.index("sched_gap")]
    want_gap = np.log(
        np.diff(np.concatenate([[np.datetime64(origin, "D")], want])).astype(np.int64)
    )
    np.testing.assert_allclose(gaps, want_gap, atol=1e-6)


def test_an_ad_hoc_closure_recorded_later_changes_no_input(monkeypatch):
    """The calendar's rows after an origin are like its bars: an ad hoc closure that the
    package records (after the fact) changes no input of any window."""
    import exchange_calendars as xc

    bars = read_bars(bundled_path("spx")).slice(0, 900)
    cfg = DataConfig(encoder_steps=E, decoder_steps=D, calendar="XNYS")
    ref = build_features(bars, cfg, train_rows=(0, 600))
    extra = [pd.Timestamp("2002-03-12"), pd.Timestamp("2002-03-13")]
    cls = type(xc.get_calendar("XNYS"))
    monkeypatch.setattr(cls, "adhoc_holidays", property(lambda self: list(extra)))
    got = build_features(bars, cfg, train_rows=(0, 600))
    np.testing.assert_array_equal(ref.future, got.future)
    np.testing.assert_array_equal(ref.known, got.known)
    np.testing.assert_array_equal(ref.historical, got.historical)


def test_realised_gaps_are_historical_not_known():
    bars = _gappy_bars()
    fs = build_features(bars, DataConfig(encoder_steps=E, decoder_steps=D), train_rows=(0, 1000))
    miss = [HISTORICAL_NAMES.index(f"miss_{L}") for L in (2, 3, 5)]
    assert fs.historical[WARMUP:, miss].std(0).min() > 0.5  # the gaps are seen, as history
    # and the decoder never sees them: its inputs are those of ts[t] + k minutes
    t = int(np.flatnonzero(np.diff(bars.ts) > NS_MIN)[5])  # a bar followed by a gap
    tl = Timeline(bars.ts[t : t + 1], fs.stats.clock, D)
    fut = bars.ts[t] + np.arange(1, D + 1) * NS_MIN
    np.testing.assert_array_equal(fs.future[t], calendar_features(fut, fut, tl))


# ------------------------------------------------------------------ input checks
@pytest.fixture
def cols():
    return bars_columns(random_bars(300, seed=5))


def test_clashing_columns_are_refused(tmp_path, cols):
    path = write_table(tmp_path / "clash.parquet", {**cols, "Close": cols["close"] * 2})
    with pytest.raises(DataError, match=r"clash.parquet: columns 'close' and 'Close' both present"):
        read_bars(path)
    rc = train_cli.main(
        ["--parquet-file", path, "--preset", "tiny", "--workdir", str(tmp_path / "run")]
    )
    assert rc == 2 and not (tmp_path / "run" / "checkpoints").exists()


def test_integer_epochs_are_instants_and_weekly_bars_take_no_calendar(tmp_path, cols):
    path = write_table(tmp_path / "epoch.parquet", {**cols, "ts": cols["ts"].cast(pa.int64())})
    assert read_bars(path).tz == "UTC"
    with pytest.raises(ConfigError, match="longer than a session"):
        make_clock(np.arange(3) * 7 * NS_DAY, None, (0, 3), calendar="XNYS")


def test_a_futures_roll_is_one_series(tmp_path, cols):
    sym = np.where(np.arange(300) < 120, "ESZ3", "ESH4")
    path = write_table(tmp_path / "roll.parquet", {**cols, "symbol": sym})
    bars = read_bars(path)
    w = quality_warnings(bars, NS_MIN)
    assert any("column 'symbol' changes 1 time(s)" in x and "from row 120" in x for x in w)


def test_interleaved_instruments_are_refused(tmp_path, cols):
    sym = np.where(np.arange(300) % 2 == 0, "ESZ3", "NQZ3")
    path = write_table(tmp_path / "two.parquet", {**cols, "Symbol": sym})
    with pytest.raises(
        DataError,
        match=r"two.parquet: column 'Symbol' holds 2 instruments "
        r"\(ESZ3, NQZ3\), interleaved from row 1",
    ):
        read_bars(path)
    one = write_table(tmp_path / "one.parquet", {**cols, "symbol": np.full(300, "ESZ3")})
    assert len(read_bars(one)) == 300


def test_warnings_count_irregular_steps_and_zero_volume():
    bars = random_bars(500, seed=6)
    ts = bars.ts.copy()
    ts[100:] += 30 * 10**9  # from row 100 on, half a minute off the grid
    ts[300:] += 30 * 10**9
    bars = bars.replace(ts=ts, volume=np.where(np.arange(500) < 40, 0.0, bars.volume + 1))
    w = quality_warnings(bars, NS_MIN)
    assert any(
        "2 of 499 steps are not a whole number of the 1min bar interval" in x
        and "first at row 100" in x
        for x in w
    )
    assert any("40 of 500 bars have zero volume" in x for x in w)
    allzero = quality_warnings(bars.replace(volume=np.zeros(500)), NS_MIN)
    assert any("all of them" in x for x in allzero)


def test_a_100x_price_spike_cannot_set_the_target_scale():
    bars = random_bars(1500, seed=8)
    cfg = DataConfig(encoder_steps=E, decoder_steps=D)
    clean = build_features(bars, cfg, train_rows=(0, 1000))
    spike = bars.close.copy()
    spike[600] *= 100.0  # one bad print, OHLC consistent
    bad = bars.replace(close=spike, high=np.maximum(bars.high, spike))
    fs = build_features(bad, cfg, train_rows=(0, 1000))
    assert fs.stats.target_scale == pytest.approx(clean.stats.target_scale, rel=0.05)
    assert np.abs(fs.target).max() == pytest.approx(cfg.target_clip)  # the two jumps clipped
    assert np.count_nonzero(np.abs(fs.target) >= cfg.target_clip) == 2
    plain = build_features(
        bad, dataclasses.replace(cfg, winsorize=0.0, target_clip=0.0), train_rows=(0, 1000)
    )
    assert plain.stats.target_scale > 10 * clean.stats.target_scale  # what it would have been
    w = quality_warnings(bad, NS_MIN, fs.stats.target_scale)
    assert any(
        "2 returns beyond 50 target scales" in x and ("row 600" in x or "row 601" in x) for x in w
    )


def test_the_clock_is_fitted_on_training_rows_only():
    bars = random_bars(1200, seed=9)
    cfg = DataConfig(encoder_steps=E, decoder_steps=D)
    a = build_features(bars, cfg, train_rows=(0, 600)).stats.clock
    ts = bars.ts.copy()
    ts[600:] = ts[599] + np.cumsum(np.full(600, 5 * NS_MIN))  # later bars every 5 minutes
    b = build_features(bars.replace(ts=ts), cfg, train_rows=(0, 600)).stats.clock
    assert a == b and a.interval == NS_MIN
    c = build_features(bars.replace(ts=ts), cfg, train_rows=(0, 1200)).stats.clock
    assert c.interval == 5 * NS_MIN  # (the median of the whole file would be fooled)
