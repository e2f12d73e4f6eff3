"""DQN: environment arithmetic, causality, double-DQN targets, replay buffer, learning on a
toy series, checkpoint names, exact resume, and the CLI."""

import dataclasses
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import bars_columns, call, random_bars, write_table
from tiny import TINY_DQN_CONFIG

from tftjax.config import ConfigError, DataConfig
from tftjax.data import build_features, load_dataset, make_splits
from tftjax.data.bars import Bars
from tftjax.dqn import agent, buffer, make_train, run
from tftjax.dqn.cartpole import make_cartpole
from tftjax.dqn.env import (
    TradingEnv,
    baseline_metrics,
    greedy_rollout,
    select_features,
    trading_metrics,
)
from tftjax.runner.checkpoints import list_checkpoints

# Small and quick: a few hundred env steps per epoch on the bundled ES bars.
TINY = dataclasses.replace(TINY_DQN_CONFIG, min_epochs=0, smooth_epochs=1)


def hand_env(
    ret,
    cost_bps=10.0,
    window=1,
    episode_len=10,
    scale=1.0,
    gap=None,
    ends=None,
    next_open=False,
    latency=0,
):
    """An environment on close-to-close returns ``ret`` (all of it open to close unless
    ``gap`` splits it), filled at the close unless ``next_open``."""
    n = len(ret)
    feats = jnp.asarray(np.arange(n, dtype=np.float32)[:, None])
    gap = np.zeros(n, np.float32) if gap is None else np.asarray(gap, np.float32)
    ends = np.zeros(n, bool) if ends is None else np.asarray(ends, bool)
    return TradingEnv(
        feats,
        jnp.asarray(gap),
        jnp.asarray(np.asarray(ret, np.float32) - gap),
        jnp.asarray(ends),
        jnp.float32(cost_bps * 1e-4),
        jnp.float32(scale),
        0,
        n,
        window,
        episode_len,
        252.0,
        next_open,
        latency,
    )


