"""Several instruments in one model: windows inside their series, each series' statistics
from its own training rows, global split times, statics and the instrument embedding that
reach the model, per-series tables, forecasts of every series, unknown instruments, a
checkpoint from before vocabularies, and the refusals."""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import bars_columns, call, random_bars, short_es
from tiny import TINY_TFT, TINY_TRAIN

from tftjax import evaluate as evaluate_cli
from tftjax import predict as predict_cli
from tftjax import train as train_cli
from tftjax.config import TrainConfig, preset
from tftjax.data import gather, load_dataset, read_bars, to_device, write_bars
from tftjax.data.bars import read_series
from tftjax.errors import ConfigError, DataError
from tftjax.models.tft import apply_fn, init_variables
from tftjax.serving.forecast import forecast
from tftjax.serving.saved import open_model
from tftjax.training import Trainer, train_and_evaluate

CFG = preset("tiny", remat="off")
GROUP = pytest.mark.xdist_group("multiseries")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """ES's first 700 bars and a random walk over the same times ("alt")."""
    root = tmp_path_factory.mktemp("multi")
    es = read_bars(short_es())
    write_bars(es, root / "es.parquet")
    write_bars(random_bars(len(es), seed=3).replace(ts=es.ts), root / "alt.parquet")
    return root


def pair(files):
    return [files / "es.parquet", files / "alt.parquet"]


def test_windows_stay_inside_their_series_and_splits_share_the_calendar(files):
    ds = load_dataset(pair(files), CFG.data)
    W, E = CFG.data.window, CFG.data.embargo_rows
    assert ds.names == ("es", "alt") and ds.vocab == ("es", "alt")
    for split in ("train", "val", "test"):
        starts = getattr(ds.splits, split)
        which = ds.series_of(starts)
        assert set(which.tolist()) == {0, 1}
        assert (ds.series_of(starts + W - 1) == which).all()  # the last row: same series
    # global cut times: every series' splits start at the same times; the embargo is in
    # each series' own rows
    for name in ("val", "test"):
        t = {int(s.bars.ts[s.splits.rows(name)[0]]) for s in ds.series}
        assert len(t) == 1
    for s in ds.series:
        assert s.splits.val_rows[0] - s.splits.train_rows[1] == E
        assert s.splits.test_rows[0] - s.splits.val_rows[1] == E
    # one feature matrix, each series at its row offset
    o = ds.offsets[1]
    np.testing.assert_array_equal(ds.features.historical[o:], ds.series[1].features.historical)
    np.testing.assert_array_equal(ds.features.target[:o], ds.series[0].features.target)
    # the device gather of a window at the end of series 0 holds series 0's rows only
    last = int(ds.series[0].splits.test[-1])
    b = gather(
        to_device(ds.features),
        jnp.array([last], jnp.int32),
        CFG.data.encoder_steps,
        CFG.data.decoder_steps,
    )
    np.testing.assert_array_equal(
        np.asarray(b.target[0]),
        ds.series[0].features.target[last + CFG.data.encoder_steps : last + W],
    )


def test_statistics_are_each_series_own_from_its_training_rows(files, tmp_path):
    a = load_dataset(pair(files), CFG.data)
    alt = read_bars(files / "alt.parquet")
    t0 = a.series[1].splits.test_rows[0]
    k = np.arange(len(alt)) >= t0  # alt's test rows: prices and volumes changed
    write_bars(
        alt.replace(
            open=np.where(k, alt.open * 1.3, alt.open),
            high=np.where(k, alt.high * 1.3, alt.high),
            low=np.where(k, alt.low * 1.3, alt.low),
            close=np.where(k, alt.close * 1.3, alt.close),
            volume=np.where(k, alt.volume * 3 + 1, alt.volume),
        ),
        tmp_path / "alt.parquet",
    )
    b = load_dataset([files / "es.parquet", tmp_path / "alt.parquet"], CFG.data)
    assert a.cuts == b.cuts
    for sa, sb in zip(a.series, b.series):
        fa, fb = sa.features.stats, sb.features.stats
        np.testing.assert_array_equal(fa.hist_mean, fb.hist_mean)
        np.testing.assert_array_equal(fa.hist_std, fb.hist_std)
        np.testing.assert_array_equal(fa.static, fb.static)
        assert fa.target_scale == fb.target_scale
    np.testing.assert_array_equal(a.series[0].features.historical, b.series[0].features.historical)
    np.testing.assert_array_equal(
        a.series[1].features.historical[:t0], b.series[1].features.historical[:t0]
    )
    assert not np.array_equal(a.series[1].features.target[t0:], b.series[1].features.target[t0:])
    # and they are each series' own: alt's target scale is the std of alt's training returns
    # (winsorised: within a few % of the plain numpy std of those rows)
    lo, hi = a.series[1].splits.train_rows
    r = np.diff(np.log(alt.close))[lo - 1 : hi - 1]
    assert abs(a.series[1].features.stats.target_scale / r.std() - 1) < 0.05
    assert a.series[0].features.stats.target_scale != a.series[1].features.stats.target_scale


