"""``--ensemble N``: N members in one vmapped program. Member 0 is the single model of the
same seed (the no-ensemble path as the reference), the members differ, the ensemble's
forecast is the members' own forecasts averaged (each member run alone, averaged in numpy),
its pinball loss is at most the members' mean, and the refusals."""

import jax
import numpy as np
import pytest
from conftest import call, short_es

from tftjax import backtest
from tftjax import train as train_cli
from tftjax.config import TrainConfig, preset
from tftjax.data import load_dataset, to_device
from tftjax.stats.losses import quantile_loss
from tftjax.training import Trainer, create_train_state
from tftjax.training.evaluation import window_targets
from tftjax.training.trainer import epoch_indices

CFG = preset("tiny", remat="off", matmul_precision="highest")
TC = TrainConfig(batch_size=32, learning_rate=1e-3, seed=3)
N = 3


@pytest.fixture(scope="module")
def trained():
    """The ensemble and the single model of the same seed, 4 steps on the same batches."""
    ds = load_dataset(short_es(), CFG.data)
    data = to_device(ds.features)
    idx = epoch_indices(TC, ds.splits.train, 1)[:4]
    out = {"ds": ds, "data": data}
    for name, cfg in (("single", CFG), ("ens", CFG.override(ensemble=N))):
        tr = Trainer(cfg, TC, data)
        state = create_train_state(cfg, TC, jax.random.key(TC.seed))
        key = jax.random.key(TC.seed, impl="rbg")
        for b in idx:
            state, _ = tr.train_step(state, b, key)
        out[name] = (tr, jax.device_get(state.params))
    return out


def _member(params, i):
    return jax.tree.map(lambda x: x[i], params)


@pytest.mark.slow
@pytest.mark.xdist_group("ensemble_trained")  # one worker trains the fixture for both tests
def test_member_0_is_the_single_model_of_the_same_seed(trained):
    single, ens = trained["single"][1], trained["ens"][1]
    assert {x.shape[0] for x in jax.tree.leaves(ens)} == {N}
    # Same init, batches and dropout key: the same arithmetic, but vmapped (batched matmuls
    # may sum in another order: float32 rounding, ~1e-7 relative, in the gradients). Adam
    # normalises each step to about lr = 1e-3 per entry, so a rounding difference moves an
    # entry by ~1e-7 * lr, except where a gradient is near 0 and its sign can flip (at most
    # 2 lr a step, 4 steps: 8e-3; where the gradient is tiny, its relative rounding, and so
    # the step's, is larger). Allowed: every entry within 8e-3, and all but 0.1% of them
    # within a thousandth of one step (1e-6): the members are the runs they claim to be.
    # (Measured here: at most 1.3e-7.)
    a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(_member(ens, 0))])
    b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(single)])
    d = np.abs(a - b)
    assert d.max() <= 8e-3 and np.mean(d > 1e-6) < 1e-3, (d.max(), np.mean(d > 1e-6))
    # the other members started elsewhere (their own keys)
    c = np.concatenate([np.ravel(x) for x in jax.tree.leaves(_member(ens, 1))])
    assert np.mean(np.abs(c - a) > 1e-3) > 0.5


@pytest.mark.slow
@pytest.mark.xdist_group("ensemble_trained")
def test_the_forecast_is_the_members_average_and_never_worse_than_their_mean(trained):
    ds, data = trained["ds"], trained["data"]
    tr, ens = trained["ens"]
    starts = ds.splits.val[:64]
    pred, _ = tr.predict(ens, starts)
    one = Trainer(CFG, TC, data)
    members = np.stack([one.predict(_member(ens, i), starts)[0] for i in range(N)])
    np.testing.assert_allclose(pred, members.mean(0), rtol=1e-5, atol=1e-6)
    # pinball loss is convex in the forecast: the average's loss <= the members' mean (the
    # difference here is the ensemble's gain; 1e-6 allows float32 summation)
    y = window_targets(ds, starts)
    qs = np.asarray(CFG.head.quantiles, np.float32)
    mask = np.ones(len(starts), bool)
    loss = lambda p: float(quantile_loss(y, p, qs, mask))
    assert loss(pred) <= np.mean([loss(m) for m in members]) + 1e-6
    # the walk-forward's seeds alone (walkforward.member_sums): each member's window sums
    # are those of its own forecast (numpy's sums by hand), and the averaged forecast's P90
    # is never above their mean P90 (the same convexity; float32 forecasts: 1e-6)
    from tftjax.stats import scoring
    from tftjax.training.walkforward import member_sums

    sums = member_sums(CFG.override(ensemble=N), tr, ens, starts, y, qs)
    assert sums.shape == (N, len(starts), 6)
    i90 = int(np.argmin(np.abs(qs - 0.9)))
    for i in range(N):  # float64 by hand: the sums agree to float64 summation order
        err = np.asarray(y, np.float64) - np.asarray(members[i][..., i90], np.float64)
        q = np.float64(qs[i90])  # the level as the model has it (float32's 0.9)
        p90 = np.nansum(np.maximum(q * err, (q - 1) * err))
        assert sums[i, :, 2].sum() == pytest.approx(p90, rel=1e-9)
    row = scoring.from_sums(scoring.window_sums(y, pred, qs))["q_risk_90"]
    assert row <= np.mean([scoring.from_sums(m)["q_risk_90"] for m in sums]) + 1e-6


@pytest.mark.parametrize("main", [train_cli.main, backtest.main])
def test_ensemble_0_is_refused_with_one_line(tmp_path, capsys, main):
    rc = call(
        main,
        "--preset",
        "tiny",
        "--ensemble",
        "0",
        "--parquet-file",
        short_es(),
        "--workdir",
        tmp_path / "run",
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--ensemble must be >= 1 member, got 0" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("runloop_base")
def test_an_ensemble_trains_evaluates_predicts_and_exports_float32(tmp_path, capsys):
    from tiny import TINY_TRAIN

    from tftjax import evaluate, export, predict

    run = tmp_path / "run"
    assert (
        call(
            train_cli.main,
            *TINY_TRAIN,
            "--ensemble",
            "2",
            "--epochs",
            "2",
            "--parquet-file",
            short_es(),
            "--workdir",
            run,
        )
        == 0
    )
    assert call(evaluate.main, "--checkpoint", run) == 0
    assert call(predict.main, "--checkpoint", run, "--out", tmp_path / "p.parquet") == 0
    assert call(export.main, "--checkpoint", run, "--out", tmp_path / "exp") == 0
    # files others can read: every exported file has the mode a new file gets here (the
    # umask's), not safetensors' 0600
    import os

    umask = os.umask(0)
    os.umask(umask)
    for f in (tmp_path / "exp").iterdir():
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f
    capsys.readouterr()
    assert (
        call(export.main, "--checkpoint", run, "--out", tmp_path / "exp8", "--calibrate", "2") == 2
    )
    assert "is an ensemble of 2 members" in capsys.readouterr().err
