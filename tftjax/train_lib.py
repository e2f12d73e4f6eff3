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

import dataclasses
import functools
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.training import train_state

from tftjax import losses, runloop
from tftjax.checkpoints import list_checkpoints, read_meta, restore_state
from tftjax.config import ConfigError, TFTConfig, TrainConfig
from tftjax.data import (DataError, Dataset, DeviceData, FeatureStats, epoch_batches,
                         find_data_file, gather, load_dataset, to_device)
from tftjax.models.tft import TFT, init_variables, quant_spec
from tftjax.quant import as_minmax, int8_variables, layer_names, unmatched, unobserved
from tftjax.remat import plan as remat_plan
from tftjax.runloop import TrainingDiverged

__all__ = ["ConfigError", "TFTTask", "TrainConfig", "TrainState", "Trainer", "TrainingDiverged",
           "create_train_state", "evaluate_checkpoint", "make_eval_step", "make_train_step",
           "train_and_evaluate"]

Array = jax.Array


class TrainState(train_state.TrainState):
    """``step``, ``params``, ``opt_state``, ``quant_stats`` (pytrees) plus static
    ``apply_fn``/``tx``. ``quant_stats``: the QAT activation observers (empty for a float
    model), updated by every training step and checkpointed with the rest."""

    quant_stats: Any = struct.field(default_factory=dict)

    def variables(self) -> dict:
        """The Flax variables to evaluate with."""
        return {"params": self.params, "quant_stats": self.quant_stats}


def make_optimizer(tc: TrainConfig, total_steps: int | None = None) -> optax.GradientTransformation:
    """AdamW with global-norm clipping, the learning-rate schedule of ``tc`` over
    ``total_steps`` (only a cosine schedule needs it) and weight decay on every parameter or
    on weight matrices only (``tc.decay_all``)."""
    total = int(total_steps or 1)
    if tc.lr_schedule == "constant" and not tc.warmup_steps:
        total = 0  # the schedule does not depend on it: one cached optimizer
    return _optimizer(tc.learning_rate, tc.weight_decay, tc.grad_clip, tc.lr_schedule,
                      tc.warmup_steps, total, tc.decay_all)


def decay_mask(params):
    """True for the weight matrices (kernels, stacked and LSTM weights), False for biases,
    LayerNorm scales/offsets and the per-variable input embeddings (``emb_k``, ``emb_b``)."""
    def keep(path, x):
        name = str(getattr(path[-1], "key", path[-1]))
        return name in ("kernel", "w_i", "w_h") or (name.endswith("_k") and name != "emb_k")
    return jax.tree_util.tree_map_with_path(keep, params)


# The optimizer and apply_fn are static fields of TrainState: reusing the same
# objects for equal settings lets every run in a process hit jit's cache.
@functools.lru_cache(maxsize=None)
def _optimizer(lr: float, weight_decay: float, clip: float, schedule: str = "constant",
               warmup: int = 0, total: int = 0, decay_all: bool = True
               ) -> optax.GradientTransformation:
    if schedule == "cosine":
        rate = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total, warmup + 1), 0.0)
    elif warmup:
        rate = optax.join_schedules([optax.linear_schedule(0.0, lr, warmup),
                                     optax.constant_schedule(lr)], [warmup])
    else:
        rate = lr
    mask = None if decay_all else decay_mask
    return optax.chain(optax.clip_by_global_norm(clip),
                       optax.adamw(rate, weight_decay=weight_decay, mask=mask))


@functools.lru_cache(maxsize=None)
def _apply_fn(cfg: TFTConfig):
    return TFT(cfg).apply


def create_train_state(cfg: TFTConfig, tc: TrainConfig, key: Array,
                       total_steps: int | None = None) -> TrainState:
    """A fresh state; ``total_steps``: the run's optimizer steps (for a cosine schedule)."""
    variables = init_variables(cfg, key)
    return TrainState.create(apply_fn=_apply_fn(cfg), params=variables["params"],
                             quant_stats=variables.get("quant_stats", {}),
                             tx=make_optimizer(tc, total_steps))


def _loss_fn(params, quant_stats, apply_fn, batch, mask, quantiles, dropout_key, denom=None,
             vol_target=False):
    # quant_stats is mutable: the observers move with this batch (once, in the forward
    # pass: a rematerialised block's recomputation only rebuilds residuals) and come back.
    (pred, _), updated = apply_fn({"params": params, "quant_stats": quant_stats},
                                  batch.static, batch.historical, batch.known, False,
                                  rngs={"dropout": dropout_key}, mutable=["quant_stats"])
    pred = forecast(pred, batch, vol_target)
    return (losses.quantile_loss(batch.target, pred, quantiles, mask, denom),
            updated.get("quant_stats", {}))