@pytest.mark.slow
@GROUP
def test_statics_and_the_instrument_embedding_reach_the_model(files):
    ds = load_dataset(pair(files), CFG.data)
    st = ds.features.static
    s0, s1 = st[0], st[ds.offsets[1]]
    # the instrument: an int32 row of the table, not a float static (static input 0 is 0)
    assert ds.features.instrument.dtype == np.int32 and s0[0] == s1[0] == 0.0
    assert (ds.features.instrument[0], ds.features.instrument[ds.offsets[1]]) == (0, 1)
    # log price and log volume dropped (back-adjusted levels carry later splits: zero for
    # every series); log volatility and the bar interval are the series' own
    assert s0[1] == s1[1] == s0[2] == s1[2] == 0.0 and s0[3] != s1[3]
    cfg = CFG.override(instruments=2, dropout=0.0)
    variables = init_variables(cfg, jax.random.key(0))
    starts = jnp.array([ds.series[0].splits.train[0]] * 2, jnp.int32)
    b = gather(to_device(ds.features), starts, cfg.data.encoder_steps, cfg.data.decoder_steps)
    assert b.instrument.tolist() == [0, 0]
    static = jnp.stack([jnp.asarray(s0), jnp.asarray(s1)])  # same window, other statics
    inst = jnp.array([0, 1], jnp.int32)  # and another instrument
    f = apply_fn(cfg)
    out = jax.jit(lambda v: f(v, static, b.historical, b.known, True, inst)[0])(variables)
    assert float(jnp.abs(out[0] - out[1]).max()) > 1e-4
    with pytest.raises(ValueError, match="needs `instrument`"):  # never a float static again
        f(variables, static, b.historical, b.known, True)

    def table_grad(params, key, train):  # d(sum of outputs)/d(instrument table)
        def loss(p):
            if not train:
                return f({"params": p}, static, b.historical, b.known, True, inst)[0].sum()
            return f(
                {"params": p}, static, b.historical, b.known, False, inst, rngs={"dropout": key}
            )[0].sum()

        return jax.grad(loss)(params)["static_vsn"]["instrument_table"]

    grad = jax.jit(table_grad, static_argnums=2)
    g = grad(variables["params"], jax.random.key(0), False)
    norms = np.linalg.norm(np.asarray(g), axis=1)
    assert norms[0] > 0 and norms[1] > 0 and norms[2] == 0  # the unknown row: unused here
    # in training, --instrument-dropout sends some windows to the unknown row: it learns
    hit = [
        np.linalg.norm(np.asarray(grad(variables["params"], jax.random.key(i), True)[2]))
        for i in range(8)
    ]
    assert max(hit) > 0


@pytest.fixture(scope="module")
def run(files, tmp_path_factory):
    root = tmp_path_factory.mktemp("multirun")
    # with its plots: the quantile fans' titles name each window's series
    from tftjax import plots

    titles, draw = [], plots.quantile_fan
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "quantile_fan", lambda *a, **k: (titles.extend(a[5]), draw(*a, **k)))
        assert (
            call(
                train_cli.main,
                *TINY_TFT,
                "--epochs",
                "1",
                "--workdir",
                root / "run",
                "--parquet-file",
                *pair(files),
            )
            == 0
        )
    (root / "run" / "fan_titles.json").write_text(json.dumps(titles))
    return root / "run"


