"""The TFT's optimizer: global-norm clipping, then AdamW with the run's learning-rate schedule
and weight decay on every parameter or on weight matrices only.

One optax ``GradientTransformation`` (:class:`Optimizer`: ``init`` and ``update`` as optax
defines them, usable wherever optax's are) with three ways to run its step, all with
optax's arithmetic and optax's optimizer state, so that checkpoints, ``--resume`` and a
switch between them keep working:

=========  ===============================================================================
``optax``  ``optax.chain(clip_by_global_norm, adamw)`` and ``apply_updates``: a reduction
           and an update fusion per parameter leaf (``--kernels xla``)
``flat``   the same expressions on every leaf laid end to end in one buffer: a few XLA
           launches in all (``--kernels pallas --kernels-exclude optimizer``)
``pallas`` :mod:`tftjax.models.kernels.pallas_adamw`: one norm kernel and one update kernel
           per 48 leaves, the parameters written in place (``--kernels pallas``)
=========  ===============================================================================

The train step calls :attr:`Optimizer.step`, which returns the new parameters directly
(the in-place kernels never materialise an update); ``update`` gives optax's updates for
any other caller. Only the global norm's summation order differs between the three, so
they agree to float32 round-off.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from tftjax.config import TFTConfig, TrainConfig
from tftjax.models.kernels import pallas_adamw
from tftjax.models.kernels.pallas_adamw import AdamW

Backend = Literal["optax", "flat", "pallas"]


class Optimizer(NamedTuple):
    """An optax ``GradientTransformation`` (``init``, ``update``) plus its fused ``step``."""

    init: Callable
    update: Callable
    step: Callable
    """``(params, grads, opt_state) -> (new params, new state, the gradients' global norm
    before clipping)``."""
    hyper: AdamW
    backend: str


def backend_of(cfg: TFTConfig) -> tuple[Backend, bool]:
    """``(backend, interpret)`` of ``cfg``'s optimizer: the Pallas kernels where
    ``--kernels pallas`` includes the optimizer (interpreted off a GPU), the flat XLA buffer
    where it excludes it, optax's per-leaf update under ``--kernels xla``."""
    from tftjax.config import Kernels
    from tftjax.models.compute import kernel_mode

    mode = kernel_mode(cfg, "optimizer")
    if mode.pallas:
        return "pallas", mode.interpret
    return ("flat" if cfg.execution.kernels == Kernels.PALLAS else "optax"), False


def make_optimizer(
    tc: TrainConfig,
    total_steps: int | None = None,
    backend: Backend = "optax",
    interpret: bool = False,
) -> Optimizer:
    """The optimizer of ``tc`` over ``total_steps`` (only a cosine schedule needs them).
    Equal settings give the same object, so that every run of a process hits jit's cache
    (the optimizer is a static field of the train state)."""
    total = int(total_steps or 1)
    if tc.lr_schedule == "constant" and not tc.warmup_steps:
        total = 0  # the schedule does not depend on it: one cached optimizer
    return _optimizer(
        tc.learning_rate,
        tc.weight_decay,
        tc.grad_clip,
        tc.lr_schedule,
        tc.warmup_steps,
        total,
        tc.decay_all,
        backend,
        interpret,
    )


def learning_rate(tc: TrainConfig, total_steps: int | None, step: int) -> float:
    """The learning rate :func:`make_optimizer`'s schedule gives at optimizer step ``step``."""
    rate = schedule(tc.learning_rate, tc.lr_schedule, tc.warmup_steps, int(total_steps or 1))
    return float(rate(step)) if callable(rate) else float(rate)  # type: ignore[arg-type]


def schedule(lr: float, kind: str, warmup: int, total: int):
    """The learning rate, or its schedule of the optimizer step (optax's)."""
    if kind == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total, warmup + 1), 0.0)
    if warmup:
        return optax.join_schedules(
            [optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup]
        )
    return lr


def decay_mask(params):
    """True for the weight matrices (kernels, stacked and LSTM weights), False for biases,
    LayerNorm scales/offsets and the per-variable input embeddings (``emb_k``, ``emb_b``)."""

    def keep(path, x):
        name = str(getattr(path[-1], "key", path[-1]))
        return name in ("kernel", "w_i", "w_h") or (name.endswith("_k") and name != "emb_k")

    return jax.tree_util.tree_map_with_path(keep, params)


