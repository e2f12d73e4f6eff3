"""Estimation for a few thousand windows: ``--ema`` (the weights' moving average, what is
validated and kept), ``--evals-per-epoch`` (checks inside an epoch) and ``--smooth`` (early
stopping on the mean of the last checks), against hand recursions; and the refusals."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from conftest import call, short_es
from tiny import TINY_TRAIN

from tftjax import train as train_cli
from tftjax.config import TrainConfig, preset
from tftjax.data import load_dataset, to_device
from tftjax.training import Trainer, create_train_state
from tftjax.training.task import TFTTask
from tftjax.training.trainer import epoch_indices

CFG = preset("tiny", remat="off", matmul_precision="highest")


@pytest.mark.slow
def test_ema_is_the_moving_average_of_the_trained_weights_by_hand():
    ds = load_dataset(short_es(), CFG.data)
    data = to_device(ds.features)
    d, steps = 0.6, 3
    out = {}
    for ema in (0.0, d):
        tc = TrainConfig(batch_size=32, seed=1, ema=ema)
        tr = Trainer(CFG, tc, data)
        state = create_train_state(CFG, tc, jax.random.key(tc.seed))
        trail = [jax.device_get(state.params)]
        for b in epoch_indices(tc, ds.splits.train, 1)[:steps]:
            state, _ = tr.train_step(state, b, jax.random.key(1, impl="rbg"))
            trail.append(jax.device_get(state.params))
        out[ema] = (jax.device_get(state), trail)
    plain, trail = out[0.0]
    with_ema = out[d][0]
    # the raw weights train as without --ema (the average only reads them): 1e-6 allows a
    # different fusion of the two programs
    for a, b in zip(jax.tree.leaves(with_ema.params), jax.tree.leaves(plain.params)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    hand = trail[0]  # e_0 = the initial weights; e_k = d e_{k-1} + (1 - d) p_k
    for p in trail[1:]:
        hand = jax.tree.map(lambda e, x: d * np.float64(e) + (1 - d) * np.float64(x), hand, p)
    for a, b in zip(jax.tree.leaves(with_ema.ema_params), jax.tree.leaves(hand)):
        np.testing.assert_allclose(a, b, atol=1e-6)  # float32 of three steps: ~1e-7
    assert with_ema.variables()["params"] is with_ema.ema_params  # what is validated and kept
    assert plain.ema_params == {} and plain.variables()["params"] is plain.params


def test_smooth_ranks_a_check_by_the_mean_of_the_last_ones():
    task = TFTTask.__new__(TFTTask)
    task.score, task.tc = "val_loss", TrainConfig(smooth=3)
    hist = [{"val_loss": v} for v in (0.9, 0.5, 0.7, 0.4)] + [{"val_loss": None}]
    assert task.rank(hist) == pytest.approx((0.5 + 0.7 + 0.4) / 3)
    task.tc = TrainConfig(smooth=1)
    assert task.rank(hist) == 0.4


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--ema", "1"], "--ema must be in [0, 1) (0: off), got 1.0"),
        (["--smooth", "0"], "--smooth must be >= 1 check, got 0"),
        (["--evals-per-epoch", "0"], "--evals-per-epoch must be >= 1, got 0"),
        (
            ["--evals-per-epoch", "9", "--max-steps-per-epoch", "3"],
            "--evals-per-epoch 9 exceeds the 3 steps of an epoch",
        ),
    ],
)
def test_bad_estimation_flags_exit_2_with_one_line(tmp_path, capsys, args, expect):
    rc = call(
        train_cli.main,
        *TINY_TRAIN,
        "--parquet-file",
        short_es(),
        "--workdir",
        tmp_path / "run",
        *args,
    )
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and err.count("\n") == 1, err


@pytest.mark.slow
@pytest.mark.xdist_group("runloop_base")
def test_checks_inside_an_epoch_split_its_batches(tmp_path):
    run = tmp_path / "run"
    assert (
        call(
            train_cli.main,
            *TINY_TRAIN,
            "--epochs",
            "2",
            "--evals-per-epoch",
            "3",
            "--max-steps-per-epoch",
            "7",
            "--smooth",
            "2",
            "--ema",
            "0.5",
            "--parquet-file",
            short_es(),
            "--workdir",
            run,
            "--no-tensorboard",
        )
        == 0
    )
    assert not (run / "tensorboard").exists()  # --no-tensorboard writes none
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5, 6]  # 3 checks a data epoch
    assert [r["steps"] for r in rows] == [3, 2, 2, 3, 2, 2]  # 7 steps split in 3
    assert [r["data_epoch"] for r in rows] == pytest.approx([1 / 3, 2 / 3, 1, 4 / 3, 5 / 3, 2])
    summary = json.loads((run / "summary.json").read_text())
    scores = [r["val_loss"] for r in rows]
    smoothed = [np.mean(scores[max(i - 1, 0) : i + 1]) for i in range(6)]
    assert summary["best_epoch"] == 1 + int(np.argmin(smoothed))
    assert dataclasses.asdict(TrainConfig(ema=0.5))["ema"] == summary["identity"]["train"]["ema"]


@pytest.mark.slow  # an old run's checkpoint restored and trained on
def test_a_checkpoint_from_before_ema_restores(tmp_path):
    """A state written before ``ema_params`` existed (its top-level fields: step, params,
    opt_state, quant_stats) restores into today's state, the missing field empty."""
    import orbax.checkpoint as ocp

    from tftjax.runner.checkpoints import restore_state
    from tftjax.training.state import abstract_train_state

    tc = TrainConfig()
    state = jax.device_get(create_train_state(CFG, tc, jax.random.key(2)))
    old = {
        "step": state.step,
        "params": state.params,
        "opt_state": state.opt_state,
        "quant_stats": state.quant_stats,
    }
    path = tmp_path / "tft_epoch_1"
    ocp.Checkpointer(ocp.CompositeCheckpointHandler()).save(
        path, args=ocp.args.Composite(state=ocp.args.StandardSave(old))
    )
    back = restore_state(path, abstract_train_state(CFG, tc))
    assert back.ema_params == {}
    for a, b in zip(jax.tree.leaves(back.params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(Exception):  # noqa: B017 - Orbax raises several types: a run with --ema needs its average on disk
        restore_state(path, abstract_train_state(CFG, TrainConfig(ema=0.9)))
