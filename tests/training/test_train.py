"""Training: single trace, learning, NaN guard, checkpoint names, exact resume, CLIs."""

import dataclasses
import json
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest
from conftest import call, random_bars, short_es, xla_optimised

from tftjax import train as train_cli
from tftjax.config import ConfigError, TrainConfig, preset
from tftjax.data import Dataset, load_dataset, make_splits, to_device
from tftjax.data.features import FeatureSet, FeatureStats
from tftjax.runner.checkpoints import list_checkpoints
from tftjax.training import Trainer, create_train_state, train_and_evaluate

CFG = preset("tiny")
TC = TrainConfig(epochs=1, batch_size=32, learning_rate=3e-3, max_steps_per_epoch=4, patience=0)
quiet = dict(log=lambda *a: None, progress=False, plots=False)  # the plots: one test below
# the tests of the tiny model on the short ES bars share one worker and its compiled steps
# (tests/models/test_precision.py's bf16 training test too)
ES = pytest.mark.xdist_group("train_es")


@pytest.fixture(scope="module")
def es():
    return load_dataset(short_es(), CFG.data)


def signal_dataset(n=2264, seed=0) -> Dataset:
    """Targets = 1.5 · known feature 0 + noise: learnable from the known future inputs."""
    rng = np.random.default_rng(seed)
    bars = random_bars(n, seed=seed)
    known = rng.normal(size=(n, 10)).astype(np.float32)
    target = (1.5 * known[:, 0] + 0.3 * rng.normal(size=n)).astype(np.float32)
    stats = FeatureStats(np.zeros(210), np.ones(210), 1.0, np.zeros(5), (0, n))
    # decoder step k of a window ending at row t sees row t+1+k's known inputs (a gap-free grid)
    d = CFG.data.decoder_steps
    future = known[np.minimum(np.arange(n)[:, None] + 1 + np.arange(d), n - 1)]
    fs = FeatureSet(
        rng.normal(size=(n, 210)).astype(np.float32),
        known,
        future,
        np.zeros(5, np.float32),
        target,
        stats,
    )
    return Dataset.single(bars, fs, make_splits(n, CFG.data), CFG.data)


@pytest.mark.slow  # the bundled bars' run (train_es, with the slow tier's)
@ES
def test_train_step_traces_once(es):
    trainer = Trainer(CFG, TC, to_device(es.features), max_traces=1)
    state = create_train_state(CFG, TC, jax.random.key(0))
    key = jax.random.key(1, impl="rbg")
    for i in range(3):
        idx = np.asarray(es.splits.train[i * 32 : (i + 1) * 32], np.int32)
        idx[-2:] = -1  # padded rows do not retrace
        state, m = trainer.train_step(state, idx, key)
    assert int(state.step) == 3 and np.isfinite(float(m["loss"]))
    chex.clear_trace_counter()


@pytest.mark.slow  # the bundled bars' run (train_es, with the slow tier's)
@ES
def test_padded_rows_do_not_count(es):
    data = to_device(es.features)
    state = create_train_state(CFG, TC, jax.random.key(0))
    idx = np.asarray(es.splits.val[:10], np.int32)
    whole = Trainer(CFG, dataclasses.replace(TC, eval_batch_size=10), data)
    padded = Trainer(CFG, dataclasses.replace(TC, eval_batch_size=4), data)  # 4 + 4 + 2 (+2 pad)
    a, b = whole.evaluate(state.params, idx), padded.evaluate(state.params, idx)
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-5)
    assert whole.evaluate(state.params, idx[:5])["loss"] != pytest.approx(a["loss"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.heavy
def test_loss_falls_well_below_naive_baseline(tmp_path):
    tc = dataclasses.replace(TC, epochs=4, max_steps_per_epoch=None)
    with xla_optimised():  # ~110 steps: the optimised program's speed pays for its compile
        _, s = train_and_evaluate(CFG, tc, tmp_path, data=signal_dataset(1400), **quiet)
    model, naive = s["model"]["val"]["loss"], s["baselines"]["train_quantiles"]["val"]["loss"]
    assert model < 0.5 * naive, (model, naive)
    assert s["history"][-1]["train_loss"] < 0.5 * s["history"][0]["train_loss"]


def names(workdir):
    return list_checkpoints(workdir / "checkpoints")


@pytest.mark.slow
@ES
def test_checkpoint_names_full_run(tmp_path, es):
    tc = dataclasses.replace(TC, epochs=3)
    train_and_evaluate(CFG, tc, tmp_path, data=es, **dict(quiet, plots=True))
    got = set(names(tmp_path))
    assert {"tft_epoch_2", "tft_epoch_3", "tft_final_epoch3"} <= got
    hist = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in hist] == [1, 2, 3]
    best = min(hist, key=lambda h: h["val_loss"])["epoch"]
    assert got == {"tft_epoch_2", "tft_epoch_3", "tft_final_epoch3", f"tft_epoch_{best}"}
    for png in ("loss_curves.png", "quantile_fan.png", "variable_importance.png"):
        assert (tmp_path / png).stat().st_size > 1000
    # a second run into the same folder is refused, and leaves the first run's files as they were
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match="already holds checkpoints"):
        train_and_evaluate(CFG, TC, tmp_path, data=es, **quiet)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before


