"""Trade only where there is signal (issue 39): the deflated-Sharpe gate against a hand
computation and on a random walk, action augmentation against single-action steps,
decisions every K bars, the exit cost at a split's end, time to the close, out-of-fold
forecasts that never read their own fold, and the forecast rule's thresholds chosen on
validation only."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_bars
from scipy.stats import norm
from test_dqn import TINY, hand_env

from tftjax.data import write_bars
from tftjax.dqn import agent, oof, rule
from tftjax.dqn.env import TradingState, bars_to_close, policy_rollout
from tftjax.dqn.significance import deflated_sharpe, gate, min_detectable_sharpe, pooled, psr

G = 0.5772156649015329


# ----------------------------------------------------------------- significance
def test_deflated_sharpe_and_detectable_sharpe_by_hand():
    rng = np.random.default_rng(0)
    x = rng.normal(0.002, 0.01, 400)
    sr = x.mean() / x.std()
    z = (x - x.mean()) / x.std()
    g3, g4 = np.mean(z**3), np.mean(z**4)
    trials = [0.05, -0.02, 0.01, 0.12, 0.0, -0.08]
    v = max(np.var(trials, ddof=1), (1 + sr * sr / 2) / x.size)
    n = 30
    sr0 = math.sqrt(v) * ((1 - G) * norm.ppf(1 - 1 / n) + G * norm.ppf(1 - 1 / (n * math.e)))
    want = norm.cdf(
        (sr - sr0) * math.sqrt(x.size - 1) / math.sqrt(1 - g3 * sr + (g4 - 1) / 4 * sr * sr)
    )
    d = deflated_sharpe(x, n, trials)
    assert d["sr0"] == pytest.approx(sr0, rel=1e-9) and d["dsr"] == pytest.approx(want, rel=1e-9)
    # one candidate: no deflation, the PSR against 0
    assert gate(x, 1)["dsr"] == pytest.approx(
        norm.cdf(sr * math.sqrt(x.size - 1) / math.sqrt(1 - g3 * sr + (g4 - 1) / 4 * sr * sr)),
        rel=1e-9,
    )
    assert psr(np.zeros(50)) == 0.5
    assert min_detectable_sharpe(2520, 252.0) == pytest.approx(
        (1.6448536 + 0.8416212) * math.sqrt(252 / 2520), rel=1e-6
    )


def test_pooled_figures_leave_flat_seeds_out():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0.001, 0.01, 300), rng.normal(-0.0005, 0.01, 300)
    p = pooled([a, np.zeros(300), b, np.zeros(300)], 252.0)
    assert p["seeds_flat"] == 2 and p["seeds_trading"] == 2
    se = [math.sqrt((1 + (r.mean() / r.std()) ** 2 / 2) / 300) * math.sqrt(252) for r in (a, b)]
    assert p["mean_se_trading"] == pytest.approx(np.mean(se), rel=1e-9)
    mix = (a + b) / 2
    assert p["pooled_sharpe"] == pytest.approx(mix.mean() / mix.std() * math.sqrt(252), rel=1e-9)


@pytest.fixture(scope="module")
def walk_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rw") / "walk.parquet"
    write_bars(random_bars(1500, seed=11), path)
    return path


def test_the_gate_refuses_a_lucky_validation_record(walk_file):
    """A random walk has no edge: of 20 seeds, each shipped on its best smoothed validation
    record, at most one clears the deflated-Sharpe gate (its candidates: ranked epochs x
    seeds); a record with a real edge does clear it."""
    from tftjax.dqn.loop import build_envs
    from tftjax.dqn.seeds import evaluate_seeds, train_seeds

    cfg = dataclasses.replace(TINY, epochs=5, smooth_epochs=2, fee_bps=0.0, spread_bps=0.0)
    envs, _, cfg = build_envs(cfg, walk_file)
    dqn, params, best, best_epoch, history = train_seeds(cfg, 20, envs, log=lambda *a: None)
    assert all(e >= 2 for e in best_epoch)  # only full smoothing windows compete
    report = evaluate_seeds(dqn, envs, params, best, best_epoch, dqn.cfg, history)
    assert report["candidates"] == (5 - 2 + 1) * 20
    assert report["shipped"].count("dqn") <= 1, report["gates"]
    edge = np.random.default_rng(2).normal(0.004, 0.01, envs["val"].decisions)
    assert gate(edge, report["candidates"], level=0.95)["passes"]


# ----------------------------------------------------------------- environment
def test_action_augmentation_targets_equal_the_single_action_targets():
    jax.config.update("jax_default_matmul_precision", "highest")
    rng = np.random.default_rng(3)
    ret = rng.normal(0, 0.01, 60).astype(np.float32)
    for every in (1, 3):
        env = hand_env(
            ret, cost_bps=5.0, window=2, scale=100.0, next_open=True, gap=ret * 0.3, latency=1
        )
        env = env.replace(every=every)
        keys = jnp.asarray([[5, 1, 0], [17, -1, -1], [30, 0, 1]], jnp.int32)
        aug = jax.jit(agent.augmented)(env, keys)
        step_fn = jax.jit(env.step)  # one compile for the nine single-action steps
        net = agent.QNetwork(3, (8,))
        p = net.init(jax.random.PRNGKey(0), jnp.zeros((env.obs_dim,)))["params"]
        tp = jax.tree.map(lambda x: x * 0.5, p)
        apply = jax.jit(lambda params, o: net.apply({"params": params}, o))
        y_aug = agent.double_dqn_targets(
            apply(p, aug.next_obs), apply(tp, aug.next_obs), aug.reward, aug.terminal, 0.9
        )
        for b, key in enumerate(np.asarray(keys)):
            state = TradingState(jnp.int32(key[0]), jnp.asarray(key[1:]), jnp.int32(0))
            for a in range(3):
                step = step_fn(jax.random.PRNGKey(0), state, jnp.int32(a))
                row = 3 * b + a
                assert int(aug.action[row]) == a
                # the same few float32 operations in two compiled programs: a few ulps
                assert float(aug.reward[row]) == pytest.approx(
                    float(step.reward), rel=1e-6, abs=1e-6
                )
                np.testing.assert_array_equal(
                    np.asarray(aug.next_obs[row]), np.asarray(step.next_obs)
                )
                np.testing.assert_array_equal(
                    np.asarray(aug.obs[row]), np.asarray(env.decode(keys[b]))
                )
                y = agent.double_dqn_targets(
                    apply(p, step.next_obs[None]),
                    apply(tp, step.next_obs[None]),
                    step.reward[None],
                    step.terminal[None],
                    0.9,
                )
                # the same floats in, one network applied to batches of 9 and of 1: only
                # float32 rounding differs, a few ulps of terms of size <= |r| + |Q| < 4
                np.testing.assert_allclose(float(y_aug[row]), float(y[0]), rtol=0, atol=4e-6)


def test_a_decision_every_k_bars_holds_in_between_and_sums_the_bars():
    ret = np.array([0.0, 0.01, -0.02, 0.005, 0.003, -0.001, 0.004, 0.002, -0.003, 0.0], np.float32)
    c = 10e-4
    env = hand_env(ret, cost_bps=10.0, episode_len=3).replace(every=3)
    state = TradingState(jnp.int32(0), jnp.zeros((1,), jnp.int32), jnp.int32(0))
    out = env.step(jax.random.PRNGKey(0), state, jnp.int32(2))  # long over bars 1..3
    assert float(out.raw_reward) == pytest.approx(0.01 - 0.02 + 0.005 - c, abs=1e-7)
    assert int(out.state.t) == 3 and int(out.state.pos) == 1
    out = env.step(jax.random.PRNGKey(1), out.state, jnp.int32(0))  # flip: bars 4..6
    assert float(out.raw_reward) == pytest.approx(-(0.003 - 0.001 + 0.004) - 2 * c, abs=1e-7)
    # a pass decides on bars 0, 3, 6 only: the path's other entries are ignored
    path = jnp.asarray([1, -1, -1, 0, 1, 1, -1, 1, 1], jnp.int32)
    held, net, _ = jax.device_get(policy_rollout(env, path))
    np.testing.assert_array_equal(held, [1, 1, 1, 0, 0, 0, -1, -1, -1])


def test_a_split_is_traded_from_its_first_bar_and_pays_to_exit():
    ret = np.random.default_rng(4).normal(0, 0.01, 40).astype(np.float32)
    env = hand_env(ret, cost_bps=10.0, window=3).on((10, 30))
    assert env.first_decision == 10 and env.decisions == 19  # bars 11..29 traded
    held, net, _ = jax.device_get(policy_rollout(env, jnp.ones(env.decisions, jnp.int32)))
    assert held.tolist() == [1] * 19
    assert float(net.sum()) == pytest.approx(float(ret[11:30].sum()) - 2 * 10e-4, abs=1e-6)


def test_bars_to_close_by_hand():
    ends = np.zeros(10, bool)
    ends[[3, 7]] = True
    want = np.array([3, 2, 1, 0, 3, 2, 1, 0, 64, 64]) / 64
    np.testing.assert_array_equal(bars_to_close(ends), want.astype(np.float32))


# ----------------------------------------------------------------- out-of-fold forecasts
def _fake_model(seen):
    """A 'model' that forecasts from its training bars' mean return and the bar at ``t``
    (causal); ``seen`` records the last training bar time of each fitted model."""

    def fit(head, m):
        seen[m] = int(head.ts[-1])
        return float(np.mean(np.diff(np.log(head.close)))), m

    def predict(model):
        mu, _ = model
        close = predict.close
        r = np.r_[0.0, np.diff(np.log(close))]
        valid = np.arange(close.size) >= 5
        return {"first": np.stack([r, r + mu], 1), "cum": mu + r, "valid": valid}

    return fit, predict


def test_out_of_fold_forecasts_never_read_their_own_fold():
    from tftjax.config import DataConfig
    from tftjax.data.windows import walk_forward_times

    bars = random_bars(3000, seed=5)
    times = walk_forward_times([bars.ts], DataConfig(encoder_steps=16, decoder_steps=1), 4, 0.4)
    seen = {}
    fit, predict = _fake_model(seen)
    predict.close = bars.close
    blocks = oof.build(bars, times, fit, predict, before=2, log=lambda *a: None)
    starts = [b.start for b in blocks]
    assert len(blocks) == 6 and starts == sorted(starts)
    assert all(seen[m] < starts[m] for m in range(6))  # each model fitted before its start
    for k, (val_start, _, _) in enumerate(times):
        f = oof.for_fold(blocks, bars.ts, val_start)
        used = np.unique(f["model"][f["model"] >= 0])
        assert all(seen[m] < val_start for m in used)  # no model saw the fold's bars
        rows = f["model"] >= 0
        assert np.all(np.asarray(starts)[f["model"][rows]] <= bars.ts[rows])  # out of sample
        assert np.all(f["model"][bars.ts >= val_start] == 2 + k)  # the fold's own model
        # change every bar from the fold's validation start: nothing before it moves
        cut = int(np.searchsorted(bars.ts, val_start))
        close = bars.close.copy()
        close[cut:] *= np.exp(np.random.default_rng(k).normal(0, 0.05, len(bars.ts) - cut))
        alt = dataclasses.replace(bars, close=close)
        seen2 = {}
        fit2, predict2 = _fake_model(seen2)
        predict2.close = alt.close
        g = oof.for_fold(
            oof.build(alt, times, fit2, predict2, log=lambda *a: None), alt.ts, val_start
        )
        np.testing.assert_array_equal(g["columns"][:cut], f["columns"][:cut])
        assert not np.array_equal(g["columns"][cut:], f["columns"][cut:])


# ----------------------------------------------------------------- the forecast rule
def test_rule_path_by_hand():
    f = np.array([0.0, 3.0, 1.5, 0.5, -0.2, -3.0, -1.0, 2.5])
    valid = np.ones(f.size, bool)
    # entry 2, exit 1: long at 3.0, held at 1.5 (> 1), closed at 0.5, short at -3.0, held
    # at -1.0 (not beyond -1: closed), long at 2.5
    assert rule.rule_path(f, valid, 2.0, 1.0).tolist() == [0, 1, 1, 0, 0, -1, 0, 1]
    assert rule.rule_path(f, valid, 2.0, 0.0).tolist() == [0, 1, 1, 1, 0, -1, -1, 1]
    valid[2] = False
    assert rule.rule_path(f, valid, 2.0, 0.0).tolist() == [0, 1, 0, 0, 0, -1, -1, 1]


def test_the_rule_chooses_on_validation_only(walk_file):
    """Each fold's thresholds maximise its validation Sharpe (checked against every
    candidate) and do not change when everything after the last fold's test start changes."""
    from tftjax.data import read_bars
    from tftjax.data.windows import walk_forward_times
    from tftjax.dqn.loop import build_envs, data_config

    cfg = dataclasses.replace(TINY, spread_bps=1.0, fee_bps=0.0)
    bars = read_bars(walk_file)
    times = walk_forward_times([bars.ts], data_config(cfg), 3, 0.4)
    rng = np.random.default_rng(6)
    r = np.r_[0.0, np.diff(np.log(bars.close))]
    signal = np.r_[r[1:], 0.0] * 0.5 + rng.normal(0, 0.002, r.size)  # some skill
    block = oof.Block(
        int(bars.ts[0]), np.zeros((r.size, 1), np.float32), signal, np.ones(r.size, bool)
    )
    out = rule.walk_forward_rule(cfg, walk_file, times, [block])
    envs, _, _ = build_envs(cfg, walk_file, fold=times[0])
    chosen = rule.choose(envs["val"], signal, block.valid)
    assert chosen["val_sharpe"] == max(chosen["val_sharpes"])
    assert out["folds"][0]["entry_costs"] == chosen["entry_costs"]
    late = int(np.searchsorted(bars.ts, times[-1][1]))
    moved = signal.copy()
    moved[late:] = -moved[late:]
    again = rule.walk_forward_rule(cfg, walk_file, times, [dataclasses.replace(block, cum=moved)])
    for a, b in zip(out["folds"], again["folds"]):
        assert (a["entry_costs"], a["exit_fraction"]) == (b["entry_costs"], b["exit_fraction"])
    assert not np.array_equal(out["net"], again["net"])


@pytest.mark.slow  # an old run resumed through the CLI
def test_a_run_from_before_these_settings_still_resumes(tmp_path):
    """A checkpoint written before --psr-gate, --action-augment and --decision-every existed
    resumes with them at their defaults (what it ran with)."""
    import json

    from tftjax.dqn import run

    quiet = dict(progress=False, log=lambda *a: None, tensorboard=False)
    run(dataclasses.replace(TINY, epochs=1), tmp_path, **quiet)
    for meta in (tmp_path / "checkpoints").glob("*/meta/metadata"):
        m = json.loads(meta.read_text())
        for k in ("psr_gate", "action_augment", "decision_every"):
            del m["identity"]["config"][k]
        meta.write_text(json.dumps(m))
    summary = run(dataclasses.replace(TINY, epochs=2), tmp_path, resume=True, **quiet)
    assert summary["epochs_run"] == 2
