"""TFT training: state, jitted steps, the epoch loop, evaluation.

``train_and_evaluate(model_cfg, train_cfg, workdir)`` is the whole job; the
CLI (``python -m tftjax.train``) only parses flags. Steps are pure functions
``(state, batch_idx, key) -> (state, metrics)`` jitted with the old state
donated; a batch is a vector of window *start indices* (``-1`` pads the last
batch) and the windows are gathered on the device inside the step.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

from tftjax import losses
from tftjax.checkpoints import EpochCheckpointer, last_checkpoint, list_checkpoints, read_history
from tftjax.config import TFTConfig
from tftjax.data import Dataset, DeviceData, FeatureStats, epoch_batches, gather, load_dataset, to_device
from tftjax.models.tft import TFT, init_params
from tftjax.remat import plan as remat_plan

Array = jax.Array


class TrainState(train_state.TrainState):
    """``step``, ``params``, ``opt_state`` (pytree) plus static ``apply_fn``/``tx``."""


class ConfigError(ValueError):
    """Settings that cannot work (e.g. a workdir holding another run's checkpoints)."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation and loop settings."""

    epochs: int = 10
    batch_size: int = 64
    learning_rate: float = 1e-3
    weight_decay: float = 1e-4
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    seed: int = 0
    patience: int = 5
    """Stop after this many epochs without a better validation loss (0: never)."""
    max_steps_per_epoch: int | None = None
    eval_batch_size: int = 256
    resume: bool = False
    profile_dir: str | None = None
    """Write a jax.profiler trace of a few training steps here."""
    progress: bool = True


def make_optimizer(tc: TrainConfig) -> optax.GradientTransformation:
    return _optimizer(tc.learning_rate, tc.weight_decay, tc.grad_clip)


# The optimizer and apply_fn are static fields of TrainState: reusing the same
# objects for equal settings lets every run in a process hit jit's cache.
@functools.lru_cache(maxsize=None)
def _optimizer(lr: float, weight_decay: float, clip: float) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(clip), optax.adamw(lr, weight_decay=weight_decay))


@functools.lru_cache(maxsize=None)
def _apply_fn(cfg: TFTConfig):
    return TFT(cfg).apply


def create_train_state(cfg: TFTConfig, tc: TrainConfig, key: Array) -> TrainState:
    params = init_params(cfg, key)
    return TrainState.create(apply_fn=_apply_fn(cfg), params=params, tx=make_optimizer(tc))


def _loss_fn(params, apply_fn, batch, mask, quantiles, dropout_key):
    pred, _ = apply_fn({"params": params}, batch.static, batch.historical, batch.known, False,
                       rngs={"dropout": dropout_key})
    return losses.quantile_loss(batch.target, pred, quantiles, mask)


@functools.lru_cache(maxsize=None)
def make_train_step(cfg: TFTConfig, *, max_traces: int | None = None) -> Callable:
    """The jitted ``step(state, data, batch_idx, key) -> (state, metrics)``, state donated."""
    quantiles = np.asarray(cfg.quantiles, np.float32)

    def step(state: TrainState, data: DeviceData, batch_idx: Array, key: Array):
        mask = batch_idx >= 0
        batch = gather(data, jnp.maximum(batch_idx, 0), cfg.encoder_steps, cfg.decoder_steps)
        dropout_key = jax.random.fold_in(key, state.step)
        loss, grads = jax.value_and_grad(_loss_fn)(state.params, state.apply_fn, batch, mask,
                                                   quantiles, dropout_key)
        new_state = state.apply_gradients(grads=grads)
        return new_state, {"loss": loss, "grad_norm": optax.global_norm(grads),
                           "count": mask.sum()}

    if max_traces is not None:
        import chex

        step = chex.assert_max_traces(step, n=max_traces)
    return jax.jit(step, donate_argnums=(0,))