@pytest.mark.slow
@GROUP
def test_one_model_over_two_series_reports_each_and_the_pool(run, files, capsys):
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["series"]) == {"es", "alt"}
    assert (run / "quantile_fan.png").stat().st_size > 1000
    titles = json.loads((run / "fan_titles.json").read_text())  # test windows of both series
    assert titles and all(t.split(": ")[0] in ("es", "alt") for t in titles), titles
    for name in ("es", "alt"):
        e = summary["series"][name]
        assert set(e["model"]) == {"train", "val", "test"}
        assert set(e["baselines"]) == set(summary["baselines"]) and "range_ewma" in e["baselines"]
    # the pool weighs every window alike: its loss is the window-weighted mean of the series'
    ds = load_dataset(pair(files), CFG.data)
    n = [int((ds.series_of(ds.splits.test) == i).sum()) for i in range(2)]
    pooled = sum(
        summary["series"][k]["model"]["test"]["loss"] * m for k, m in zip(("es", "alt"), n)
    )
    assert abs(pooled / sum(n) - summary["model"]["test"]["loss"]) < 1e-4
    saved = open_model(run)
    assert saved.cfg.model.instruments == 2
    assert saved.featurisation["vocab"] == ("es", "alt")
    # evaluate one of the series alone: the run's cut times, so the same test windows
    capsys.readouterr()
    assert (
        call(evaluate_cli.main, "--checkpoint", run, "--parquet-file", files / "alt.parquet") == 0
    )
    out = capsys.readouterr().out
    assert f"test split, {n[1]:,} windows" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("TFT ") and " test " in ln)
    assert abs(float(line.split()[2]) - summary["series"]["alt"]["model"]["test"]["loss"]) < 1e-4


@pytest.mark.slow
@GROUP
def test_forecasts_of_every_series_are_their_scored_windows(run, files, tmp_path):
    saved = open_model(run)
    ds = load_dataset(pair(files), saved.cfg.data, **saved.featurisation)
    test = ds.splits.test
    scored, _ = Trainer(saved.cfg, saved.tc, to_device(ds.features)).predict(saved.variables, test)
    e = saved.cfg.data.encoder_steps
    j = int(np.flatnonzero(ds.series_of(test) == 1)[3])  # a test window of alt
    origin = ds.ts[test[j] + e - 1]
    f = forecast(saved, as_of=str(np.datetime64(int(origin), "ns")))
    assert list(f.table["instrument"][:: saved.cfg.data.decoder_steps]) == ["es", "alt"]
    # same step, another batch row: a few ulps (tests/serving/test_predict.py says why)
    np.testing.assert_allclose(f.pred[1], scored[j], rtol=1e-5, atol=1e-6 * np.abs(scored[j]).max())
    scale = ds.series[1].features.stats.target_scale
    np.testing.assert_array_equal(
        f.table["q50"][saved.cfg.data.decoder_steps :], f.pred[1][:, 1].astype(np.float64) * scale
    )
    out = tmp_path / "f.csv"
    assert call(predict_cli.main, "--checkpoint", run, "--out", out) == 0
    import pyarrow.csv as pcsv

    t = pcsv.read_csv(out).to_pydict()
    assert t["instrument"] == ["es"] * 5 + ["alt"] * 5
    assert len(set(t["data_sha256"])) == 2  # each series' own data


@pytest.mark.slow
@GROUP
def test_a_universe_file_with_a_new_listing_forecasts_under_embed(run, files, tmp_path):
    """A symbol that starts after the model's training cut has no training rows to fit
    statistics on: it takes the trained series' pooled statistics, and the file says so."""
    es, alt = read_bars(files / "es.parquet"), read_bars(files / "alt.parquet")
    new = random_bars(len(es), seed=7).replace(ts=es.ts).slice(520, len(es))  # after the cut
    table = pa.concat_tables(
        [
            pa.table({**bars_columns(b), "symbol": [name] * len(b)})
            for name, b in (("es", es), ("alt", alt), ("new", new))
        ]
    )
    pq.write_table(table, tmp_path / "universe.parquet")
    saved = open_model(run)
    cut = saved.featurisation["cuts"][0]
    assert new.ts[0] > cut  # no row of the new listing before the training cut
    f = forecast(saved, tmp_path / "universe.parquet", unknown="embed")
    d = saved.cfg.data.decoder_steps
    assert f.table["instrument"][::d].tolist() == ["alt", "es", "new"]
    assert f.table["stats_from"][::d].tolist() == ["trained", "trained", "pooled"]
    assert np.isfinite(f.pred).all()
    # the pooled statistics: the trained series' training rows taken together, checked
    # against the two series' own (a row-count-weighted mean of their means)
    stats = saved.featurisation["stats"]
    w = np.array([stats[n].train_rows[1] - stats[n].train_rows[0] for n in ("es", "alt")], float)
    mean = (w[0] * stats["es"].hist_mean + w[1] * stats["alt"].hist_mean) / w.sum()
    np.testing.assert_allclose(f.dataset.series[2].features.stats.hist_mean, mean, rtol=1e-12)
    # without embed the same file is refused in one line, naming the symbol
    with pytest.raises(DataError, match="instrument 'new' is not one the model was trained on"):
        forecast(saved, tmp_path / "universe.parquet")


