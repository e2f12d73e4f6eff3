"""Walk-forward evaluation (``python -m tftjax.backtest``): folds that keep training,
validation and test apart and tile the test region, choices made on validation only, one
tiny run end to end, and the refusals."""

import dataclasses
import hashlib
import json

import numpy as np
import pytest
from conftest import REPO, call, short_es
from scipy import stats
from tiny import TINY_TFT

from tftjax import backtest
from tftjax.config import preset
from tftjax.data import bundled_path, load_dataset, read_bars
from tftjax.data.windows import walk_forward_times
from tftjax.stats import scoring, verdict

CFG = preset("tiny")
SPX_RECIPE = REPO / "experiments" / "preregistered" / "spx.json"


def test_folds_keep_train_val_and_test_apart_and_tile_the_test_region():
    bars = read_bars(bundled_path("spx"))
    cfg = CFG.data
    W, E, enc = cfg.window, cfg.embargo_rows, cfg.encoder_steps
    times = walk_forward_times([bars.ts], cfg, 5, 0.4)
    covered = []
    for fold in times:
        ds = load_dataset(bundled_path("spx"), cfg, fold=fold)
        sp, st = ds.splits, ds.series[0].features.stats
        t0, t1 = sp.test_rows
        assert bars.ts[t0] == fold[1]  # the test stretch starts at the fold's time
        last_train_row = sp.train.max() + W - 1
        assert last_train_row < sp.val_rows[0] - E + 1  # an embargo before validation
        assert sp.val.max() + W - 1 < t0 - E + 1  # and before the test stretch
        assert st.train_rows[1] <= sp.val_rows[0] - E  # statistics from the training rows
        targets = sp.test[:, None] + enc + np.arange(W - enc)
        assert targets.min() == t0 and targets.max() == t1 - 1  # targets inside the stretch
        assert last_train_row < targets.min()
        covered.append((t0, t1))
    # consecutive folds: each one's test stretch starts where the previous one's ended; and
    # every fold trains on more than the one before (an expanding window)
    for (_, a1), (b0, _) in zip(covered, covered[1:]):
        assert a1 == b0
    assert covered[-1][1] == len(bars)


def _sums(rng, q90, n=200):
    """Per-window sums whose P90 q-risk is about ``q90``."""
    s = np.zeros((n, 6))
    s[:, 0] = rng.uniform(0.9, 1.1, n) * q90
    s[:, 2] = s[:, 0] * 5
    s[:, 3] = 10.0
    s[:, 4], s[:, 5] = 8, 10
    return s


def _fold(rng, val: dict, test: dict, n=200):
    y = rng.normal(size=(n, 2))
    pred = {m: np.sort(rng.normal(size=(n, 2, 3)), axis=-1) for m in val}
    return verdict.Fold(
        {m: _sums(rng, q) for m, q in val.items()},
        {m: _sums(rng, q) for m, q in test.items()},
        y,
        pred,
    )


def test_the_baseline_is_chosen_per_fold_on_its_own_validation_never_on_test():
    rng = np.random.default_rng(0)
    folds = [  # fold 1: "a" best on validation, "b" on test; fold 2 the other way round
        _fold(rng, {"tft": 0.5, "a": 0.40, "b": 0.45}, {"tft": 0.5, "a": 0.60, "b": 0.30}),
        _fold(rng, {"tft": 0.5, "a": 0.45, "b": 0.40}, {"tft": 0.5, "a": 0.30, "b": 0.60}),
    ]
    out = verdict.summarize(folds, (0.1, 0.5, 0.9), 2, 200)
    assert out["chosen_per_fold"] == ["a", "b"]
    # the stitched choice is fold 1's "a" then fold 2's "b", window for window
    np.testing.assert_allclose(
        out["pooled"]["chosen"]["test"]["q_risk_90"],
        scoring.from_sums(np.concatenate([folds[0].test["a"], folds[1].test["b"]]))["q_risk_90"],
    )
    assert out["comparisons"] == 2  # Holm over the baselines a and b (side comparisons)
    assert set(out["pooled"]) == {"tft", "a", "b", "chosen"}
    for n in ("a", "b", "chosen"):  # every model calibrated alike; the TFT compared with each
        assert {"crps", "interval_score_80", "hits", "pit"} <= set(out["pooled"][n]["calibration"])
        v = out["pooled"][n]["vs"]
        assert v["dm_p90"].get("p_holm", v["dm_p90"]["p"]) >= v["dm_p90"]["p"]
        assert v["p90_diff_ci95"][0] <= v["p90_diff"] <= v["p90_diff_ci95"][1]
    assert "p_holm" not in out["pooled"]["chosen"]["vs"]["dm_p90"]  # the verdict's one test
    # a fold's choice reads no target of its own test stretch, nor of any later fold's:
    # rewrite every test row (and the later fold's validation) and the first pick stands
    changed = [
        verdict.Fold(
            f.val if k == 0 else {m: _sums(rng, 0.1 if m == "b" else 0.9) for m in f.val},
            {m: _sums(rng, 0.01 if m == "b" else 0.99) for m in f.test},
            f.y,
            f.pred,
        )
        for k, f in enumerate(folds)
    ]
    assert verdict.summarize(changed, (0.1, 0.5, 0.9), 2, 50)["chosen_per_fold"][0] == "a"


