"""The DQN's execution and selection (issue 26): next-open and close fills with latency and
costs against an event-by-event simulation by hand, session-end flattening against the CME
trade date, rewards in units of the data, the flat fallback, Polyak every update, extending an
early-stopped run, and the refusals."""

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from conftest import call
from test_dqn import TINY, hand_env

from tftjax.config import ConfigError
from tftjax.data import bundled_path
from tftjax.dqn import __main__ as dqn_cli
from tftjax.dqn import make_train, run
from tftjax.dqn.config import COSTS, DQNConfig
from tftjax.dqn.env import session_ends
from tftjax.dqn.loop import DQNTask, build_envs

quiet = dict(log=lambda *a: None, progress=False)


def simulate(o, c, decisions, latency, cost, next_open, ends):
    """Event by event, in time order (open k, close k, open k+1, ...): the order decided on
    close s fills at open s+1+L (next open) or close s+L; each fill pays cost per unit; on a
    session's last bar everything is closed at its close, superseding pending orders. Step t's
    P&L is that of [close t, close t+1)."""
    fills = {}
    for s, d in enumerate(decisions):
        fills[(s + 1 + latency, 0) if next_open else (s + latency, 1)] = (s, d)
    pos, out = 0, []
    for t in range(len(decisions)):
        net = 0.0
        if ends[t]:  # market-on-close: supersedes every order decided up to t
            fills = {k: v for k, v in fills.items() if v[0] > t}
            net -= cost * abs(pos)
            pos = 0
        elif (t, 1) in fills:
            new = fills.pop((t, 1))[1]
            net -= cost * abs(new - pos)
            pos = new
        net += pos * math.log(o[t + 1] / c[t])
        if (t + 1, 0) in fills:
            new = fills.pop((t + 1, 0))[1]
            net -= cost * abs(new - pos)
            pos = new
        net += pos * math.log(c[t + 1] / o[t + 1])
        out.append(net)
    return np.array(out)


def env_pnl(o, c, decisions, latency, cost_bps, next_open, ends):
    ret = np.r_[0.0, np.log(c[1:] / c[:-1])]
    gap = np.r_[0.0, np.log(o[1:] / c[:-1])]
    env = hand_env(
        ret,
        cost_bps=cost_bps,
        gap=gap,
        ends=ends,
        next_open=next_open,
        latency=latency,
        episode_len=50,
    )
    state = env.reset(jax.random.PRNGKey(0))[1].replace(t=jnp.int32(0))
    out = []
    for k, d in enumerate(decisions):
        step = env.step(jax.random.PRNGKey(k), state, jnp.int32(d + 1))
        out.append(float(step.raw_reward))
        state = step.state
    return np.array(out)


def test_next_open_fills_with_latency_and_costs_by_hand():
    o = np.array([100.0, 101.0, 99.0, 100.0, 102.0, 101.0])
    c = np.array([100.5, 100.0, 99.5, 101.0, 101.5, 103.0])
    spread, fee, slip = 4.0, 1.0, 0.5  # bp: half the spread + fee + slippage per unit traded
    cfg = DQNConfig(spread_bps=spread, fee_bps=fee, slippage_bps=slip)
    cost = 3.5e-4
    assert cfg.cost == pytest.approx(cost)
    d = [1, -1, -1, 0, 1]  # decided on closes 0..4; latency 1: each fills at open s + 2
    want = [
        0.0,
        math.log(c[2] / o[2]) - cost,  # long from open 2
        math.log(o[3] / c[2]) - 2 * cost - math.log(c[3] / o[3]),  # flip at open 3
        -math.log(o[4] / c[3]) - math.log(c[4] / o[4]),  # short held
        -math.log(o[5] / c[4]) - cost,
    ]  # flat from open 5 (close 4's order: open 6)
    got = env_pnl(o, c, d, 1, cfg.cost * 1e4, True, np.zeros(6, bool))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        simulate(o, c, d, 1, cost, True, np.zeros(6, bool)), want, rtol=1e-12
    )