# ----------------------------------------------------------------- environment
def test_reward_by_hand_with_costs_and_flips():
    ret = np.array([0.0, 0.01, -0.02, 0.005, 0.003, -0.001, 0.0, 0.0], np.float32)
    env = hand_env(ret, cost_bps=10.0, scale=1e4)
    c = 10.0 * 1e-4
    state = env.reset(jax.random.PRNGKey(0))[1].replace(t=jnp.int32(0))
    # flat -> long, long -> short (a flip pays twice), short -> flat, flat -> flat
    actions = [2, 0, 1, 1, 2]
    expect = [+1 * 0.01 - c, -1 * -0.02 - 2 * c, 0 * 0.005 - c, 0.0, +1 * -0.001 - c]
    for k, (a, want) in enumerate(zip(actions, expect)):
        out = env.step(jax.random.PRNGKey(k), state, jnp.int32(a))
        np.testing.assert_allclose(float(out.raw_reward), want, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(float(out.reward), want * 1e4, rtol=1e-5)
        assert float(out.terminal) == 0.0
        state = out.state
        assert int(state.pos) == a - 1 and int(state.t) == k + 1


def test_episode_ends_by_time_limit_and_resets_inside_the_split():
    ret = np.linspace(-0.01, 0.01, 40).astype(np.float32)
    env = hand_env(ret, window=3, episode_len=5).on((10, 30))
    obs, state = env.reset(jax.random.PRNGKey(3))
    start = int(state.t)
    assert env.first_decision <= start <= env.first_decision + env.decisions - env.horizon
    for k in range(5):
        out = env.step(jax.random.PRNGKey(100 + k), state, jnp.int32(2))
        state = out.state
    assert bool(out.done) and float(out.terminal) == 0.0
    # s' is the true next observation (bar start+5, long), not the reset one.
    np.testing.assert_array_equal(
        np.asarray(out.next_obs), np.asarray(env.observe(start + 5, jnp.array([1])))
    )
    assert int(state.steps) == 0 and int(state.pos) == 0
    assert 10 <= int(state.t) and int(state.t) + env.horizon <= 29  # from the split's first bar


def test_observation_uses_no_bar_after_t():
    bars = random_bars(900, seed=4)
    splits = make_splits(len(bars), DataConfig(encoder_steps=8, decoder_steps=1))
    ref = build_features(bars, train_rows=splits.train_rows)
    names = ("r1", "ret_5", "rvol_60", "clv_20", "vz_20", "tod_sin")
    t = 500
    rng = np.random.default_rng(0)
    k = len(bars) - (t + 1)
    shock = np.exp(rng.normal(0, 0.05, k))
    close = bars.close.copy()
    close[t + 1 :] *= shock
    changed = Bars(
        bars.path,
        bars.ts,
        bars.open * np.r_[np.ones(t + 1), shock],
        np.maximum(bars.high * np.r_[np.ones(t + 1), shock], close),
        np.minimum(bars.low * np.r_[np.ones(t + 1), shock], close),
        close,
        bars.volume * np.r_[np.ones(t + 1), rng.uniform(0.1, 5, k)],
    )
    alt = build_features(changed, stats=ref.stats)
    z = jnp.zeros(len(bars))
    envs = [
        TradingEnv(
            jnp.asarray(select_features(f, names)),
            z,
            z,
            z.astype(bool),
            jnp.float32(0),
            jnp.float32(1),
            0,
            len(bars),
            8,
            10,
            1.0,
        )
        for f in (ref, alt)
    ]
    for tt in (150, 300, t):
        for pos in (-1, 0, 1):
            np.testing.assert_array_equal(
                np.asarray(envs[0].observe(tt, jnp.array([pos]))),
                np.asarray(envs[1].observe(tt, jnp.array([pos]))),
            )
    assert not np.array_equal(
        np.asarray(envs[0].observe(t + 1, jnp.array([0]))),
        np.asarray(envs[1].observe(t + 1, jnp.array([0]))),
    )


def test_trading_metrics_by_hand():
    net = np.array([0.01, -0.02, 0.005, 0.0])
    pos = np.array([1, -1, -1, 0])
    m = trading_metrics(net, pos, annualisation=4.0)
    assert m["total_log_return"] == pytest.approx(-0.005)
    assert m["sharpe"] == pytest.approx(net.mean() / net.std() * 2.0)
    assert m["max_drawdown"] == pytest.approx(1 - np.exp(-0.02))  # peak 0.01 -> -0.01
    assert m["turnover"] == pytest.approx((1 + 2 + 0 + 1) / 4)
    held = trading_metrics(net, np.array([1, -1, -1, -1]), annualisation=4.0)
    assert held["turnover"] == pytest.approx((1 + 2 + 0 + 0 + 1) / 4)  # the exit after the end
    b = baseline_metrics(np.array([0.01, -0.02]), cost=0.001, annualisation=1.0)
    assert b["buy_and_hold"]["total_log_return"] == pytest.approx(0.01 - 0.02 - 2 * 0.001)
    assert b["flat"] == {
        "total_log_return": 0.0,
        "sharpe": 0.0,
        "max_drawdown": 0.0,
        "turnover": 0.0,
    }


# ----------------------------------------------------------------- agent
def test_double_dqn_targets_against_numpy():
    rng = np.random.default_rng(0)
    qo, qt = rng.normal(size=(7, 3)), rng.normal(size=(7, 3))
    r, term = rng.normal(size=7), (rng.random(7) < 0.3).astype(np.float64)
    want = np.empty(7)
    for i in range(7):  # the online net picks, the target net values
        want[i] = r[i] + 0.9 * (1 - term[i]) * qt[i, np.argmax(qo[i])]
    got = agent.double_dqn_targets(
        jnp.asarray(qo), jnp.asarray(qt), jnp.asarray(r), jnp.asarray(term), 0.9
    )
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_huber_loss_and_gradient_flow_only_through_online_q():
    net = agent.QNetwork(2, (4,))
    p = net.init(jax.random.PRNGKey(0), jnp.zeros(3))["params"]
    tp = jax.tree.map(lambda x: x + 0.1, p)
    apply = lambda params, x: net.apply({"params": params}, x)
    b = buffer.Transitions(
        jnp.ones((5, 3)),
        jnp.array([0, 1, 0, 1, 1]),
        jnp.arange(5.0),
        -jnp.ones((5, 3)),
        jnp.array([0, 0, 1, 0, 1.0]),
    )
    loss, _ = agent.dqn_loss(p, tp, apply, b, 0.5, huber_delta=1.0)
    q = np.asarray(apply(p, b.obs))[np.arange(5), np.asarray(b.action)]
    y = np.asarray(
        agent.double_dqn_targets(
            apply(p, b.next_obs), apply(tp, b.next_obs), b.reward, b.terminal, 0.5
        )
    )
    d = np.abs(q - y)
    want = np.where(d <= 1, 0.5 * d**2, d - 0.5).mean()
    assert float(loss) == pytest.approx(want, rel=1e-5)
    g_target = jax.grad(lambda t: agent.dqn_loss(p, t, apply, b, 0.5)[0])(tp)
    assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(g_target))