def forecast(raw: Array, batch, vol_target: bool) -> Array:
    """The quantile forecasts ``[B, D, Q]`` in target units from the network's outputs: as
    they are, or (``vol_target``) times each window's EWMA volatility at its forecast time."""
    return raw * batch.scale[:, None, None] if vol_target else raw


def _gather_fn(cfg: TFTConfig, par):
    if par is not None and par.feature_rows_sharded:
        from tftjax.parallel import gather_rows_sharded

        return lambda data, idx: gather_rows_sharded(par, data, idx, cfg.encoder_steps,
                                                     cfg.decoder_steps)
    return lambda data, idx: gather(data, idx, cfg.encoder_steps, cfg.decoder_steps)


@functools.lru_cache(maxsize=None)
def make_train_step(cfg: TFTConfig, *, max_traces: int | None = None, par=None,
                    accumulate: int = 1) -> Callable:
    """The jitted ``step(state, data, batch_idx, key) -> (state, metrics)``, state donated.

    ``par`` (a :class:`tftjax.parallel.Parallel`): compiled for its mesh, the batch sharded
    over the devices and the state replicated (None: one default device, no shardings).
    ``accumulate`` K: the batch runs as K micro-batches (micro-batch k holds rows k, k+K,
    k+2K, … so that every device works on each) in a ``lax.scan``; their gradients are
    summed in float32 and the optimizer steps once, so the update is the full batch's
    (to round-off; with dropout, micro-batch k draws its masks from the step's key folded
    with k) and the peak memory is one micro-batch's. QAT observers see the micro-batches
    one after another.
    """
    quantiles = np.asarray(cfg.quantiles, np.float32)
    take = _gather_fn(cfg, par)
    k_acc = int(accumulate)

    def grads_of(params, stats, apply_fn, data, idx, dropout_key, denom):
        batch = take(data, jnp.maximum(idx, 0))
        return jax.value_and_grad(_loss_fn, has_aux=True)(
            params, stats, apply_fn, batch, idx >= 0, quantiles, dropout_key, denom,
            cfg.vol_target)

    def step(state: TrainState, data: DeviceData, batch_idx: Array, key: Array):
        mask = batch_idx >= 0
        dropout_key = jax.random.fold_in(key, state.step)
        if k_acc == 1:
            (loss, stats), grads = grads_of(state.params, state.quant_stats, state.apply_fn, data,
                                            batch_idx, dropout_key, None)
        else:
            denom = jnp.maximum(mask.sum(), 1).astype(jnp.float32)
            micro = batch_idx.reshape(-1, k_acc).T  # [K, B/K]
            if par is not None:
                from jax.sharding import NamedSharding
                from jax.sharding import PartitionSpec as P

                from tftjax.parallel import AXIS

                micro = jax.lax.with_sharding_constraint(micro,
                                                         NamedSharding(par.mesh, P(None, AXIS)))

            def body(carry, xs):
                g_sum, l_sum, stats = carry
                idx, k = xs
                (l, stats), g = grads_of(state.params, stats, state.apply_fn, data, idx,
                                         jax.random.fold_in(dropout_key, k), denom)
                g_sum = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_sum, g)
                return (g_sum, l_sum + l, stats), None

            zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
            (grads, loss, stats), _ = jax.lax.scan(
                body, (zeros, jnp.zeros((), jnp.float32), state.quant_stats),
                (micro, jnp.arange(k_acc)))
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
        new_state = state.apply_gradients(grads=grads, quant_stats=stats)
        return new_state, {"loss": loss, "grad_norm": optax.global_norm(grads),
                           "count": mask.sum()}

    if max_traces is not None:
        import chex

        step = chex.assert_max_traces(step, n=max_traces)
    if par is None:
        return jax.jit(step, donate_argnums=(0,))
    return jax.jit(step, donate_argnums=(0,),
                   in_shardings=(par.replicated, par.data_shardings(), par.batch_sharding,
                                 par.replicated),
                   out_shardings=(par.replicated, par.replicated))


@functools.lru_cache(maxsize=None)
def make_eval_step(cfg: TFTConfig, mode: str | None = None, par=None) -> Callable:
    """Jitted ``(variables, data, batch_idx) -> (MetricSums, predictions, interpretation)``;
    ``mode``: float, fake (-quant) or int8 arithmetic (default: the config's own); ``par``:
    the batch sharded over its devices like the train step's, outputs replicated."""
    quantiles = np.asarray(cfg.quantiles, np.float32)
    model = TFT(cfg, mode)
    take = _gather_fn(cfg, par)

    def step(variables, data: DeviceData, batch_idx: Array):
        mask = batch_idx >= 0
        batch = take(data, jnp.maximum(batch_idx, 0))
        pred, interp = model.apply(variables, batch.static, batch.historical, batch.known, True)
        pred = forecast(pred, batch, cfg.vol_target)
        return losses.metric_sums(batch.target, pred, quantiles, mask), pred, interp

    if par is None:
        return jax.jit(step)
    return jax.jit(step, in_shardings=(par.replicated, par.data_shardings(), par.batch_sharding),
                   out_shardings=par.replicated)


