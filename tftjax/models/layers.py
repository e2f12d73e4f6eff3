"""TFT building blocks as Flax linen modules.

Shape glossary:
  B  batch            T   time steps (T_e encoder + T_d decoder)
  N  flattened rows (B or B·T)
  m  variables in a selection network      d_v per-variable embedding size
  d  hidden size      H   attention heads  d_h = d / H

Choices where the reference implementations differ (tft_spec.md):
  * skip connection when sizes differ: a Dense projection (google-research);
  * real inputs: a per-variable ``Linear(1 → d_v)`` then a per-variable
    ``GRN(d_v, d_v, d)`` (pytorch-forecasting), in the variable selection
    networks of :mod:`tftjax.models.vsn`;
  * attention: queries at the decoder steps only, and a decoder step sees
    itself and everything before it (google-research's ``j <= i``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from tftjax.models.dropout import Dropout
from tftjax.models.kernels import pallas_attention
from tftjax.models.kernels.mode import KernelMode
from tftjax.models.recurrence import lstm_recurrence
from tftjax.quant import core as qt
from tftjax.quant.calib import calibration_record, calibration_stats
from tftjax.quant.core import QuantSpec

Array = jax.Array
Policy = Callable[..., Any] | None


def _einsum_f32(spec: str, a: Array, b: Array) -> Array:
    """``jnp.einsum(spec, a, b)`` with float32 products and accumulation whatever the
    operands' dtype (bf16 compute: bfloat16 operands, a float32 result), and a backward pass
    in the operands' dtype: the float32 cotangent is cast to it first, so the transposed
    matmuls are bfloat16 × bfloat16 too (left to autodiff they would promote the bfloat16
    operand and run in float32). float32 operands: exactly ``jnp.einsum``."""
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _einsum_f32_fwd(spec, a, b):
    return einsum_f32(spec, a, b), (a, b)


def _einsum_f32_bwd(spec, res, g):
    a, b = res
    _, vjp = jax.vjp(lambda a, b: jnp.einsum(spec, a, b), a, b)
    return vjp(g.astype(jnp.result_type(a, b)))


einsum_f32 = jax.custom_vjp(_einsum_f32, nondiff_argnums=(0,))
einsum_f32.defvjp(_einsum_f32_fwd, _einsum_f32_bwd)


def dense(mod: Any, param: str, x: jax.Array, w: jax.Array, quant: QuantSpec | None) -> jax.Array:
    """``x @ w`` over the last axis of ``x`` and the first of ``w``, quantized when
    ``quant`` covers the layer: ``fake``: ``fq(x) @ fq(w)``; ``int8``: int8 operands,
    int32 accumulation, rescaled after."""
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    if not qt.covered(quant, mod.path, param):
        return jax.lax.dot_general(x, w, dims)
    if quant.calibrate is not None:  # record, quantize no activation
        calibration_record(mod, param, x, quant)
        return jax.lax.dot_general(x, qt.weight(mod, param, w, quant), dims)
    stats = qt.observer(mod, param, x, quant)
    if quant.mode == "fake":
        wq = qt.weight(mod, param, w, quant)
        return jax.lax.dot_general(qt.quantize_observed(x, stats, quant.symmetric), wq, dims)
    s, zp = qt.activation_qparams(stats, quant.symmetric)
    qw, sw = qt.weight(mod, param, w, quant)
    return qt.int8_dense(qt.quantize_activation(x, s, zp), s, zp, qw, sw)


class Dense(nn.Module):
    """``nn.Dense`` (same parameters, initialisers and names) that quantizes when ``quant``
    covers its path: observed int8 input, int8 per-output-channel kernel (tftjax.quant)."""

    features: int
    use_bias: bool = True
    quant: QuantSpec | None = None
    zero_init: bool = False
    """A zero kernel (the anchored head: its untrained outputs are 0)."""

    @nn.compact
    def __call__(self, x: Array) -> Array:
        init = nn.initializers.zeros if self.zero_init else nn.initializers.lecun_normal()
        kernel = self.param("kernel", init, (x.shape[-1], self.features))
        y = dense(self, "kernel", x, kernel, self.quant)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,))
        return y


def norm_stats(x: Array, eps: float = 1e-6, fast: bool = False) -> tuple[Array, Array]:
    """Mean and ``1/sqrt(var + eps)`` over the last axis in float32 for any input dtype,
    recomputed in the backward pass from ``x`` itself (checkpointed), so that a bfloat16
    ``x`` leaves no float32 copy of itself behind as a residual. ``fast``: the variance as
    ``E[x²] − E[x]²`` (flax's LayerNorm), else ``E[(x − E[x])²]``."""

    def stats(x):
        xf = x.astype(jnp.float32)
        mean = xf.mean(-1, keepdims=True)
        if fast:
            var = jnp.maximum(0.0, jnp.square(xf).mean(-1, keepdims=True) - jnp.square(mean))
        else:
            var = jnp.square(xf - mean).mean(-1, keepdims=True)
        return mean, lax.rsqrt(var + eps)

    return jax.checkpoint(stats)(x)


class LayerNorm(nn.Module):
    """``flax.linen.LayerNorm`` (same parameters, names, epsilon and float32 arithmetic):
    statistics in float32, the normalisation in the input's dtype (bf16 compute: bfloat16
    output and residuals)."""

    epsilon: float = 1e-6

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        bias = self.param("bias", nn.initializers.zeros, (x.shape[-1],))
        mean, rstd = norm_stats(x, self.epsilon, fast=True)
        mul = (rstd * scale).astype(x.dtype)
        return (x - mean.astype(x.dtype)) * mul + bias.astype(x.dtype)


class GLU(nn.Module):
    """``σ(W_4 g + b_4) ⊙ (W_5 g + b_5)``, dropout on the input."""

    features: int
    dropout: float = 0.0
    quant: QuantSpec | None = None

    @nn.compact
    def __call__(self, x: Array, deterministic: bool = True) -> Array:
        x = Dropout(self.dropout)(x, deterministic)
        value, gate = jnp.split(
            Dense(2 * self.features, quant=self.quant, name="proj")(x), 2, axis=-1
        )
        return nn.sigmoid(gate) * value


class GRN(nn.Module):
    """Gated residual network ``LayerNorm(skip(a) + GLU(W_1 ELU(W_2 a + W_3 c + b_2) + b_1))``."""

    hidden: int
    output: int
    dropout: float = 0.0
    quant: QuantSpec | None = None

    @nn.compact
    def __call__(self, a: Array, context: Array | None = None, deterministic: bool = True) -> Array:
        dense = functools.partial(Dense, quant=self.quant)
        skip = a if a.shape[-1] == self.output else dense(self.output, name="skip")(a)
        h = dense(self.hidden, name="fc2")(a)
        if context is not None:
            h = h + dense(self.hidden, use_bias=False, name="context")(context)
        h = checkpoint_name(nn.elu(h), "grn_hidden")
        h = dense(self.hidden, name="fc1")(h)
        g = GLU(self.output, self.dropout, self.quant, name="glu")(h, deterministic)
        return LayerNorm(name="norm")(skip + g)


class GateAddNorm(nn.Module):
    """``LayerNorm(a + GLU(b))``."""

    features: int
    dropout: float = 0.0
    quant: QuantSpec | None = None

    @nn.compact
    def __call__(self, a: Array, b: Array, deterministic: bool = True) -> Array:
        glu = GLU(self.features, self.dropout, self.quant, name="glu")
        return LayerNorm(name="norm")(a + glu(b, deterministic))


class LSTM(nn.Module):
    """Single-layer LSTM over time, input projections hoisted out of the scan.

    Float (not quantized): :func:`tftjax.models.recurrence.lstm_recurrence`, whose
    backward pass recomputes the activations from the saved gates and cell states (every
    tier). Quantized: a ``lax.scan`` differentiated by autodiff; with ``remat`` its per-step
    body is ``jax.checkpoint``-ed, so the backward pass recomputes gates from the saved
    ``(c, h)`` carries.
    Parameters match ``nn.OptimizedLSTMCell``'s count: ``8d² + 4d``.

    Quantized (``quant``), ``w_i`` sees the observed int8 inputs; the recurrent
    ``h @ w_h`` quantizes ``h`` with the observer's range *before* this batch (a
    range cannot be known before the recurrence has run) and updates the
    observer once after the scan with every ``h`` the step multiplied; in the
    first training step (nothing observed yet) ``h`` passes unquantized.
    """

    features: int
    remat: bool = False
    policy: Policy = None
    quant: QuantSpec | None = None
    forget_bias: float = 0.0
    """Initial forget-gate bias (gates are laid out i, f, g, o)."""
    kernel: KernelMode = KernelMode.XLA
    """Float: both recurrences as persistent Pallas kernels (tftjax.models.kernels.pallas_lstm),
    compiled (GPU) or interpreted (CPU tests); XLA: ``lax.scan``s."""

    @nn.compact
    def __call__(self, carry: tuple[Array, Array], xs: Array) -> tuple[tuple[Array, Array], Array]:
        d = self.features
        w_i = self.param("w_i", nn.initializers.lecun_normal(), (xs.shape[-1], 4 * d))
        w_h = self.param("w_h", nn.initializers.orthogonal(), (d, 4 * d))

        def bias_init(key, shape, dtype=jnp.float32):
            return jnp.zeros(shape, dtype).at[d : 2 * d].set(self.forget_bias)

        b = self.param("b", bias_init, (4 * d,))
        if not (
            qt.covered(self.quant, self.path, "w_h") or qt.covered(self.quant, self.path, "w_i")
        ):
            # float: the recurrence with its hand-written backward pass (a few kernels per
            # step on a GPU); with remat it keeps only the cell states and outputs
            c0, h0 = carry[0].astype(jnp.float32), carry[1].astype(xs.dtype)
            carry, hs = lstm_recurrence(
                jnp.swapaxes(xs, 0, 1),
                w_i,
                b.astype(xs.dtype),
                w_h,
                c0,
                h0,
                self.remat,
                self.kernel,
            )
            return carry, jnp.swapaxes(hs, 0, 1)  # [B, T, d]
        xp = jnp.swapaxes(dense(self, "w_i", xs, w_i, self.quant), 0, 1) + b  # [T, B, 4d]

        recurrent, stats = self._recurrent(w_h)

        def step(state, x_t):
            c, h = state  # the cell state float32 (bf16 compute too), h the compute dtype
            gates = checkpoint_name(x_t + recurrent(h), "lstm_gates")
            i, f, g, o = jnp.split(gates, 4, axis=-1)
            c = nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g)  # (promoted to c's float32)
            h = (nn.sigmoid(o) * jnp.tanh(c)).astype(x_t.dtype)
            return (c, h), h

        if self.remat:
            step = jax.checkpoint(step, policy=self.policy, prevent_cse=False)
        c0, h0 = carry[0].astype(jnp.float32), carry[1].astype(xp.dtype)
        carry, hs = lax.scan(step, (c0, h0), xp)
        seen_h = lambda: jnp.concatenate([h0[None], hs[:-1]], axis=0)
        if stats is not None:  # every h the recurrent matmul saw: h_0 … h_{T-1}
            rec = qt.batch_range(seen_h())
            self.variable("quant_batch", "w_h_in", lambda: rec).value = rec
        elif (
            qt.covered(self.quant, self.path, "w_h")
            and self.quant.calibrate is not None
            and self.is_mutable_collection("quant_calib")
            and not self.is_initializing()
        ):
            ref = (
                self.get_variable("quant_stats", "w_h_in")
                if self.quant.calibrate == "mse"
                else None
            )
            rec = calibration_stats(
                seen_h(), self.quant.calibrate, ref, symmetric=self.quant.symmetric
            )
            self.variable("quant_calib", "w_h_in", lambda: rec).value = rec
        return carry, jnp.swapaxes(hs, 0, 1)  # [B, T, d]

    def _recurrent(self, w_h: Array):
        """``h ↦ h @ w_h`` (quantized when covered) and the observer to update after the
        scan (``None``: none, or not a training step)."""
        if not qt.covered(self.quant, self.path, "w_h"):
            return (lambda h: h @ w_h.astype(h.dtype)), None
        var = self.variable("quant_stats", "w_h_in", qt.init_minmax, ())
        update = self.is_mutable_collection("quant_batch") and not self.is_initializing()
        stats = var.value
        s, zp = qt.activation_qparams(stats, self.quant.symmetric)
        if self.quant.mode == "int8":
            qw, sw = qt.weight(self, "w_h", w_h, self.quant)
            return (
                lambda h: qt.int8_dense(qt.quantize_activation(h, s, zp), s, zp, qw, sw),
                var if update else None,
            )
        wq, seen = qt.weight(self, "w_h", w_h, self.quant), stats.count > 0
        if self.quant.calibrate is not None:  # a calibration pass: float h, recorded after
            return (lambda h: h @ wq), None
        return (lambda h: jnp.where(seen, qt.fake_quant(h, s, zp), h) @ wq, var if update else None)