def test_epsilon_schedule_and_polyak():
    eps = [float(agent.linear_epsilon(jnp.int32(s), 1.0, 0.1, 100)) for s in (0, 50, 100, 500)]
    assert eps == pytest.approx([1.0, 0.55, 0.1, 0.1])
    new = agent.polyak({"w": jnp.zeros(2)}, {"w": jnp.ones(2)}, 0.25)
    np.testing.assert_allclose(np.asarray(new["w"]), [0.25, 0.25])


def test_replay_buffer_ring_against_numpy():
    buf = buffer.init(5, 2)
    ref = []
    for k in range(4):  # 3 transitions per add wrap the 5-slot ring
        obs = np.full((3, 2), k, np.float32) + np.arange(3)[:, None] / 10
        tr = buffer.Transitions(
            jnp.asarray(obs),
            jnp.arange(3, dtype=jnp.int32) + k,
            jnp.full(3, float(k)),
            jnp.asarray(obs + 1),
            jnp.zeros(3),
        )
        buf = buffer.add(buf, tr)
        ref.extend(obs)
    slots = np.empty((5, 2), np.float32)
    for i, o in enumerate(ref):
        slots[i % 5] = o
    np.testing.assert_array_equal(np.asarray(buf.data.obs), slots)
    assert int(buf.size) == 5 and int(buf.ptr) == 12 % 5
    s = buffer.sample(buf, jax.random.PRNGKey(0), 64)
    assert set(map(tuple, np.asarray(s.obs).round(3))) <= set(map(tuple, slots.round(3)))


def test_cartpole_truncation_is_not_terminal():
    env = make_cartpole()
    obs, state = env.reset(jax.random.PRNGKey(0))
    state = state.replace(time=env.max_steps - 1)
    out = env.step(jax.random.PRNGKey(1), state, jnp.int32(1))
    assert bool(out.done) and float(out.terminal) == 0.0
    assert not np.allclose(np.asarray(out.next_obs), np.asarray(out.obs))  # s' is pre-reset


# ----------------------------------------------------------------- learning
def sine_bars(n=1600, period=8, amp=2e-3):
    t = np.arange(n)
    close = 100.0 * np.exp(amp * np.sin(2 * np.pi * t / period))
    open_ = np.r_[close[0], close[:-1]]
    ts = np.datetime64("2024-01-02T00:00", "ns").astype(np.int64) + t * 60 * 10**9
    vol = 100.0 + (t % 7)
    return Bars(
        "sine.parquet",
        ts,
        open_,
        np.maximum(open_, close) * 1.0001,
        np.minimum(open_, close) * 0.9999,
        close,
        vol,
    )


@pytest.mark.slow
def test_agent_beats_buy_and_hold_and_flat_on_a_deterministic_series(tmp_path):
    path = write_table(tmp_path / "sine.parquet", bars_columns(sine_bars()))
    cfg = dataclasses.replace(
        TINY,
        features=("r1",),
        window=4,
        fee_bps=0.5,
        epochs=12,
        steps_per_epoch=1000,
        hidden=(32,),
        learning_rate=3e-3,
        eps_decay_steps=4000,
        gamma=0.5,
        episode_len=64,
    )
    summary = run(cfg, tmp_path / "run", parquet_file=path, progress=False, log=lambda *a: None)
    val = summary["splits"]["val"]
    dqn, hold, flat = (val[k]["total_log_return"] for k in ("dqn", "buy_and_hold", "flat"))
    assert dqn > hold + 0.05 and dqn > flat + 0.05, val
    assert val["dqn"]["sharpe"] > max(val["buy_and_hold"]["sharpe"], 0.0)


