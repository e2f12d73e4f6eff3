"""The TFT's train state and optimizer.

``TrainState`` is a flax ``TrainState`` plus ``quant_stats`` (the QAT activation
observers); the optimizer is AdamW with global-norm clipping, a learning-rate
schedule and weight decay on every parameter or on weight matrices only.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training import train_state

from tftjax.config import TFTConfig, TrainConfig
from tftjax.models.tft import apply_fn, init_variables
from tftjax.models.kernels import pallas_adamw

Array = jax.Array


class TrainState(train_state.TrainState):
    """``step``, ``params``, ``opt_state``, ``quant_stats`` (pytrees) plus static
    ``apply_fn``/``tx``. ``quant_stats``: the QAT activation observers (empty for a float
    model), updated by every training step and checkpointed with the rest."""

    quant_stats: Any = struct.field(default_factory=dict)
    ema_params: Any = struct.field(default_factory=dict)
    """``--ema``: the moving average of ``params`` (empty: off), what is evaluated and kept."""

    def variables(self) -> dict:
        """The Flax variables to evaluate with (the weights' moving average under ``--ema``)."""
        return {"params": self.ema_params or self.params, "quant_stats": self.quant_stats}


def make_optimizer(tc: TrainConfig, total_steps: int | None = None) -> optax.GradientTransformation:
    """AdamW with global-norm clipping, the learning-rate schedule of ``tc`` over
    ``total_steps`` (only a cosine schedule needs it) and weight decay on every parameter or
    on weight matrices only (``tc.decay_all``)."""
    total = int(total_steps or 1)
    if tc.lr_schedule == "constant" and not tc.warmup_steps:
        total = 0  # the schedule does not depend on it: one cached optimizer
    return _optimizer(tc.learning_rate, tc.weight_decay, tc.grad_clip, tc.lr_schedule,
                      tc.warmup_steps, total, tc.decay_all)


def learning_rate(tc: TrainConfig, total_steps: int | None, step: int) -> float:
    """The learning rate :func:`make_optimizer`'s schedule gives at optimizer step ``step``."""
    rate = _schedule(tc.learning_rate, tc.lr_schedule, tc.warmup_steps, int(total_steps or 1))
    return float(rate(step)) if callable(rate) else float(rate)


def _schedule(lr: float, schedule: str, warmup: int, total: int):
    if schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total, warmup + 1), 0.0)
    if warmup:
        return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup),
                                     optax.constant_schedule(lr)], [warmup])
    return lr


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
    rate = _schedule(lr, schedule, warmup, total)
    mask = None if decay_all else decay_mask
    tx = optax.chain(optax.clip_by_global_norm(clip),
                     optax.adamw(rate, weight_decay=weight_decay, mask=mask))
    # what --optimizer-kernel pallas needs to run the same optimizer as Pallas kernels
    pallas_adamw.register(tx, pallas_adamw.AdamW(rate, weight_decay, clip, mask))
    return tx


def member_keys(key: Array, n: int) -> Array:
    """``[n]`` keys of an ensemble's members: member 0 has ``key`` itself (so that it is the
    single model of the same seed), member ``i`` ``fold_in(key, i)``."""
    return jax.vmap(lambda i: jax.lax.cond(i == 0, lambda: key,
                                           lambda: jax.random.fold_in(key, i)))(jnp.arange(n))


def create_train_state(cfg: TFTConfig, tc: TrainConfig, key: Array,
                       total_steps: int | None = None) -> TrainState:
    """A fresh state; ``total_steps``: the run's optimizer steps (for a cosine schedule).
    ``--ensemble N``: every leaf (the step count too) stacked over a leading member axis,
    member ``i`` initialised from :func:`member_keys`' ``i``-th key."""
    if cfg.model.ensemble > 1:
        one = cfg.override(ensemble=1)
        keys = member_keys(key, cfg.model.ensemble)
        members = [create_train_state(one, tc, keys[i], total_steps)
                   for i in range(cfg.model.ensemble)]
        stack = lambda *xs: jnp.stack([jnp.asarray(x) for x in xs])  # noqa: E731
        return members[0].replace(**{f: jax.tree.map(stack, *[getattr(m, f) for m in members])
                                     for f in ("step", "params", "opt_state", "quant_stats",
                                               "ema_params")})
    variables = init_variables(cfg, key)
    tx = make_optimizer(tc, total_steps)
    return TrainState(step=0, apply_fn=apply_fn(cfg), params=variables["params"], tx=tx,
                      opt_state=_init_fn(tx)(variables["params"]),
                      quant_stats=variables.get("quant_stats", {}),
                      ema_params=(jax.tree.map(jnp.copy, variables["params"]) if tc.ema > 0
                                  else {}))


@functools.lru_cache(maxsize=None)
def _init_fn(tx: optax.GradientTransformation):
    # Jitted: run eagerly, every zeros_like of the optimizer state is an XLA compile of its
    # own (dozens per model, a few seconds on XLA:CPU); tx objects are cached, so this is
    # one compile per optimizer and model shape.
    return jax.jit(tx.init)


def abstract_train_state(cfg: TFTConfig, tc: TrainConfig, total_steps: int | None = None):
    """Shapes and dtypes of :func:`create_train_state`'s state (nothing allocated)."""
    return jax.eval_shape(lambda k: create_train_state(cfg, tc, k, total_steps),
                          jax.random.key(0))