@functools.lru_cache(maxsize=None)
def make_eval_step(cfg: TFTConfig) -> Callable:
    """Jitted ``(params, data, batch_idx) -> (MetricSums, predictions, interpretation)``."""
    quantiles = np.asarray(cfg.quantiles, np.float32)
    model = TFT(cfg)

    @jax.jit
    def step(params, data: DeviceData, batch_idx: Array):
        mask = batch_idx >= 0
        batch = gather(data, jnp.maximum(batch_idx, 0), cfg.encoder_steps, cfg.decoder_steps)
        pred, interp = model.apply({"params": params}, batch.static, batch.historical,
                                   batch.known, True)
        return losses.metric_sums(batch.target, pred, quantiles, mask), pred, interp

    return step


class Trainer:
    """Binds a model config, its device data and compiled steps.

    ``train_step(state, batch_idx, key)`` and ``evaluate(params, starts)`` are
    what the loop uses; tests call them directly.
    """

    def __init__(self, cfg: TFTConfig, tc: TrainConfig, data: DeviceData,
                 max_traces: int | None = None):
        self.cfg, self.tc, self.data = cfg, tc, data
        self._train = make_train_step(cfg, max_traces=max_traces)
        self._eval = make_eval_step(cfg)

    def train_step(self, state: TrainState, batch_idx, key):
        return self._train(state, self.data, jnp.asarray(batch_idx, jnp.int32), key)

    def evaluate(self, params, starts: np.ndarray) -> dict[str, float]:
        total = None
        for idx in _eval_batches(starts, self.tc.eval_batch_size):
            sums, _, _ = self._eval(params, self.data, idx)
            total = sums if total is None else losses.add(total, sums)
        return losses.finalize(total)

    def predict(self, params, starts: np.ndarray):
        """Predictions ``[n, T_d, Q]`` and interpretation for windows at ``starts``."""
        preds, interps = [], []
        for idx in _eval_batches(starts, self.tc.eval_batch_size):
            _, pred, interp = self._eval(params, self.data, idx)
            keep = np.asarray(idx) >= 0
            preds.append(np.asarray(pred)[keep])
            interps.append(jax.tree.map(lambda x: np.asarray(x)[keep], interp))
        return np.concatenate(preds), jax.tree.map(lambda *xs: np.concatenate(xs), *interps)


def _eval_batches(starts: np.ndarray, batch_size: int):
    # One batch shape for every call: one compiled eval step.
    idx, mask = epoch_batches(starts, batch_size, seed=0, epoch=0, shuffle=False)
    for i, m in zip(idx, mask):
        yield jnp.asarray(np.where(m, i, -1), jnp.int32)


def window_targets(ds: Dataset, starts: np.ndarray) -> np.ndarray:
    """Targets ``[n, T_d]`` of the windows at ``starts`` (host numpy)."""
    e, d = ds.cfg.encoder_steps, ds.cfg.decoder_steps
    return ds.features.target[starts[:, None] + e + np.arange(d)]


def baselines(ds: Dataset, quantiles, split: str) -> dict[str, dict]:
    train_y = window_targets(ds, ds.splits.train)
    return losses.naive_baselines(train_y.ravel(), window_targets(ds, getattr(ds.splits, split)),
                                  quantiles)


# ------------------------------------------------------------------ the loop
def _meta(cfg: TFTConfig, tc: TrainConfig, ds: Dataset, best: float, bad_epochs: int) -> dict:
    return {
        "kind": "tft",
        "model_config": cfg.to_json(),
        "train_config": dataclasses.asdict(tc),
        "feature_stats": ds.features.stats.to_json(),
        "parquet_file": str(ds.bars.path),
        "early_stopping": {"best_val_loss": best, "bad_epochs": bad_epochs},
    }


def _is_finite(x: float) -> bool:
    return math.isfinite(x)