class InterpretableAttention(nn.Module):
    """Multi-head attention with per-head Q/K, one shared V, heads averaged.

    ``H̃ = (1/H) Σ_h softmax(Q_h K_hᵀ / √d_h + mask) V``; output ``W_H H̃``.
    Returns the output and the head-averaged attention weights.
    """

    heads: int
    features: int
    dropout: float = 0.0
    quant: QuantSpec | None = None
    kernel: KernelMode = KernelMode.XLA
    """The attention itself as Pallas kernels (tftjax.models.kernels.pallas_attention), compiled (GPU)
    or interpreted (CPU tests)."""

    @nn.compact
    def __call__(
        self, q_in: Array, kv: Array, mask: Array, deterministic: bool = True
    ) -> tuple[Array, Array]:
        H = self.heads
        dh = self.features // H
        dense = functools.partial(Dense, quant=self.quant)
        qf = dense(H * dh, name="query")(q_in)
        q = qf.reshape(q_in.shape[:-1] + (H, dh))  # [B, Tq, H, dh]
        # No key bias: q·b_k is the same for every key, and softmax ignores it.
        kf = dense(H * dh, use_bias=False, name="key")(kv)
        k = kf.reshape(kv.shape[:-1] + (H, dh))
        v = dense(dh, name="value")(kv)  # [B, T, dh], shared by all heads
        # bf16 operands, float32 products and softmax (bf16 compute too)
        logits = einsum_f32("bqhd,bkhd->bhqk", q, k)
        logits = logits / jnp.sqrt(dh).astype(jnp.float32)
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
        attn = checkpoint_name(nn.softmax(logits, axis=-1), "attention_weights")  # [B, H, Tq, T]
        if not self.kernel.pallas:
            attn_d = Dropout(self.dropout)(attn.astype(v.dtype), deterministic)
            mixed = jnp.einsum("bhqk,bkd->bqd", attn_d, v) / H  # mean over heads [B, Tq, dh]
        else:  # the weights above only for the interpretation (unused in training: removed)
            keep = Dropout(self.dropout)(attn, deterministic, mask_only=True)  # the same units
            mixed = pallas_attention.attend(
                qf, kf, v, mask, keep, self.dropout, heads=H, interpret=self.kernel.interpret
            )
        return dense(self.features, name="out")(mixed), attn.mean(axis=1)
