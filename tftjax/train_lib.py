"""TFT training: state, jitted steps, evaluation, and the TFT's part of the run loop.

``train_and_evaluate(model_cfg, train_cfg, workdir)`` is the whole job: it
hands :class:`TFTTask` (one epoch of steps, validation, summary) to the shared
host loop :func:`tftjax.runloop.run`, which owns checkpoints, resume, early
stopping and the NaN stop. The CLI (``python -m tftjax.train``) only parses
flags. Steps are pure functions ``(state, batch_idx, key) -> (state, metrics)``
jitted with the old state donated; a batch is a vector of window *start
indices* (``-1`` pads the last batch) and the windows are gathered on the
device inside the step.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

from tftjax import losses, runloop
from tftjax.checkpoints import read_meta, restore_state
from tftjax.config import ConfigError, TFTConfig, TrainConfig
from tftjax.data import (DataError, Dataset, DeviceData, FeatureStats, epoch_batches,
                         find_data_file, gather, load_dataset, to_device)
from tftjax.models.tft import TFT, init_params
from tftjax.remat import plan as remat_plan
from tftjax.runloop import TrainingDiverged

__all__ = ["ConfigError", "TFTTask", "TrainConfig", "TrainState", "Trainer", "TrainingDiverged",
           "create_train_state", "evaluate_checkpoint", "make_eval_step", "make_train_step",
           "train_and_evaluate"]

Array = jax.Array


class TrainState(train_state.TrainState):
    """``step``, ``params``, ``opt_state`` (pytree) plus static ``apply_fn``/``tx``."""


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


# ------------------------------------------------------------------ the TFT's part of the loop
class TFTTask:
    """The TFT for :func:`tftjax.runloop.run`: an epoch of jitted steps, validation, summary."""

    kind, score, mode, epoch_bar = "tft", "val_loss", "min", False
    may_change = ("train.epochs",) + tuple(f"model.{f}" for f in TFTConfig.EXECUTION_FIELDS)

    def __init__(self, cfg: TFTConfig, tc: TrainConfig, ds: Dataset, workdir: Path, *,
                 progress: bool = True, profile_dir: str | None = None, log: Callable = print):
        self.cfg, self.tc, self.ds, self.log = cfg, tc, ds, log
        self.epochs, self.patience = tc.epochs, tc.patience
        self.progress, self.profile_dir = progress, profile_dir
        self.trainer = Trainer(cfg, tc, to_device(ds.features))
        self._identity = {"data": ds.identity(workdir), "model": cfg.to_json(),
                          "train": tc.to_json()}
        # Dropout masks from the RBG generator: same quality for dropout, and
        # XLA:CPU compiles it much faster than threefry (17 s → 11 s, tiny preset).
        self.dropout_key = jax.random.key(tc.seed, impl="rbg")
        self.compiled = False

    def identity(self) -> dict:
        return self._identity

    def extra_meta(self) -> dict:
        return {"feature_stats": self.ds.features.stats.to_json()}

    def init_state(self) -> TrainState:
        return create_train_state(self.cfg, self.tc, jax.random.key(self.tc.seed))

    def abstract_state(self):
        return jax.eval_shape(lambda k: create_train_state(self.cfg, self.tc, k),
                              jax.random.key(self.tc.seed))

    def describe(self, state) -> str:
        ds, note = self.ds, remat_plan(self.cfg.remat).note
        n = sum(x.size for x in jax.tree.leaves(state.params))
        return ((note + "\n" if note else "")
                + f"TFT {n:,} parameters; {len(ds.bars):,} bars from {ds.bars.path}; windows "
                f"train {ds.splits.train.size:,} / val {ds.splits.val.size:,} / test "
                f"{ds.splits.test.size:,}; remat={self.cfg.remat}, batch {self.tc.batch_size}")

    def train_epoch(self, state: TrainState, epoch: int):
        """One pass over the training windows.

        The host reads the running loss of step ``i-1`` right after dispatching
        step ``i``: the device is never idle waiting for the host, every step's
        loss is checked for NaN/inf (a diverged run stops within its epoch), and
        the samples/s shown are of *completed* steps. The first step of the
        process includes the compile, timed apart.
        """
        tc = self.tc
        idx, mask = epoch_batches(self.ds.splits.train, tc.batch_size, seed=tc.seed, epoch=epoch)
        idx = np.where(mask, idx, -1).astype(np.int32)[: tc.max_steps_per_epoch]
        valid = (idx >= 0).sum(axis=1)
        bar = self._bar(len(idx), epoch)
        profiling = False
        loss_sum, pending = jnp.zeros(()), None
        t0, compile_s, done = time.perf_counter(), None, 0

        def settle(i, running_loss):  # waits for step i; checks and shows it
            nonlocal done
            loss = float(running_loss)
            done += int(valid[i])
            if not np.isfinite(loss):
                raise TrainingDiverged(f"training loss became {loss} at step {i + 1} of epoch "
                                       f"{epoch}")
            if bar is not None:
                rate = done / max(time.perf_counter() - t0, 1e-9)
                bar.update(1)
                bar.set_postfix(loss=f"{loss / max(valid[: i + 1].sum(), 1):.4f}",
                                samples_s=f"{rate:.1f}")
            return loss

        try:
            for i, b in enumerate(idx):
                if self.profile_dir and epoch == 1 and i == 1:
                    jax.profiler.start_trace(self.profile_dir)
                    profiling = True
                state, m = self.trainer.train_step(state, b, self.dropout_key)
                if not self.compiled:  # the call returns once compiled and dispatched
                    compile_s, self.compiled = time.perf_counter() - t0, True
                    t0 = time.perf_counter()
                loss_sum = loss_sum + m["loss"] * m["count"]
                if pending is not None:
                    settle(*pending)
                pending = (i, loss_sum)
                if profiling and i == min(5, len(idx) - 1):
                    jax.block_until_ready(state)
                    jax.profiler.stop_trace()
                    profiling = False
            total = settle(*pending)
        finally:
            if profiling:
                jax.profiler.stop_trace()
            if bar is not None:
                bar.close()
        elapsed = time.perf_counter() - t0
        out = {"train_loss": total / max(int(valid.sum()), 1),
               "samples_per_s": int(valid.sum()) / elapsed, "epoch_time_s": elapsed,
               "steps": int(len(idx))}
        if compile_s is not None:
            out["compile_s"] = compile_s
        return state, out

    def _bar(self, total: int, epoch: int):
        if not self.progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=f"epoch {epoch}", unit="step", leave=False,
                    file=sys.stderr, dynamic_ncols=True)

    def validate(self, state: TrainState) -> dict:
        if self.ds.splits.val.size == 0:
            return {"val_loss": None}
        val = self.trainer.evaluate(state.params, self.ds.splits.val)
        return {"val_loss": val["loss"], "val_q_risk_50": val["q_risk_50"],
                "val_q_risk_90": val["q_risk_90"]}

    @staticmethod
    def epoch_line(m: dict) -> str:
        val = ("no validation windows" if m["val_loss"] is None else
               f"val loss {m['val_loss']:.4f}  q-risk P50 {m['val_q_risk_50']:.4f} "
               f"P90 {m['val_q_risk_90']:.4f}")
        return (f"train loss {m['train_loss']:.4f}  {val}  {m['samples_per_s']:.1f} samples/s "
                f"({m['epoch_time_s']:.1f} s"
                + (f"; train step compiled in {m['compile_s']:.1f} s)" if "compile_s" in m else ")"))

    def summarize(self, state: TrainState, workdir: Path, history: list[dict]):
        summary = summarize(self.trainer, state.params, self.ds, self.cfg)
        summary["parameters"] = sum(x.size for x in jax.tree.leaves(state.params))
        try:
            from tftjax import plots

            plots.training_plots(workdir, history, self.trainer, state.params, self.ds, self.cfg)
        except Exception as e:  # plots must never lose a finished run
            self.log(f"warning: plots not written ({type(e).__name__}: {e})")
        return summary, format_summary(summary)


def train_and_evaluate(cfg: TFTConfig, tc: TrainConfig, workdir: str | Path, *,
                       parquet_file: str | Path | None = None, dataset: Dataset | None = None,
                       resume: bool = False, progress: bool = True,
                       profile_dir: str | None = None, callback: Callable | None = None,
                       log: Callable = print) -> dict:
    """Train, validate every epoch, checkpoint, and evaluate the best epoch on the test split.

    Args:
      cfg: model config; tc: training config.
      workdir: run folder (checkpoints/, metrics.jsonl, summary.json, plots).
      parquet_file: OHLCV bars (default: the bundled ES bars; on resume, the
        file the run was trained on, found again by its content hash).
      dataset: a prepared dataset (overrides ``parquet_file``; for tests).
      resume: continue the latest checkpoint in ``workdir`` (data, model and
        training config must match it; only ``tc.epochs`` may grow).
      progress: a per-epoch progress bar; profile_dir: a ``jax.profiler``
        trace of steps 2-6 of epoch 1.
      callback: ``(epoch, state, metrics, is_final)`` after each epoch.

    Returns:
      The summary dict (also written to ``workdir/summary.json``).

    Raises:
      DataError: bad input data; ConfigError: bad settings or a resume that
      does not match; TrainingDiverged: NaN/inf loss (the last good
      checkpoint is kept).
    """
    workdir = Path(workdir)

    def make_task(saved: dict | None) -> TFTTask:
        ds = dataset
        if ds is None:
            stats, path = None, parquet_file
            if saved is not None:
                stats = FeatureStats.from_json(saved["feature_stats"])
                if path is None:
                    path = find_data_file(saved["identity"]["data"], workdir)
            ds = load_dataset(path, cfg.data, stats=stats)
        return TFTTask(cfg, tc, ds, workdir, progress=progress, profile_dir=profile_dir, log=log)

    return runloop.run(make_task, workdir, kind="tft", resume=resume, progress=progress,
                       callback=callback, log=log)


def evaluate_checkpoint(checkpoint: str | Path, parquet_file: str | Path | None = None,
                        split: str = "test", log: Callable = print) -> dict:
    """Metrics of a saved TFT on one split, beside the naive baselines.

    The weights, model and training config and the feature statistics come
    from the checkpoint. The data is the file the run was trained on (found
    relative to the run folder or at its recorded path, and refused when its
    content hash changed), or ``parquet_file`` on purpose, featurised with the
    *training* statistics.

    Raises:
      DataError: no checkpoint, not a TFT checkpoint, or the data is missing or changed.
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise DataError(f"{checkpoint}: no such checkpoint directory")
    try:
        meta = read_meta(checkpoint)
    except Exception as e:  # orbax raises several types for a folder that is not a checkpoint
        raise DataError(f"{checkpoint}: not a readable tftjax checkpoint ({type(e).__name__})") from None
    if meta.get("kind") != "tft":
        raise DataError(f"{checkpoint}: not a TFT checkpoint (kind {meta.get('kind')!r})")
    try:
        cfg = TFTConfig.from_json(meta["identity"]["model"])
        tc = TrainConfig.from_json(meta["identity"]["train"])
        recorded = meta["identity"]["data"]
        stats = FeatureStats.from_json(meta["feature_stats"])
    except (KeyError, TypeError):
        raise DataError(f"{checkpoint}: written by an older tftjax (no data identity in its "
                        "metadata)") from None
    run_dir = checkpoint.resolve().parent.parent  # RUN/checkpoints/NAME
    path = parquet_file or find_data_file(recorded, run_dir)
    ds = load_dataset(path, cfg.data, stats=stats)
    if ds.identity()["sha256"] == recorded["sha256"]:
        source = f"{ds.bars.path} (the training data)"
    else:
        source = (f"{ds.bars.path} (another file than the training data, {recorded['file']}; "
                  "featurised with the training run's statistics)")
    state = restore_state(checkpoint, jax.eval_shape(
        lambda k: create_train_state(cfg, tc, k), jax.random.key(0)))
    trainer = Trainer(cfg, tc, to_device(ds.features))
    starts = getattr(ds.splits, split)
    summary = {"model": {split: trainer.evaluate(state.params, starts)}, "baselines": {},
               "checkpoint": str(checkpoint), "weights_epoch": meta.get("weights_epoch"),
               "data": ds.identity()}
    if split != "train":
        for name, m in baselines(ds, cfg.quantiles, split).items():
            summary["baselines"][name] = {split: m}
    log(f"{checkpoint} (weights of epoch {meta.get('weights_epoch')}) on {source}, {split} "
        f"split, {starts.size:,} windows")
    log(format_summary(summary))
    return summary

def summarize(trainer: Trainer, params, ds: Dataset, cfg: TFTConfig) -> dict:
    out: dict[str, Any] = {"model": {}, "baselines": {}}
    splits = [s for s in ("train", "val", "test") if getattr(ds.splits, s).size]
    for split in splits:
        out["model"][split] = trainer.evaluate(params, getattr(ds.splits, split))
    for split in (s for s in splits if s != "train"):
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