# ----------------------------------------------------------------- checkpoints
def _run(tmp_path, name, cfg=TINY, **kw):
    calls = []

    def cb(epoch, state, metrics, is_final):
        calls.append((epoch, is_final, jax.device_get(state)))

    summary = run(cfg, tmp_path / name, progress=False, callback=cb, log=lambda *a: None, **kw)
    return summary, calls


def _best_epochs(workdir):
    """Epochs tied for the best validation Sharpe (the loop keeps the first of them)."""
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    top = max(r["val_sharpe"] for r in rows)
    return {r["epoch"] for r in rows if r["val_sharpe"] == top}, rows


def assert_kept(ckpt_dir, latest, final, best):
    """The latest epochs, the final and exactly the loop's best epoch (the first of a tie)."""
    assert set(list_checkpoints(ckpt_dir)) == (
        {f"dqn_epoch_{e}" for e in latest} | {final, f"dqn_epoch_{min(best)}"}
    )


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dqn")
    cfg = dataclasses.replace(TINY, epochs=4)
    return tmp, _run(tmp, "full", cfg)


@pytest.mark.xdist_group("dqn_full_run")
def test_checkpoint_names_after_a_full_run(full_run):
    tmp, (summary, calls) = full_run
    wd = tmp / "full"
    best, rows = _best_epochs(wd)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert_kept(wd / "checkpoints", (3, 4), "dqn_final_epoch4", best)
    assert [(e, f) for e, f, _ in calls] == [(1, False), (2, False), (3, False), (4, True)]
    for f in ("metrics.jsonl", "summary.json", "learning_curves.png", "equity_curve.png"):
        assert (wd / f).exists(), f


def test_checkpoint_names_after_early_stop(tmp_path):
    # No gradient step happens before epoch 10, so the greedy Sharpe never improves after epoch 1:
    # patience 2 stops the run at epoch 3 of 10.
    cfg = dataclasses.replace(TINY, epochs=10, learning_starts=TINY.buffer_size)
    summary, calls = _run(tmp_path, "es", dataclasses.replace(cfg, patience=2))
    assert summary["stopped_early"] and summary["epochs_run"] == 3
    best, rows = _best_epochs(tmp_path / "es")
    assert best == {1, 2, 3}  # a three-way tie: the first, epoch 1, is the best kept
    assert_kept(tmp_path / "es" / "checkpoints", (2, 3), "dqn_final_epoch3", best)
    assert "dqn_final_epoch10" not in list_checkpoints(tmp_path / "es" / "checkpoints")
    assert [(e, f) for e, f, _ in calls] == [(1, False), (2, False), (3, True)]


@pytest.mark.xdist_group("dqn_full_run")
def test_interrupted_run_resumes_exactly(tmp_path, full_run):
    _, (_, full_calls) = full_run
    cfg = dataclasses.replace(TINY, epochs=4)

    def interrupt(epoch, state, metrics, is_final):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "r", progress=False, callback=interrupt, log=lambda *a: None)
    assert "dqn_final_epoch2" not in list_checkpoints(tmp_path / "r" / "checkpoints")
    with pytest.raises(ConfigError, match="--resume"):
        run(cfg, tmp_path / "r", progress=False, log=lambda *a: None)
    _, calls = _run(tmp_path, "r", cfg, resume=True)
    assert [(e, f) for e, f, _ in calls] == [(3, False), (4, True)]
    resumed, straight = calls[-1][2], full_calls[-1][2]
    # Everything: online and target params, optimiser state, buffer, env states, RNG, counters.
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(straight)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    best, _ = _best_epochs(tmp_path / "r")
    assert_kept(tmp_path / "r" / "checkpoints", (3, 4), "dqn_final_epoch4", best)


@pytest.mark.xdist_group("dqn_full_run")
def test_resume_refuses_other_settings(tmp_path, full_run):
    tmp, _ = full_run
    with pytest.raises(ConfigError, match="config.window: 4 in the checkpoint, 8 now"):
        run(
            dataclasses.replace(TINY, window=8, epochs=4),
            tmp / "full",
            resume=True,
            progress=False,
            log=lambda *a: None,
        )