@pytest.mark.parametrize("next_open", [True, False])
@pytest.mark.parametrize("latency", [0, 2])
def test_fills_equal_the_event_simulation(next_open, latency):
    rng = np.random.default_rng(latency + 7 * next_open)
    n = 40
    c = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    o = c * np.exp(rng.normal(0, 0.004, n))
    d = rng.integers(-1, 2, n - 1)
    ends = rng.random(n) < 0.15  # some sessions' last bars
    got = env_pnl(o, c, d, latency, 7.0, next_open, ends)
    np.testing.assert_allclose(
        got, simulate(o, c, d, latency, 7e-4, next_open, ends[: n - 1]), rtol=2e-5, atol=2e-7
    )
    # flat over every bar after a session end unless a new order fills
    assert np.isfinite(got).all()


def test_session_ends_are_the_cme_trade_date_changes():
    """On the bundled ES bars with XCME, the bars flattened are exactly those after which the
    CME trade date (17:00 Chicago starts the next one) changes, and the last bar."""
    pytest.importorskip("exchange_calendars")
    cfg = dataclasses.replace(TINY, calendar="XCME", flatten_at_session_end=True)
    envs, ds, _ = build_envs(cfg, bundled_path("es"))
    ends = session_ends(ds.features.timeline)
    wall = pd.to_datetime(ds.bars.ts)  # naive: the calendar's wall clock, Chicago
    trade_date = (wall + pd.Timedelta(hours=7)).date
    want = np.r_[trade_date[1:] != trade_date[:-1], True]
    assert want.sum() >= 2
    np.testing.assert_array_equal(ends, want)
    np.testing.assert_array_equal(np.asarray(envs["train"].session_end), ends)
    # and the agent holds nothing over a session end: a greedy long agent's held positions
    from tftjax.dqn.env import _constant_rollout

    env = envs["train"].on((0, len(ds.bars)))
    held, _, _ = jax.device_get(_constant_rollout(env, 1))
    t = env.first_decision + np.arange(env.decisions)
    assert (held[ends[t]] == 0).all() and (held[~ends[t]] == 1).any()


def test_flatten_and_fill_refusals():
    with pytest.raises(ConfigError, match="needs --calendar"):
        build_envs(dataclasses.replace(TINY, flatten_at_session_end=True), bundled_path("es"))
    pytest.importorskip("exchange_calendars")
    with pytest.raises(ConfigError, match="daily bars end a session every bar"):
        build_envs(
            dataclasses.replace(TINY, calendar="XNYS", flatten_at_session_end=True),
            bundled_path("spx"),
        )


def test_rewards_are_in_units_of_the_data_on_es_spx_and_btc():
    """The learning reward of holding long is the bar's return in training target scales (std
    about 1) on every set, where ×1e4 made it 2 on ES and 100+ on BTC; a short run on each
    (one compiled epoch: the three environments have one shape) keeps Q and the loss O(1)."""
    envs, q, loss = {}, {}, {}
    rows = 1_200
    for name in ("es", "spx", "btc"):
        e, ds, cfg = build_envs(dataclasses.replace(TINY, epochs=2), bundled_path(name))
        assert cfg.reward_scale == pytest.approx(1 / ds.features.stats.target_scale)
        assert (cfg.spread_bps, cfg.fee_bps, cfg.slippage_bps) == COSTS[name]
        train = e["train"]
        r = np.asarray(train.gap + train.intra)[train.lo + 1 : train.hi] * float(train.reward_scale)
        assert 0.5 < r.std() < 2.0, (name, r.std())
        envs[name] = jax.tree.map(lambda a: a[:rows] if getattr(a, "ndim", 0) else a, train).on(
            (0, rows)
        )
    dqn = make_train(dataclasses.replace(TINY, epochs=2, steps_per_epoch=400), envs["es"])
    for name, env in envs.items():
        s = dqn.init(jax.random.PRNGKey(0), env)
        for _ in range(2):
            s, m = dqn.epoch(s, env)
        q[name], loss[name] = abs(float(m["q_mean"])), float(m["loss"])
    assert max(q.values()) < 3.0 and max(loss.values()) < 3.0, (q, loss)


def _task(tmp_path, **kw):
    cfg = dataclasses.replace(TINY, **kw)
    envs, ds, cfg = build_envs(cfg, bundled_path("es"))
    return DQNTask(cfg, envs, ds, tmp_path)