@pytest.mark.slow
@GROUP
def test_unknown_instruments_are_refused_or_embedded_on_purpose(run, files, tmp_path, capsys):
    other = tmp_path / "other.parquet"
    shutil.copy(files / "alt.parquet", other)
    out = tmp_path / "f.parquet"
    rc = call(predict_cli.main, "--checkpoint", run, "--parquet-file", other, "--out", out)
    err = capsys.readouterr().err
    assert rc == 2 and "instrument 'other' is not one the model was trained on (es, alt)" in err
    assert err.count("\n") == 1 and not out.exists()
    # named as the instrument it is: the trained row and statistics
    assert (
        call(
            predict_cli.main,
            "--checkpoint",
            run,
            "--parquet-file",
            other,
            "--instrument",
            "alt",
            "--out",
            out,
        )
        == 0
    )
    named = pq.read_table(out).to_pydict()
    # served as unknown: the reserved row and its own statistics (other numbers)
    assert (
        call(
            predict_cli.main,
            "--checkpoint",
            run,
            "--parquet-file",
            other,
            "--unknown-instrument",
            "embed",
            "--out",
            out,
        )
        == 0
    )
    unknown = pq.read_table(out).to_pydict()
    assert unknown["instrument"][0] == "other" and named["instrument"][0] == "alt"
    assert unknown["q50"] != named["q50"]


@pytest.mark.slow
@GROUP
def test_a_checkpoint_from_before_vocabularies_still_evaluates(files, tmp_path, capsys):
    """A one-series run whose checkpoint holds what tftjax wrote before vocabularies: no
    instrument table, static input 0 the old real-valued code, no per-series metadata."""
    ds = load_dataset(files / "es.parquet", CFG.data, vocab=None)
    tc = TrainConfig(epochs=1, batch_size=32, max_steps_per_epoch=2, patience=0)
    train_and_evaluate(
        CFG, tc, tmp_path / "old", data=ds, progress=False, log=lambda *a: None, plots=False
    )
    final = next((tmp_path / "old" / "checkpoints").glob("tft_final_epoch*"))
    meta_file = final / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    for k in ("series", "vocab", "cuts"):
        meta.pop(k)
    meta["identity"]["model"]["model"].pop("instruments")
    meta["identity"]["model"]["model"].pop("instrument_dropout")
    meta_file.write_text(json.dumps(meta))
    saved = open_model(tmp_path / "old")
    assert saved.cfg.model.instruments == 0 and saved.featurisation["vocab"] is None
    assert "instrument_table" not in saved.variables["params"]["static_vsn"]
    capsys.readouterr()
    assert (
        call(
            evaluate_cli.main,
            "--checkpoint",
            tmp_path / "old",
            "--parquet-file",
            files / "es.parquet",
        )
        == 0
    )
    assert "TFT " in capsys.readouterr().out


def test_an_instrument_index_outside_the_vocabulary_is_refused(files):
    """The table lookup under jit would clip an index to a wrong row without a word."""
    from tftjax.training.trainer import predict_windows

    ds = load_dataset(pair(files), CFG.data)  # rows 0 and 1, and 2 for the unknown one
    bad = ds.features.instrument.copy()
    bad[-1] = 3
    data = to_device(dataclasses.replace(ds.features, instrument=bad))
    cfg = CFG.override(instruments=2)
    for build in (
        lambda: Trainer(cfg, TrainConfig(), data),
        lambda: predict_windows(cfg, TrainConfig(), data, None, np.zeros(1, np.int32)),
    ):
        with pytest.raises(
            ConfigError,
            match=r"instrument index 3 is outside this model's "
            r"vocabulary \(rows 0\.\.2",
        ):
            build()