def test_dm_bandwidth_is_twice_the_bootstrap_block_with_a_fixed_b_p_value():
    # an AR(1) loss differential with phi 0.95: Politis-White asks for a block of tens of
    # windows, Newey-West's rule of thumb gives 5 lags for 1,000
    rng = np.random.default_rng(3)
    e = rng.normal(size=1000)
    d = np.empty(1000)
    d[0] = e[0]
    for t in range(1, 1000):
        d[t] = 0.95 * d[t - 1] + e[t]
    r = verdict.dm(d + 1.0, np.ones(1000), horizon=1)
    assert r["block"] == scoring.block_length(d) and r["block"] > scoring.default_lags(1000, 1)
    assert r["lags"] == 2 * r["block"]
    # and the statistic is Diebold-Mariano's with those lags (numpy by hand: Bartlett
    # weights), scaled by exp(-b/2) at b = (lags + 1) / n, against t with ceil(1.5 / b) df
    n, L, x = 1000, r["lags"], d - d.mean()
    v = x @ x / n + 2 * sum((1 - k / (L + 1)) * (x[:-k] @ x[k:]) / n for k in range(1, L + 1))
    b = (L + 1) / n
    stat = d.mean() / np.sqrt(v / n) * np.exp(-b / 2)
    assert r["stat"] == pytest.approx(stat, rel=1e-9)
    assert r["df"] == int(np.ceil(1.5 / b))
    assert r["p"] == pytest.approx(2 * stats.t.sf(abs(stat), r["df"]), rel=1e-9)


def _timed(rng, k: int, val: dict, test: dict, n: int = 200) -> verdict.Fold:
    """Fold ``k`` (test from 1000 (k + 1)): validation windows ending in the 100 ns before
    it, test windows ending every 10 ns from it (the second half after the next fold's
    start: windows that straddle it)."""
    f = _fold(rng, val, test, n)
    start = 1000 * (k + 1)
    f.test_start = start
    f.val_ends = start - 100 + np.arange(n) % 100
    f.test_ends = start + np.arange(n) * 10
    return f


def test_the_verdict_asks_both_ways_whether_one_forecast_encompasses_the_other():
    # the TFT's P90 is the true conditional quantile, every baseline's a blind constant:
    # the TFT adds what the chosen baseline lacks, and nothing is added the other way
    rng = np.random.default_rng(7)
    qs, n = (0.1, 0.5, 0.9), 600
    folds = []
    for _ in range(2):
        scale = np.exp(np.cumsum(rng.normal(0, 0.15, n)) * 0.3)
        y = scale[:, None] * rng.standard_normal((n, 2))
        true = stats.norm.ppf(qs)[None, None, :] * scale[:, None, None] * np.ones((1, 2, 1))
        blind = stats.norm.ppf(qs)[None, None, :] * scale.mean() * np.ones((n, 2, 1))
        pred = {"tft": true, "a": blind, "b": blind * 1.1}
        sums = {m: scoring.window_sums(y, p, qs) for m, p in pred.items()}
        folds.append(verdict.Fold(sums, sums, y, pred))
    out = verdict.summarize(folds, qs, 2, 50)
    e = out["encompassing"]
    assert e["level"] == 0.9 and e["model_adds"]["p"] < 1e-3
    assert e["model_adds"]["theta"][2] > 0.5
    assert e["baseline_adds"]["p"] > e["model_adds"]["p"]
    assert "encompassing at P90" in verdict.format_table(out)
    assert verdict.brief(out)["encompassing"] == e


