"""The DQN's part of the shared run loop (:mod:`tftjax.runner.loop`): environments from the
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
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tftjax.config import ConfigError, DataConfig
from tftjax.dqn.cartpole import make_cartpole
from tftjax.dqn.config import DQNConfig, with_costs
from tftjax.dqn.env import make_trading_env
from tftjax.dqn.metrics import bars_per_year
from tftjax.dqn.train import iterations_per_epoch, make_train
from tftjax.errors import TrainingDiverged
from tftjax.runner import loop as runloop

# Filled from the data when left None; on resume they follow the checkpoint (ε's decay
# depends on the run's length, which a resume may extend).
DERIVED = (
    "steps_per_epoch",
    "eps_decay_steps",
    "reward_scale",
    "spread_bps",
    "fee_bps",
    "slippage_bps",
)


def data_config(cfg: DQNConfig) -> DataConfig:
    """The data options of the DQN's bars (windows of ``cfg.window`` bars, one step ahead)."""
    return DataConfig(
        encoder_steps=cfg.window,
        decoder_steps=1,
        calendar=cfg.calendar,
        timezone=cfg.timezone,
        bar_interval=cfg.bar_interval,
        train_fraction=cfg.train_fraction,
        val_fraction=cfg.val_fraction,
    )


def build_envs(cfg: DQNConfig, parquet_file=None, stats=None, fold=None, extra=None):
    """``({split: env}, dataset or None, cfg resolved)``: train/val/test for trading,
    train/val (the same env) for CartPole. Trading costs left None take the bundled set's
    defaults (:data:`~tftjax.dqn.config.COSTS`), the reward scale 1 / the training split's
    target scale. ``fold``: a walk-forward fold's times (:func:`tftjax.data.load_dataset`).
    ``extra``: ``dataset -> [n, k]`` more observation columns (out-of-fold forecasts)."""
    if cfg.env == "cartpole":
        if parquet_file is not None:
            raise ConfigError("--parquet-file is for --env trading; CartPole has no bars")
        scale = cfg.reward_scale or 1.0
        cfg = dataclasses.replace(cfg, reward_scale=scale)
        env = make_cartpole(scale)
        return {"train": env, "val": env}, None, cfg
    from tftjax.data import load_dataset
    from tftjax.data.bundled import DATASETS, bundled_path

    ds = load_dataset(parquet_file, data_config(cfg), stats=stats, fold=fold)
    here = Path(ds.bars.path).resolve()
    name = next((n for n in DATASETS if bundled_path(n) == here), None)
    cfg = with_costs(cfg, name)
    if cfg.reward_scale is None:  # rewards in units of the data: O(1) on any market
        cfg = dataclasses.replace(cfg, reward_scale=1.0 / float(ds.features.stats.target_scale))
    if extra is not None:
        if cfg.tft_checkpoint is not None:
            raise ConfigError(
                "--tft-checkpoint and out-of-fold forecasts are two sources of "
                "the same columns: choose one"
            )
        extra = extra(ds)
    elif cfg.tft_checkpoint is not None:  # the TFT's forecasts as more observation columns
        from tftjax.dqn.tft_inputs import load_tft, tft_columns

        extra = tft_columns(
            load_tft(cfg.tft_checkpoint), ds.bars.path, int(ds.bars.ts[ds.splits.val_rows[0]])
        )
    return (
        {s: make_trading_env(ds, cfg, split=s, extra=extra) for s in ("train", "val", "test")},
        ds,
        cfg,
    )