def train_and_evaluate(cfg: TFTConfig, tc: TrainConfig, workdir: str | Path, *,
                       parquet_file: str | Path | None = None, dataset: Dataset | None = None,
                       callback: Callable | None = None, log: Callable = print) -> dict:
    """Train, validate every epoch, checkpoint, and evaluate on the test split.

    Args:
      cfg: model config; tc: training config.
      workdir: run folder (checkpoints/, metrics.jsonl, plots).
      parquet_file: OHLCV bars (default: the bundled ES bars).
      dataset: a prepared dataset (overrides ``parquet_file``; for tests).
      callback: ``(epoch, state, metrics, is_final)`` after each epoch; the
        default saves Orbax checkpoints under ``workdir/checkpoints``.

    Returns:
      The summary dict (also written to ``workdir/summary.json``).

    Raises:
      DataError: bad input data; ValueError: bad settings;
      TrainingDiverged: NaN/inf loss (the last good checkpoint is kept).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt_dir = workdir / "checkpoints"
    existing = list_checkpoints(ckpt_dir)
    if existing and not tc.resume:
        raise ConfigError(f"{ckpt_dir} already holds checkpoints ({', '.join(existing[-3:])}); "
                         "pass --resume to continue that run or choose another --workdir")
    checkpointer = EpochCheckpointer(ckpt_dir, "tft", best_metric="val_loss", mode="min")
    callback = callback or (lambda e, s, m, f: checkpointer(e, s, m, f, meta=meta_fn()))

    init_key = jax.random.key(tc.seed)
    # Dropout masks from the RBG generator: same quality for dropout, and
    # XLA:CPU compiles it much faster than threefry (17 s → 11 s, tiny preset).
    dropout_key = jax.random.key(tc.seed, impl="rbg")
    stats = None
    start_epoch, best, bad_epochs = 0, math.inf, 0
    state = None
    resumed = None
    if tc.resume:
        probe = jax.eval_shape(lambda k: create_train_state(cfg, tc, k), init_key)
        resumed = checkpointer.restore_latest(probe)
        if resumed is not None:
            start_epoch, state, meta = resumed
            stats = FeatureStats.from_json(meta["feature_stats"])
            best = meta["early_stopping"]["best_val_loss"]
            bad_epochs = meta["early_stopping"]["bad_epochs"]
            saved = TFTConfig.from_json(meta["model_config"])
            # The remat tier and VSN chunking change memory, not parameters.
            if dataclasses.replace(saved, remat=cfg.remat, vsn_chunk=cfg.vsn_chunk) != cfg:
                raise ConfigError(f"--resume: the checkpoint in {ckpt_dir} was trained with a "
                                 f"different model config {meta['model_config']}")
            log(f"resuming from {ckpt_dir}/tft_epoch_{start_epoch}")
    if dataset is None:
        dataset = load_dataset(parquet_file, cfg.data, stats=stats)
    ds = dataset
    if state is None:
        state = create_train_state(cfg, tc, init_key)
    meta_fn = lambda: _meta(cfg, tc, ds, best, bad_epochs)  # noqa: E731

    metrics_path = workdir / "metrics.jsonl"
    history = read_history(metrics_path, upto=start_epoch)
    metrics_path.write_text("".join(json.dumps(h) + "\n" for h in history))

    note = remat_plan(cfg.remat).note
    if note:
        log(note)
    trainer = Trainer(cfg, tc, to_device(ds.features))
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    log(f"TFT {n_params:,} parameters; {len(ds.bars):,} bars from {ds.bars.path}; windows "
        f"train {ds.splits.train.size:,} / val {ds.splits.val.size:,} / test {ds.splits.test.size:,}; "
        f"remat={cfg.remat}")

    stopped_early = False
    epoch = start_epoch
    for epoch in range(start_epoch + 1, tc.epochs + 1):
        state, train_m = _run_epoch(trainer, state, ds, tc, epoch, dropout_key)
        if not _is_finite(train_m["train_loss"]):
            raise TrainingDiverged(
                f"training loss became {train_m['train_loss']} in epoch {epoch}; stopped without "
                f"saving it (last good checkpoint: {last_checkpoint(ckpt_dir)})")
        val = trainer.evaluate(state.params, ds.splits.val)
        if not _is_finite(val["loss"]):
            raise TrainingDiverged(f"validation loss became {val['loss']} in epoch {epoch}; "
                                   f"stopped (last good checkpoint: {last_checkpoint(ckpt_dir)})")
        if val["loss"] < best:
            best, bad_epochs = val["loss"], 0
        else:
            bad_epochs += 1
        stop = tc.patience > 0 and bad_epochs >= tc.patience
        is_final = stop or epoch == tc.epochs
        metrics = {"epoch": epoch, **train_m, "val_loss": val["loss"],
                   "val_q_risk_50": val["q_risk_50"], "val_q_risk_90": val["q_risk_90"]}
        history.append(metrics)
        with metrics_path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
        log(f"epoch {epoch}: train loss {train_m['train_loss']:.4f}  val loss {val['loss']:.4f}  "
            f"q-risk P50 {val['q_risk_50']:.4f} P90 {val['q_risk_90']:.4f}  "
            f"{train_m['samples_per_s']:.0f} samples/s")
        callback(epoch, state, metrics, is_final)
        if stop:
            stopped_early = True
            log(f"early stop at epoch {epoch}: no better validation loss for {tc.patience} epochs")
            break
    checkpointer.close()

    summary = summarize(trainer, state.params, ds, cfg)
    summary.update(epochs_run=epoch, stopped_early=stopped_early, parameters=n_params,
                   history=history)
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    log(format_summary(summary))
    try:
        from tftjax import plots

        plots.training_plots(workdir, history, trainer, state.params, ds, cfg)
    except Exception as e:  # plots must never lose a finished run
        log(f"warning: plots not written ({type(e).__name__}: {e})")
    return summary


def _run_epoch(trainer: Trainer, state, ds: Dataset, tc: TrainConfig, epoch: int, key):
    idx, mask = epoch_batches(ds.splits.train, tc.batch_size, seed=tc.seed, epoch=epoch)
    idx = np.where(mask, idx, -1).astype(np.int32)
    if tc.max_steps_per_epoch:
        idx = idx[: tc.max_steps_per_epoch]
    bar = None
    if tc.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(idx), desc=f"epoch {epoch}", unit="step", leave=False,
                   file=sys.stderr, dynamic_ncols=True)
    loss_sum = jnp.zeros(())
    count = 0
    t0 = time.perf_counter()
    profiling = False
    for i, b in enumerate(idx):
        if tc.profile_dir and epoch in (1,) and i == 1:
            jax.profiler.start_trace(tc.profile_dir)
            profiling = True
        state, m = trainer.train_step(state, b, key)
        loss_sum = loss_sum + m["loss"] * m["count"]
        n = int((b >= 0).sum())
        count += n
        if profiling and i == min(5, len(idx) - 1):
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            profiling = False
        if bar is not None:
            bar.update(1)
            if i % 5 == 0 or i == len(idx) - 1:
                el = time.perf_counter() - t0
                bar.set_postfix(loss=f"{float(m['loss']):.4f}", samples_s=f"{count / el:.0f}")
    if profiling:
        jax.block_until_ready(state)
        jax.profiler.stop_trace()
    train_loss = float(loss_sum) / max(count, 1)
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    return state, {"train_loss": train_loss, "samples_per_s": count / elapsed,
                   "epoch_time_s": elapsed, "steps": int(len(idx))}


def summarize(trainer: Trainer, params, ds: Dataset, cfg: TFTConfig) -> dict:
    out: dict[str, Any] = {"model": {}, "baselines": {}}
    for split in ("train", "val", "test"):
        out["model"][split] = trainer.evaluate(params, getattr(ds.splits, split))
    for split in ("val", "test"):
        for name, m in baselines(ds, cfg.quantiles, split).items():
            out["baselines"].setdefault(name, {})[split] = m
    return out


def format_summary(summary: dict) -> str:
    rows = [("TFT", summary["model"])]
    rows += [({"zero": "naive: zero return", "train_quantiles": "naive: train quantiles"}[k], v)
             for k, v in summary["baselines"].items()]
    head = f"{'':24s} {'split':6s} {'loss':>9s} {'q-risk P50':>11s} {'q-risk P90':>11s}"
    lines = [head, "-" * len(head)]
    for name, by_split in rows:
        for split in ("train", "val", "test"):
            if split in by_split:
                m = by_split[split]
                lines.append(f"{name:24s} {split:6s} {m['loss']:9.4f} {m['q_risk_50']:11.4f} "
                             f"{m['q_risk_90']:11.4f}")
    return "\n".join(lines)
