"""Walk-forward evaluation (``python -m tftjax.backtest``): folds that keep training,
validation and test apart and tile the test region, choices made on validation only, one
tiny run end to end, and the refusals."""

import json

import numpy as np
import pytest
from conftest import call, short_es
from test_runloop import TINY_TFT

from tftjax import backtest, scoring
from tftjax.config import preset
from tftjax.data import bundled_path, load_dataset, read_bars
from tftjax.data.windows import walk_forward_times

CFG = preset("tiny")


def test_folds_keep_train_val_and_test_apart_and_tile_the_test_region():
    bars = read_bars(bundled_path("spx"))
    cfg = CFG.data
    W, E, enc = cfg.window, cfg.embargo_rows, cfg.encoder_steps
    times = walk_forward_times([bars.ts], cfg, 5, 0.4)
    covered = []
    for k, fold in enumerate(times):
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
    for (a0, a1), (b0, b1) in zip(covered, covered[1:]):
        assert a1 == b0
    assert covered[-1][1] == len(bars)


def test_the_baseline_is_chosen_on_validation_never_on_test():
    rng = np.random.default_rng(0)

    def sums(q90):  # per-window sums whose P90 q-risk is about q90
        n = 200
        s = np.zeros((n, 6))
        s[:, 0] = rng.uniform(0.9, 1.1, n) * q90
        s[:, 2] = s[:, 0] * 5
        s[:, 3] = 10.0
        s[:, 4], s[:, 5] = 8, 10
        return s

    rows = {"tft": {"val": [sums(0.5)], "test": [sums(0.5)]},
            "a": {"val": [sums(0.40)], "test": [sums(0.60)]},  # best on validation
            "b": {"val": [sums(0.45)], "test": [sums(0.30)]}}  # best on test
    y1, p1 = rng.normal(size=200), np.sort(rng.normal(size=(200, 3)), axis=1)
    y, pred = rng.normal(size=(200, 2)), np.sort(rng.normal(size=(200, 2, 3)), axis=-1)
    out = backtest.summarize(scoring, rows, [], y1, p1, [(y, pred)], (0.1, 0.5, 0.9), 2, 200)
    assert out["best_baseline_on_val"] == "a"
    assert out["comparisons"] == 2
    assert set(out["pooled"]) == {"tft", "a", "b"}
    assert out["pooled"]["a"]["dm_tft_vs"]["p_holm"] >= out["pooled"]["a"]["dm_tft_vs"]["p"]


@pytest.mark.xdist_group("runloop_base")
def test_a_tiny_walk_forward_end_to_end(tmp_path, capsys, monkeypatch):
    # tuning inside each fold: the search (tested in test_tune.py) stands in here, to show
    # what each fold's search is given and that the fold trains with what it chose
    import tftjax.training.search
    from tftjax.training import open_checkpoint

    seen = []

    def search(cfg, tc, paths, workdir, trials, seed=0, progress=False, log=print,
               dataset=None):
        sp = dataset.splits
        seen.append((sp.train_rows, sp.val_rows, sp.test_rows, trials, tc.epochs))
        return {"settings": {"model": {"dropout": 0.05 * (seed + 1)}, "train": {}}}

    monkeypatch.setattr(tftjax.training.search, "tune", search)
    assert call(backtest.main, *TINY_TFT, "--folds", "2", "--epochs", "1", "--parquet-file",
                short_es(), "--workdir", tmp_path / "bt", "--bootstrap", "100",
                "--tune-trials", "3", "--tune-epochs", "2") == 0
    out = json.loads((tmp_path / "bt" / "backtest.json").read_text())
    assert [f["fold"] for f in out["folds"]] == [1, 2]
    assert out["settings"]["tuned"] == "in each fold"
    assert len(seen) == 2 and all(t[3:] == (3, 2) for t in seen)
    for k, (tr, va, te, *_) in enumerate(seen, 1):  # each fold's search: its own stretches
        assert tr[1] <= va[0] and va[1] <= te[0]
        assert out["folds"][k - 1]["tuned"] == {"model": {"dropout": 0.05 * k}, "train": {}}
        assert open_checkpoint(tmp_path / "bt" / f"fold_{k}").cfg.dropout == pytest.approx(0.05 * k)
    assert seen[0][2][0] < seen[1][2][0]  # the second fold's search reaches further
    assert out["folds"][0]["train_rows"][0][1] < out["folds"][1]["train_rows"][0][1]
    assert out["best_baseline_on_val"] in out["pooled"]
    lo, hi = out["pooled"]["tft"]["ci95"]["q_risk_90"]
    assert lo <= out["pooled"]["tft"]["test"]["q_risk_90"] <= hi
    assert set(out["calibration"]["hits"]) == {"0.1", "0.9"}
    assert len(out["pooled"]["tft"]["q_risk_90_by_step"]) == 5  # one per forecast step
    assert "| TFT |" in capsys.readouterr().out


@pytest.mark.parametrize("args,expect", [
    (["--folds", "1"], "--folds must be >= 2"),
    (["--folds", "40"], "leave 5 bars a fold, fewer than one 25-bar window"),
    (["--test-fraction", "1.5"], "--test-fraction must be in (0, 1)"),
    (["--tune-trials", "-1"], "--tune-trials must be >= 0"),
    (["--target", "nonsense"], "--target must be one of"),
])
def test_bad_backtest_input_exits_2_with_one_line(tmp_path, capsys, args, expect):
    rc = call(backtest.main, *TINY_TFT, "--parquet-file", short_es(), "--workdir",
              tmp_path / "bt", *args)
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and err.count("\n") == 1, err
    assert not (tmp_path / "bt").exists()
