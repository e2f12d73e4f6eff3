"""The DQN training loop, PureJaxRL style: ``make_train(cfg, env)`` builds pure
functions, collection and updates run inside ``lax.scan``/``lax.cond``, one jit
per epoch.

One loop iteration: ε-greedy actions for ``num_envs`` parallel episodes, one
vmapped environment step (auto-reset), the transitions into the replay
buffer, and, once ``learning_starts`` env steps are stored and every
``train_every`` iterations, one double-DQN gradient step (Huber loss, global
norm clipping, Adam); every ``target_update_every`` gradient steps the target
network moves to the online one (hard copy for ``tau = 1``, Polyak
otherwise). An epoch is ``ceil(steps_per_epoch / num_envs)`` iterations in one
``lax.scan``: for trading, ``steps_per_epoch`` defaults to the training
split's length.

The whole loop state (:class:`DQNState`: online and target parameters,
optimiser state, replay buffer, environment states, ε/step counters, RNG
key) is one pytree: it is what a checkpoint holds, so ``--resume`` continues
exactly where the run stopped.

:func:`run` is the host loop behind ``python -m tftjax.dqn``: epochs,
greedy validation, early stopping on the validation score, Orbax epoch and
final checkpoints through ``callback(epoch, state, metrics, is_final)``,
``metrics.jsonl``, a final table and plots.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from tftjax.checkpoints import (EpochCheckpointer, last_checkpoint, list_checkpoints, read_history,
                                read_meta)
from tftjax.config import DQNConfig
from tftjax.dqn import agent, buffer
from tftjax.dqn.env import (TradingEnv, baseline_metrics, greedy_episodes,
                            greedy_rollout, make_cartpole, make_trading_env, trading_metrics)

CARTPOLE_STEPS_PER_EPOCH = 10_000
EVAL_EPISODES = 10


class ConfigError(ValueError):
    """Settings that cannot work (reported as one line, exit code 2)."""


class TrainingDiverged(RuntimeError):
    """A NaN/inf loss; nothing of that epoch was saved."""


@struct.dataclass
class DQNState:
    params: Any
    target_params: Any
    opt_state: Any
    buffer: buffer.ReplayBuffer
    env_state: Any
    obs: jax.Array  # [E, D]: what each episode acts on next
    ep_return: jax.Array  # [E] raw return of each running episode
    key: jax.Array  # uint32[2]
    step: jax.Array  # int32: env steps so far (drives ε)
    updates: jax.Array  # int32: gradient steps so far


class DQN(NamedTuple):
    """What :func:`make_train` returns: pure functions of one resolved config."""

    cfg: DQNConfig
    network: agent.QNetwork
    init: Callable  # (key, env) -> DQNState
    epoch: Callable  # jitted (state, env) -> (state, metrics); donates state
    train: Callable  # jitted key -> (state, per-epoch metrics): cfg.epochs epochs in one scan
    apply: Callable  # (params, obs) -> Q


def resolve(cfg: DQNConfig, env) -> DQNConfig:
    """Fill the defaults that depend on the data: steps per epoch and ε decay."""
    spe = cfg.steps_per_epoch
    if spe is None:
        spe = env.hi - env.lo if isinstance(env, TradingEnv) else CARTPOLE_STEPS_PER_EPOCH
    decay = cfg.eps_decay_steps
    if decay is None:
        decay = max(1, int(0.3 * cfg.epochs * spe))
    return dataclasses.replace(cfg, steps_per_epoch=int(spe), eps_decay_steps=int(decay))


def iterations_per_epoch(cfg: DQNConfig) -> int:
    return -(-cfg.steps_per_epoch // cfg.num_envs)


def make_train(cfg: DQNConfig, env) -> DQN:
    """Pure init/epoch/train functions for ``cfg`` (resolved against ``env``)."""
    cfg = resolve(cfg, env)
    network = agent.QNetwork(env.num_actions, tuple(cfg.hidden))
    E = cfg.num_envs
    iters = iterations_per_epoch(cfg)
    tx = agent.make_optimizer(cfg.learning_rate, cfg.max_grad_norm,
                              end_fraction=cfg.lr_end_fraction,
                              decay_steps=cfg.epochs * iters // cfg.train_every)

    def apply(params, obs):
        return network.apply({"params": params}, obs)

    def init(key, env) -> DQNState:
        k_net, k_env, k_run = jax.random.split(key, 3)
        params = network.init(k_net, jnp.zeros((env.obs_dim,), jnp.float32))["params"]
        obs, env_state = jax.vmap(env.reset)(jax.random.split(k_env, E))
        return DQNState(params=params, target_params=jax.tree.map(jnp.copy, params),
                        opt_state=tx.init(params), buffer=buffer.init(cfg.buffer_size, env.obs_dim),
                        env_state=env_state, obs=obs.astype(jnp.float32),
                        ep_return=jnp.zeros((E,), jnp.float32), key=k_run,
                        step=jnp.zeros((), jnp.int32), updates=jnp.zeros((), jnp.int32))

    def update(s: DQNState, key):
        batch = buffer.sample(s.buffer, key, cfg.batch_size)
        (loss, q), grads = jax.value_and_grad(agent.dqn_loss, has_aux=True)(
            s.params, s.target_params, apply, batch, cfg.gamma, cfg.huber_delta)
        upd, opt_state = tx.update(grads, s.opt_state, s.params)
        params = optax.apply_updates(s.params, upd)
        n = s.updates + 1
        target = jax.lax.cond(n % cfg.target_update_every == 0,
                              lambda: agent.polyak(s.target_params, params, cfg.tau),
                              lambda: s.target_params)
        return s.replace(params=params, opt_state=opt_state, target_params=target, updates=n), \
            (loss, q, jnp.ones((), jnp.float32))

    def skip(s: DQNState, key):
        z = jnp.zeros((), jnp.float32)
        return s, (z, z, z)

    def iteration(env, s: DQNState, it):
        key, k_act, k_env, k_upd = jax.random.split(s.key, 4)
        q = apply(s.params, s.obs)
        eps = agent.linear_epsilon(s.step, cfg.eps_start, cfg.eps_end, cfg.eps_decay_steps)
        action = agent.epsilon_greedy(k_act, q, eps)
        out = jax.vmap(env.step)(jax.random.split(k_env, E), s.env_state, action)
        buf = buffer.add(s.buffer, buffer.Transitions(s.obs, action, out.reward,
                                                      out.next_obs.astype(jnp.float32),
                                                      out.terminal))
        ep_return = s.ep_return + out.raw_reward
        finished = out.done.astype(jnp.float32)
        s = s.replace(buffer=buf, env_state=out.state, obs=out.obs.astype(jnp.float32),
                      ep_return=ep_return * (1.0 - finished), key=key, step=s.step + E)
        ready = (buf.size >= cfg.learning_starts) & (it % cfg.train_every == 0)
        s, (loss, qm, did) = jax.lax.cond(ready, update, skip, s, k_upd)
        return s, dict(loss=loss, q=qm, did=did, reward=out.raw_reward.mean(),
                       ep_sum=(ep_return * finished).sum(), ep_n=finished.sum())

    def epoch(s: DQNState, env) -> tuple[DQNState, dict]:
        s, m = jax.lax.scan(lambda c, i: iteration(env, c, i), s,
                            jnp.arange(iters, dtype=jnp.int32))
        n_upd = m["did"].sum()
        metrics = {
            "loss": jnp.where(n_upd > 0, (m["loss"] * m["did"]).sum() / jnp.maximum(n_upd, 1),
                              jnp.nan),
            "q_mean": (m["q"] * m["did"]).sum() / jnp.maximum(n_upd, 1),
            "updates": n_upd,
            "epsilon": agent.linear_epsilon(s.step, cfg.eps_start, cfg.eps_end,
                                            cfg.eps_decay_steps),
            "reward_per_step": m["reward"].mean(),
            "episodes": m["ep_n"].sum(),
            "episode_return": m["ep_sum"].sum() / jnp.maximum(m["ep_n"].sum(), 1),
            "env_steps": s.step,
        }
        return s, metrics

    def train(key):
        s = init(key, env)
        return jax.lax.scan(lambda c, _: epoch(c, env), s, None, length=cfg.epochs)

    return DQN(cfg, network, init, jax.jit(epoch, donate_argnums=0), jax.jit(train), apply)


# ------------------------------------------------------------------ evaluation
class Evaluator:
    """Greedy evaluation on held-out data; ``score`` ranks checkpoints and drives early stop."""

    score_name = "val_sharpe"

    def __init__(self, dqn: DQN, envs: dict, seed: int):
        self.dqn, self.envs = dqn, envs
        self.key = jax.random.PRNGKey(seed + 10_007)
        if isinstance(envs["train"], TradingEnv):
            self._roll = jax.jit(lambda p, env: greedy_rollout(dqn.apply, p, env))
        else:
            self.score_name = "val_return"
            self._episodes = jax.jit(lambda p, env, k: greedy_episodes(dqn.apply, p, env, k,
                                                                       EVAL_EPISODES))

    @property
    def trading(self) -> bool:
        return isinstance(self.envs["train"], TradingEnv)

    def rollout(self, params, split: str) -> dict:
        """Positions, net returns and the bar returns of a greedy pass over ``split``."""
        env = self.envs[split]
        pos, net, nxt = jax.device_get(self._roll(params, env))
        return {"positions": pos, "net": net, "next_ret": nxt}

    def __call__(self, params, split: str = "val") -> dict:
        if self.trading:
            env = self.envs[split]
            r = self.rollout(params, split)
            m = trading_metrics(r["net"], r["positions"], env.annualisation)
            return {f"{split}_{k}": v for k, v in m.items()}
        returns = np.asarray(self._episodes(params, self.envs["train"], self.key))
        return {f"{split}_return": float(returns.mean()), f"{split}_return_min": float(returns.min())}

    def baselines(self, split: str) -> dict:
        if not self.trading:
            return {}
        env = self.envs[split]
        nxt = np.asarray(env.ret[env.first_decision + 1 : env.hi])
        return baseline_metrics(nxt, env.cost, env.annualisation)


# ------------------------------------------------------------------ host loop
def build_envs(cfg: DQNConfig, parquet_file=None, stats=None):
    """``({"train", "val", "test"} envs, dataset or None)`` for ``cfg.env``."""
    if cfg.env == "cartpole":
        env = make_cartpole(cfg.reward_scale)
        return {"train": env, "val": env}, None
    from tftjax.config import DataConfig
    from tftjax.data import load_dataset

    ds = load_dataset(parquet_file, DataConfig(encoder_steps=cfg.window, decoder_steps=1),
                      stats=stats)
    kw = dict(window=cfg.window, features=tuple(cfg.features), episode_len=cfg.episode_len,
              cost_bps=cfg.cost_bps, reward_scale=cfg.reward_scale)
    return {s: make_trading_env(ds, split=s, **kw) for s in ("train", "val", "test")}, ds


def _compatible(given: DQNConfig, saved: DQNConfig, explicit) -> list[str]:
    """Fields set explicitly (``explicit``; ``None``: all) that differ from the checkpoint's
    (``epochs`` may change on resume)."""
    diff = []
    for f in dataclasses.fields(DQNConfig):
        if f.name == "epochs" or (explicit is not None and f.name not in explicit):
            continue
        g, s = getattr(given, f.name), getattr(saved, f.name)
        if g is None:
            continue
        if isinstance(g, (list, tuple)):
            g, s = tuple(g), tuple(s)
        if g != s:
            diff.append(f"{f.name}={g!r} (checkpoint: {s!r})")
    return diff


def run(cfg: DQNConfig, workdir: str | Path, *, parquet_file=None, resume: bool = False,
        patience: int = 10, progress: bool = True, callback: Callable | None = None,
        explicit: set[str] | None = None, log: Callable = print) -> dict:
    """Train, validate greedily every epoch, checkpoint, and summarise.

    Args:
      cfg: agent, environment and loop settings (``cfg.epochs`` epochs in all).
      workdir: ``checkpoints/``, ``metrics.jsonl``, ``summary.json``, plots.
      parquet_file: bars for the trading env (default: the bundled ES bars).
      resume: continue from the latest complete ``dqn_epoch_{N}`` checkpoint.
      patience: early stop after this many epochs without a better validation
        score (Sharpe for trading, greedy return for CartPole); 0 disables.
      callback: extra ``(epoch, state, metrics, is_final)`` called after the
        checkpoint of each epoch is written.
      explicit: on resume, the ``cfg`` fields the user set (they must match the
        checkpoint's); the others come from the checkpoint. ``None``: all.

    Returns:
      The summary dict (also ``workdir/summary.json``).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt_dir = workdir / "checkpoints"
    existing = list_checkpoints(ckpt_dir)
    if existing and not resume:
        raise ConfigError(f"{ckpt_dir} already holds checkpoints ({', '.join(existing[-3:])}); "
                          "pass --resume to continue that run or choose another --workdir")
    if patience < 0:
        raise ConfigError(f"--patience must be >= 0, got {patience}")
    checkpointer = EpochCheckpointer(ckpt_dir, "dqn", best_metric="score", mode="max")
    start_epoch, best, bad_epochs, meta = 0, -math.inf, 0, None
    if resume and checkpointer.latest_epoch() is not None:
        meta = read_meta(ckpt_dir / f"dqn_epoch_{checkpointer.latest_epoch()}")
        saved = DQNConfig.from_json(meta["config"])
        diff = _compatible(cfg, saved, explicit)
        if diff:
            raise ConfigError(f"--resume: {ckpt_dir} was trained with other settings: "
                              + "; ".join(diff))
        cfg = dataclasses.replace(saved, epochs=cfg.epochs)
    stats = None
    if meta is not None and meta.get("feature_stats"):
        from tftjax.data import FeatureStats

        stats = FeatureStats.from_json(meta["feature_stats"])
    try:
        envs, ds = build_envs(cfg, parquet_file, stats)
    except ValueError as e:
        if type(e) is ValueError:
            raise ConfigError(str(e)) from e
        raise
    env = envs["train"]
    dqn = make_train(cfg, env)
    cfg = dqn.cfg
    key = jax.random.PRNGKey(cfg.seed)
    if meta is not None:
        start_epoch, state, meta = checkpointer.restore_latest(jax.eval_shape(dqn.init, key, env))
        best, bad_epochs = meta["early_stopping"]["best"], meta["early_stopping"]["bad_epochs"]
        log(f"resuming from {ckpt_dir}/dqn_epoch_{start_epoch}")
    else:
        state = dqn.init(key, env)
    evaluator = Evaluator(dqn, envs, cfg.seed)
    score_name = evaluator.score_name

    def meta_fn():
        return {"config": cfg.to_json(), "early_stopping": {"best": best, "bad_epochs": bad_epochs},
                "feature_stats": ds.features.stats.to_json() if ds is not None else None,
                "source": str(ds.bars.path) if ds is not None else "gymnax CartPole-v1"}

    metrics_path = workdir / "metrics.jsonl"
    history = read_history(metrics_path, upto=start_epoch)
    metrics_path.write_text("".join(json.dumps(h) + "\n" for h in history))

    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    if ds is not None:
        log(f"DQN {n_params:,} parameters; {len(ds.bars):,} bars from {ds.bars.path}; rows "
            f"train {env.hi - env.lo:,} / val {envs['val'].hi - envs['val'].lo:,} / test "
            f"{envs['test'].hi - envs['test'].lo:,}; {cfg.steps_per_epoch:,} env steps per epoch "
            f"({cfg.num_envs} parallel episodes), cost {cfg.cost_bps:g} bp")
    else:
        log(f"DQN {n_params:,} parameters on gymnax CartPole-v1; {cfg.steps_per_epoch:,} env "
            f"steps per epoch ({cfg.num_envs} parallel episodes)")

    t0 = time.perf_counter()
    epoch_fn = dqn.epoch.lower(state, env).compile()
    compile_s = time.perf_counter() - t0
    log(f"compiled the epoch step in {compile_s:.1f} s")

    bar = None
    if progress and start_epoch < cfg.epochs:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.epochs, initial=start_epoch, desc="dqn", unit="epoch")
    stopped_early = False
    epoch = start_epoch
    try:
        for epoch in range(start_epoch + 1, cfg.epochs + 1):
            t = time.perf_counter()
            state, train_m = epoch_fn(state, env)
            train_m = {k: float(v) for k, v in jax.device_get(train_m).items()}
            if train_m["episodes"] == 0:
                train_m["episode_return"] = None  # no episode ended in this epoch
            seconds = time.perf_counter() - t
            if train_m["updates"] > 0 and not math.isfinite(train_m["loss"]):
                raise TrainingDiverged(f"DQN loss became {train_m['loss']} in epoch {epoch}; stopped "
                                       f"without saving it (last good checkpoint: {last_checkpoint(ckpt_dir)})")
            val = evaluator(state.params, "val")
            score = val[score_name]
            if score > best:
                best, bad_epochs = score, 0
            else:
                bad_epochs += 1
            stop = patience > 0 and bad_epochs >= patience
            is_final = stop or epoch == cfg.epochs
            metrics = {"epoch": epoch, **train_m, **val, "score": score, "epoch_s": seconds,
                       "steps_per_s": iterations_per_epoch(cfg) * cfg.num_envs / seconds}
            history.append(metrics)
            with metrics_path.open("a") as f:
                f.write(json.dumps(metrics) + "\n")
            checkpointer(epoch, state, metrics, is_final, meta=meta_fn())
            if callback is not None:
                callback(epoch, state, metrics, is_final)
            if bar is not None:
                bar.update(1)
                bar.set_postfix({score_name: f"{score:.3g}", "loss": f"{train_m['loss']:.3g}",
                                 "eps": f"{train_m['epsilon']:.2f}",
                                 "steps/s": f"{metrics['steps_per_s']:,.0f}"})
            if stop:
                stopped_early = True
                break
        if bar is not None:
            bar.close()
        if start_epoch >= cfg.epochs:
            log(f"{ckpt_dir} already holds epoch {start_epoch} of {cfg.epochs}: nothing to train")
            final = ckpt_dir / f"dqn_final_epoch{start_epoch}"
            if not final.exists():
                checkpointer(start_epoch, state, history[-1] if history else {}, True, meta=meta_fn())
        if stopped_early:
            log(f"early stop at epoch {epoch}: no better {score_name} for {patience} epochs")
    finally:  # an interrupted run still completes the saves already started
        checkpointer.close()

    summary = summarize(evaluator, state.params)
    timing = [h["epoch_s"] for h in history if "epoch_s" in h]
    summary.update(epochs_run=epoch, stopped_early=stopped_early, parameters=n_params,
                   compile_s=compile_s, config=cfg.to_json(),
                   median_epoch_s=float(np.median(timing)) if timing else None,
                   best_score=best, history=history)
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    log(format_summary(summary, evaluator.trading))
    try:
        from tftjax import plots

        plots.dqn_plots(workdir, history, evaluator, state.params)
    except Exception as e:  # plots must never lose a finished run
        log(f"warning: plots not written ({type(e).__name__}: {e})")
    return summary