def test_flat_is_shipped_unless_validation_clears_the_gate(tmp_path):
    task = _task(tmp_path, smooth_epochs=3, epochs=6)
    hist = []
    for v in (0.5, -1.0, -2.0, -0.4, 0.3, 0.1):  # smoothed from the 3rd: -0.83, -1.13, ...
        hist.append({"val_sharpe": v})
        assert task.rank(hist) == (
            -math.inf
            if len(hist) < 3
            else pytest.approx(np.mean([h["val_sharpe"] for h in hist[-3:]]))
        )
    assert hist[1]["val_sharpe_smoothed"] is None  # epochs 1-2: partial windows never compete
    assert hist[2]["val_sharpe_smoothed"] == pytest.approx(-2.5 / 3)
    flat = {"sharpe": 0.0, "total_log_return": 0.0}
    splits = {"val": {"dqn": {"sharpe": 0.3}, "flat": flat}, "test": {"dqn": {}, "flat": flat}}
    rng = np.random.default_rng(0)
    n = task.envs["val"].decisions
    edge, luck = rng.normal(0.004, 0.01, n), rng.normal(0.0, 0.01, n)
    out = task.selection(edge, hist, splits)
    assert out["shipped_policy"] == "dqn" and "clears the --psr-gate" in out["verdict"]
    assert out["candidates"] == 4 and "4 epochs compared" in out["verdict"]
    out = task.selection(luck, hist, splits)
    assert out["shipped_policy"] == "flat" and "shipping FLAT" in out["verdict"]
    assert splits["test"]["shipped (flat)"] == flat
    out = _task(tmp_path, flat_fallback=False, smooth_epochs=3, epochs=6).selection(
        luck, hist, {"val": {"dqn": {}, "flat": flat}}
    )
    assert out["shipped_policy"] == "dqn" and "anyway (--no-flat-fallback)" in out["verdict"]


def test_no_early_stop_before_min_epochs_or_the_end_of_exploration(tmp_path):
    task = _task(tmp_path, min_epochs=5, eps_decay_steps=1_000)
    assert not task.may_stop(4, {"env_steps": 5_000})
    assert not task.may_stop(6, {"env_steps": 800})
    assert task.may_stop(6, {"env_steps": 1_000})


def test_polyak_moves_the_target_after_every_update():
    """tau < 1: after each gradient step the target is ``(1-τ) θ' + τ θ`` of the new online
    parameters (by hand, one update per epoch), not once per target_update_every updates."""
    from tftjax.data import load_dataset
    from tftjax.dqn.env import make_trading_env
    from tftjax.dqn.loop import data_config

    cfg = dataclasses.replace(
        TINY,
        tau=0.1,
        learning_starts=32,
        steps_per_epoch=4,
        num_envs=4,
        target_update_every=1_000,
        reward_scale=100.0,
        spread_bps=0.0,
        fee_bps=1.0,
        slippage_bps=0.0,
    )
    env = make_trading_env(load_dataset(None, data_config(cfg)), cfg)
    dqn = make_train(cfg, env)
    s = dqn.init(jax.random.PRNGKey(1), env)
    updates = 0
    while updates < 4:
        before = jax.tree.map(np.array, jax.device_get(s.target_params))
        s, m = dqn.epoch(s, env)
        if int(m["updates"]) == 0:
            continue
        updates += 1
        now = jax.device_get(s.params)
        for t, p, b in zip(
            jax.tree.leaves(jax.device_get(s.target_params)),
            jax.tree.leaves(now),
            jax.tree.leaves(before),
        ):
            np.testing.assert_allclose(
                np.asarray(t), 0.9 * b + 0.1 * np.asarray(p), rtol=1e-5, atol=1e-7
            )
        assert any(
            not np.allclose(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(now))
        )