def test_the_choice_reads_the_whole_record_before_its_test_start_and_nothing_after():
    rng = np.random.default_rng(4)
    qs = (0.1, 0.5, 0.9)
    folds = [  # fold 0: "a" better on validation, far worse on test; fold 1 the other way
        _timed(rng, 0, {"tft": 0.5, "a": 0.40, "b": 0.45}, {"tft": 0.5, "a": 0.90, "b": 0.30}),
        _timed(rng, 1, {"tft": 0.5, "a": 0.40, "b": 0.45}, {"tft": 0.5, "a": 0.30, "b": 0.60}),
        _timed(rng, 2, {"tft": 0.5, "a": 0.45, "b": 0.40}, {"tft": 0.5, "a": 0.30, "b": 0.60}),
    ]

    def by_hand(k: int, name: str) -> float:  # numpy: the windows that end before fold k
        start = 1000 * (k + 1)
        rows = [f.val[name][f.val_ends < start] for f in folds[: k + 1]]
        rows += [f.test[name][f.test_ends < start] for f in folds[:k]]
        return scoring.from_sums(np.concatenate(rows))["q_risk_90"]

    picks = verdict.summarize(folds, qs, 2, 50)["chosen_per_fold"]
    assert picks == [min("ab", key=lambda n: by_hand(k, n)) for k in range(3)]
    # fold 0 has only its validation ("a"); fold 1 reads fold 0's test too, where "a" was
    # far worse: the record picks "b" although fold 1's own validation favours "a"
    assert picks[:2] == ["a", "b"] and verdict.choose(folds[1], ["a", "b"]) == "a"
    # nothing at or after a fold's test start: rewrite fold 1's and 2's test rows and the
    # earlier test windows that end at or after fold 1's test start (fold 0's from 1000 on
    # end at 1000 + 10 i): fold 1's pick stands
    changed = []
    for k, f in enumerate(folds):
        late = f.test_ends >= 2000 if k == 0 else np.ones(f.test_ends.size, bool)
        test = {m: r.copy() for m, r in f.test.items()}
        for m in test:
            test[m][late] = _sums(rng, 0.01 if m == "a" else 0.99, int(late.sum()))
        changed.append(dataclasses.replace(f, test=test))
    assert verdict.summarize(changed, qs, 2, 50)["chosen_per_fold"][1] == "b"


def test_the_pair_control_is_the_best_pair_and_weight_on_validation_by_hand():
    # numpy by hand: every pair, every weight of the grid, the P90 q-risk 2 sum(pinball) /
    # sum|y| on the validation windows; best_pair's arguments are the validation targets
    # and forecasts alone (nothing of the test stretch reaches it)
    rng = np.random.default_rng(6)
    qs = np.array([0.1, 0.5, 0.9])
    y = rng.normal(size=(300, 2))
    preds = {  # three forecasts of different scales, none the truth's
        n: np.sort(rng.normal(size=(300, 2, 3)) * s + s * np.array([-1.3, 0, 1.3]), axis=-1)
        for n, s in (("a", 0.6), ("b", 1.4), ("c", 1.0))
    }

    def q90(p):
        e = y - p[..., 2]
        return 2 * np.maximum(0.9 * e, -0.1 * e).sum() / np.abs(y).sum()

    grid = [round(0.1 * i, 1) for i in range(11)]
    scores = {
        (a, b, w): q90(w * preds[a] + (1 - w) * preds[b])
        for a, b in [("a", "b"), ("a", "c"), ("b", "c")]
        for w in grid
    }
    want = min(scores, key=lambda k: scores[k])
    got = verdict.best_pair(y, preds, qs, verdict.all_pairs(["a", "b", "c"]))
    assert got == want, (got, want)
    assert verdict.all_pairs(["a", "b", "c"]) == [("a", "b"), ("a", "c"), ("b", "c")]