def summarize(evaluator: Evaluator, params) -> dict:
    out = {"splits": {}}
    for split in ("val", "test") if evaluator.trading else ("val",):
        m = evaluator(params, split)
        row = {"dqn": {k[len(split) + 1:]: v for k, v in m.items()}}
        row.update(evaluator.baselines(split))
        out["splits"][split] = row
    return out


def format_summary(summary: dict, trading: bool) -> str:
    lines = [f"DQN after {summary['epochs_run']} epochs"
             + (" (early stop)" if summary["stopped_early"] else "")
             + (f", median {summary['median_epoch_s']:.2f} s per epoch"
                if summary.get("median_epoch_s") else "")]
    if trading:
        lines += ["| split | policy | total log return | Sharpe (ann.) | max drawdown | turnover |",
                  "|---|---|---|---|---|---|"]
        for split, rows in summary["splits"].items():
            for name, m in rows.items():
                lines.append(f"| {split} | {name} | {m['total_log_return']:+.4f} | "
                             f"{m['sharpe']:+.2f} | {m['max_drawdown']:.2%} | {m['turnover']:.3f} |")
    else:
        m = summary["splits"]["val"]["dqn"]
        lines.append(f"greedy return over {EVAL_EPISODES} episodes: mean {m['return']:.1f}, "
                     f"min {m['return_min']:.1f}")
    return "\n".join(lines)