def run(*args, timeout=600):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_cli_train_and_evaluate(tmp_path, capsys):
    wd = tmp_path / "run"
    p = run(
        "-m",
        "tftjax.train",
        "--preset",
        "tiny",
        "--epochs",
        "1",
        "--batch-size",
        "32",
        "--max-steps-per-epoch",
        "3",
        "--workdir",
        str(wd),
        "--no-progress",
        "--profile",
        "--parquet-file",
        short_es(),
        "--no-plots",
    )
    assert p.returncode == 0, p.stderr
    assert not list(wd.glob("*.png"))  # --no-plots (the plots: test_checkpoint_names_full_run)
    assert "naive: train quantiles" in p.stdout and "q-risk P50" in p.stdout
    assert (wd / "checkpoints" / "tft_final_epoch1").is_dir()
    assert list((wd / "tensorboard").rglob("*.xplane.pb"))  # beside the scalars
    # evaluate in-process (its python -m entry: test_evaluate_cli_missing_checkpoint)
    from tftjax import evaluate as evaluate_cli

    capsys.readouterr()
    assert call(evaluate_cli.main, "--checkpoint", wd / "checkpoints" / "tft_final_epoch1") == 0
    out = capsys.readouterr().out
    assert "test" in out and "q-risk P90" in out


@pytest.mark.parametrize(
    "args,expect",
    [
        (
            ["--remat", "sideways"],
            "--remat must be one of off, minimal, aggressive, full, "
            "offload, fastest, auto, got 'sideways'",
        ),
        (["--precision", "fp8"], "--precision must be one of f32, bf16, got 'fp8'"),
        (
            ["--matmul-precision", "fastest"],
            "--matmul-precision must be one of default, high, highest, got 'fastest'",
        ),
        (["--vsn-kernel", "cuda"], "--vsn-kernel must be one of xla, pallas, got 'cuda'"),
        (["--lstm-kernel", "cudnn"], "--lstm-kernel must be one of xla, pallas, got 'cudnn'"),
        (["--grn-kernel", "cuda"], "--grn-kernel must be one of xla, pallas, got 'cuda'"),
        (
            ["--attention-kernel", "flash"],
            "--attention-kernel must be one of xla, pallas, got 'flash'",
        ),
        (
            ["--optimizer-kernel", "apex"],
            "--optimizer-kernel must be one of xla, pallas, got 'apex'",
        ),
        (["--epochs", "0"], "--epochs 0 keeps the --init-from weights as they are"),
        (["--seed", "-1"], "seed must be in [0, 2**32), got -1"),
        (["--hidden-size", "0"], "--hidden-size must be >= 1, got 0"),
        (["--dropout", "1.5"], "--dropout must be in [0, 1), got 1.5"),
        (["--d-v", "0"], "--d-v must be >= 1, got 0"),
        (["--kernels", "triton"], "--kernels must be one of xla, pallas, got 'triton'"),
        (
            ["--kernels-exclude", "vsn,flash"],
            "--kernels-exclude must be one of vsn, lstm, grn, attention, optimizer, got 'flash'",
        ),
        (["--parquet-file", "/nonexistent/bars.parquet"], "bars.parquet: file not found"),
        (["--bogus-flag"], "bogus"),
        (["--remat", "auto"], "--remat auto needs --memory-budget"),
        (["--remat", "auto", "--memory-budget", "1MB"], "no remat tier fits"),
        (["--remat", "auto", "--memory-budget", "lots"], "is not a size"),
    ],
)
def test_cli_bad_input_exit_2(tmp_path, args, expect, capsys):
    rc = call(train_cli.main, "--preset", "tiny", "--workdir", tmp_path / "w", *args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert expect in err and "Traceback" not in err
    assert not (tmp_path / "w").exists()


def test_cli_bad_input_exit_2_through_python_m(tmp_path):
    # the entry point as a user runs it: one line on stderr, exit code 2, nothing written
    p = run(
        "-m",
        "tftjax.train",
        "--preset",
        "tiny",
        "--workdir",
        str(tmp_path / "w"),
        "--remat",
        "sideways",
    )
    assert p.returncode == 2, p.stderr
    assert "--remat must be one of off" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "w").exists()


def test_evaluate_cli_missing_checkpoint(tmp_path):
    p = run("-m", "tftjax.evaluate", "--checkpoint", str(tmp_path / "nope"))
    assert p.returncode == 2 and "Traceback" not in p.stderr and "nope" in p.stderr