@functools.lru_cache(maxsize=None)
def _optimizer(
    lr: float,
    weight_decay: float,
    clip: float,
    kind: str = "constant",
    warmup: int = 0,
    total: int = 0,
    decay_all: bool = True,
    backend: Backend = "optax",
    interpret: bool = False,
) -> Optimizer:
    rate = schedule(lr, kind, warmup, total)
    mask = None if decay_all else decay_mask
    chain = optax.chain(
        optax.clip_by_global_norm(clip), optax.adamw(rate, weight_decay=weight_decay, mask=mask)
    )
    h = AdamW(rate, weight_decay, clip, mask)
    if backend == "optax":
        step = functools.partial(_optax_step, chain)
    elif backend == "flat":
        step = functools.partial(_flat_step, h)
    elif backend == "pallas":
        step = functools.partial(_pallas_step, h, interpret)
    else:
        raise ValueError(f"unknown optimizer backend {backend!r}")
    update = chain.update if backend == "optax" else functools.partial(_update_from_step, step)
    return Optimizer(chain.init, update, step, h, backend)


def _update_from_step(step: Callable, grads, state, params=None):
    """optax's ``update`` from a fused step: the updates are the new parameters less the
    old."""
    if params is None:
        raise ValueError("this optimizer's update needs the parameters (AdamW's decay)")
    new, state, _ = step(params, grads, state)
    return jax.tree.map(jnp.subtract, new, params), state


def _optax_step(chain, params, grads, state):
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    updates, state = chain.update(grads, state, params)
    return optax.apply_updates(params, updates), state, optax.global_norm(grads)


def _pallas_step(h: AdamW, interpret: bool, params, grads, state):
    return pallas_adamw.step(h, params, grads, state, interpret=interpret)


def _flat_step(h: AdamW, params, grads, state) -> tuple[Any, Any, jax.Array]:
    """optax's clip, AdamW and update on every leaf laid end to end in one float32 buffer
    (the expressions of :mod:`tftjax.models.kernels.pallas_adamw`'s update kernel)."""
    clip_state, adam, mask_state, sched_state = pallas_adamw.adam_state(state)
    leaves_p, tree = jax.tree.flatten(params)
    flat = [
        jnp.concatenate([a.astype(jnp.float32).reshape(-1) for a in xs])
        for xs in (
            leaves_p,
            tree.flatten_up_to(grads),
            tree.flatten_up_to(adam.mu),
            tree.flatten_up_to(adam.nu),
        )
    ]
    p, g, mu, nu = flat
    g_norm = jnp.sqrt(jnp.sum(g * g))
    g = jnp.where(g_norm < h.clip, g, (g / g_norm) * h.clip)  # optax.clip_by_global_norm
    count = optax.safe_increment(adam.count)
    mu = (1 - h.b1) * g + h.b1 * mu  # optax.scale_by_adam
    nu = (1 - h.b2) * (g * g) + h.b2 * nu
    u = (mu / (1 - h.b1**count)) / (jnp.sqrt(nu / (1 - h.b2**count) + h.eps_root) + h.eps)
    decays = pallas_adamw.decays(h, params)
    if any(decays):  # optax.add_decayed_weights, masked
        keep = jnp.concatenate([jnp.full(a.size, d, jnp.float32) for a, d in zip(leaves_p, decays)])
        u = u + h.weight_decay * keep * p
    if callable(h.rate):  # optax.scale_by_learning_rate
        step_size = -1 * h.rate(sched_state.count)
        sched_state = sched_state._replace(count=optax.safe_increment(sched_state.count))
    else:
        step_size = -1 * h.rate
    p = p + step_size * u  # optax.apply_updates
    split = functools.partial(_split, leaves_p, tree)
    adam = optax.ScaleByAdamState(count=count, mu=split(mu), nu=split(nu))
    return split(p), (clip_state, (adam, mask_state, sched_state)), g_norm


def _split(like: list, tree, flat: jax.Array):
    """The buffer ``flat`` back as leaves shaped (and typed) as ``like``, in ``tree``."""
    out, at = [], 0
    for a in like:
        out.append(flat[at : at + a.size].reshape(a.shape).astype(a.dtype))
        at += a.size
    return jax.tree.unflatten(tree, out)
