"""The DQN's part of the shared run loop (:mod:`tftjax.runloop`): environments from the
data, one jitted epoch, greedy validation, and the summary table and plots.

:func:`run` is the library behind ``python -m tftjax.dqn``: epochs, greedy
validation after each, early stopping on the validation score (trading:
Sharpe; CartPole: greedy return) with the best epoch's agent restored, Orbax
``dqn_epoch_{N}`` / ``dqn_final_epoch{N}`` checkpoints holding the whole
:class:`~tftjax.dqn.train.DQNState` (so ``resume`` continues bit for bit),
``metrics.jsonl``, ``summary.json``, a final table and plots.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from tftjax import runloop
from tftjax.config import ConfigError, DataConfig
from tftjax.dqn.config import DQNConfig
from tftjax.dqn.env import make_cartpole, make_trading_env
from tftjax.dqn.train import iterations_per_epoch, make_train
from tftjax.runloop import TrainingDiverged

# Filled from the data when left None; on resume they follow the checkpoint (ε's decay
# depends on the run's length, which a resume may extend).
DERIVED = ("steps_per_epoch", "eps_decay_steps")


def build_envs(cfg: DQNConfig, parquet_file=None, stats=None):
    """``({split: env}, dataset or None)``: train/val/test for trading, train/val (the same
    env) for CartPole."""
    if cfg.env == "cartpole":
        if parquet_file is not None:
            raise ConfigError("--parquet-file is for --env trading; CartPole has no bars")
        env = make_cartpole(cfg.reward_scale)
        return {"train": env, "val": env}, None
    from tftjax.data import load_dataset

    ds = load_dataset(parquet_file, DataConfig(encoder_steps=cfg.window, decoder_steps=1),
                      stats=stats)
    kw = dict(window=cfg.window, features=tuple(cfg.features), episode_len=cfg.episode_len,
              cost_bps=cfg.cost_bps, reward_scale=cfg.reward_scale)
    return {s: make_trading_env(ds, split=s, **kw) for s in ("train", "val", "test")}, ds


class DQNTask:
    """The DQN for :func:`tftjax.runloop.run`."""

    kind, mode, epoch_bar = "dqn", "max", True
    may_change = ("config.epochs",)

    def __init__(self, cfg: DQNConfig, envs: dict, ds, workdir: Path, log: Callable = print):
        self.envs, self.ds, self.log = envs, ds, log
        self.env = envs["train"]
        self.dqn = make_train(cfg, self.env)
        self.cfg = self.dqn.cfg  # resolved: steps per epoch and ε decay filled in
        self.epochs, self.patience = cfg.epochs, cfg.patience
        self.score = "val_" + self.env.score_name
        self.eval_splits = [s for s in envs if s != "train"]
        data = ds.identity(workdir) if ds is not None else {"env": "gymnax CartPole-v1"}
        self._identity = {"data": data, "config": self.cfg.to_json()}
        self.key = jax.random.PRNGKey(self.cfg.seed)
        self.eval_key = jax.random.PRNGKey(self.cfg.seed + 10_007)
        self._epoch, self.compile_s = None, None

    def identity(self) -> dict:
        return self._identity

    def extra_meta(self) -> dict:
        return {"feature_stats": self.ds.features.stats.to_json() if self.ds is not None else None}

    def init_state(self):
        return self.dqn.init(self.key, self.env)

    def abstract_state(self):
        return jax.eval_shape(self.dqn.init, self.key, self.env)

    def describe(self, state) -> str:
        c, n = self.cfg, sum(x.size for x in jax.tree.leaves(state.params))
        per_epoch = (f"{c.steps_per_epoch:,} env steps per epoch ({c.num_envs} parallel "
                     "episodes)")
        if self.ds is None:
            return f"DQN {n:,} parameters on gymnax CartPole-v1; {per_epoch}"
        rows = " / ".join(f"{s} {e.hi - e.lo:,}" for s, e in self.envs.items())
        return (f"DQN {n:,} parameters; {len(self.ds.bars):,} bars from {self.ds.bars.path}; "
                f"rows {rows}; {per_epoch}, cost {c.cost_bps:g} bp")

    def train_epoch(self, state, epoch: int):
        first = self._epoch is None
        if first:
            t = time.perf_counter()
            self._epoch = self.dqn.epoch.lower(state, self.env).compile()
            self.compile_s = time.perf_counter() - t
        t = time.perf_counter()
        state, m = self._epoch(state, self.env)
        m = {k: float(v) for k, v in jax.device_get(m).items()}  # waits for the epoch
        seconds = time.perf_counter() - t
        if m["updates"] > 0 and not math.isfinite(m["loss"]):
            raise TrainingDiverged(f"DQN loss became {m['loss']} in epoch {epoch}")
        if m["updates"] == 0:
            m["loss"] = m["q_mean"] = None  # no gradient step yet (still filling the buffer)
        if m["episodes"] == 0:
            m["episode_return"] = None  # no episode ended in this epoch
        steps = iterations_per_epoch(self.cfg) * self.cfg.num_envs
        m.update(epoch_s=seconds, steps_per_s=steps / seconds)
        if first:
            m["compile_s"] = self.compile_s
        return state, m

    def _greedy(self, params, split: str) -> dict:
        return self.envs[split].evaluate(self.dqn.apply, params, self.eval_key)

    def validate(self, state) -> dict:
        return {f"val_{k}": v for k, v in self._greedy(state.params, "val").items()}

    def epoch_line(self, m: dict) -> str:
        loss = "–" if m["loss"] is None else f"{m['loss']:.4g}"
        return (f"{self.score} {m[self.score]:.4g}  loss {loss}  ε {m['epsilon']:.2f}  "
                f"{m['steps_per_s']:,.0f} env steps/s"
                + (f" (compiled in {m['compile_s']:.1f} s)" if "compile_s" in m else ""))

    def summarize(self, state, workdir: Path, history: list[dict]):
        params = state.params
        splits = {s: {"dqn": self._greedy(params, s), **self.envs[s].baselines()}
                  for s in self.eval_splits}
        timing = [h["epoch_s"] for h in history if "epoch_s" in h]
        summary = {"splits": splits, "parameters": sum(x.size for x in jax.tree.leaves(params)),
                   "compile_s": self.compile_s, "config": self.cfg.to_json(),
                   "median_epoch_s": float(np.median(timing)) if timing else None}
        try:
            from tftjax import plots

            rollouts = {s: self.envs[s].rollout(self.dqn.apply, params) for s in self.eval_splits}
            plots.dqn_plots(workdir, history, self.score, rollouts)
        except Exception as e:  # plots must never lose a finished run
            self.log(f"warning: plots not written ({type(e).__name__}: {e})")
        return summary, format_summary(summary, self.env.eval_note)


HEADERS = {"total_log_return": "total log return", "sharpe": "Sharpe (ann.)",
           "max_drawdown": "max drawdown", "return": "greedy return", "return_min": "worst episode"}
FORMATS = {"total_log_return": "{:+.4f}", "sharpe": "{:+.2f}", "max_drawdown": "{:.2%}",
           "turnover": "{:.3f}", "return": "{:.1f}", "return_min": "{:.1f}"}


def format_summary(summary: dict, note: str) -> str:
    """A markdown table: one row per split and policy, one column per metric."""
    rows = [(split, name, m) for split, by in summary["splits"].items() for name, m in by.items()]
    keys = list(rows[0][2])
    lines = [f"DQN, {note}" + (f"; median {summary['median_epoch_s']:.2f} s per epoch"
                               if summary.get("median_epoch_s") else ""),
             "| split | policy | " + " | ".join(HEADERS.get(k, k) for k in keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for split, name, m in rows:
        cells = [FORMATS.get(k, "{:.4g}").format(m[k]) for k in keys]
        lines.append(f"| {split} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(cfg: DQNConfig, workdir: str | Path, *, parquet_file=None, resume: bool = False,
        progress: bool = True, callback: Callable | None = None, log: Callable = print) -> dict:
    """Train, validate greedily every epoch, checkpoint, and summarise the best epoch.

    Args:
      cfg: agent, environment and loop settings (``cfg.epochs`` epochs, ``cfg.patience``).
      workdir: ``checkpoints/``, ``metrics.jsonl``, ``summary.json``, plots.
      parquet_file: bars for the trading env (default: the bundled ES bars; on
        resume, the file the run was trained on, found by its content hash).
      resume: continue the latest complete ``dqn_epoch_{N}`` checkpoint; ``cfg``
        must equal the checkpoint's (``epochs`` may grow; fields left ``None``
        that the data fills in follow the checkpoint).
      callback: ``(epoch, state, metrics, is_final)`` after each epoch's checkpoint.

    Returns:
      The summary dict (also ``workdir/summary.json``).
    """
    workdir = Path(workdir)

    def make_task(saved: dict | None) -> DQNTask:
        c, stats, path = cfg, None, parquet_file
        if saved is not None:
            from tftjax.data import FeatureStats, find_data_file

            was = DQNConfig.from_json(saved["identity"]["config"])
            c = dataclasses.replace(cfg, **{f: getattr(was, f) for f in DERIVED
                                            if getattr(cfg, f) is None})
            if c.lr_end_fraction < 1 and c.epochs != was.epochs:
                raise ConfigError(f"--resume: --epochs cannot change ({was.epochs} → {c.epochs}) "
                                  f"with lr_end_fraction {c.lr_end_fraction}: the learning-rate "
                                  "decay spans the run's epochs")
            if saved.get("feature_stats"):
                stats = FeatureStats.from_json(saved["feature_stats"])
            if path is None and c.env == "trading" and "sha256" in saved["identity"]["data"]:
                path = find_data_file(saved["identity"]["data"], workdir)
        envs, ds = build_envs(c, path, stats)
        return DQNTask(c, envs, ds, workdir, log)

    return runloop.run(make_task, workdir, kind="dqn", resume=resume, progress=progress,
                       callback=callback, log=log)
