"""``--anchor``: the TFT's quantile head anchored on a volatility baseline. The untrained model
forecasts the anchor's own quantiles, ``auto`` chooses on validation only, epoch 0 is scored
so early stopping can keep the anchor, and the refusals."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from conftest import call, short_es
from tiny import tiny_tft

from tftjax import train as train_cli
from tftjax.config import ConfigError, TrainConfig, preset
from tftjax.data import bundled_path, load_dataset, to_device
from tftjax.stats import baselines, scoring
from tftjax.stats.volatility import anchor, range_variance
from tftjax.training import Trainer, create_train_state
from tftjax.training.anchoring import anchor_forecasts, resolve_anchor
from tftjax.training.evaluation import baselines_forecasts, window_targets

CFG = preset("tiny", remat="off")


@pytest.fixture(scope="module")
def spx():
    """S&P daily (every anchor defined), the tiny preset's windows."""
    return load_dataset(bundled_path("spx"), CFG.data)


def test_anchors_are_the_baselines_quantiles_by_hand(spx):
    # the range EWMA by hand (numpy recursion), against tftjax.stats.volatility.anchor
    s = spx.series[0]
    qs, (a, b) = np.asarray(CFG.head.quantiles), s.splits.train_rows
    y = s.features.target.astype(np.float64)
    rv = (
        range_variance(s.bars.open, s.bars.high, s.bars.low, s.bars.close)
        / s.features.stats.target_scale**2
    )
    v, prev = np.empty(y.size), float(np.mean(rv[a:b]))
    for t in range(y.size):  # v[t] = λ v[t-1] + (1-λ) rv[t], the variance of r[t+1]
        prev = 0.94 * prev + 0.06 * rv[t]
        v[t] = prev
    z = np.quantile(y[a + 1 : b] / np.sqrt(v[a : b - 1]), qs)
    got = anchor("range_ewma", y, CFG.data.decoder_steps, qs, (a, b), ranges=rv, daily=True)
    np.testing.assert_allclose(got.sigma[:, 0], np.sqrt(v), rtol=1e-9)
    np.testing.assert_allclose(got.z, z, rtol=1e-9)
    # and each anchor's quantiles are its baseline's, window for window
    starts = spx.splits.val
    base = baselines_forecasts(spx, qs, starts)
    for name in ("ewma_empirical", "range_ewma", "har"):
        np.testing.assert_allclose(
            anchor_forecasts(spx, name, qs, starts), base[name], rtol=1e-12, err_msg=name
        )


@pytest.mark.parametrize("name", ["ewma_empirical", "range_ewma", "har"])
def test_an_anchors_saved_fit_gives_its_forecasts_again(spx, name):
    """What a saved model keeps of its anchor (``Anchor.fit``: the starting variance, the
    standardised quantiles, HAR's coefficients and floor) gives the anchor it was fitted as,
    without the training rows: the path a saved model takes on new bars."""
    s = spx.series[0]
    qs, rows = np.asarray(CFG.head.quantiles), s.splits.train_rows
    y = s.features.target.astype(np.float64)
    rv = (
        range_variance(s.bars.open, s.bars.high, s.bars.low, s.bars.close)
        / s.features.stats.target_scale**2
    )
    kw = dict(ranges=rv, daily=True)
    fitted = anchor(name, y, CFG.data.decoder_steps, qs, rows, **kw)
    again = anchor(name, y, CFG.data.decoder_steps, qs, (0, 0), fit=fitted.fit, **kw)
    np.testing.assert_array_equal(again.z, fitted.z)  # read back, not refitted
    np.testing.assert_array_equal(again.sigma, fitted.sigma)  # the same recursion and start
    with pytest.raises(ValueError, match="a fit of the"):
        other = "har" if name != "har" else "range_ewma"
        anchor(other, y, CFG.data.decoder_steps, qs, rows, fit=fitted.fit, **kw)


# "zero" compiles a second predict program (the full tier; "learnt" is the quick tier's)
@pytest.mark.parametrize("median", ["learnt", pytest.param("zero", marks=pytest.mark.slow)])
def test_the_untrained_model_forecasts_the_anchors_quantiles(spx, median):
    cfg = CFG.override(anchor="range_ewma", anchor_median=median)
    _, ds, _ = resolve_anchor(cfg, spx)
    trainer = Trainer(cfg, TrainConfig(eval_batch_size=64), to_device(ds.features))
    state = create_train_state(cfg, trainer.tc, jax.random.key(0))
    starts = ds.splits.test[:100]
    pred, _ = trainer.predict(state.variables(), starts)
    want = anchor_forecasts(ds, "range_ewma", cfg.head.quantiles, starts)
    if median == "zero":
        want[..., 1] = 0.0
    # float32 σ and z, one product: a few float32 ulps of the float64 reference
    np.testing.assert_allclose(np.asarray(pred, np.float64), want, rtol=1e-6, atol=0)