class DQNTask:
    """The DQN for :func:`tftjax.runner.loop.run`."""

    kind, mode, epoch_bar = "dqn", "max", True
    may_change = ("config.epochs", "config.patience")

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

    def normalize_identity(self, saved: dict) -> dict:
        """A checkpoint's identity with the settings added since it was written at their
        defaults (what it ran with), so that such a run still resumes."""
        return {**saved, "config": DQNConfig.from_json(saved["config"]).to_json()}

    def extra_meta(self) -> dict:
        return {"feature_stats": self.ds.features.stats.to_json() if self.ds is not None else None}

    def init_state(self):
        return self.dqn.init(self.key, self.env)

    def abstract_state(self):
        return jax.eval_shape(self.dqn.init, self.key, self.env)

    def describe(self, state) -> str:
        c, n = self.cfg, sum(x.size for x in jax.tree.leaves(state.params))
        per_epoch = f"{c.steps_per_epoch:,} env steps per epoch ({c.num_envs} parallel episodes)"
        if self.ds is None:
            return f"DQN {n:,} parameters on gymnax CartPole-v1; {per_epoch}"
        rows = " / ".join(f"{s} {e.hi - e.lo:,}" for s, e in self.envs.items())
        return (
            f"DQN {n:,} parameters; {len(self.ds.bars):,} bars from {self.ds.bars.path}; "
            f"rows {rows}; {per_epoch}; fills at the "
            + ("next open" if c.fill == "next-open" else "close")
            + (f" after {c.latency} bar(s)" if c.latency else "")
            + f"; cost {c.cost * 1e4:g} bp a unit traded (spread {c.spread_bps:g}/2 + fee "
            f"{c.fee_bps:g} + slippage {c.slippage_bps:g})"
            + ("; flat at every session end" if c.flatten_at_session_end else "")
            + f"; rewards × {c.reward_scale:.4g}; Sharpe annualised at "
            + "{:,.0f} bars a year ({})".format(
                *bars_per_year(self.ds.bars.ts, self.ds.features.timeline)
            )
        )

    def train_epoch(self, state, epoch: int):
        first = self._epoch is None
        if first:
            t = time.perf_counter()
            self._epoch = self.dqn.epoch.lower(state, self.env).compile()
            self.compile_s = time.perf_counter() - t
        assert self._epoch is not None
        t = time.perf_counter()
        state, m = self._epoch(state, self.env)
        m: dict[str, Any] = {k: float(v) for k, v in jax.device_get(m).items()}  # waits
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

    def _greedy(self, params, split: str, key=None) -> dict:
        return self.envs[split].evaluate(
            self.dqn.apply, params, self.eval_key if key is None else key
        )

    def validate(self, state) -> dict:
        # fresh episodes every epoch (CartPole): no epoch is chosen on the episodes it was
        # scored on, and a smoothed score averages over different ones
        key = jax.random.fold_in(self.eval_key, int(jax.device_get(state.step)))
        return {f"val_{k}": v for k, v in self._greedy(state.params, "val", key).items()}

    @property
    def window(self) -> int:
        """Epochs in a smoothed score: ``smooth_epochs``, or the run's epochs if fewer."""
        return min(self.cfg.smooth_epochs, self.cfg.epochs)

    def rank(self, history: list[dict]) -> float:
        """The mean validation score of the last ``smooth_epochs`` epochs (the ranking
        early stopping and the best epoch use). Only full windows compete: an earlier epoch
        ranks below every later one (its smoothed score is recorded as None)."""
        if len(history) < self.window:
            history[-1][self.score + "_smoothed"] = None
            return -math.inf
        recent = [h[self.score] for h in history[-self.window :]]
        history[-1][self.score + "_smoothed"] = float(np.mean(recent))
        return float(np.mean(recent))

    def may_stop(self, epoch: int, metrics: dict) -> bool:
        """Not before ``min_epochs``, nor while ε is still decaying."""
        return epoch >= self.cfg.min_epochs and metrics["env_steps"] >= self.cfg.eps_decay_steps

    def epoch_line(self, m: dict) -> str:
        loss = "–" if m["loss"] is None else f"{m['loss']:.4g}"
        return (
            f"{self.score} {m[self.score]:.4g}  loss {loss}  ε {m['epsilon']:.2f}  "
            f"{m['steps_per_s']:,.0f} env steps/s"
            + (f" (compiled in {m['compile_s']:.1f} s)" if "compile_s" in m else "")
        )

    def summarize(self, state, workdir: Path, history: list[dict]):
        params = state.params
        splits = {
            s: {"dqn": self._greedy(params, s), **self.envs[s].baselines()}
            for s in self.eval_splits
        }
        timing = [h["epoch_s"] for h in history if "epoch_s" in h]
        summary = {
            "splits": splits,
            "parameters": sum(x.size for x in jax.tree.leaves(params)),
            "compile_s": self.compile_s,
            "config": self.cfg.to_json(),
            "median_epoch_s": float(np.median(timing)) if timing else None,
        }
        rollouts = {s: self.envs[s].rollout(self.dqn.apply, params) for s in self.eval_splits}
        val = rollouts.get("val")  # CartPole has no rollout (no equity)
        summary.update(self.selection(None if val is None else val["net"], history, splits, params))
        if self.ds is not None:  # every trade of the greedy passes, hit rate and exposure
            from tftjax.dqn.report import format_trades, trade_stats, trades

            done = {
                s: trades(self.envs[s], r["positions"], self.ds.bars.ts)
                for s, r in rollouts.items()
            }
            summary["trades"] = {
                s: {**trade_stats(t), "exposure": float(np.mean(rollouts[s]["positions"] != 0))}
                for s, t in done.items()
            }
            (workdir / "trades.json").write_text(json.dumps(done))
            (workdir / "trades.md").write_text(
                "test split, the agent's trades (log returns; net of costs)\n\n"
                + format_trades(done["test"])
                + "\n"
            )
        try:
            from tftjax import plots

            plots.dqn_plots(workdir, history, self.score, rollouts)
            if self.ds is not None:
                from tftjax.dqn.report import report_png

                r = rollouts["test"]
                report_png(
                    workdir / "report.png",
                    self.envs["test"],
                    r["positions"],
                    r["net"],
                    "DQN agent, test split",
                )
        except Exception as e:  # plots must never lose a finished run
            self.log(f"warning: plots not written ({type(e).__name__}: {e})")
        from tftjax.dqn.report import format_summary

        return summary, format_summary(summary, self.env.eval_note) + "\n" + summary["verdict"]

    def selection(self, val_net, history: list[dict], splits: dict, params=None) -> dict:
        """What is shipped and why. Trading: the agent only where its validation record
        ``val_net`` (the shipped epoch's greedy pass) clears ``--psr-gate`` as a deflated
        Sharpe over every epoch ranked (else flat, unless ``--no-flat-fallback``); CartPole:
        the final greedy return over fresh episodes and the share of the last evaluations at
        475+."""
        key = self.score + "_smoothed"
        best = max((h[key] for h in history if h.get(key) is not None), default=None)
        if self.ds is None:  # CartPole
            fresh = self.envs["val"].evaluate(
                self.dqn.apply, params, jax.random.PRNGKey(self.cfg.seed + 77_777), 100
            )
            last = [h[self.score] for h in history[-10:] if h.get(self.score) is not None]
            share = float(np.mean([r >= 475 for r in last])) if last else None
            return {
                "shipped_policy": "dqn",
                "final_return_fresh": fresh["return"],
                "final_return_fresh_min": fresh["return_min"],
                "last10_at_475": share,
                "verdict": f"final greedy return over 100 fresh episodes "
                f"{fresh['return']:.1f} (worst {fresh['return_min']:.0f}); "
                f"{share if share is not None else float('nan'):.0%} of the last "
                f"{len(last)} evaluations at 475 or more",
            }
        from tftjax.dqn.significance import gate

        ranked = [h[self.score] for h in history if h.get(key) is not None]
        per_bar = np.asarray(ranked) / math.sqrt(self.envs["val"].annualisation)
        g = gate(
            np.zeros(3) if val_net is None else val_net,
            max(len(ranked), 1),
            per_bar,
            self.cfg.psr_gate,
        )
        beats = g["passes"]
        ship = "dqn" if beats or not self.cfg.flat_fallback else "flat"
        told = "–" if best is None else f"{best:+.2f}"
        verdict = (
            f"the shipped epoch's validation record (smoothed Sharpe {told}, mean of "
            f"{self.window} epochs; {g['trials']} epochs compared) has a deflated "
            f"Sharpe of {g['dsr']:.3f} (PSR against 0: {g['psr']:.3f}): it "
            + ("clears" if beats else "does not clear")
            + f" the --psr-gate of "
            f"{self.cfg.psr_gate:g}: "
            + (
                "shipping the agent"
                if ship == "dqn"
                else "shipping FLAT (no position; --no-flat-fallback ships the agent)"
            )
            + ("" if beats or ship == "flat" else " anyway (--no-flat-fallback)")
        )
        if ship == "flat":
            for split in splits.values():
                split["shipped (flat)"] = dict(split["flat"])
        return {
            "shipped_policy": ship,
            "best_val_smoothed": best,
            "gate": g,
            "candidates": g["trials"],
            "verdict": verdict,
        }