@pytest.mark.slow
def test_an_early_stopped_run_can_be_extended(tmp_path, capsys):
    cfg = dataclasses.replace(TINY, epochs=6, learning_starts=TINY.buffer_size, patience=1)
    summary = run(cfg, tmp_path / "r", **quiet)
    assert summary["stopped_early"] and summary["epochs_run"] < 6
    stopped = summary["epochs_run"]
    lines = []
    run(
        dataclasses.replace(cfg, epochs=8),
        tmp_path / "r",
        resume=True,
        progress=False,
        log=lines.append,
    )
    assert any("to train on, pass --epochs N with another --patience" in x for x in lines)
    lines = []
    summary = run(
        dataclasses.replace(cfg, epochs=stopped + 2, patience=0),
        tmp_path / "r",
        resume=True,
        progress=False,
        log=lines.append,
    )
    assert any("training on to epoch" in x for x in lines), lines
    assert summary["epochs_run"] == stopped + 2
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, stopped + 3))
    # the old final stays (its weights) but only the new one is final
    from tftjax.runner.checkpoints import list_checkpoints, read_meta

    ckpts = tmp_path / "r" / "checkpoints"
    finals = {n: read_meta(ckpts / n)["is_final"] for n in list_checkpoints(ckpts)}
    assert finals[f"dqn_final_epoch{stopped}"] is False
    assert [n for n, f in finals.items() if f] == [f"dqn_final_epoch{stopped + 2}"]
    assert (
        read_meta(ckpts / f"dqn_final_epoch{stopped}")["superseded_by"]
        == f"dqn_final_epoch{stopped + 2}"
    )


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--fill", "tomorrow"], "--fill must be next-open or close, got 'tomorrow'"),
        (["--latency", "-1"], "--latency must be >= 0 bars, got -1"),
        (["--spread-bps", "-1"], "--spread-bps must be >= 0, got -1.0"),
        (["--fee-bps", "-0.5"], "--fee-bps must be >= 0, got -0.5"),
        (["--slippage-bps", "-2"], "--slippage-bps must be >= 0, got -2.0"),
        (["--flatten-at-session-end"], "--flatten-at-session-end needs --calendar"),
        (["--smooth-epochs", "0"], "--smooth-epochs must be >= 1, got 0"),
        (["--seeds", "0"], "--seeds must be >= 1, got 0"),
        (["--decision-every", "0"], "--decision-every must be >= 1 bar, got 0"),
        (["--psr-gate", "1.5"], "--psr-gate must be in (0, 1), got 1.5"),
        (["--env", "cartpole", "--action-augment"], "--action-augment is for --env trading"),
        (["--tft-checkpoint", "/nonexistent/tft"], "no such checkpoint or run folder"),
    ],
)
def test_bad_execution_flags_exit_2_with_one_line(tmp_path, capsys, args, expect):
    rc = call(dqn_cli.main, "--workdir", tmp_path / "d", "--no-progress", *args)
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and err.strip().count("\n") == 0, err
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_seeds_in_one_program_equal_separate_runs(tmp_path):
    """--seeds 2 selects, seed by seed, the agent a separate --patience 0 run of that seed
    keeps (its epoch of best smoothed validation Sharpe), with the same parameters; and the
    report's numbers are that agent's on test."""
    from tiny import raw_state

    from tftjax.dqn.seeds import run_seeds

    cfg = dataclasses.replace(TINY, epochs=2, smooth_epochs=2)
    report = run_seeds(cfg, 2, tmp_path / "seeds", log=lambda *a: None)
    ck = next((tmp_path / "seeds" / "checkpoints").glob("dqn_seeds_final_epoch2"))
    stacked = raw_state(ck)
    # The vmapped program batches the network's dots over the seeds, so its sums may round
    # off differently from the single seed's in the last ulp; Adam carries that through the
    # ~250 updates (measured ~1e-5, hence 2e-4). What would break the claim, a seed's
    # keys or epsilon shared or mixed, changes the trajectories and is off by O(1). A
    # round-off difference flips a greedy action or a best epoch only where two Q-values, or
    # two epochs' validation Sharpes, tie to ~1e-7: about 1e-3 over the ~1,600 decisions.
    for i in range(2):
        one = run(dataclasses.replace(cfg, seed=i), tmp_path / f"s{i}", **quiet)
        assert report["best_epoch"][i] == one["best_epoch"]
        params = raw_state(tmp_path / f"s{i}" / "checkpoints" / "dqn_final_epoch2")["params"]
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(stacked)):
            np.testing.assert_allclose(np.asarray(b)[i], np.asarray(a), rtol=2e-4, atol=2e-6)
        got = report["per_seed"][i]["test"]["agent"]
        want = one["splits"]["test"]["dqn"]
        for k in ("total_log_return", "sharpe", "turnover"):
            assert got[k] == pytest.approx(want[k], rel=1e-3, abs=1e-6), k
    assert (tmp_path / "seeds" / "seeds.md").read_text().count("| seed ") == 4
    with pytest.raises(ConfigError, match="--seeds must be >= 1, got 0"):
        run_seeds(cfg, 0, tmp_path / "none")