class Trainer:
    """Binds a model config, its device data and compiled steps.

    ``train_step(state, batch_idx, key)`` and ``evaluate(params, starts)`` are
    what the loop uses; tests call them directly.
    """

    def __init__(self, cfg: TFTConfig, tc: TrainConfig, data: DeviceData,
                 max_traces: int | None = None, par=None):
        self.cfg, self.tc, self.data, self.par = cfg, tc, data, par
        if par is not None:
            from tftjax.parallel import check_divisible

            check_divisible(tc.batch_size // tc.accumulate, par.size,
                            "--batch-size" if tc.accumulate == 1 else
                            f"--batch-size / --accumulate {tc.accumulate} =")
        self._train = make_train_step(cfg, max_traces=max_traces, par=par,
                                      accumulate=tc.accumulate)
        # an eval batch is padded anyway: round it up to a multiple of the devices
        n = par.size if par is not None else 1
        self.eval_batch_size = -(-tc.eval_batch_size // n) * n

    def _batch(self, idx) -> Array:
        idx = np.asarray(idx, np.int32)
        return self.par.batch(idx) if self.par is not None else jnp.asarray(idx)

    def train_step(self, state: TrainState, batch_idx, key):
        return self._train(state, self.data, self._batch(batch_idx), key)

    def evaluate(self, variables, starts: np.ndarray, mode: str | None = None) -> dict[str, float]:
        """Loss and q-risk over the windows at ``starts``; ``variables``: a Flax variables
        dict (or bare params), ``mode``: see :func:`model_variables`."""
        step = make_eval_step(self.cfg, mode, self.par)
        variables = model_variables(self.cfg, variables, mode)
        total = None
        for idx in _eval_batches(starts, self.eval_batch_size):
            sums, _, _ = step(variables, self.data, self._batch(idx))
            total = sums if total is None else losses.add(total, sums)
        return losses.finalize(total)

    def predict(self, variables, starts: np.ndarray, mode: str | None = None):
        """Predictions ``[n, T_d, Q]`` and interpretation for windows at ``starts``."""
        step = make_eval_step(self.cfg, mode, self.par)
        variables = model_variables(self.cfg, variables, mode)
        preds, interps = [], []
        for idx in _eval_batches(starts, self.eval_batch_size):
            _, pred, interp = step(variables, self.data, self._batch(idx))
            keep = np.asarray(idx) >= 0
            preds.append(np.asarray(pred)[keep])
            interps.append(jax.tree.map(lambda x: np.asarray(x)[keep], interp))
        return np.concatenate(preds), jax.tree.map(lambda *xs: np.concatenate(xs), *interps)


def train_epochs(cfg: TFTConfig, tc: TrainConfig, ds: Dataset, epochs: int | None = None,
                 par=None) -> tuple[TrainState, list[float]]:
    """``epochs`` (default ``tc.epochs``) epochs of the run loop's training steps (the same
    batches, initial weights and dropout key from ``tc.seed``) without checkpoints or
    evaluation: the final state and each epoch's mean training loss. For comparisons of
    execution settings (remat tiers, meshes, accumulation) trained from one seed."""
    epochs = tc.epochs if epochs is None else epochs
    data = par.put_data(ds.features) if par is not None else to_device(ds.features)
    trainer = Trainer(cfg, tc, data, par=par)
    per_epoch = -(-ds.splits.train.size // tc.batch_size)
    if tc.max_steps_per_epoch:
        per_epoch = min(per_epoch, tc.max_steps_per_epoch)
    state = create_train_state(cfg, tc, jax.random.key(tc.seed), per_epoch * tc.epochs)
    key = jax.random.key(tc.seed, impl="rbg")
    if par is not None:
        state, key = par.replicate(state), par.replicate(key)
    history = []
    for epoch in range(1, epochs + 1):
        idx, mask = epoch_batches(ds.splits.train, tc.batch_size, seed=tc.seed, epoch=epoch)
        idx = np.where(mask, idx, -1).astype(np.int32)[: tc.max_steps_per_epoch]
        total = 0.0
        for b in idx:
            state, m = trainer.train_step(state, b, key)
            total += float(m["loss"]) * int((b >= 0).sum())
        history.append(total / max(int((idx >= 0).sum()), 1))
    return state, history


def leaf_differences(params, reference) -> dict[str, float]:
    """Per parameter leaf: ``max |p - r| / max |r|`` (the largest difference relative to the
    leaf's scale), keyed by the leaf's path."""
    out = {}
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                            jax.tree.leaves(reference)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        out[jax.tree_util.keystr(path)] = float(np.abs(a - b).max() / max(np.abs(b).max(),
                                                                          1e-30))
    return out


def model_variables(cfg: TFTConfig, variables: dict, mode: str | None = None) -> dict:
    """The variables a TFT of ``cfg`` runs with in ``mode`` (``None``: the config's own;
    ``float``; ``fake``: fake-quant; ``int8``: int8 kernels, converted here from float ones
    unless they already are). ``variables`` may be bare params (a float model).

    Raises:
      ConfigError: a quantized mode whose activation observers never saw data (train with
        --qat or calibrate first: their range would quantize everything to zero).
    """
    if "params" not in variables:
        variables = {"params": variables}
    spec = quant_spec(cfg, mode)
    if spec is None:
        return {"params": variables["params"]}
    stats = variables.get("quant_stats")
    if stats is None or unobserved(stats):
        raise ConfigError(f"{spec.mode} inference needs observed activation ranges: train with "
                          "--qat, or calibrate a float model (--calibrate N)")
    if spec.mode == "int8" and "weight_scale" not in variables:
        variables = {**_to_int8(variables["params"], spec), "quant_stats": stats}
    return variables


@functools.partial(jax.jit, static_argnums=1)
def _to_int8(params, spec):
    return int8_variables(params, spec)


def _eval_batches(starts: np.ndarray, batch_size: int):
    # One batch shape for every call: one compiled eval step.
    idx, mask = epoch_batches(starts, batch_size, seed=0, epoch=0, shuffle=False)
    for i, m in zip(idx, mask):
        yield np.where(m, i, -1).astype(np.int32)


def window_targets(ds: Dataset, starts: np.ndarray) -> np.ndarray:
    """Targets ``[n, T_d]`` of the windows at ``starts`` (host numpy)."""
    e, d = ds.cfg.encoder_steps, ds.cfg.decoder_steps
    return ds.features.target[starts[:, None] + e + np.arange(d)]


def baselines(ds: Dataset, quantiles, split: str) -> dict[str, dict]:
    """Metrics of every baseline (:mod:`tftjax.baselines`) on the windows of ``split``."""
    from tftjax import baselines as bl

    starts = getattr(ds.splits, split)
    preds = bl.forecasts(ds.features.target, starts + ds.cfg.encoder_steps - 1,
                         ds.cfg.decoder_steps, quantiles, ds.splits.train_rows)
    y = window_targets(ds, starts)
    return {name: losses.numpy_metrics(y, p, quantiles) for name, p in preds.items()}


# ------------------------------------------------------------------ the TFT's part of the loop
class TFTTask:
    """The TFT for :func:`tftjax.runloop.run`: an epoch of jitted steps, validation, summary."""

    kind, score, mode, epoch_bar = "tft", "val_loss", "min", False
    may_change = ("train.epochs", "train.accumulate") + tuple(
        f"model.{f}" for f in TFTConfig.EXECUTION_FIELDS)

    def __init__(self, cfg: TFTConfig, tc: TrainConfig, ds: Dataset, workdir: Path, *,
                 progress: bool = True, profile_dir: str | None = None,
                 init: "Initial | None" = None, log: Callable = print, par=None):
        from tftjax.parallel import make_parallel

        self.cfg, self.tc, self.ds, self.log, self.init = cfg, tc, ds, log, init
        # the mesh: all local devices unless told (one on a plain CPU); the batch is sharded
        # over it, the state replicated
        f = ds.features
        self.par = (par if par is not None else make_parallel()).for_features(
            sum(a.nbytes for a in (f.historical, f.known, f.target, f.future)) + f.target.nbytes)
        if cfg.qat:
            shapes = jax.eval_shape(lambda k: init_variables(cfg, k), jax.random.key(0))
            if bad := unmatched(cfg.qat_layers, shapes["params"]):
                raise ConfigError(f"--qat-layers {' '.join(bad)} matches no layer; layers are "
                                  "named like " + ", ".join(layer_names(shapes["params"])[:4])
                                  + ", … (tftjax.quant.layer_names)")
        self.epochs, self.patience = tc.epochs, tc.patience
        per_epoch = -(-ds.splits.train.size // tc.batch_size)
        if tc.max_steps_per_epoch:
            per_epoch = min(per_epoch, tc.max_steps_per_epoch)
        self.total_steps = per_epoch * tc.epochs
        if tc.lr_schedule == "cosine":  # the schedule spans the run's epochs: they are fixed
            self.may_change = tuple(f for f in self.may_change if f != "train.epochs")
        self.progress, self.profile_dir = progress, profile_dir
        self.trainer = Trainer(cfg, tc, self.par.put_data(ds.features), par=self.par)
        self._identity = {"data": ds.identity(workdir), "model": cfg.to_json(),
                          "train": tc.to_json()}
        # Dropout masks from the RBG generator: same quality for dropout, and
        # XLA:CPU compiles it much faster than threefry (17 s → 11 s, tiny preset).
        self.dropout_key = self.par.replicate(jax.random.key(tc.seed, impl="rbg"))
        self.compiled = False

    def identity(self) -> dict:
        return self._identity

    def extra_meta(self) -> dict:
        return {"feature_stats": self.ds.features.stats.to_json()}

    def init_state(self) -> TrainState:
        state = create_train_state(self.cfg, self.tc, jax.random.key(self.tc.seed),
                                   self.total_steps)
        if self.init is not None:
            self.log(self.init.note)
            place = lambda new, old: np.asarray(new, old.dtype)  # noqa: E731
            state = state.replace(
                params=jax.tree.map(place, self.init.params, state.params),
                quant_stats=(jax.tree.map(place, self.init.quant_stats, state.quant_stats)
                             if self.init.quant_stats else state.quant_stats))
        # replicated over the mesh, as the train step returns it: one compile
        return self.par.replicate(state)

    def abstract_state(self):
        """Shapes, dtypes and the replicated sharding of this mesh: a checkpoint written on
        any number of devices restores onto this run's."""
        shapes = jax.eval_shape(lambda k: create_train_state(self.cfg, self.tc, k,
                                                             self.total_steps),
                                jax.random.key(self.tc.seed))
        rep = self.par.replicated
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), shapes)

    def restore(self, checkpointer, epoch: int) -> TrainState:
        """The state of epoch checkpoint ``epoch``; a float run's checkpoint written before
        ``quant_stats`` existed restores with an empty one."""
        like = self.abstract_state()
        try:
            return checkpointer.restore(epoch, like)
        except Exception:
            if like.quant_stats:
                raise
            r = checkpointer.restore(epoch, {"step": like.step, "params": like.params,
                                             "opt_state": like.opt_state})
            return like.replace(step=r["step"], params=r["params"], opt_state=r["opt_state"])

    @staticmethod
    def normalize_identity(identity: dict) -> dict:
        """A saved identity with the fields added since (at their defaults) filled in."""
        out = dict(identity)
        try:
            out["model"] = TFTConfig.from_json(identity["model"]).to_json()
            out["train"] = TrainConfig.from_json(identity["train"]).to_json()
        except (KeyError, TypeError, ConfigError):
            pass  # reported field by field by the comparison
        return out

    def describe(self, state) -> str:
        ds, note = self.ds, remat_plan(self.cfg.remat).note
        n = sum(x.size for x in jax.tree.leaves(state.params))
        warn = "".join(f"warning: {w}\n" for w in ds.warnings)
        clock = ds.features.stats.clock
        from tftjax.data.calendar import format_interval

        cal = (f"; bar {format_interval(clock.interval)}, calendar {clock.calendar or 'none'}, "
               f"clock {clock.zone or 'as stored'}")
        return (warn + (note + "\n" if note else "")
                + f"TFT {n:,} parameters; {len(ds.bars):,} bars from {ds.bars.path}; windows "
                f"train {ds.splits.train.size:,} / val {ds.splits.val.size:,} / test "
                f"{ds.splits.test.size:,}{cal}; remat={self.cfg.remat}, batch "
                f"{self.tc.batch_size}"
                + (f" as {self.tc.accumulate} accumulated micro-batches of "
                   f"{self.tc.batch_size // self.tc.accumulate}" if self.tc.accumulate > 1 else "")
                + f"; {self.par.describe()}"
                + (f"; QAT (int8 fake-quant of {', '.join(self.cfg.qat_layers)}"
                   + (f", observers frozen after {self.cfg.qat_freeze_after} steps)"
                      if self.cfg.qat_freeze_after is not None else ")")
                   if self.cfg.qat else ""))

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
        val = self.trainer.evaluate(state.variables(), self.ds.splits.val)
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
        summary = summarize(self.trainer, state.variables(), self.ds, self.cfg)
        summary["parameters"] = sum(x.size for x in jax.tree.leaves(state.params))
        if self.init is not None:
            summary["init_from"] = self.init.source
        try:
            from tftjax import plots

            from tftjax.parallel import is_primary

            plots.training_plots(workdir, history, self.trainer, state.variables(), self.ds,
                                 self.cfg, write=is_primary())
        except Exception as e:  # plots must never lose a finished run
            self.log(f"warning: plots not written ({type(e).__name__}: {e})")
        return summary, format_summary(summary)


def train_and_evaluate(cfg: TFTConfig, tc: TrainConfig, workdir: str | Path, *,
                       parquet_file: str | Path | None = None, dataset: Dataset | None = None,
                       resume: bool = False, progress: bool = True,
                       profile_dir: str | None = None, callback: Callable | None = None,
                       log: Callable = print, par=None) -> dict:
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
      par: the device mesh (:func:`tftjax.parallel.make_parallel`; default: every local
        device, features replicated).

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
        init = None
        if saved is None and tc.init_from:  # on resume the run's own checkpoint has them
            init = initial_weights(tc.init_from, cfg, ds)
        return TFTTask(cfg, tc, ds, workdir, progress=progress, profile_dir=profile_dir,
                       init=init, log=log, par=par)

    return runloop.run(make_task, workdir, kind="tft", resume=resume, progress=progress,
                       callback=callback, log=log)


class Checkpoint(NamedTuple):
    path: Path
    meta: dict
    cfg: TFTConfig
    tc: TrainConfig


def open_checkpoint(path: str | Path, flag: str = "--checkpoint") -> Checkpoint:
    """A TFT checkpoint's metadata and configs: ``path`` is a checkpoint directory or a run
    folder (its newest final checkpoint: the best epoch's weights).

    Raises:
      DataError: missing, unreadable, not a TFT checkpoint, or from an older tftjax.
    """
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"{flag} {path}: no such checkpoint or run folder")
    if (path / "checkpoints").is_dir():
        finals = [n for n in list_checkpoints(path / "checkpoints") if "_final_epoch" in n]
        if not finals:
            raise DataError(f"{flag} {path}: the run has no final checkpoint yet (name one of "
                            f"its epoch checkpoints under {path / 'checkpoints'})")
        path = path / "checkpoints" / finals[-1]
    try:
        meta = read_meta(path)
    except Exception as e:  # orbax raises several types for a folder that is not a checkpoint
        raise DataError(f"{flag} {path}: not a readable tftjax checkpoint "
                        f"({type(e).__name__})") from None
    if meta.get("kind") != "tft":
        raise DataError(f"{flag} {path}: not a TFT checkpoint (kind {meta.get('kind')!r})")
    try:
        cfg = TFTConfig.from_json(meta["identity"]["model"])
        tc = TrainConfig.from_json(meta["identity"]["train"])
        meta["identity"]["data"]["sha256"], meta["feature_stats"]
    except (KeyError, TypeError, ConfigError):
        raise DataError(f"{flag} {path}: written by an older tftjax (no data identity in its "
                        "metadata)") from None
    return Checkpoint(path, meta, cfg, tc)