def test_long_files_split_by_symbol(files, tmp_path):
    es, alt = read_bars(files / "es.parquet"), read_bars(files / "alt.parquet")
    table = pa.concat_tables(
        [
            pa.table({**bars_columns(b), "symbol": [name] * len(b)})
            for name, b in (("ES", es), ("ALT", alt))
        ]
    )
    table = table.take(pa.array(np.argsort(np.concatenate([es.ts, alt.ts]), kind="stable")))
    pq.write_table(table, tmp_path / "long.parquet")
    series = read_series(tmp_path / "long.parquet")
    assert [s.symbol for s in series] == ["ALT", "ES"]
    np.testing.assert_array_equal(series[1].close, es.close)
    np.testing.assert_array_equal(series[0].ts, alt.ts)
    ds = load_dataset(tmp_path / "long.parquet", CFG.data)
    assert ds.names == ("ALT", "ES")
    # a symbol missing on a row: refused, naming it
    sym = table.column("symbol").to_pylist()
    sym[5] = None
    bad = table.set_column(table.column_names.index("symbol"), "symbol", pa.array(sym))
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"column 'symbol' row 5: missing symbol"):
        read_series(tmp_path / "bad.parquet")


@pytest.mark.parametrize(
    "case,expect",
    [
        ("no_symbol", "a long file needs a symbol column (symbol, ticker, instrument, …)"),
        ("intervals", "series of different bar intervals in one run: es 1min, hourly 1h"),
        ("missing_dir", "--out"),
        ("as_of_after", "is after the data: the last bar of"),
        ("as_of_before", "can be an origin at --as-of 2013-09-01"),
        ("dqn", "not a TFT checkpoint (a DQN trader's)"),
    ],
)
@pytest.mark.slow
@GROUP
def test_bad_multiseries_input_exits_2_with_one_line(run, files, tmp_path, capsys, case, expect):
    es = read_bars(files / "es.parquet")
    out = tmp_path / "f.parquet"
    if case == "no_symbol":  # two instruments stacked in one file, nothing to tell them apart
        table = pa.concat_tables([pa.table(bars_columns(es))] * 2)
        pq.write_table(
            table.take(pa.array(np.argsort(np.concatenate([es.ts, es.ts]), kind="stable"))),
            tmp_path / "long.parquet",
        )
        args = (
            train_cli.main,
            *TINY_TRAIN,
            "--workdir",
            tmp_path / "r",
            "--parquet-file",
            tmp_path / "long.parquet",
        )
    elif case == "intervals":
        hourly = random_bars(len(es), seed=4)
        hourly = hourly.replace(ts=es.ts[0] + np.arange(len(es), dtype=np.int64) * 3600 * 10**9)
        write_bars(hourly, tmp_path / "hourly.parquet")
        args = (
            train_cli.main,
            *TINY_TRAIN,
            "--workdir",
            tmp_path / "r",
            "--parquet-file",
            files / "es.parquet",
            tmp_path / "hourly.parquet",
        )
    elif case == "missing_dir":
        out = tmp_path / "nowhere" / "f.parquet"
        args = (predict_cli.main, "--checkpoint", run, "--out", out)
    elif case == "as_of_after":
        args = (predict_cli.main, "--checkpoint", run, "--as-of", "2020-01-01", "--out", out)
    elif case == "as_of_before":
        args = (predict_cli.main, "--checkpoint", run, "--as-of", "2013-09-01", "--out", out)
    else:  # the same refusal meets a DQN run's checkpoint: its metadata says kind "dqn"
        ck = tmp_path / "ck"
        shutil.copytree(next((run / "checkpoints").glob("tft_final_epoch*")), ck)
        meta = json.loads((ck / "meta" / "metadata").read_text())
        (ck / "meta" / "metadata").write_text(json.dumps({**meta, "kind": "dqn"}))
        args = (predict_cli.main, "--checkpoint", ck, "--out", out)
    rc = call(*args)
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists() and not (tmp_path / "r" / "checkpoints").exists()
