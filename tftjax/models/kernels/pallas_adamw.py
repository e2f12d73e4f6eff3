"""The optimizer step (global-norm clip, AdamW, the parameter update) as Pallas kernels over
every parameter at once (GPU, Triton): apex's multi-tensor apply, in JAX.

On a GPU, optax's ``chain(clip_by_global_norm, adamw)`` plus ``apply_updates`` compiles to
one sum-of-squares reduction and one update fusion per parameter leaf: for TFT-225, 149 +
142 kernel launches per step, a third of the step's launches once the VSN and LSTM run as
Pallas kernels (``docs/precision-gpu.md``). Here the same arithmetic runs as:

* **one norm kernel** over every gradient leaf: one program per ``BLOCK`` elements of one
  leaf (the leaves' blocks laid end to end, each program's leaf chosen by a static branch
  on its program index), each writing its block's sum of squares; XLA adds the partial
  sums (one reduction) into the global norm;
* **one update kernel per group** of at most :data:`GROUP` leaves (a CUDA kernel's
  parameters are limited to 4 KB: seven pointers a leaf), laid out the same way: each
  program reads its block of ``p``, ``g``, ``mu`` and ``nu`` and writes ``p``, ``mu`` and
  ``nu`` back in place (``input_output_aliases``; the train step donates its state).

The arithmetic is optax's, expression by expression (``optax.clip_by_global_norm``,
``scale_by_adam``, ``add_decayed_weights`` under its mask, ``scale_by_learning_rate``,
``apply_updates``), and the optimizer state keeps optax's structure and values: a run can
switch between ``--optimizer-kernel xla`` and ``pallas``, and resume across them. Only
the global norm's summation order differs (blocks, then the partial sums, instead of leaf
by leaf), so results agree to float32 round-off, not bit for bit.

On CPU the kernels run in Pallas' interpreter (the tests compare them with optax there).
Compiled for the H100 target without a GPU (``tftjax.memory.targets``) each kernel is one
``__gpu$xla.gpu.triton`` custom call.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.experimental import pallas as pl

from tftjax.models.kernels import multi_tensor as mt
from tftjax.models.kernels.triton_util import triton_params

Array = jax.Array
GROUP = 48
"""Leaves per update kernel: 7 pointers each, 2.7 KB of the 4 KB a CUDA kernel may take."""


@dataclasses.dataclass(frozen=True)
class AdamW:
    """What :func:`tftjax.training.optimizer.make_optimizer` built: optax's
    ``chain(clip_by_global_norm(clip), adamw(rate, weight_decay=..., mask=...))``."""

    rate: float | Callable
    """The learning rate, or its schedule of the optimizer step (optax's)."""
    weight_decay: float
    clip: float
    mask: Callable | None
    """None: decay every leaf; else optax's mask of which leaves to decay
    (:func:`~tftjax.training.optimizer.decay_mask`)."""
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    eps_root: float = 0.0


def _norm_kernel(*refs, leaves: tuple[mt.Leaf, ...]):
    *g_refs, out_ref = refs
    i = pl.program_id(0)  # read here: the interpreter cannot read it inside a branch
    for leaf, g_ref in zip(leaves, g_refs):

        @pl.when(mt.mine(i, leaf))
        def _(leaf=leaf, g_ref=g_ref):
            sl, mask = mt.block(i, leaf)
            g = mt.load(g_ref, sl, mask).astype(jnp.float32)
            out_ref[i] = jnp.sum(g * g)


def _update_kernel(*refs, leaves: tuple[mt.Leaf, ...], h: AdamW):
    n = len(leaves)
    s_ref = refs[0]
    p_in, g_in, mu_in, nu_in = (refs[1 + k * n : 1 + (k + 1) * n] for k in range(4))
    p_out, mu_out, nu_out = (refs[1 + 4 * n + k * n : 1 + 4 * n + (k + 1) * n] for k in range(3))
    pid = pl.program_id(0)  # read here: the interpreter cannot read it inside a branch
    for i, leaf in enumerate(leaves):

        @pl.when(mt.mine(pid, leaf))
        def _(i=i, leaf=leaf):
            g_norm, trigger, bc1, bc2, step_size = (s_ref[k] for k in range(5))
            sl, mask = mt.block(pid, leaf)
            p = mt.load(p_in[i], sl, mask)
            g = mt.load(g_in[i], sl, mask).astype(jnp.float32)  # bf16 gradients too
            mu = mt.load(mu_in[i], sl, mask)
            nu = mt.load(nu_in[i], sl, mask)
            # optax.clip_by_global_norm
            g = jnp.where(trigger > 0, g, (g / g_norm) * h.clip)
            # optax.scale_by_adam (update_moment, update_moment_per_elem_norm, bias_correction)
            mu = (1 - h.b1) * g + h.b1 * mu
            nu = (1 - h.b2) * (g * g) + h.b2 * nu
            u = (mu / bc1) / (jnp.sqrt(nu / bc2 + h.eps_root) + h.eps)
            if leaf.decay:  # optax.add_decayed_weights (masked)
                u = u + h.weight_decay * p
            u = step_size * u  # optax.scale_by_learning_rate
            mt.store(p_out[i], sl, p + u, mask)  # optax.apply_updates
            mt.store(mu_out[i], sl, mu, mask)
            mt.store(nu_out[i], sl, nu, mask)


def decays(h: AdamW, params) -> list[bool]:
    """Whether each leaf of ``params`` takes weight decay (optax's mask, leaf by leaf)."""
    if h.mask is None:
        return [True] * len(jax.tree.leaves(params))
    return [bool(b) for b in jax.tree.leaves(h.mask(params))]


def global_norm(grads, *, interpret: bool) -> Array:
    """``optax.global_norm(grads)`` through the norm kernel (one launch and one reduction)."""
    flat = [g.reshape(-1) for g in jax.tree.leaves(grads)]
    leaves, total = mt.layout([g.size for g in flat], [False] * len(flat))
    partial = pl.pallas_call(
        functools.partial(_norm_kernel, leaves=leaves),
        out_shape=jax.ShapeDtypeStruct((total,), jnp.float32),
        grid=(total,),
        in_specs=[pl.no_block_spec] * len(flat),
        out_specs=pl.no_block_spec,
        interpret=interpret,
        compiler_params=triton_params(interpret),
        name="adamw_grad_norm",
    )(*flat)
    return jnp.sqrt(jnp.sum(partial))


def adam_state(opt_state):
    """``(clip, adam, mask, schedule)`` states of optax's ``chain(clip_by_global_norm,
    adamw)``, the state of :func:`tftjax.training.optimizer.make_optimizer`."""
    clip_state, inner = opt_state
    adam = inner[0]
    if not isinstance(adam, optax.ScaleByAdamState) or len(inner) != 3:
        raise TypeError(
            "pallas_adamw.step expects the optimizer state of "
            "tftjax.training.optimizer.make_optimizer (clip, then adamw)"
        )
    return clip_state, adam, inner[1], inner[2]


def step(h: AdamW, params, grads, opt_state, *, interpret: bool) -> tuple[Any, Any, Array]:
    """One optimizer step: ``(new params, new optimizer state, the gradients' global norm
    before clipping)``, as optax's chain and ``apply_updates`` would give."""
    clip_state, adam, mask_state, sched_state = adam_state(opt_state)
    leaves_p, tree = jax.tree.flatten(params)
    leaves_g = tree.flatten_up_to(grads)
    leaves_mu, leaves_nu = tree.flatten_up_to(adam.mu), tree.flatten_up_to(adam.nu)
    for p in leaves_p + leaves_mu + leaves_nu:
        if p.dtype != jnp.float32:
            raise TypeError(f"pallas_adamw: float32 parameters and moments only, got {p.dtype}")
    for g in leaves_g:
        if g.dtype not in (jnp.float32, jnp.bfloat16):
            raise TypeError(f"pallas_adamw: float32 or bfloat16 gradients only, got {g.dtype}")
    g_norm = global_norm(leaves_g, interpret=interpret)
    trigger = g_norm < h.clip
    count_inc = optax.safe_increment(adam.count)
    bc1 = 1 - h.b1**count_inc
    bc2 = 1 - h.b2**count_inc
    if callable(h.rate):
        step_size = -1 * h.rate(sched_state.count)
        sched_state = sched_state._replace(count=optax.safe_increment(sched_state.count))
    else:
        step_size = -1 * h.rate
    scalars = jnp.stack(
        [
            g_norm,
            trigger.astype(jnp.float32),
            jnp.asarray(bc1, jnp.float32),
            jnp.asarray(bc2, jnp.float32),
            jnp.asarray(step_size, jnp.float32),
        ]
    )
    decays_ = decays(h, params)
    new_p, new_mu, new_nu = [], [], []
    for lo in range(0, len(leaves_p), GROUP):
        sl = slice(lo, lo + GROUP)
        flat = [
            [a.reshape(-1) for a in xs[sl]] for xs in (leaves_p, leaves_g, leaves_mu, leaves_nu)
        ]
        leaves, total = mt.layout([a.size for a in flat[0]], decays_[sl])
        n = len(leaves)
        outs = pl.pallas_call(
            functools.partial(_update_kernel, leaves=leaves, h=h),
            out_shape=[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in flat[0] * 3],
            grid=(total,),
            in_specs=[pl.no_block_spec] * (1 + 4 * n),
            out_specs=[pl.no_block_spec] * (3 * n),
            input_output_aliases={
                1 + k * n + i: k2 * n + i for k, k2 in ((0, 0), (2, 1), (3, 2)) for i in range(n)
            },
            interpret=interpret,
            compiler_params=triton_params(interpret),
            name="adamw_update",
        )(scalars, *flat[0], *flat[1], *flat[2], *flat[3])
        for xs, out in zip((new_p, new_mu, new_nu), (outs[:n], outs[n : 2 * n], outs[2 * n :])):
            xs.extend(o.reshape(a.shape) for o, a in zip(out, leaves_p[sl]))
    unflat = functools.partial(jax.tree.unflatten, tree)
    adam = optax.ScaleByAdamState(count=count_inc, mu=unflat(new_mu), nu=unflat(new_nu))
    return unflat(new_p), (clip_state, (adam, mask_state, sched_state)), g_norm