def restore_checkpoint(ck: Checkpoint) -> TrainState:
    """The checkpoint's train state (a float checkpoint written before ``quant_stats``
    existed gets an empty one).

    Raises:
      DataError: the state cannot be restored (damaged, or not this model's shapes).
    """
    like = jax.eval_shape(lambda k: create_train_state(ck.cfg, ck.tc, k), jax.random.key(0))
    try:
        return restore_state(ck.path, like)
    except Exception as e:  # orbax raises several types
        if not like.quant_stats:
            try:
                r = restore_state(ck.path, {"step": like.step, "params": like.params,
                                            "opt_state": like.opt_state})
                return like.replace(step=r["step"], params=r["params"], opt_state=r["opt_state"])
            except Exception:
                pass
        raise DataError(f"{ck.path}: the weights cannot be restored ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200]})") from None


class Initial(NamedTuple):
    """Weights a run starts from (``--init-from``)."""

    params: Any
    quant_stats: Any  # the source's observers when it is a QAT run of the same layers, else None
    source: dict
    note: str


def initial_weights(init_from: str | Path, cfg: TFTConfig, ds: Dataset) -> Initial:
    """The weights of ``--init-from`` (a float or QAT checkpoint / run folder) for a run of
    ``cfg`` on ``ds``: the same model (quantization and execution settings aside) trained on
    the same data, else ConfigError naming what differs."""
    try:
        ck = open_checkpoint(init_from, "--init-from")
    except DataError as e:
        raise ConfigError(str(e)) from None
    skip = TFTConfig.EXECUTION_FIELDS + ("dropout",)  # shapes and data must match, not these
    diff = runloop.identity_diff({k: v for k, v in ck.cfg.float_twin().to_json().items()
                                  if k not in skip},
                                 {k: v for k, v in cfg.float_twin().to_json().items()
                                  if k not in skip})
    if diff:
        raise ConfigError(f"--init-from {ck.path}: another model than this run's: "
                          + "; ".join(diff).replace("in the checkpoint", "there"))
    src, now = ck.meta["identity"]["data"], ds.identity()
    if src.get("sha256") != now["sha256"]:
        raise ConfigError(f"--init-from {ck.path}: trained on {src.get('file')} (sha256 "
                          f"{str(src.get('sha256'))[:12]}…), this run reads {now['file']} (sha256 "
                          f"{now['sha256'][:12]}…): fine-tune on the data the weights were "
                          "trained on")
    state = restore_checkpoint(ck)
    same_quant = ck.cfg.qat and cfg.qat and tuple(ck.cfg.qat_layers) == tuple(cfg.qat_layers)
    source = {"checkpoint": str(ck.path), "weights_epoch": ck.meta.get("weights_epoch"),
              "qat": ck.cfg.qat}
    kind = "QAT" if ck.cfg.qat else "float"
    note = (f"initialised from the {kind} weights of {ck.path} (epoch "
            f"{ck.meta.get('weights_epoch')})" + ("" if same_quant or not cfg.qat
                                                  else "; activation observers start empty"))
    stats = None
    if same_quant:  # keep the ranges; count this run's steps (for --qat-freeze-after)
        stats = jax.tree.map(lambda m: m._replace(count=jnp.minimum(m.count, 1)),
                             as_minmax(state.quant_stats), is_leaf=lambda t: hasattr(t, "_fields"))
    return Initial(state.params, stats, source, note)


