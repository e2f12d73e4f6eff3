"""The shared run loop, through the CLIs where a user meets it: identity-checked resume,
early stopping that restores the best weights, the final checkpoint after a crash,
the NaN stop, and evaluate's data checks. CLIs run in-process (``main(argv)``) so
that they share this worker's compiled steps."""

import dataclasses
import json
import shutil
from pathlib import Path

import chex
import jax
import numpy as np
import pytest
from conftest import bars_columns, call, random_bars, short_es, write_table
from tiny import TINY_DQN, TINY_DQN_CONFIG, TINY_TRAIN, other_file, quiet, raw_state, tft_quiet

from tftjax import dqn as dqn_lib
from tftjax import evaluate as evaluate_cli
from tftjax import train as train_cli
from tftjax.config import (
    ConfigError,
    DataConfig,
    ExecutionConfig,
    HeadConfig,
    ModelConfig,
    TFTConfig,
    TrainConfig,
    preset,
)
from tftjax.data import Dataset, epoch_batches, load_dataset
from tftjax.dqn import __main__ as dqn_cli
from tftjax.dqn.config import DQN_PRESETS, DQNConfig
from tftjax.runner.checkpoints import list_checkpoints
from tftjax.serving.saved import evaluate_checkpoint
from tftjax.training import TrainingDiverged, train_and_evaluate


def snapshot(d):
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*")}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A 3-epoch tiny TFT run on a copy of the bundled bars: ``(root, workdir)``."""
    root = tmp_path_factory.mktemp("base")
    (root / "data").mkdir()
    shutil.copy(short_es(), root / "data" / "bars.parquet")
    rc = call(
        train_cli.main,
        *TINY_TRAIN,
        "--epochs",
        "3",
        "--workdir",
        root / "run",
        "--parquet-file",
        root / "data" / "bars.parquet",
    )
    assert rc == 0
    assert not list((root / "run").glob("*.png"))  # --no-plots
    return root, root / "run"


@pytest.mark.slow  # the shared tiny run (runloop_base, with the slow tier's)
@pytest.mark.xdist_group("runloop_base")
def test_resume_refuses_what_would_mix_runs(base, tmp_path, capsys):
    _, wd = base
    before = snapshot(wd)
    cases = [
        (["--parquet-file", other_file(tmp_path)], "other.parquet (1500 rows"),
        (["--learning-rate", "0.003"], "train.learning_rate: 0.001 in the checkpoint, 0.003 now"),
        (["--batch-size", "16"], "train.batch_size: 32 in the checkpoint, 16 now"),
        (["--seed", "1"], "train.seed: 0 in the checkpoint, 1 now"),
        (["--weight-decay", "0"], "train.weight_decay: 0.0001 in the checkpoint, 0.0 now"),
        (["--hidden-size", "32"], "model.hidden: 16 in the checkpoint, 32 now"),
        (["--preset", "tft225"], "model.hidden: 16 in the checkpoint, 128 now"),
        (["--epochs", "2"], "--epochs 2 is below the 3 epochs already trained"),
    ]
    for args, expect in cases:
        capsys.readouterr()
        rc = call(train_cli.main, "--resume", "--workdir", wd, "--no-progress", *args)
        err = capsys.readouterr().err
        assert rc == 2, (args, err)
        assert expect in err and "Traceback" not in err and err.count("\n") == 1, (args, err)
    assert snapshot(wd) == before  # nothing in the run folder changed


def test_resume_without_a_checkpoint_is_an_error(tmp_path, capsys):
    for wd in (tmp_path / "missing", tmp_path):
        rc = call(train_cli.main, "--resume", "--workdir", wd, "--preset", "tiny")
        err = capsys.readouterr().err
        assert rc == 2 and "no checkpoint to resume in" in err and "Traceback" not in err
    rc = call(dqn_cli.main, "--resume", "--workdir", tmp_path)
    assert rc == 2 and "no checkpoint to resume" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists() and not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.xdist_group("runloop_base")
