"""Your own columns as inputs (tftjax.data.covariates): no look-ahead, roles honoured (a known
column at its decoder slots' own times, an observed one at rows up to the origin), the
forward-fill limit and its flag, the unknown bucket, and bad input refused in one line."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import call
from covariate_panel import LONG_GAP, panel_table, write_panel

from tftjax.config import preset
from tftjax.data import load_dataset
from tftjax.errors import ConfigError, DataError

CFG = preset("tiny").override(
    observed=("flow",), known=("event",), static=("sector", "beta"), categorical=("event", "sector")
)
E, D = CFG.data.encoder_steps, CFG.data.decoder_steps


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    return write_panel(tmp_path_factory.mktemp("cov") / "panel.parquet")


def one_series(tmp_path, n=400, gap_at=None, **columns):
    """Daily business-day bars of one series with ``columns`` (a gap of 3 bars at row
    ``gap_at``: those days are dropped)."""
    days = np.arange(
        np.datetime64("2016-01-04"), np.datetime64("2019-01-01"), dtype="datetime64[D]"
    )
    days = days[np.is_busday(days)]
    keep = np.ones(days.size, bool)
    if gap_at is not None:
        keep[gap_at : gap_at + 3] = False
    days = days[keep][:n]
    rng = np.random.default_rng(0)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    cols = {
        "ts": days.astype("datetime64[ns]"),
        "open": close,
        "high": close * 1.01,
        "low": close * 0.99,
        "close": close,
        "volume": np.full(n, 1e5),
        **{k: (v(n) if callable(v) else v) for k, v in columns.items()},
    }
    path = tmp_path / "one.parquet"
    pq.write_table(pa.table(cols), path)
    return str(path)


def test_no_covariate_value_after_t_reaches_a_window_that_ends_by_t(panel, tmp_path):
    ds = load_dataset(panel, CFG.data)
    table = panel_table()
    s0 = ds.series[0]
    t_row = s0.splits.test_rows[0] + 20  # inside the test stretch: the statistics are fixed
    t = int(s0.bars.ts[t_row])
    ts = table.column("ts").cast(pa.int64()).to_numpy()
    later = ts > t
    rng = np.random.default_rng(1)
    flow = table.column("flow").to_numpy(zero_copy_only=False).copy()
    flow[later] = rng.normal(0, 5, later.sum())
    event = np.array(table.column("event").to_pylist(), dtype=object)
    event[later] = rng.choice(["none", "opex", "qend", "brand-new"], later.sum())
    changed = table.set_column(table.schema.get_field_index("flow"), "flow", pa.array(flow))
    changed = changed.set_column(
        changed.schema.get_field_index("event"), "event", pa.array(event.tolist())
    )
    path = tmp_path / "changed.parquet"
    pq.write_table(changed, path)
    other = load_dataset(str(path), CFG.data)
    for a, b in zip(ds.series, other.series):
        upto = int(np.searchsorted(a.bars.ts, t, side="right"))  # rows at or before t
        fa, fb = a.features, b.features
        np.testing.assert_array_equal(fa.historical[:upto], fb.historical[:upto])
        np.testing.assert_array_equal(fa.known[:upto], fb.known[:upto])
        np.testing.assert_array_equal(fa.static[1:], fb.static[1:])  # 0: the file name's code
        # the decoder inputs of every window that ends by t: origins D or more rows before it
        np.testing.assert_array_equal(fa.future[: upto - D], fb.future[: upto - D])
        for split in ("train", "val", "test"):
            sa, sb = getattr(a.splits, split), getattr(b.splits, split)
            np.testing.assert_array_equal(sa[sa + E + D <= upto], sb[sb + E + D <= upto])
        assert not np.array_equal(fa.future[upto:], fb.future[upto:])  # the change arrived


def z_of(ds, name, values):
    fit = ds.series[0].features.stats.covariates
    return (np.asarray(values, np.float64) - fit["mean"][name]) / fit["std"][name]


def test_a_known_column_is_read_at_its_decoder_slots_and_an_observed_one_up_to_the_origin(
    tmp_path,
):
    x = lambda n: np.arange(n, dtype=np.float64) ** 1.5  # distinct values, a row's own
    path = one_series(tmp_path, gap_at=250, x=x)
    known = load_dataset(path, preset("tiny").override(known=("x",)).data)
    s = known.series[0]
    slots = s.features.timeline.slot_index()
    assert np.diff(slots).max() == 4  # the gap: 3 business days with no bar
    raw = s.bars.columns["x"]
    for origin in (200, 247, 248, 249, 300):
        want = slots[origin] + np.arange(1, D + 1)
        # the row on each decoder slot, or (the gap) the last row before it: never a later one
        row = np.searchsorted(slots, want, side="right") - 1
        np.testing.assert_allclose(
            s.features.future[origin, :, -1], z_of(known, "x", raw[row]), rtol=1e-6
        )
        assert (row >= origin).all() and (slots[row] <= want).all()
    assert s.features.historical.shape[1] == 210  # nothing of it in the encoder's history
    np.testing.assert_allclose(s.features.known[:, -1], z_of(known, "x", raw), rtol=1e-6)

    observed = load_dataset(path, preset("tiny").override(observed=("x",)).data)
    o = observed.series[0].features
    assert o.future.shape[2] == 10 and o.known.shape[1] == 10  # not a decoder input
    np.testing.assert_allclose(o.historical[:, 210], z_of(observed, "x", raw), rtol=1e-6)
    assert not o.historical[:, 211].any()  # nothing missing: the flag is 0


def test_observed_values_are_carried_forward_up_to_the_limit_with_a_flag(tmp_path):
    n = 400

    def y(n):
        v = np.arange(n, dtype=np.float64) % 7
        v[200:203] = np.nan  # 3 missing: carried forward
        v[300:340] = np.nan  # 40 missing: 10 carried, 30 stale (limit 10)
        return v

    path = one_series(tmp_path, n=n, y=y)
    cfg = preset("tiny").override(observed=("y",), max_ffill=10)
    ds = load_dataset(path, cfg.data)
    f, s = ds.series[0].features, ds.series[0]
    raw = s.bars.columns["y"]
    value, flag = f.historical[:, 210], f.historical[:, 211]
    np.testing.assert_allclose(value[200:203], z_of(ds, "y", [raw[199]] * 3), rtol=1e-6)
    np.testing.assert_allclose(value[300:310], z_of(ds, "y", [raw[299]] * 10), rtol=1e-6)
    assert (value[310:340] == 0).all()  # stale: no value
    assert flag[200:203].all() and flag[300:340].all() and flag.sum() == 43
    np.testing.assert_array_equal(np.flatnonzero(f.own.stale), np.arange(310, 340))
    # every window whose encoder holds a stale row is left out, by hand
    full = preset("tiny").override(observed=("y",), max_ffill=1000)
    every = load_dataset(path, full.data).series[0].splits
    for split in ("train", "val", "test"):
        starts = getattr(every, split)
        clean = starts[(starts + E <= 310) | (starts >= 340)]
        np.testing.assert_array_equal(getattr(s.splits, split), clean)


def test_a_level_training_never_saw_takes_the_unknown_bucket_and_is_noted(tmp_path):
    def kind(n):
        v = np.where(np.arange(n) % 3 == 0, "a", "b").astype(object)
        v[-20:] = "c"  # only after the training rows
        return v

    path = one_series(tmp_path, kind=kind)
    ds = load_dataset(path, preset("tiny").override(observed=("kind",), categorical=("kind",)).data)
    (col,) = ds.schema.columns
    assert col.levels == ("a", "b")
    f = ds.series[0].features
    np.testing.assert_array_equal(f.historical[-20:, 210], 2.0)  # the unknown bucket
    np.testing.assert_array_equal(f.historical[:3, 210], [0, 1, 1])
    assert any("level(s) c not seen in the training rows" in w for w in ds.warnings)


def test_more_levels_than_allowed_a_text_real_and_a_varying_static_are_refused(panel, tmp_path):
    many = lambda n: np.array([f"L{i}" for i in range(n)], dtype=object)
    path = one_series(tmp_path, kind=many)
    cats = preset("tiny").override(observed=("kind",), categorical=("kind",), max_categories=50)
    with pytest.raises(
        DataError,
        match=r"'kind' has [0-9]+ levels in the training rows, more than --max-categories 50",
    ):
        load_dataset(path, cats.data)
    with pytest.raises(
        DataError, match=r"column 'kind' holds text \('L0'\), and --observed takes it as a real"
    ):
        load_dataset(path, preset("tiny").override(observed=("kind",)).data)
    with pytest.raises(
        DataError,
        match=r"panel.parquet\[a\]: column 'volume' takes [0-9]+ values within one series",
    ):
        load_dataset(panel, preset("tiny").override(static=("volume",)).data)
    with pytest.raises(DataError, match=r"column 'flow' row [0-9]+: a --static value is missing"):
        load_dataset(panel, preset("tiny").override(static=("flow",)).data)
    with pytest.raises(DataError, match=r"no column 'fundng' \(named by --target-column"):
        load_dataset(panel, preset("tiny").override(observed=("fundng",)).data)
    with pytest.raises(
        ConfigError, match=r"column 'flow' is named in two roles \(--observed and --known\)"
    ):
        preset("tiny").override(observed=("flow",), known=("flow",))
    with pytest.raises(ConfigError, match=r"--categorical sector: not named by"):
        preset("tiny").override(categorical=("sector",))


def test_a_missing_known_value_is_refused_naming_the_column_and_its_time(tmp_path):
    def ev(n):
        v = np.array(["x"] * n, dtype=object)
        v[150] = None
        return v

    path = one_series(tmp_path, ev=ev)
    cfg = preset("tiny").override(known=("ev",), categorical=("ev",))
    with pytest.raises(
        DataError,
        match=r"column 'ev' row 150 \(2016-0[78]-[0-9]{2}T00:00:00 \(no zone\)\): a --known value is missing",
    ):
        load_dataset(path, cfg.data)


def test_the_train_command_refuses_bad_columns_in_one_line_before_training(panel, tmp_path, capsys):
    from tftjax.train import main

    run = tmp_path / "run"
    for flags, says in (
        (["--observed", "nope"], "no column 'nope'"),
        (["--observed", "flow", "--known", "flow"], "named in two roles"),
        (["--static", "volume"], "values within one series"),
        (["--observed", "event"], "holds text ('none'), and --observed takes it as a real"),
    ):
        rc = call(main, "--preset", "tiny", "--parquet-file", panel, "--workdir", run, *flags)
        err = capsys.readouterr().err
        assert rc == 2 and says in err and err.count("\n") == 1, (flags, err)
        assert not run.exists()


def test_the_schema_round_trips_and_sets_the_models_widths(panel):
    from tftjax.data.covariates import Schema
    from tftjax.training.run import model_inputs

    ds = load_dataset(panel, CFG.data)
    meta = ds.stats_meta()
    assert Schema.from_json(meta["covariates"]) == ds.schema
    assert [(c["name"], c["role"], c["categorical"], c["dtype"]) for c in meta["covariates"]] == [
        ("sector", "static", True, "text"),
        ("beta", "static", False, "number"),
        ("flow", "observed", False, "number"),
        ("event", "known", True, "text"),
    ]
    model = model_inputs(CFG, ds)
    assert (model.model.num_static, model.model.num_historical, model.model.num_known) == (
        7,
        212,
        11,
    )
    assert model.model.categories == (4, 3)  # event: 3 levels + unknown; sector: 2 + unknown
    f = ds.features
    assert f.historical.shape[1] == 212 and f.future.shape[2] == 11 and f.static.shape[1] == 7
    c = ds.series[2]
    assert c.features.own.stale[LONG_GAP[0] :].sum() == (LONG_GAP[1] - LONG_GAP[0]) - E - D


def test_known_values_ahead_come_from_rows_with_empty_prices_or_a_future_table(tmp_path):
    n, ahead = 400, 5
    ev = lambda m: np.array([f"e{i % 3}" for i in range(m)], dtype=object)

    def prices_then_nothing(n_all):  # the last rows: no prices, the schedule only
        path = one_series(tmp_path, n=n_all, ev=ev)
        t = pq.read_table(path)
        for c in ("open", "high", "low", "close", "volume"):
            v = t.column(c).to_numpy().copy()
            v[n:] = np.nan
            t = t.set_column(t.schema.get_field_index(c), c, pa.array(v))
        pq.write_table(t, path)
        return path

    cfg = preset("tiny").override(known=("ev",), categorical=("ev",))
    ds = load_dataset(prices_then_nothing(n + ahead), cfg.data, need_splits=False)
    s = ds.series[0]
    assert len(s.bars) == n and s.bars.ahead is not None and s.bars.ahead[0].size == ahead
    levels = ds.schema.columns[0].levels
    want = [levels.index(f"e{i % 3}") for i in range(n, n + ahead)]
    np.testing.assert_array_equal(s.features.future[n - 1, :, -1], want)
    assert not s.features.own.unscheduled[n - 1]
    # the same values from a --future table; its times must share the bars' zone-awareness
    days = pq.read_table(prices_then_nothing(n + ahead)).column("ts").to_numpy()[n:]
    fut = tmp_path / "future.parquet"
    pq.write_table(pa.table({"ts": days, "ev": ev(n + ahead)[n:].tolist()}), fut)
    plain = one_series(tmp_path, n=n, ev=ev)
    f = load_dataset(plain, cfg.data, need_splits=False, future=str(fut)).series[0].features
    np.testing.assert_array_equal(f.future[n - 1, :, -1], want)
    zoned = tmp_path / "zoned.parquet"
    pq.write_table(
        pa.table({"ts": pa.array(days).cast(pa.timestamp("ns", tz="UTC")), "ev": ["e0"] * ahead}),
        zoned,
    )
    with pytest.raises(
        DataError, match=r"its times are in the zone UTC, and the bars' .* are naive"
    ):
        load_dataset(plain, cfg.data, need_splits=False, future=str(zoned))
    two = tmp_path / "two.parquet"  # rows of two series for a file of one: refused
    sym = ["x"] * (ahead - 1) + ["y"]
    pq.write_table(pa.table({"ts": days, "symbol": sym, "ev": ["e0"] * ahead}), two)
    with pytest.raises(DataError, match=r"its column 'symbol' names several series"):
        load_dataset(plain, cfg.data, need_splits=False, future=str(two))


def test_statics_from_a_static_file_equal_those_from_the_bars(panel, tmp_path):
    from covariate_panel import SERIES

    table = tmp_path / "statics.csv"
    rows = [f"{n},{sector},{beta}" for n, (sector, beta) in SERIES.items()]
    table.write_text("symbol,sector,beta\n" + "\n".join(rows) + "\n")
    from_file = load_dataset(panel, CFG.override(static_file=str(table)).data)
    np.testing.assert_array_equal(
        from_file.features.static, load_dataset(panel, CFG.data).features.static
    )
    table.write_text("symbol,sector,beta\n" + "\n".join(rows[:2]) + "\n")
    with pytest.raises(DataError, match=r"statics.csv: no row for series 'c'"):
        load_dataset(panel, CFG.override(static_file=str(table)).data)


def test_the_target_cannot_be_known_ahead():
    with pytest.raises(
        ConfigError, match=r"--known close: the target column cannot be an input known"
    ):
        preset("tiny").override(known=("close",))