@functools.lru_cache(maxsize=None)
def _calibrate_step(cfg: TFTConfig):
    model = TFT(cfg, "fake")

    @jax.jit
    def step(variables, data: DeviceData, batch_idx: Array):
        batch = gather(data, batch_idx, cfg.encoder_steps, cfg.decoder_steps)
        _, updated = model.apply(variables, batch.static, batch.historical, batch.known, True,
                                 mutable=["quant_stats"])
        return updated["quant_stats"]

    return step


def calibrate(cfg: TFTConfig, params, data: DeviceData, starts: np.ndarray, batches: int,
              batch_size: int, seed: int = 0) -> tuple[TFTConfig, dict]:
    """Post-training quantization: observers of a float model's layers (``cfg.qat_layers``)
    calibrated on ``batches`` shuffled full batches of the windows at ``starts`` (training
    windows; cycled if there are fewer), no training. Returns the quantized config and its
    ``quant_stats``."""
    qcfg = dataclasses.replace(cfg, qat=True)
    stats = init_variables(qcfg, jax.random.key(0))["quant_stats"]
    idx, mask = epoch_batches(starts, batch_size, seed=seed, epoch=1)
    full = [i for i, m in zip(idx, mask) if m.all()] or [np.resize(idx[0][mask[0]], batch_size)]
    step = _calibrate_step(qcfg)
    for b in range(batches):
        stats = step({"params": params, "quant_stats": stats}, data,
                     jnp.asarray(full[b % len(full)], jnp.int32))
    return qcfg, stats