@pytest.fixture(scope="module")
def early_tft(predict_run):
    """A tiny TFT trained (one short epoch) on the first 700 ES bars, its run folder and its
    bars: conftest.predict_run (runloop_base's, built once per worker). Its data ends long
    before the validation split of a DQN on the whole ES file."""
    return predict_run / "run", str(predict_run / "bars.parquet")


@pytest.mark.slow
@pytest.mark.xdist_group("runloop_base")
def test_tft_forecasts_join_the_observation_causally(early_tft, tmp_path):
    from tftjax.data import read_bars, write_bars

    run_dir, _ = early_tft
    cfg = dataclasses.replace(TINY, tft_checkpoint=str(run_dir))
    envs, ds, _ = build_envs(cfg, bundled_path("es"))
    plain, _, _ = build_envs(TINY, bundled_path("es"))
    feats, base = np.asarray(envs["train"].feats), np.asarray(plain["train"].feats)
    q = feats.shape[1] - base.shape[1]
    assert q == 3  # the tiny preset's three quantiles, step 1
    np.testing.assert_array_equal(feats[:, : base.shape[1]], base)
    cols = feats[:, base.shape[1] :]
    assert (cols[:100] == 0).all() and np.isfinite(cols).all() and np.abs(cols[200:]).sum() > 0
    assert (np.diff(cols[200:], axis=1) >= -1e-6).mean() > 0.5  # quantile-like columns
    # causal: other bars after t change no observation at t (the TFT's forecasts included;
    # t after the DQN's training rows, whose statistics its own features are scaled by)
    bars = read_bars(bundled_path("es"))
    t = int(ds.splits.val_rows[0]) + 20
    rng = np.random.default_rng(0)
    shock = np.r_[np.ones(t + 1), np.exp(rng.normal(0, 0.01, len(bars) - t - 1))]
    changed = dataclasses.replace(
        bars,
        open=bars.open * shock,
        high=bars.high * shock,
        low=bars.low * shock,
        close=bars.close * shock,
        volume=bars.volume * np.r_[np.ones(t + 1), rng.uniform(0.5, 2, len(bars) - t - 1)],
    )
    path = tmp_path / "es_changed.parquet"
    write_bars(changed, path)
    other, _, _ = build_envs(cfg, path)
    hist = jnp.zeros(1, jnp.int32)
    for tt in (400, 1_000, t):
        np.testing.assert_array_equal(
            np.asarray(envs["train"].observe(tt, hist)),
            np.asarray(other["train"].observe(tt, hist)),
        )
    assert not np.array_equal(
        np.asarray(envs["train"].observe(t + 3, hist)),
        np.asarray(other["train"].observe(t + 3, hist)),
    )


@pytest.mark.slow
@pytest.mark.xdist_group("runloop_base")
def test_a_tft_trained_too_late_or_no_tft_is_refused(early_tft, tmp_path):
    from tftjax.data import DataError

    run_dir, head = early_tft
    # a DQN on the TFT's own 700 bars: the TFT's validation reaches past the DQN's split
    with pytest.raises(ConfigError, match="its forecasts would leak"):
        build_envs(dataclasses.replace(TINY, tft_checkpoint=str(run_dir)), head)
    with pytest.raises(DataError, match="--tft-checkpoint .*no such checkpoint or run folder"):
        build_envs(
            dataclasses.replace(TINY, tft_checkpoint=str(tmp_path / "none")), bundled_path("es")
        )
    dqn_run = tmp_path / "dqn"
    run(dataclasses.replace(TINY, epochs=1), dqn_run, **quiet)
    with pytest.raises(DataError, match="not a TFT checkpoint"):
        build_envs(dataclasses.replace(TINY, tft_checkpoint=str(dqn_run)), bundled_path("es"))


