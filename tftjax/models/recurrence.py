"""The LSTM recurrence with a hand-written backward pass (``jax.custom_vjp``).

Left to autodiff, a ``lax.scan`` LSTM step stacks a dozen residuals per step (each gate's
activation, products, the cell's tanh), and on a GPU each stacked residual is its own small
kernel per step: compiled for the H100 spec, TFT-225's two LSTMs were 1,624 of the step's
2,472 kernel launches (``python -m tftjax.memory --target h100 --cost``). Here the forward
step keeps the gates' pre-activations and the cell state, and the backward
step recomputes the activations from them in float32 (the remat tiers keep less: the
gates are recomputed from the inputs, kept anyway, and the saved outputs). The kernels'
gradients are one GEMM each after the backward scan (``Σ_t h_{t-1}ᵀ dgates_t``,
``Σ_t x_tᵀ dgates_t``), accumulated in float32 with bf16 compute too.

Gates are laid out i, f, g, o; ``c`` is float32 in every compute dtype, ``h`` and the gates
are the compute dtype (that of ``xp``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from tftjax.models.kernels import pallas_lstm
from tftjax.models.kernels.mode import KernelMode

Array = jax.Array
F32 = jnp.float32


def _scan(xp: Array, w_h: Array, c0: Array, h0: Array):
    wd = w_h.astype(xp.dtype)

    def step(carry, x_t):
        c, h = carry
        gates = checkpoint_name(x_t + h @ wd, "lstm_gates")
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)  # float32 (c's dtype)
        h = (jax.nn.sigmoid(o) * jnp.tanh(c)).astype(x_t.dtype)
        return (c, h), (gates, c, h)

    (c, h), (gates, cs, hs) = lax.scan(step, (c0, h0), xp)
    return (c, h), hs, gates, cs


def _recur(xp: Array, w_h: Array, c0: Array, h0: Array, kernel: KernelMode):
    """The forward recurrence: a ``lax.scan``, or one Pallas kernel
    (``tftjax.models.kernels.pallas_lstm``, compiled for a GPU or interpreted)."""
    if not kernel.pallas:
        return _scan(xp, w_h, c0, h0)
    gates, cs, hs = pallas_lstm.forward(
        xp, w_h.astype(xp.dtype), c0, h0, interpret=kernel.interpret
    )
    return (cs[-1], hs[-1]), hs, gates, cs


def _lstm_recurrence(
    xs: Array,
    w_i: Array,
    b: Array,
    w_h: Array,
    c0: Array,
    h0: Array,
    recompute: bool = False,
    kernel: KernelMode = KernelMode.XLA,
) -> tuple[tuple[Array, Array], Array]:
    """``((c_T, h_T), h_{1..T})`` of the LSTM over ``xs`` ``[T, B, F]`` (time-major, the
    compute dtype), with input kernel ``w_i`` ``[F, 4d]`` and bias ``b`` ``[4d]``, recurrent
    kernel ``w_h`` ``[d, 4d]`` (any float dtype: cast to the compute dtype inside the step),
    ``c0`` ``[B, d]`` float32 and ``h0`` ``[B, d]``.

    ``recompute`` (the remat tiers): the backward pass recomputes the input projection and
    the gates from ``xs`` and the saved outputs, so the step keeps only the cell states and
    outputs (``xs`` is the VSN's output, kept anyway); else it keeps the gates too.

    ``kernel``: both recurrences as persistent Pallas kernels (``tftjax.models.kernels.pallas_lstm``),
    compiled (GPU) or interpreted (CPU tests); XLA: ``lax.scan``s."""
    carry, hs, _, _ = _recur(_project(xs, w_i, b), w_h, c0, h0, kernel)
    return carry, hs


def _project(xs, w_i, b):
    return jnp.einsum("tbf,fg->tbg", xs, w_i) + b


def _fwd(xs, w_i, b, w_h, c0, h0, recompute, kernel):
    carry, hs, gates, cs = _recur(_project(xs, w_i, b), w_h, c0, h0, kernel)
    return (carry, hs), (xs, w_i, b, w_h, c0, h0, None if recompute else gates, cs, hs)


def _bwd(recompute, kernel, res, ct):
    xs, w_i, b, w_h, c0, h0, gates, cs, hs = res
    (dc_t, dh_t), dhs = ct
    dt = xs.dtype
    wd = w_h.astype(dt)
    c_prev = jnp.concatenate([c0[None], cs[:-1]], axis=0)
    h_prev = jnp.concatenate([h0[None], hs[:-1]], axis=0)
    if recompute:  # the gates again: one GEMM for the projection, one per step
        gates = _project(xs, w_i, b) + jnp.einsum("tbd,dg->tbg", h_prev, wd)

    def step(carry, xs_t):
        dc, dh = carry
        g_t, c_t, cp_t, dh_out = xs_t
        dh = dh + dh_out.astype(F32)
        i, f, g, o = jnp.split(g_t.astype(F32), 4, axis=-1)
        si, sf, tg, so = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
        tc = jnp.tanh(c_t)
        dc = dc + dh * so * (1.0 - tc * tc)
        dgates = jnp.concatenate(
            [
                dc * tg * si * (1.0 - si),
                dc * cp_t * sf * (1.0 - sf),
                dc * si * (1.0 - tg * tg),
                dh * tc * so * (1.0 - so),
            ],
            axis=-1,
        ).astype(dt)
        dh_prev = lax.dot_general(dgates, wd, (((1,), (1,)), ((), ())), preferred_element_type=F32)
        return (dc * sf, dh_prev), dgates

    if not kernel.pallas:
        (dc0, dh0), dgates = lax.scan(
            step, (dc_t.astype(F32), dh_t.astype(F32)), (gates, cs, c_prev, dhs), reverse=True
        )
    else:
        dgates, dc0, dh0 = pallas_lstm.backward(
            gates.astype(dt), cs, c0, dhs, dc_t, dh_t, wd, interpret=kernel.interpret
        )
    dw_h = jnp.einsum("tbd,tbg->dg", h_prev, dgates, preferred_element_type=F32)
    dw_i = jnp.einsum("tbf,tbg->fg", xs, dgates, preferred_element_type=F32)
    dxs = jnp.einsum("tbg,fg->tbf", dgates, w_i)
    db = dgates.astype(F32).sum((0, 1))
    return (
        dxs.astype(xs.dtype),
        dw_i.astype(w_i.dtype),
        db.astype(b.dtype),
        dw_h.astype(w_h.dtype),
        dc0.astype(c0.dtype),
        dh0.astype(h0.dtype),
    )


lstm_recurrence = jax.custom_vjp(_lstm_recurrence, nondiff_argnums=(6, 7))
lstm_recurrence.defvjp(_fwd, _bwd)