def evaluate_checkpoint(checkpoint: str | Path, parquet_file: str | Path | None = None,
                        split: str = "test", *, int8: bool = False, calibrate_batches: int = 0,
                        log: Callable = print) -> dict:
    """Metrics of a saved TFT on one split, beside the naive baselines.

    The weights, model and training config and the feature statistics come
    from the checkpoint (or an exported folder, :mod:`tftjax.export`). The data
    is the file the run was trained on (found relative to the run folder or at
    its recorded path, and refused when its content hash changed), or
    ``parquet_file`` on purpose, featurised with the *training* statistics.
    ``int8``: also the int8 inference path (and the float weights without
    quantization) of a QAT checkpoint, or of a float one calibrated on
    ``calibrate_batches`` training batches (PTQ). An int8 export is evaluated as
    int8 beside its float32 weights.

    Raises:
      DataError: no checkpoint, not a TFT checkpoint, or the data is missing or changed.
      ConfigError: ``int8`` of a float checkpoint without calibration, and the like.
    """
    from tftjax import export

    checkpoint = Path(checkpoint)
    if calibrate_batches and not int8:
        raise ConfigError("--calibrate needs --int8 (it calibrates the int8 activation ranges)")
    exp = None
    if export.is_export(checkpoint):
        exp = export.load(checkpoint)
        cfg, tc, recorded, stats = exp.cfg, TrainConfig(), exp.data, exp.feature_stats
        variables, run_dir = exp.variables, checkpoint
        if int8 and exp.kind != "int8":
            raise ConfigError(f"{checkpoint} holds float32 weights only: export a --qat run, or "
                              "a float one with --calibrate N, to get an int8 model")
        weights_epoch = exp.source.get("weights_epoch")
        what = f"{checkpoint} (export of {exp.source.get('checkpoint')}, epoch {weights_epoch})"
        if calibrate_batches:
            raise ConfigError(f"{checkpoint} is an export: calibrate when exporting "
                              "(python -m tftjax.export --calibrate N)")
    else:
        ck = open_checkpoint(checkpoint)
        cfg, tc, recorded = ck.cfg, ck.tc, ck.meta["identity"]["data"]
        stats = FeatureStats.from_json(ck.meta["feature_stats"])
        weights_epoch = ck.meta.get("weights_epoch")
        what = f"{ck.path} (weights of epoch {weights_epoch})"
        run_dir = ck.path.resolve().parent.parent  # RUN/checkpoints/NAME
        if int8 and not cfg.qat and not calibrate_batches:
            raise ConfigError(f"{ck.path} is a float model: add --calibrate N to calibrate its "
                              "int8 activation ranges on N training batches (PTQ)")
        if calibrate_batches and cfg.qat:
            raise ConfigError(f"{ck.path} was trained with --qat: its activation ranges are "
                              "already calibrated; drop --calibrate")
        variables = restore_checkpoint(ck).variables()
    path = parquet_file or find_data_file(recorded, run_dir)
    ds = load_dataset(path, cfg.data, stats=stats)
    same_data = ds.identity()["sha256"] == recorded["sha256"]
    if same_data:
        source = f"{ds.bars.path} (the training data)"
    else:
        source = (f"{ds.bars.path} (another file than the training data, {recorded['file']}; "
                  "featurised with the training run's statistics)")
    trainer = Trainer(cfg, tc, to_device(ds.features))
    if calibrate_batches:
        if not same_data:
            raise ConfigError("--calibrate uses the training windows: evaluate on the training "
                              "data (drop --parquet-file)")
        cfg, qstats = calibrate(cfg, variables["params"], trainer.data, ds.splits.train,
                                calibrate_batches, tc.batch_size)
        trainer = Trainer(cfg, tc, trainer.data)
        variables = {"params": variables["params"], "quant_stats": qstats}
        what += f", int8 ranges calibrated on {calibrate_batches} training batches (PTQ)"
    starts = getattr(ds.splits, split)
    summary = {"model": {}, "baselines": {}, "checkpoint": str(checkpoint),
               "weights_epoch": weights_epoch, "data": ds.identity()}
    int8_export = "weight_scale" in variables
    if int8_export:  # the int8 model, beside the export's float32 weights
        summary["model"][split] = trainer.evaluate(variables, starts, "int8")
        summary["variants"] = {"float": {split: trainer.evaluate(exp.float_variables, starts,
                                                                 "float")}}
    else:
        summary["model"][split] = trainer.evaluate(variables, starts)
        if int8:
            summary["variants"] = {m: {split: trainer.evaluate(variables, starts, m)}
                                   for m in ("float", "int8")}
    summary["quantized"] = bool(cfg.qat) and not int8_export
    if calibrate_batches:
        summary["ptq_batches"] = calibrate_batches
    for name, m in baselines(ds, cfg.quantiles, split).items():
        summary["baselines"][name] = {split: m}
    log(f"{what} on {source}, {split} split, {starts.size:,} windows")
    log(format_summary(summary, int8_model=int8_export, ptq=bool(calibrate_batches)))
    return summary