@pytest.mark.slow  # a walk-forward of DQN runs
def test_dqn_walk_forward_tiles_the_test_region_and_stitches_it(tmp_path, capsys):
    from tftjax.data.windows import walk_forward_times
    from tftjax.dqn.loop import data_config
    from tftjax.dqn.walkforward import walk_forward

    cfg = dataclasses.replace(TINY, epochs=1)
    out = walk_forward(cfg, 2, None, tmp_path / "wf", folds=2, log=lambda *a: None)
    assert [f["fold"] for f in out["folds"]] == [1, 2]
    assert out["folds"][0]["test_from"] < out["folds"][1]["test_from"]
    # each fold's own data: train and validation rows before its test stretch
    ts = build_envs(cfg)[1].bars.ts
    for k, fold in enumerate(walk_forward_times([ts], data_config(cfg), 2, 0.4)):
        envs, ds, _ = build_envs(cfg, None, fold=fold)
        assert ds.splits.val_rows[1] <= ds.splits.test_rows[0]
        assert envs["test"].decisions == out["folds"][k]["test_bars"]
    # pooled over the stitched stretches: the bars add up, and flat stays flat
    total = sum(f["test_bars"] for f in out["folds"])
    assert out["baselines"]["flat"]["total_log_return"] == 0.0
    assert out["baselines"]["buy_and_hold"]["exposure"] == 1.0 and total > 400
    assert (tmp_path / "wf" / "walk_forward.md").read_text().count("(agent) |") == 2
    rc = call(dqn_cli.main, "--folds", "1", "--workdir", tmp_path / "x", "--no-progress")
    assert rc == 2 and "--folds must be >= 2" in capsys.readouterr().err


@pytest.mark.parametrize("next_open", [True, False])
def test_trades_add_up_to_the_pass(next_open):
    """The per-trade table partitions the pass: the trades' net P&L sums to the pass's net
    return, their costs to the costs paid; a flip closes one trade and opens the next."""
    from tftjax.dqn.env import policy_rollout
    from tftjax.dqn.report import trades

    rng = np.random.default_rng(3)
    n = 60
    c = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    o = c * np.exp(rng.normal(0, 0.004, n))
    ret, gap = np.r_[0.0, np.log(c[1:] / c[:-1])], np.r_[0.0, np.log(o[1:] / c[:-1])]
    ends = rng.random(n) < 0.1
    env = hand_env(ret, cost_bps=5.0, gap=gap, ends=ends, next_open=next_open, episode_len=80)
    path = jnp.asarray(rng.integers(-1, 2, env.decisions), jnp.int32)
    held, net, _ = jax.device_get(policy_rollout(env, path))
    tr = trades(env, held, np.arange(n) * 60 * 10**9)
    assert len(tr) > 5
    np.testing.assert_allclose(sum(t["net"] for t in tr), net.sum(), rtol=1e-5, atol=1e-6)
    units = np.abs(np.diff(np.r_[0.0, held, 0.0])).sum()  # the exit after the end included
    assert sum(t["costs"] for t in tr) <= 5e-4 * units + 1e-9
    assert all(t["bars"] >= 1 for t in tr)


def test_the_compact_buffer_trains_the_same_weights():
    """Keys (bar, decisions) in the buffer instead of observations: the observations rebuilt
    at sampling are the same floats (checked exactly below), so two epochs give the same
    parameters, with a buffer of 2 int32 per state instead of the window of features."""
    from tftjax.data import load_dataset
    from tftjax.dqn.env import make_trading_env
    from tftjax.dqn.loop import data_config

    cfg = dataclasses.replace(
        TINY, reward_scale=100.0, spread_bps=1.0, fee_bps=0.2, slippage_bps=0.0
    )
    env = make_trading_env(load_dataset(None, data_config(cfg)), cfg)
    out = {}
    for compact in (True, False):
        dqn = make_train(dataclasses.replace(cfg, compact_buffer=compact, epochs=2), env)
        s = dqn.init(jax.random.PRNGKey(2), env)
        for _ in range(2):
            s, m = dqn.epoch(s, env)
        assert int(m["updates"]) > 0
        out[compact] = jax.device_get(s)
    assert out[True].buffer.data.obs.shape == (TINY.buffer_size, 2)
    assert out[True].buffer.data.obs.dtype == np.int32
    assert out[False].buffer.data.obs.shape == (TINY.buffer_size, env.obs_dim)
    # Bit for bit here, but the two are different compiled programs (a gather feeds the
    # network's first dot in one): XLA may fuse that dot otherwise and round off its sums
    # differently in the last ulp, which Adam carries through the updates (what
    # test_seeds_in_one_program_equal_separate_runs allows too). A wrong rebuild trains on
    # other observations and is off by O(1).
    for a, b in zip(jax.tree.leaves(out[True].params), jax.tree.leaves(out[False].params)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
    # and what the buffer rebuilds is what was stored
    k = np.asarray(out[True].buffer.data.obs[:50])
    np.testing.assert_array_equal(
        np.asarray(jax.vmap(env.decode)(jnp.asarray(k))),
        np.asarray(out[False].buffer.data.obs[:50]),
    )