def test_the_seeds_are_pooled_over_the_folds_each_alone_beside_the_row():
    # two folds of three seeds' per-window sums (walkforward.member_sums, tested on a
    # trained ensemble in test_ensemble.py): each seed's P90 over both folds' windows
    from tftjax.training import walkforward as wf

    rng = np.random.default_rng(8)
    tally = wf.Tally()
    for k in range(2):
        rows = {"tft": 0.5, "a": 0.4, "b": 0.45, "combination": 0.42}
        f = _timed(rng, k, rows, rows)
        f.dates = f.test_ends
        tally.scored.append(f)
        tally.folds.append({"combination_weight": 0.0, "pair": ["a", "a", 0.0]})
        tally.members.append(np.stack([_sums(rng, q) for q in (0.40, 0.50, 0.60)]))
    out = wf.summarize(tally, preset("tiny").override(decoder_steps=2), 50)
    m = out["pooled"]["tft"]["members"]
    want = [
        scoring.from_sums(np.concatenate([t[i] for t in tally.members]))["q_risk_90"]
        for i in range(3)
    ]
    np.testing.assert_allclose(m["q_risk_90"], want, rtol=1e-12)
    assert m["min"] == min(want) and m["max"] == max(want)
    assert m["sd"] == pytest.approx(np.std(want, ddof=1), rel=1e-12)
    assert "the TFT's 3 seeds alone" in wf.format_table(out)


RECIPE = {
    "set": "ES tiny",
    "written": "2026-12-07T16:40+00:00",
    "test": "TFT vs chosen, DM P90 by date",
    "holm_family": ["es: TFT vs chosen"],
}


def test_every_committed_recipe_reads_and_names_real_settings():
    from tftjax.cli.options import BacktestOptions
    from tftjax.config import TrainConfig
    from tftjax.training import preregistration as pr

    cfg = preset("compact")
    names = pr.settings_of(
        cfg.model, cfg.head, cfg.quant, cfg.execution, cfg.data, TrainConfig(), BacktestOptions()
    )
    files = sorted((REPO / "experiments" / "preregistered").glob("*.json"))
    assert {f.stem for f in files} == {"spx", "nasdaq", "btc", "us-daily", "es"}
    for f in files:
        recipe = pr.read_recipe(f)
        assert set(recipe["flags"]) <= set(names), f
        assert recipe["written"].endswith("+00:00")  # a time a reader reads has its zone


def test_verdict_words():
    better, worse = (-0.02, -0.01), (0.01, 0.02)  # paired intervals of the P90 difference
    assert verdict.verdict({"stat": -3.0, "p": 0.001}, better) == "beats"
    assert verdict.verdict({"stat": 3.0, "p": 0.001}, worse) == "behind"
    assert verdict.verdict({"stat": -3.0, "p": 0.01, "p_holm": 0.06}, better, "p_holm") == "level"
    assert verdict.verdict({"stat": float("nan"), "p": float("nan")}, better) == "level"
    # significant by DM, but the interval straddles 0 (a model that kept the anchor's weights
    # differs from it by float32 rounding): level
    assert verdict.verdict({"stat": -3.0, "p": 0.001}, (-1e-7, 1e-7)) == "level"