def summarize(trainer: Trainer, variables, ds: Dataset, cfg: TFTConfig) -> dict:
    """Metrics on every split beside the baselines; a QAT model also with its float
    weights run without fake-quant and with the int8 inference path (``variants``)."""
    out: dict[str, Any] = {"model": {}, "baselines": {}}
    splits = [s for s in ("train", "val", "test") if getattr(ds.splits, s).size]
    for split in splits:
        out["model"][split] = trainer.evaluate(variables, getattr(ds.splits, split))
    if cfg.qat:
        out["variants"] = {m: {split: trainer.evaluate(variables, getattr(ds.splits, split), m)
                               for split in splits} for m in ("float", "int8")}
    for split in splits:
        for name, m in baselines(ds, cfg.quantiles, split).items():
            out["baselines"].setdefault(name, {})[split] = m
    return out


VARIANT_NAMES = {"float": "TFT: float, no quant", "int8": "TFT: int8 inference"}


def format_summary(summary: dict, qat: bool | None = None, int8_model: bool = False,
                   ptq: bool = False) -> str:
    """The metrics table: the model, its quantization variants, the baselines."""
    qat = summary.get("quantized", bool(summary.get("variants"))) if qat is None else qat
    name = ("TFT int8 (export)" if int8_model else "TFT: fake-quant (PTQ)" if ptq
            else "TFT: fake-quant (QAT)" if qat else "TFT")
    rows = [(name, summary["model"])]
    rows += [(VARIANT_NAMES[k], v) for k, v in summary.get("variants", {}).items()]
    from tftjax.baselines import NAMES

    rows += [(NAMES.get(k, k), v) for k, v in summary["baselines"].items()]
    head = (f"{'':28s} {'split':6s} {'loss':>9s} {'q-risk P50':>11s} {'q-risk P90':>11s} "
            f"{'cover 10-90':>11s}")
    lines = [head, "-" * len(head)]
    for split in ("train", "val", "test"):
        for name, by_split in rows:
            if split in by_split:
                m = by_split[split]
                cov = m.get("coverage_80", float("nan"))
                lines.append(f"{name:28s} {split:6s} {m['loss']:9.4f} {m['q_risk_50']:11.4f} "
                             f"{m['q_risk_90']:11.4f} {cov:11.3f}")
    return "\n".join(lines)