def run(
    cfg: DQNConfig,
    workdir: str | Path,
    *,
    parquet_file=None,
    resume: bool | str = False,
    progress: bool = True,
    callback: Callable | None = None,
    log: Callable = print,
    tensorboard: bool = True,
) -> dict:
    """Train, validate greedily every epoch, checkpoint, and summarise the best epoch.

    Args:
      cfg: agent, environment and loop settings (``cfg.epochs`` epochs, ``cfg.patience``).
      workdir: ``checkpoints/``, ``metrics.jsonl``, ``summary.json``, plots.
      parquet_file: bars for the trading env (default: the bundled ES bars; on
        resume, the file the run was trained on, found by its content hash).
      resume: continue the latest complete ``dqn_epoch_{N}`` checkpoint; ``cfg``
        must equal the checkpoint's (``epochs`` may grow; fields left ``None``
        that the data fills in follow the checkpoint); ``"auto"``: that where one exists,
        else a fresh run. A signal (SIGTERM, SIGINT, SIGUSR1) ends the run after the epoch
        in flight and its checkpoint (:class:`~tftjax.runner.preemption.Preempted`).
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
            c = dataclasses.replace(
                cfg, **{f: getattr(was, f) for f in DERIVED if getattr(cfg, f) is None}
            )
            if c.lr_end_fraction < 1 and c.epochs != was.epochs:
                raise ConfigError(
                    f"--resume: --epochs cannot change ({was.epochs} → {c.epochs}) "
                    f"with lr_end_fraction {c.lr_end_fraction}: the learning-rate "
                    "decay spans the run's epochs"
                )
            if saved.get("feature_stats"):
                stats = FeatureStats.from_json(saved["feature_stats"])
            if path is None and c.env == "trading" and "sha256" in saved["identity"]["data"]:
                path = find_data_file(saved["identity"]["data"], workdir)
        envs, ds, c = build_envs(c, path, stats)
        return DQNTask(c, envs, ds, workdir, log)

    _, summary = runloop.run(
        make_task,
        workdir,
        kind="dqn",
        resume=resume,
        progress=progress,
        callback=callback,
        log=log,
        tensorboard=tensorboard,
    )
    return summary