def test_whole_run_in_one_jit_matches_the_epoch_loop():
    ds = load_dataset(None, DataConfig(encoder_steps=TINY.window, decoder_steps=1))
    from tftjax.dqn.env import make_trading_env

    env = make_trading_env(
        ds,
        dataclasses.replace(
            TINY, fee_bps=1.0, spread_bps=0.0, slippage_bps=0.0, reward_scale=100.0
        ),
    )
    dqn = make_train(dataclasses.replace(TINY, epochs=2), env)
    key = jax.random.PRNGKey(5)
    state, metrics = dqn.train(key)
    s = dqn.init(key, env)
    for _ in range(2):
        s, _ = dqn.epoch(s, env)
    # one scan over the epochs against the jitted epoch called twice: the same ops, compiled
    # in two programs whose fusions may round off differently in the last ulp; Adam carries
    # that through the updates (the bound of test_seeds_in_one_program_equal_separate_runs)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(s.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6)
    assert metrics["loss"].shape == (2,)
    pos, net, _ = greedy_rollout(dqn.apply, s.params, env.on(ds.splits.val_rows))
    assert set(np.unique(np.asarray(pos))) <= {-1, 0, 1}


# ----------------------------------------------------------------- CLI
def cli(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "tftjax.dqn", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_cli_runs_on_the_bundled_bars(tmp_path, capsys):
    wd = tmp_path / "cli"
    p = cli(
        "--epochs",
        "2",
        "--steps-per-epoch",
        "256",
        "--num-envs",
        "4",
        "--fee-bps",
        "0.5",
        "--workdir",
        str(wd),
        "--no-progress",
    )
    assert p.returncode == 0, p.stderr
    assert "buy_and_hold" in p.stdout and "Sharpe" in p.stdout
    assert "dqn_final_epoch2" in list_checkpoints(wd / "checkpoints")
    cfg = json.loads((wd / "summary.json").read_text())["config"]
    assert cfg["fee_bps"] == 0.5 and cfg["num_envs"] == 4
    assert cfg["spread_bps"] == 1.5 and cfg["fill"] == "next-open"  # the ES default spread
    # the resume in-process (its compiled epoch comes from the shared cache)
    from tftjax.dqn import __main__ as dqn_cli

    capsys.readouterr()
    assert call(dqn_cli.main, "--epochs", "3", "--workdir", wd, "--resume", "--no-progress") == 0
    assert "resuming from" in capsys.readouterr().out
    assert "dqn_final_epoch3" in list_checkpoints(wd / "checkpoints")


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--parquet-file", "/nonexistent/bars.parquet"], "bars.parquet: file not found"),
        (["--num-envs", "0"], "num_envs must be >= 1"),
        (["--epochs", "0"], "epochs must be >= 1"),
        (["--patience", "-1"], "patience must be >= 0, got -1"),
        (["--seed", "-1"], "seed must be in [0, 2**32), got -1"),
        (["--learning-starts", "60000"], "learning_starts (60000) must be <= buffer_size (50000)"),
        (["--env", "pong"], "pong"),
        (["--bogus"], "bogus"),
    ],
)
def test_cli_bad_input_exit_2(tmp_path, args, expect, capsys):
    from tftjax.dqn import __main__ as dqn_cli

    rc = call(dqn_cli.main, "--workdir", tmp_path / "w", "--no-progress", *args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert expect in err and "Traceback" not in err


def test_cli_bad_input_exit_2_through_python_m(tmp_path):
    p = cli("--workdir", str(tmp_path / "w"), "--no-progress", "--num-envs", "0")
    assert p.returncode == 2, p.stderr
    assert "num_envs must be >= 1" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.slow  # a CLI run on another environment
def test_cli_cartpole_through_the_same_loop(tmp_path, capsys):
    from tftjax.dqn import __main__ as dqn_cli

    wd = tmp_path / "cp"
    rc = call(
        dqn_cli.main,
        "--env",
        "cartpole",
        "--epochs",
        "2",
        "--steps-per-epoch",
        "2000",
        "--workdir",
        wd,
        "--no-progress",
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "CartPole-v1" in out and "greedy return over 10 fresh episodes each epoch" in out
    assert "final greedy return over 100 fresh episodes" in out
    summary = json.loads((wd / "summary.json").read_text())
    assert summary["last10_at_475"] is not None and summary["final_return_fresh"] > 0
    assert "| val | dqn |" in out
    assert "dqn_final_epoch2" in list_checkpoints(wd / "checkpoints")
    assert (wd / "learning_curves.png").exists() and not (wd / "equity_curve.png").exists()
    rows = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in rows] == [2000, 4000]