@pytest.mark.slow
@pytest.mark.xdist_group("runloop_base")
def test_a_tiny_walk_forward_end_to_end(tmp_path, capsys, monkeypatch):
    # tuning inside each fold: the search (tested in test_tune.py) stands in here, to show
    # what each fold's search is given and that the fold trains with what it chose
    import tftjax.training.search
    from tftjax.training import open_checkpoint

    seen = []

    def search(
        cfg,
        tc,
        paths,
        workdir,
        trials,
        seed=0,
        progress=False,
        log=print,
        dataset=None,
        tensorboard=True,
    ):
        sp = dataset.splits
        seen.append((sp.train_rows, sp.val_rows, sp.test_rows, trials, tc.epochs))
        return {"settings": {"model": {"dropout": 0.05 * (seed + 1)}, "train": {}}}

    monkeypatch.setattr(tftjax.training.search, "tune", search)
    recipe = tmp_path / "recipe.json"  # pre-registered: the run must be it
    recipe.write_text(json.dumps({**RECIPE, "flags": {"preset": "tiny", "folds": 2}}))
    argv = [
        *TINY_TFT,
        "--preregistered",
        recipe,
        "--folds",
        "2",
        "--epochs",
        "1",
        "--parquet-file",
        short_es(),
        "--workdir",
        tmp_path / "bt",
        "--bootstrap",
        "100",
        "--tune-trials",
        "3",
        "--tune-epochs",
        "2",
    ]
    assert call(backtest.main, *argv) == 0
    out = json.loads((tmp_path / "bt" / "backtest.json").read_text())
    assert [f["fold"] for f in out["folds"]] == [1, 2]
    pre = out["preregistration"]  # the file's hash, for a reader to check it came first
    assert pre["sha256"] == hashlib.sha256(recipe.read_bytes()).hexdigest()
    assert pre["holm_family"] == RECIPE["holm_family"] and pre["test"] == RECIPE["test"]
    assert out["settings"]["tuned"] == "in each fold"
    assert len(seen) == 2 and all(t[3:] == (3, 2) for t in seen)
    for k, (tr, va, te, *_) in enumerate(seen, 1):  # each fold's search: its own stretches
        assert tr[1] <= va[0] and va[1] <= te[0]
        assert out["folds"][k - 1]["tuned"] == {"model": {"dropout": 0.05 * k}, "train": {}}
        assert open_checkpoint(tmp_path / "bt" / f"fold_{k}").cfg.model.dropout == pytest.approx(
            0.05 * k
        )
    assert seen[0][2][0] < seen[1][2][0]  # the second fold's search reaches further
    assert out["folds"][0]["train_rows"][0][1] < out["folds"][1]["train_rows"][0][1]
    assert len(out["chosen_per_fold"]) == 2
    assert [f["chosen"] for f in out["folds"]] == out["chosen_per_fold"]
    # the first fold's record is its validation: its pick is the lowest validation P90 of
    # its baselines (later folds' records add the earlier folds' stretches)
    for k, f in enumerate(out["folds"]):
        val = {n: v for n, v in f["val_q_risk_90"].items() if n not in verdict.MODELS}
        assert f["chosen"] in val and (k > 0 or val[f["chosen"]] == min(val.values()))
        # the pair control: the best pair and weight on validation, never worse there than
        # any baseline alone (each is a pair's end, w = 0 or 1)
        a, b, w = f["pair"]
        assert {a, b} <= set(val) and w in verdict.WEIGHTS
        assert f["val_q_risk_90"]["pair"] <= min(val.values()) + 1e-12
    assert "pair" in out["pooled"] and "vs_pair" in out["combination"]
    assert "members" not in out["pooled"]["tft"]  # one seed
    lo, hi = out["pooled"]["tft"]["ci95"]["q_risk_90"]
    assert lo <= out["pooled"]["tft"]["test"]["q_risk_90"] <= hi
    assert out["verdict"] in ("beats", "level", "behind")
    assert set(out["pooled"]["tft"]["calibration"]["hits"]) == {"0.1", "0.9"}
    assert len(out["pooled"]["tft"]["q_risk_90_by_step"]) == 5  # one per forecast step
    # the combination: its weight chosen per fold on validation (the lowest validation P90
    # of the grid), against the same stitched choice
    c = out["combination"]
    assert len(c["weights"]) == 2 and all(w in verdict.WEIGHTS for w in c["weights"])
    assert c["chosen_per_fold"] == out["chosen_per_fold"]
    for f in out["folds"]:  # never worse on validation than both ends it chose between
        v = f["val_q_risk_90"]
        assert v["combination"] <= min(v["tft"], v[f["chosen"]]) + 1e-12
    assert c["verdict"] in ("beats", "level", "behind") and "combination" not in out["pooled"]
    assert "| TFT |" in capsys.readouterr().out
    # --resume: fold 1 trained to its end is scored again (no tuning, no training); fold 2,
    # stopped before its summary, continues from its checkpoint; the table is the same
    (tmp_path / "bt" / "fold_2" / "summary.json").unlink()
    (tmp_path / "bt" / "backtest.json").unlink()
    assert call(backtest.main, *argv, "--resume") == 0
    again = json.loads((tmp_path / "bt" / "backtest.json").read_text())
    assert len(seen) == 2  # each fold's tuning ran once
    assert [f["test"] for f in again["folds"]] == [f["test"] for f in out["folds"]]
    assert again["pooled"]["tft"]["test"] == out["pooled"]["tft"]["test"]
    assert "--resume: fold 1 was trained to its end before" in capsys.readouterr().out
    # other settings are refused, naming them; a new run refuses the folder
    assert call(backtest.main, *argv, "--resume", "--epochs", "2") == 2
    assert "--resume: " in (err := capsys.readouterr().err) and "epochs 2, it had 1" in err
    assert call(backtest.main, *argv) == 2
    assert "is not empty; choose a new folder, or pass --resume" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--folds", "1"], "--folds must be >= 2"),
        (["--folds", "40"], "leave 5 bars a fold, fewer than one 25-bar window"),
        (["--test-fraction", "1.5"], "--test-fraction must be in (0, 1)"),
        (["--tune-trials", "-1"], "--tune-trials must be >= 0"),
        (["--bootstrap", "-1"], "--bootstrap must be >= 1 resample, got -1"),
        (["--anchor", "nonsense"], "--anchor must be one of none, auto"),
        (["--anchor", "har"], "--anchor har needs daily or coarser bars"),
        (["--target", "nonsense"], "--target must be one of"),
        (["--baseline-pairs", "qr+nope"], "--baseline-pairs qr+nope: 'qr+nope' is not a pair"),
        (["--baseline-pairs", "qr"], "--baseline-pairs qr: 'qr' is not a pair of two"),
        (
            ["--preregistered", str(SPX_RECIPE)],
            f"--preregistered {SPX_RECIPE}: this run is not the recipe: "
            "--dataset None, the recipe says spx; --calendar None, the recipe says XNYS; "
            "--preset tiny, the recipe says compact; --ensemble 1, the recipe says 5",
        ),
        (["--preregistered", "nope.json"], "--preregistered nope.json: no such file"),
    ],
)
def test_bad_backtest_input_exits_2_with_one_line(tmp_path, capsys, args, expect):
    rc = call(
        backtest.main, *TINY_TFT, "--parquet-file", short_es(), "--workdir", tmp_path / "bt", *args
    )
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and err.count("\n") == 1, err
    assert not (tmp_path / "bt").exists()