def test_resume_through_the_cli_equals_the_uninterrupted_run(base, tmp_path, capsys):
    root, straight = base
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)  # a run folder moved together with its data
    ckpts = copy / "run" / "checkpoints"
    # The copy becomes a run killed during epoch 3: its epoch-3 saves never committed,
    # one of them left a temporary folder behind (it must be ignored).
    for name in ("tft_epoch_3", "tft_final_epoch3"):
        shutil.rmtree(ckpts / name)
    (ckpts / "tft_epoch_3.orbax-checkpoint-tmp-1").mkdir()
    # an execution setting may change on resume, and the change is printed (float32 matmuls
    # at full precision: on CPU the default already is)
    capsys.readouterr()
    assert (
        call(
            train_cli.main,
            "--resume",
            "--workdir",
            copy / "run",
            "--epochs",
            "3",
            "--no-progress",
            "--matmul-precision",
            "highest",
            "--no-plots",
        )
        == 0
    )
    assert (
        "--resume: model.execution.matmul_precision: 'default' in the checkpoint, "
        "'highest' now" in capsys.readouterr().out
    )
    a = raw_state(ckpts / "tft_epoch_3")
    chex.assert_trees_all_equal(a, raw_state(straight / "checkpoints" / "tft_epoch_3"))
    assert int(a["step"]) == 9
    rows = [
        json.loads(x)["epoch"] for x in (copy / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert rows == [1, 2, 3]


@pytest.fixture(scope="module")
def early(tmp_path_factory):
    """An early-stopped run whose best epoch is not its last, with every epoch's parameters
    recorded by the callback (an independent record of the weights)."""
    root = tmp_path_factory.mktemp("early")
    (root / "data").mkdir()
    data = root / "data" / "bars.parquet"
    shutil.copy(short_es(), data)
    seen = {}
    # lr 0.03: a noisy validation loss; patience 2 (it stops at epoch 6 here, best 4): the
    # best epoch is not among the latest two, and its checkpoint is kept apart from them
    tc = TrainConfig(
        epochs=20, batch_size=32, learning_rate=0.03, max_steps_per_epoch=3, patience=2
    )
    _, summary = train_and_evaluate(
        preset("tiny"),
        tc,
        root / "run",
        data=data,
        callback=lambda e, s, m, f: seen.__setitem__(e, jax.device_get(s.params)),
        **tft_quiet,
    )
    return root, summary, seen


@pytest.mark.slow
@pytest.mark.xdist_group("runloop_early")
def test_early_stop_restores_the_best_weights(early, capsys):
    root, summary, seen = early
    hist = [json.loads(x) for x in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    best = min(hist, key=lambda h: h["val_loss"])["epoch"]
    last = hist[-1]["epoch"]
    assert summary["stopped_early"] and best < last == summary["epochs_run"]
    assert summary["best_epoch"] == summary["weights_epoch"] == best
    # checkpoints after an early stop: the latest 2 epochs, the best one, and the final
    assert best < last - 1
    assert set(list_checkpoints(root / "run" / "checkpoints")) == {
        f"tft_epoch_{last - 1}",
        f"tft_epoch_{last}",
        f"tft_epoch_{best}",
        f"tft_final_epoch{last}",
    }
    final = root / "run" / "checkpoints" / f"tft_final_epoch{last}"
    chex.assert_trees_all_equal(raw_state(final)["params"], seen[best])
    assert summary["model"]["val"]["loss"] == pytest.approx(hist[best - 1]["val_loss"], rel=1e-6)
    # evaluate on the final checkpoint reproduces the summary's test metrics exactly
    ev = evaluate_checkpoint(final, log=lambda *a: None)
    assert ev["model"]["test"] == summary["model"]["test"] and ev["weights_epoch"] == best
    assert call(evaluate_cli.main, "--checkpoint", final) == 0
    out = capsys.readouterr().out
    assert f"weights of epoch {best}" in out and "(the training data)" in out


@pytest.mark.slow
@pytest.mark.xdist_group("runloop_early")
def test_evaluate_checks_the_recorded_data(early, tmp_path, capsys, monkeypatch):
    root, _, _ = early
    final = next((root / "run" / "checkpoints").glob("tft_final_epoch*"))
    data = root / "data" / "bars.parquet"
    moved = root / "data" / "elsewhere.parquet"
    data.rename(moved)
    try:
        rc = call(evaluate_cli.main, "--checkpoint", final)
        err = capsys.readouterr().err
        assert rc == 2 and "is not found" in err and "Traceback" not in err
        # the run folder moved together with its data: found relative to the run, also
        # when --checkpoint is a relative path from inside the checkpoints folder
        shutil.copytree(root / "run", tmp_path / "moved" / "run")
        (tmp_path / "moved" / "data").mkdir()
        shutil.copy(moved, tmp_path / "moved" / "data" / "bars.parquet")
        monkeypatch.chdir(tmp_path / "moved" / "run" / "checkpoints")
        assert call(evaluate_cli.main, "--checkpoint", final.name) == 0
        assert "moved/data/bars.parquet (the training data)" in capsys.readouterr().out
        write_table(data, bars_columns(random_bars(1500, seed=3)))  # same name, other content
        rc = call(evaluate_cli.main, "--checkpoint", final)
        err = capsys.readouterr().err
        assert rc == 2 and "content changed since training" in err
        # on purpose: another file, with the training statistics, said in the output
        assert call(evaluate_cli.main, "--checkpoint", final, "--parquet-file", data) == 0
        assert "another file than the training data" in capsys.readouterr().out
    finally:
        moved.replace(data)


@pytest.mark.slow
def test_nan_mid_epoch_stops_within_the_epoch(tmp_path):
    cfg = preset("tiny")
    es = load_dataset(short_es(), cfg.data)
    tc = TrainConfig(epochs=1, batch_size=32, max_steps_per_epoch=4, patience=0)
    train_and_evaluate(cfg, tc, tmp_path, data=es, **tft_quiet)
    before = snapshot(tmp_path / "checkpoints")
    # NaN decoder inputs at one origin row, first used by the third batch of epoch 2 (batch
    # order by numpy). (A NaN *target* is a missing one, masked: it cannot make the loss NaN.)
    idx, _ = epoch_batches(es.splits.train, 32, seed=0, epoch=2)
    E = cfg.data.encoder_steps
    row = int(next(s for s in idx[2] if s not in idx[:2])) + E - 1
    future = es.features.future.copy()
    future[row] = np.nan
    bad = Dataset.single(
        es.bars, dataclasses.replace(es.features, future=future), es.splits, es.cfg
    )
    with pytest.raises(TrainingDiverged, match="at step 3 of epoch 2.*tft_epoch_1"):
        train_and_evaluate(
            cfg, dataclasses.replace(tc, epochs=3), tmp_path, data=bad, resume=True, **tft_quiet
        )
    assert snapshot(tmp_path / "checkpoints") == before
    assert [
        json.loads(x)["epoch"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ] == [1]


@pytest.mark.slow
def test_no_validation_windows_turns_early_stopping_off(tmp_path):
    cfg = preset("tiny")
    ds = load_dataset(
        short_es(),
        DataConfig(
            encoder_steps=cfg.data.encoder_steps,
            decoder_steps=cfg.data.decoder_steps,
            val_fraction=0.0,
        ),
    )
    assert ds.splits.val.size == 0
    lines = []
    tc = TrainConfig(epochs=3, batch_size=32, max_steps_per_epoch=2, patience=1)
    _, s = train_and_evaluate(
        cfg, tc, tmp_path, data=ds, log=lines.append, progress=False, plots=False
    )
    assert not s["stopped_early"] and s["epochs_run"] == 3 and s["weights_epoch"] == 3
    assert "val" not in s["model"] and any("no validation windows" in x for x in lines)
    # the compile is timed apart: only the first epoch of a run carries it
    h = s["history"]
    assert h[0]["compile_s"] > 0 and not any("compile_s" in x for x in h[1:])
    assert all(x["samples_per_s"] == pytest.approx(64 / x["epoch_time_s"]) for x in h)


# ----------------------------------------------------------------- DQN
@pytest.mark.slow  # a DQN run through the CLI, killed and resumed
def test_dqn_crash_before_the_final_save_resumes_to_a_final(tmp_path, capsys):
    cfg = TINY_DQN_CONFIG
    seen = {}

    def crash_at_the_end(epoch, state, metrics, is_final):
        seen[epoch] = jax.device_get(state)
        if is_final:  # after dqn_epoch_3, before dqn_final_epoch3
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dqn_lib.run(cfg, tmp_path, callback=crash_at_the_end, **quiet)
    ckpts = tmp_path / "checkpoints"
    assert "dqn_epoch_3" in list_checkpoints(ckpts)
    assert "dqn_final_epoch3" not in list_checkpoints(ckpts)
    assert call(dqn_cli.main, "--resume", "--workdir", tmp_path, "--no-progress") == 0
    assert "nothing to train" in capsys.readouterr().out
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # the loop ranks on the smoothed score (mean of the last epochs), recorded per row as the
    # very floats it compared: the first of a tie, as the loop's strict comparison keeps it
    best = max(
        (r for r in rows if r["val_sharpe_smoothed"] is not None),
        key=lambda r: r["val_sharpe_smoothed"],
    )["epoch"]
    final = raw_state(ckpts / "dqn_final_epoch3")
    chex.assert_trees_all_equal(final["params"], seen[best].params)
    assert json.loads((tmp_path / "summary.json").read_text())["weights_epoch"] == best


@pytest.mark.slow  # a DQN run through the CLI, killed and resumed
def test_dqn_resume_through_the_cli(tmp_path, capsys):
    wd, straight = tmp_path / "run", tmp_path / "straight"
    assert call(dqn_cli.main, *TINY_DQN, "--epochs", "2", "--workdir", wd) == 0
    before = snapshot(wd)
    for args, expect in [
        (["--fee-bps", "0.5"], "config.fee_bps: 0.2 in the checkpoint, 0.5 now"),
        (["--parquet-file", other_file(tmp_path)], "other.parquet (1500 rows"),
        (["--env", "cartpole"], "config.env: 'trading' in the checkpoint, 'cartpole' now"),
    ]:
        capsys.readouterr()
        rc = call(dqn_cli.main, "--resume", "--workdir", wd, "--epochs", "3", *args)
        err = capsys.readouterr().err
        assert rc == 2 and expect in err and "Traceback" not in err, (args, err)
    assert call(train_cli.main, "--resume", "--workdir", wd) == 2  # a TFT resume of a DQN run
    assert "holds dqn checkpoints, not tft" in capsys.readouterr().err
    assert snapshot(wd) == before
    assert call(dqn_cli.main, "--resume", "--workdir", wd, "--epochs", "3", "--no-progress") == 0
    assert call(dqn_cli.main, *TINY_DQN, "--epochs", "3", "--workdir", straight) == 0
    chex.assert_trees_all_equal(
        raw_state(wd / "checkpoints" / "dqn_epoch_3"),
        raw_state(straight / "checkpoints" / "dqn_epoch_3"),
    )


# ----------------------------------------------------------------- configs
@pytest.mark.parametrize(
    "make,expect",
    [
        (lambda: ModelConfig(hidden=0), "--hidden-size must be >= 1, got 0"),
        (lambda: ModelConfig(d_v=0), "--d-v must be >= 1, got 0"),
        (lambda: ModelConfig(dropout=1.0), "--dropout must be in [0, 1), got 1.0"),
        (lambda: ModelConfig(dropout=-0.1), "--dropout must be in [0, 1)"),
        (
            lambda: ExecutionConfig(remat="sideways"),
            "--remat must be one of off, minimal, aggressive, full, offload, fastest, auto",
        ),
        (lambda: HeadConfig(quantiles=(0.1, 0.9)), "must include 0.5 and 0.9"),
        (
            lambda: DataConfig(target="nonsense"),
            "--target must be one of bar, cumulative, got 'nonsense'",
        ),
        (lambda: ModelConfig(instrument_dropout=1.0), "--instrument-dropout must be in [0, 1)"),
        (lambda: preset("tiny", qat=True, precision="bf16"), "--precision bf16 and --qat"),
        (lambda: preset("tiny", nonsense=1), "unknown model setting 'nonsense'"),
        (lambda: TFTConfig.from_json({"schema": 3}), "schema 3: written by a newer tftjax"),
        (
            lambda: TFTConfig.from_json({"hidden": 8, "colour": "red"}),
            "unknown model setting 'colour'",
        ),
        (lambda: TrainConfig(seed=-1), "seed must be in [0, 2**32), got -1"),
        (lambda: TrainConfig(learning_rate=float("nan")), "learning_rate must be a finite number"),
        (lambda: TrainConfig(patience=-1), "patience must be >= 0"),
        (
            lambda: DQNConfig(learning_starts=60_000),
            "learning_starts (60000) must be <= buffer_size",
        ),
        (lambda: DQNConfig(seed=-1), "seed must be in [0, 2**32)"),
    ],
)
def test_configs_validate_themselves(make, expect):
    with pytest.raises(ConfigError, match=None) as e:
        make()
    assert expect in str(e.value)


def test_flags_come_from_the_config_dataclasses(capsys):
    def args(*argv):
        return train_cli.configs(train_cli.COMMAND_LINE.parse([str(a) for a in argv]))

    for form in (["--remat=aggressive"], ["--remat", "aggressive"]):
        cfg, tc, _ = args("--preset", "tiny", *form, "--batch-size", "8", "--hidden-size", "32")
        assert cfg.execution.remat == "aggressive" and tc.batch_size == 8
        assert cfg == preset("tiny", hidden=32, remat="aggressive")  # tiny: the plain head
    # a new run is anchored on the baseline chosen on validation unless told otherwise
    assert args("--preset", "small")[0] == preset("small", anchor="auto")
    assert args()[0].head.anchor == "auto"  # the README's first command (tft225)
    assert args("--preset", "small", "--anchor", "none")[0].head.anchor == "none"
    assert args("--preset", "small", "--anchor", "har")[0].head.anchor == "har"
    assert args("--preset", "compact")[0] == preset("compact")  # anchored by its preset
    for flag in ("--vol-target", "--monotone-quantiles"):  # they set the head themselves
        assert args("--preset", "small", flag)[0].head.anchor == "none"
        assert f"--anchor auto (the default) resolves to none: {flag}" in capsys.readouterr().out
    # one switch for the kernels; the five old flags still set them, hidden from the help
    cfg, _, _ = args("--preset", "tiny", "--kernels", "pallas", "--kernels-exclude", "grn,lstm")
    assert cfg.execution.pallas_families == ("vsn", "attention", "optimizer")
    cfg, _, _ = args("--preset", "tiny", "--vsn-kernel", "pallas", "--attention-kernel", "pallas")
    assert cfg.execution.pallas_families == ("vsn", "attention")
    assert "--vsn-kernel" not in train_cli.COMMAND_LINE.parser.format_help()
    cfg, _ = dqn_cli.configs(dqn_cli.COMMAND_LINE.parse(["--env", "cartpole", "--epochs", "3"]))
    assert cfg == dataclasses.replace(DQN_PRESETS["cartpole"], epochs=3)


def test_default_run_folders_never_meet_an_earlier_run(tmp_path, monkeypatch):
    from tftjax.cli import run_folder

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs" / "tft"
    assert run_folder(None, root, resume=False) == root / "run_001"
    with pytest.raises(ConfigError, match="no run with checkpoints under"):
        run_folder(None, root, resume=True)
    (root / "run_001" / "checkpoints" / "tft_epoch_1").mkdir(parents=True)
    (root / "run_002").mkdir()  # started, nothing saved yet
    assert run_folder(None, root, resume=False) == root / "run_003"
    assert run_folder(None, root, resume=True) == root / "run_001"
    assert run_folder("mine", root, resume=True) == Path("mine")
    # the CLIs' defaults (relative to the current folder)
    parsed = train_cli.COMMAND_LINE.parse(["--preset", "tiny"])
    assert train_cli.configs(parsed)[2].workdir == Path("runs/tft/run_003")
    assert dqn_cli.configs(dqn_cli.COMMAND_LINE.parse([]))[1].workdir == Path("runs/dqn/run_001")
