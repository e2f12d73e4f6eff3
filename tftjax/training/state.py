"""The TFT's train state and optimizer.

``TrainState`` is a flax ``TrainState`` plus ``quant_stats`` (the QAT activation
observers) and ``ema_params``; its optimizer is :mod:`tftjax.training.optimizer`'s, run the
way the config's kernels say.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from flax.training import train_state

from tftjax.config import TFTConfig, TrainConfig
from tftjax.models.tft import apply_fn, init_variables
from tftjax.training.optimizer import backend_of, make_optimizer

Array = jax.Array


class TrainState(train_state.TrainState):
    """``step``, ``params``, ``opt_state``, ``quant_stats`` (pytrees) plus static
    ``apply_fn``/``tx``. ``quant_stats``: the QAT activation observers (empty for a float
    model), updated by every training step and checkpointed with the rest."""

    tx: Any = struct.field(pytree_node=False)
    """The optimizer (:class:`tftjax.training.optimizer.Optimizer`: optax's ``init`` and
    ``update``, and its fused ``step``)."""
    quant_stats: Any = struct.field(default_factory=dict)
    ema_params: Any = struct.field(default_factory=dict)
    """``--ema``: the moving average of ``params`` (empty: off), what is evaluated and kept."""

    def variables(self) -> dict:
        """The Flax variables to evaluate with (the weights' moving average under ``--ema``)."""
        return {"params": self.ema_params or self.params, "quant_stats": self.quant_stats}


def member_keys(key: Array, n: int) -> Array:
    """``[n]`` keys of an ensemble's members: member 0 has ``key`` itself (so that it is the
    single model of the same seed), member ``i`` ``fold_in(key, i)``."""
    return jax.vmap(
        lambda i: jax.lax.cond(i == 0, lambda: key, lambda: jax.random.fold_in(key, i))
    )(jnp.arange(n))


def create_train_state(
    cfg: TFTConfig, tc: TrainConfig, key: Array, total_steps: int | None = None
) -> TrainState:
    """A fresh state; ``total_steps``: the run's optimizer steps (for a cosine schedule).
    ``--ensemble N``: every leaf (the step count too) stacked over a leading member axis,
    member ``i`` initialised from :func:`member_keys`' ``i``-th key."""
    if cfg.model.ensemble > 1:
        one = cfg.override(ensemble=1)
        keys = member_keys(key, cfg.model.ensemble)
        members = [
            create_train_state(one, tc, keys[i], total_steps) for i in range(cfg.model.ensemble)
        ]
        stack = lambda *xs: jnp.stack([jnp.asarray(x) for x in xs])
        return members[0].replace(
            **{
                f: jax.tree.map(stack, *[getattr(m, f) for m in members])
                for f in ("step", "params", "opt_state", "quant_stats", "ema_params")
            }
        )
    variables = init_variables(cfg, key)
    tx = make_optimizer(tc, total_steps, *backend_of(cfg))
    return TrainState(
        step=0,
        apply_fn=apply_fn(cfg),
        params=variables["params"],
        tx=tx,
        opt_state=_init_fn(tx)(variables["params"]),
        quant_stats=variables.get("quant_stats", {}),
        ema_params=(jax.tree.map(jnp.copy, variables["params"]) if tc.ema > 0 else {}),
    )


@functools.lru_cache(maxsize=None)
def _init_fn(tx):
    # Jitted: run eagerly, every zeros_like of the optimizer state is an XLA compile of its
    # own (dozens per model, a few seconds on XLA:CPU); tx objects are cached, so this is
    # one compile per optimizer and model shape.
    return jax.jit(tx.init)


def abstract_train_state(cfg: TFTConfig, tc: TrainConfig, total_steps: int | None = None):
    """Shapes and dtypes of :func:`create_train_state`'s state (nothing allocated)."""
    return jax.eval_shape(lambda k: create_train_state(cfg, tc, k, total_steps), jax.random.key(0))