def test_holm_runs_over_every_row_of_the_table(tmp_path, capsys):
    """experiments/verdicts.py: the rows of several walk-forwards, Holm over all of them."""
    import importlib.util

    from tftjax.cli import main as cli_main

    spec = importlib.util.spec_from_file_location(
        "verdicts", backtest.__file__.replace("tftjax/backtest.py", "experiments/verdicts.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(5)
    paths = []
    for i, tft in enumerate((0.30, 0.70, 0.505)):  # far better, far worse, level
        folds = [_fold(rng, {"tft": 0.5, "a": 0.4}, {"tft": tft, "a": 0.5}) for _ in range(2)]
        out = verdict.summarize(folds, (0.1, 0.5, 0.9), 2, 100)
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "backtest.json").write_text(json.dumps(out))
        paths.append(f"{tmp_path / f'r{i}' / 'backtest.json'}:run {i}")
    rows, text = mod.table([mod.load(p) for p in paths])
    assert [r["run"] for r in rows] == ["run 0", "run 1", "run 2"]
    by_hand = scoring.holm([r["p"] for r in rows])
    np.testing.assert_allclose([r["p_holm_table"] for r in rows], by_hand)
    assert [r["verdict"] for r in rows][:2] == ["beats", "behind"]
    assert "| run 0 |" in text and "Holm over 3 rows" in text
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps({"pooled": {}}))
    assert cli_main(mod.main, [str(bad)]) == 2
    err = capsys.readouterr().err
    assert "from before the per-fold choice" in err and err.count("\n") == 1


def test_the_combination_weight_is_the_validation_argmin_by_hand():
    rng = np.random.default_rng(3)
    qs = (0.1, 0.5, 0.9)
    y = rng.standard_normal((400, 2)) * np.linspace(0.5, 2, 400)[:, None]  # changing scale
    z = np.array([-1.2816, 0.0, 1.2816])
    truth = np.linspace(0.5, 2, 400)[:, None, None] * z  # the right scale
    flat = np.ones((400, 1, 1)) * 1.25 * z  # a constant one
    noisy = truth * np.exp(0.6 * rng.standard_normal((400, 1, 1)))  # the right scale, noisy
    model, base = np.broadcast_to(noisy, (400, 2, 3)), np.broadcast_to(flat, (400, 2, 3))

    def p90(p):  # q-risk at 0.9 by hand: 2 Σ pinball / Σ |y|
        e = y - p[..., 2]
        return 2 * np.sum(np.maximum(0.9 * e, -0.1 * e)) / np.sum(np.abs(y))

    scores = np.array([p90(w * model + (1 - w) * base) for w in verdict.WEIGHTS])
    tie = scores <= scores.min() * (1 + 1e-9)  # the smallest weight among (near-)ties
    assert verdict.combine(y, model, base, qs) == verdict.WEIGHTS[int(np.argmax(tie))]
    assert 0 < verdict.combine(y, model, base, qs) < 1  # neither end: the test can fail
    assert verdict.combine(y, base, base, qs) == 0.0  # a tie: the baseline