def test_auto_chooses_the_lowest_validation_p90_and_reads_no_test_window(spx):
    cfg = CFG.override(anchor="auto")
    chosen, ds, scores = resolve_anchor(cfg, spx)
    assert set(scores) == {"ewma_empirical", "range_ewma", "har"}  # daily bars: HAR too
    # independently: the baselines' own forecasts scored on the validation windows
    y = window_targets(spx, spx.splits.val)
    base = baselines_forecasts(spx, cfg.head.quantiles, spx.splits.val)
    by_hand = {
        n: scoring.from_sums(scoring.window_sums(y, base[n], cfg.head.quantiles))["q_risk_90"]
        for n in scores
    }
    assert chosen.head.anchor == min(by_hand, key=by_hand.get)
    np.testing.assert_allclose([scores[n] for n in by_hand], list(by_hand.values()), rtol=1e-9)
    assert ds.features.anchor.shape == (len(ds.features), CFG.data.decoder_steps)
    # the test stretch does not enter the choice: scramble its targets (and every decoder
    # target that reaches into it) and its bars (the range anchors read OHLC), same choice
    # and the same validation scores
    s, rng = spx.series[0], np.random.default_rng(0)
    t0, d = s.splits.test_rows[0], CFG.data.decoder_steps
    target = s.features.target.copy()
    target[t0:] = rng.permutation(target[t0:]) * 5
    dec = s.features.decoder_target
    if dec is not None:
        dec = dec.copy()
        dec[t0 - d :] = rng.normal(size=dec[t0 - d :].shape) * 5
    order = np.concatenate([np.arange(t0), t0 + rng.permutation(len(s.bars.close) - t0)])
    bars = dataclasses.replace(
        s.bars,
        **{
            c: getattr(s.bars, c)[order] * (1 + (order >= t0))
            for c in ("open", "high", "low", "close")
        },
    )
    scrambled = dataclasses.replace(
        spx,
        series=(
            dataclasses.replace(
                s,
                bars=bars,
                features=dataclasses.replace(s.features, target=target, decoder_target=dec),
            ),
        ),
    )
    again = resolve_anchor(cfg, scrambled)
    assert again[0].head.anchor == chosen.head.anchor and again[2] == scores
    assert resolve_anchor(cfg, scrambled)[0].head.anchor == chosen.head.anchor


def test_har_is_refused_on_intraday_bars_and_auto_leaves_it_out():
    es = load_dataset(short_es(), CFG.data)
    with pytest.raises(ConfigError, match="--anchor har needs daily or coarser bars"):
        resolve_anchor(CFG.override(anchor="har"), es)
    _, _, scores = resolve_anchor(CFG.override(anchor="auto"), es)
    assert set(scores) == {"ewma_empirical", "range_ewma"}


@pytest.mark.parametrize(
    "args,expect",
    [
        (
            ["--anchor", "nonsense"],
            "--anchor must be one of none, auto, ewma_empirical, range_ewma, har, got 'nonsense'",
        ),
        (["--anchor", "har"], "--anchor har needs daily or coarser bars"),
        (["--anchor", "auto", "--vol-target"], "--anchor does not go with --vol-target"),
        (
            ["--anchor", "auto", "--anchor-median", "half"],
            "--anchor-median must be one of learnt, zero",
        ),
    ],
)
def test_bad_anchor_flags_exit_2_with_one_line(tmp_path, capsys, args, expect):
    rc = call(train_cli.main, *tiny_tft(*args, "--workdir", tmp_path / "w"))
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and err.count("\n") == 1, err
    assert not (tmp_path / "w").exists()


@pytest.fixture(scope="module")
def anchored_run(tmp_path_factory):
    """One tiny anchored run at learning rate 0 (epoch 1 has epoch 0's weights, so it is no
    better, and the run ships the anchor itself: the weights of epoch 0)."""
    wd = tmp_path_factory.mktemp("anchored") / "run"
    args = ("--anchor", "range_ewma", "--epochs", "1", "--learning-rate", "0")
    assert call(train_cli.main, *tiny_tft(*args, "--workdir", wd)) == 0
    return wd


@pytest.mark.slow  # a CLI run (its two tests share it: anchor_run)
@pytest.mark.xdist_group("anchor_run")
def test_epoch_0_is_scored_and_kept_when_nothing_better_is_learnt(anchored_run):
    wd = anchored_run
    rows = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1]
    assert rows[0]["val_q_risk_90"] == rows[1]["val_q_risk_90"]  # the anchored score
    summary = json.loads((wd / "summary.json").read_text())
    assert summary["weights_epoch"] == 0
    assert summary["identity"]["model"]["head"]["anchor"] == "range_ewma"
    # the shipped model's test forecasts are the anchor's (through the saved checkpoint)
    from tftjax.serving.saved import open_model

    saved = open_model(wd)
    ds = load_dataset(short_es(), saved.cfg.data, **saved.featurisation)
    starts = ds.splits.test[:50]
    pred, _ = Trainer(saved.cfg, saved.tc, to_device(ds.features)).predict(saved.variables, starts)
    np.testing.assert_allclose(
        pred, anchor_forecasts(ds, "range_ewma", saved.cfg.head.quantiles, starts), rtol=1e-6
    )
    assert baselines.NAMES["range_ewma"]  # the anchor is a baseline of the table


@pytest.mark.slow  # the CLI run above
@pytest.mark.xdist_group("anchor_run")
def test_the_anchor_fit_is_saved_and_reused_on_other_data(anchored_run, tmp_path):
    """An anchored model forecasts another file of its series (here its last 300 bars, fewer
    rows than it trained on) with the anchor fitted on its own training rows: the saved z,
    not a refit on the new file (the range anchor rebuilt from the new file's OHLC)."""
    from tftjax.data import read_bars, write_bars
    from tftjax.serving.saved import open_model

    wd = anchored_run
    saved = open_model(wd)
    fit = saved.feature_stats.anchor_fit
    assert fit["name"] == "range_ewma" and len(fit["z"]) == len(saved.cfg.head.quantiles)
    bars = read_bars(short_es())
    tail = tmp_path / "tail.parquet"
    write_bars(bars.slice(len(bars) - 300, len(bars)), tail)
    ds = load_dataset(
        tail,
        saved.cfg.data,
        **saved.featurisation,
        need_splits=False,
        instrument=saved.featurisation["vocab"][0],
    )
    np.testing.assert_array_equal(ds.features.anchor_z[0], np.float32(fit["z"]))
    assert np.all(np.isfinite(ds.features.anchor)) and np.all(ds.features.anchor > 0)
