"""TFT building blocks as Flax linen modules.

Shape glossary:
  B  batch            T   time steps (T_e encoder + T_d decoder)
  N  flattened rows (B or B·T)
  m  variables in a selection network      d_v per-variable embedding size
  d  hidden size      H   attention heads  d_h = d / H

Choices where the reference implementations differ (tft_spec.md):
  * skip connection when sizes differ: a Dense projection (google-research);
  * real inputs: a per-variable ``Linear(1 → d_v)`` then a per-variable
    ``GRN(d_v, d_v, d)`` (pytorch-forecasting), computed as one stacked
    (variable-major, batched matmul) computation, optionally in checkpointed
    chunks of variables scanned with ``lax.scan`` (the remat knob that
    really saves memory on XLA:CPU, see architecture.md);
  * attention: queries at the decoder steps only, and a decoder step sees
    itself and everything before it (google-research's ``j <= i``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from tftjax import quant as qt
from tftjax.models import fused
from tftjax.quant import QuantSpec

Array = jax.Array
Policy = Callable[..., Any] | None

# Stacked kernels [m, in, out]: fan-in scaling per variable.
stacked_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=-2,
                                                out_axis=-1, batch_axis=(0,))


class Dense(nn.Module):
    """``nn.Dense`` (same parameters, initialisers and names) that quantizes when ``quant``
    covers its path: observed int8 input, int8 per-output-channel kernel (tftjax.quant)."""

    features: int
    use_bias: bool = True
    quant: QuantSpec | None = None

    @nn.compact
    def __call__(self, x: Array) -> Array:
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features))
        y = qt.dense(self, "kernel", x, kernel, self.quant)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,))
        return y


class GLU(nn.Module):
    """``σ(W_4 g + b_4) ⊙ (W_5 g + b_5)``, dropout on the input."""

    features: int
    dropout: float = 0.0
    quant: QuantSpec | None = None

    @nn.compact
    def __call__(self, x: Array, deterministic: bool = True) -> Array:
        x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
        value, gate = jnp.split(Dense(2 * self.features, quant=self.quant, name="proj")(x), 2,
                                axis=-1)
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
        return nn.LayerNorm(name="norm")(skip + g)


class FoldedDense(nn.Module):
    """``Dense`` (same parameter, shape and initialiser) applied to the flattened embeddings
    ``concat_j (x_j k_j + b_j)`` of m scalar inputs, without forming them.

    The input is affine in ``x`` ``[N, m]``, so ``flat @ K = x @ A + b @ K`` with
    ``A_j = k_j K_j`` ``[m, out]``: a ``[N, m] × [m, out]`` matmul instead of
    ``[N, m·d_v] × [m·d_v, out]`` (d_v times fewer FLOPs; for TFT-225's encoder VSN
    the largest dense matmul of the model).
    """

    features: int
    use_bias: bool = True

    @nn.compact
    def __call__(self, x: Array, emb_k: Array, emb_b: Array) -> Array:
        m, dv = emb_k.shape
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (m * dv, self.features))
        k3 = kernel.reshape(m, dv, self.features)
        y = x @ jnp.einsum("mv,mvo->mo", emb_k, k3) + emb_b.reshape(-1) @ kernel
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,))
        return y


class EmbeddedGRN(nn.Module):
    """:class:`GRN` (same parameters and names) over the flattened per-variable embeddings
    of ``x`` ``[N, m]``, with its two input matmuls folded (:class:`FoldedDense`).
    Float only: a quantized GRN observes its real input, so it takes :class:`GRN`."""

    hidden: int
    output: int
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x: Array, emb_k: Array, emb_b: Array, context: Array | None = None,
                 deterministic: bool = True) -> Array:
        skip = FoldedDense(self.output, name="skip")(x, emb_k, emb_b)
        h = FoldedDense(self.hidden, name="fc2")(x, emb_k, emb_b)
        if context is not None:
            h = h + Dense(self.hidden, use_bias=False, name="context")(context)
        h = checkpoint_name(nn.elu(h), "grn_hidden")
        h = Dense(self.hidden, name="fc1")(h)
        g = GLU(self.output, self.dropout, name="glu")(h, deterministic)
        return nn.LayerNorm(name="norm")(skip + g)


class GateAddNorm(nn.Module):
    """``LayerNorm(a + GLU(b))``."""

    features: int
    dropout: float = 0.0
    quant: QuantSpec | None = None

    @nn.compact
    def __call__(self, a: Array, b: Array, deterministic: bool = True) -> Array:
        glu = GLU(self.features, self.dropout, self.quant, name="glu")
        return nn.LayerNorm(name="norm")(a + glu(b, deterministic))


KEEP_LEVELS = 1 << 16


def keep_mask(key: Array, rate: float, shape: tuple[int, ...]) -> Array:
    """Dropout keep-mask: ``True`` with probability ``keep_prob(rate)``, from 16 random bits per
    element (two per ``uint32`` drawn: measured 10× faster on XLA:CPU than
    ``jax.random.bernoulli``, which draws and converts a float per element)."""
    size = int(np.prod(shape))
    if jax.random.key_impl(key) != "threefry2x32":
        # Measured on XLA:CPU: RBG draws these bits ~10× slower than threefry (whose
        # compile cost, the reason the trainer's key is RBG, is one hash here).
        key = jax.random.wrap_key_data(jax.random.key_data(key).reshape(-1)[:2],
                                       impl="threefry2x32")
    bits = jax.random.bits(key, (-(-size // 2),), jnp.uint32)
    half = lax.bitcast_convert_type(bits, jnp.uint16).reshape(-1)[:size]
    return (half < _keep_threshold(rate)).reshape(shape)


def _keep_threshold(rate: float) -> int:
    return round((1.0 - rate) * KEEP_LEVELS)


def keep_prob(rate: float) -> float:
    """The exact keep probability of :func:`keep_mask` (a multiple of 2⁻¹⁶, within 2⁻¹⁷ of
    ``1 - rate``); kept values are scaled by its inverse so that the mask is unbiased."""
    return _keep_threshold(rate) / KEEP_LEVELS


def _bmm(x: Array, k: Array) -> Array:
    """Per-variable matmul ``[m, N, i] × [m, i, o] → [m, N, o]`` (variable axis batched)."""
    return lax.dot_general(x, k, (((2,), (1,)), ((0,), (0,))))


STACKED_KERNELS = ("emb_k", "fc2_k", "skip_k", "fc1_k", "glu_k")
_MATMULS = ("fc1_k", "glu_k")  # real [m, N, d_v] × [m, d_v, ·] matmuls; the rest fold a scalar


class StackedQuant(NamedTuple):
    """Static quantization settings of one stacked-GRN call (closed over, not scanned)."""

    spec: QuantSpec
    covered: frozenset  # kernel names quantized
    update: bool  # update the observers (a training or calibration step)


def _stacked_grn(p: dict, x: Array, w: Array, keep: Array | None, rate: float,
                 sq: StackedQuant | None = None, stats: dict | None = None):
    """m per-variable GRNs and their weighted sum.

    Args:
      p: stacked parameters, each with a leading variable axis of size m
        (quantized kernels already fake-quantized, or int8 with ``NAME_scale``).
      x: inputs ``[m, N]`` (one real value per variable and row).
      w: selection weights ``[m, N]``.
      keep: dropout keep-mask ``[m, N, d_v]`` on ``η_1``, drawn once for all
        variables so that it does not depend on the chunking; ``None``: no dropout.
      rate: dropout rate on ``η_1``.
      sq, stats: quantization (None: float) and the per-variable observers
        (``MinMax`` with ``[m]`` leaves) of the inputs of ``fc1_k`` and ``glu_k``.

    Returns:
      ``Σ_j w_j GRN_j(e_j)``, ``[N, d]``, and the observers after this batch.
    """
    covered = sq.covered if sq is not None else frozenset()
    int8 = sq is not None and sq.spec.mode == "int8"
    new_stats = {}

    def kern(name):  # a kernel used weight-only (int8: dequantized)
        return qt.dequantize((p[name], p[name + "_scale"])) if int8 and name in covered else p[name]

    def bmm(name, h):  # [m, N, i] × [m, i, o], observed and quantized when covered
        if name not in covered:
            return _bmm(h, p[name])
        st = stats[name]
        if sq.update:
            st = qt.observe(st, h, sq.spec.averaging_constant, sq.spec.freeze_after)
        new_stats[name] = st
        s, zp = qt.activation_qparams(st)
        if int8:
            return qt.int8_bmm(qt.quantize_activation(h, s[:, None, None], zp[:, None, None]),
                               s, zp, p[name], p[name + "_scale"])
        return _bmm(qt.fake_quant(h, s[:, None, None], zp[:, None, None]), p[name])

    # e = x·k + b is affine in the scalar x, so W_2 e and skip(e) are too: fold
    # the embedding into them (same parameters, no [m, N, d_v] → d matmuls).
    xv = x[..., None]  # [m, N, 1]
    emb_k = kern("emb_k")
    fold = lambda w: (jnp.einsum("mv,mvo->mo", emb_k, w)[:, None, :],  # noqa: E731
                      jnp.einsum("mv,mvo->mo", p["emb_b"], w)[:, None, :])
    sk, sb = fold(kern("skip_k"))
    skip = xv * sk + (sb + p["skip_b"][:, None, :])  # [m, N, d]
    fk, fb = fold(kern("fc2_k"))
    h = nn.elu(xv * fk + (fb + p["fc2_b"][:, None, :]))  # [m, N, d_v]
    h = bmm("fc1_k", h) + p["fc1_b"][:, None, :]  # η_1 [m, N, d_v]
    if keep is not None:
        h = jnp.where(keep, h / keep_prob(rate), 0.0)
    z = checkpoint_name(bmm("glu_k", h) + p["glu_b"][:, None, :], "vsn_glu")  # [m, N, 2d]
    value, gate = jnp.split(z, 2, axis=-1)
    y = checkpoint_name(skip + nn.sigmoid(gate) * value, "vsn_y")  # [m, N, d]
    mean = y.mean(-1, keepdims=True)
    var = jnp.square(y - mean).mean(-1, keepdims=True)
    y = (y - mean) * lax.rsqrt(var + 1e-6) * p["ln_scale"][:, None, :] + p["ln_bias"][:, None, :]
    return jnp.einsum("mn,mnd->nd", w, y), new_stats


class VariableSelection(nn.Module):
    """Variable selection network over m real inputs.

    Weights ``v = softmax(GRN_v(concat_j e_j, c))``; output ``Σ_j v_j GRN_j(e_j)``.
    The m per-variable GRNs are one stacked computation; with ``chunk`` set,
    they run as a ``lax.scan`` over chunks of ``chunk`` variables whose body
    is ``jax.checkpoint``-ed with ``policy``, so only the ``[N, d]`` running
    sum is saved per chunk instead of several ``[m, N, d]`` activations.

    Quantized (``quant``), the stacked matmuls ``fc1_k``/``glu_k`` observe their
    inputs with one observer per variable; the observers are updated inside the
    chunk that computes them and come out of the scan as outputs, so the
    recomputation of a checkpointed chunk in the backward pass cannot update
    them again. The fold kernels (``emb_k``, ``fc2_k``, ``skip_k``) multiply one
    scalar per variable: they are quantized weight-only.
    """

    num_vars: int
    d_v: int
    hidden: int
    dropout: float = 0.0
    chunk: int | None = None  # variables per checkpointed scan step; None: all at once
    policy: Policy = None  # jax.checkpoint policy for the chunk body
    remat_weights: bool = False  # also rematerialise the selection-weight GRN
    quant: QuantSpec | None = None
    fused: bool = False
    """Float per-variable GRNs through the fused recomputing kernel (tftjax.models.fused)
    instead of ``chunk``/``policy``: same function and gradients, a fraction of the time
    and memory. Quantized layers always take the stacked path."""

    @nn.compact
    def __call__(self, x: Array, context: Array | None = None,
                 deterministic: bool = True) -> tuple[Array, Array]:
        m, dv, d = self.num_vars, self.d_v, self.hidden
        lead = x.shape[:-1]
        xf = x.reshape(-1, m)  # [N, m]
        n = xf.shape[0]
        p = {
            "emb_k": self.param("emb_k", nn.initializers.normal(1.0), (m, dv)),
            "emb_b": self.param("emb_b", nn.initializers.zeros, (m, dv)),
            "fc2_k": self.param("fc2_k", stacked_init, (m, dv, dv)),
            "fc2_b": self.param("fc2_b", nn.initializers.zeros, (m, dv)),
            "fc1_k": self.param("fc1_k", stacked_init, (m, dv, dv)),
            "fc1_b": self.param("fc1_b", nn.initializers.zeros, (m, dv)),
            "glu_k": self.param("glu_k", stacked_init, (m, dv, 2 * d)),
            "glu_b": self.param("glu_b", nn.initializers.zeros, (m, 2 * d)),
            "skip_k": self.param("skip_k", stacked_init, (m, dv, d)),
            "skip_b": self.param("skip_b", nn.initializers.zeros, (m, d)),
            "ln_scale": self.param("ln_scale", nn.initializers.ones, (m, d)),
            "ln_bias": self.param("ln_bias", nn.initializers.zeros, (m, d)),
        }
        sq, stats, variables = None, None, {}
        covered = frozenset(k for k in STACKED_KERNELS if qt.covered(self.quant, self.path, k))
        if covered:
            for k in covered:
                if self.quant.mode == "int8":
                    p[k], p[k + "_scale"] = qt.weight(self, k, p[k], self.quant)
                else:
                    p[k] = qt.weight(self, k, p[k], self.quant)
            variables = {k: self.variable("quant_stats", f"{k}_in", qt.init_minmax, (m,))
                         for k in _MATMULS if k in covered}
            stats = {k: v.value for k, v in variables.items()}
            update = self.is_mutable_collection("quant_stats") and not self.is_initializing()
            sq = StackedQuant(self.quant, covered, update)
        emb_k = qt.dequantize((p["emb_k"], p["emb_k_scale"])) if "emb_k_scale" in p else p["emb_k"]
        # Selection weights from the flattened embeddings (and the context).
        ctx = None
        if context is not None:
            ctx = jnp.broadcast_to(context, lead + context.shape[-1:]).reshape(n, -1)
        if self.quant is None and m * dv != m:
            # Float: the embedding folded into the GRN. Its activations are [N, d] and
            # [N, m] (no [N, m·d_v]): too small to be worth recomputing.
            logits = EmbeddedGRN(min(d, m), m, self.dropout, name="weights")(
                xf, emb_k, p["emb_b"], ctx, deterministic)
        else:
            flat = (xf[:, :, None] * emb_k + p["emb_b"]).reshape(n, m * dv)  # [N, m·d_v]
            weight_grn = nn.remat(GRN, static_argnums=(3,)) if self.remat_weights else GRN
            logits = weight_grn(min(d, m), m, self.dropout, self.quant, name="weights")(
                flat, ctx, deterministic)
        w = nn.softmax(logits, axis=-1)  # [N, m]

        keep = None
        if not deterministic and self.dropout > 0:
            keep = keep_mask(self.make_rng("dropout"), self.dropout, (m, n, dv))
        xt, wt = xf.T, w.T  # variable-major [m, N]
        if self.fused and sq is None:
            out, new_stats = fused.weighted_grn_sum(p, xt, wt, keep, self.dropout), {}
        elif self.chunk is None or self.chunk >= m:
            out, new_stats = _stacked_grn(p, xt, wt, keep, self.dropout, sq, stats)
        else:
            out, new_stats = self._chunked(p, xt, wt, keep, sq, stats)
        if sq is not None and sq.update:
            for k, v in variables.items():
                v.value = new_stats[k]
        out = checkpoint_name(out, "vsn_out")
        return out.reshape(lead + (d,)), w.reshape(lead + (m,))

    def _chunked(self, p: dict, xt: Array, wt: Array, keep: Array | None,
                 sq: StackedQuant | None, stats: dict | None):
        m, c = self.num_vars, self.chunk
        k = -(-m // c)
        c = -(-m // k)  # even chunks: at most k-1 padded variables
        pad = k * c - m
        padv = lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))  # noqa: E731
        chunks = lambda a: padv(a).reshape((k, c) + a.shape[1:])  # noqa: E731
        ps = jax.tree.map(chunks, p)
        keep = None if keep is None else chunks(keep)
        stats = None if stats is None else jax.tree.map(chunks, stats)
        rate = self.dropout

        def body(acc, inputs):
            pc, xc, wc, kc, sc = inputs
            out, new = _stacked_grn(pc, xc, wc, kc, rate, sq, sc)
            return acc + out, new

        body = jax.checkpoint(body, policy=self.policy, prevent_cse=False)
        acc0 = jnp.zeros((xt.shape[1], self.hidden), xt.dtype)
        out, new = lax.scan(body, acc0, (ps, chunks(xt), chunks(wt), keep, stats))
        new = jax.tree.map(lambda a: a.reshape((k * c,) + a.shape[2:])[:m], new)
        return out, new


class LSTM(nn.Module):
    """Single-layer LSTM over time, input projections hoisted out of the scan.

    With ``remat`` the per-step body is ``jax.checkpoint``-ed inside the scan,
    so the backward pass recomputes gates from the saved ``(c, h)`` carries.
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

    @nn.compact
    def __call__(self, carry: tuple[Array, Array], xs: Array) -> tuple[tuple[Array, Array], Array]:
        d = self.features
        w_i = self.param("w_i", nn.initializers.lecun_normal(), (xs.shape[-1], 4 * d))
        w_h = self.param("w_h", nn.initializers.orthogonal(), (d, 4 * d))

        def bias_init(key, shape, dtype=jnp.float32):
            return jnp.zeros(shape, dtype).at[d : 2 * d].set(self.forget_bias)

        b = self.param("b", bias_init, (4 * d,))
        xp = jnp.swapaxes(qt.dense(self, "w_i", xs, w_i, self.quant), 0, 1) + b  # [T, B, 4d]

        recurrent, stats = self._recurrent(w_h)

        def step(state, x_t):
            c, h = state
            gates = checkpoint_name(x_t + recurrent(h), "lstm_gates")
            i, f, g, o = jnp.split(gates, 4, axis=-1)
            c = nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g)
            h = nn.sigmoid(o) * jnp.tanh(c)
            return (c, h), h

        if self.remat:
            step = jax.checkpoint(step, policy=self.policy, prevent_cse=False)
        h0 = carry[1]
        carry, hs = lax.scan(step, carry, xp)
        if stats is not None:  # every h the recurrent matmul saw: h_0 … h_{T-1}
            stats.value = qt.observe(stats.value,
                                           jnp.concatenate([h0[None], hs[:-1]], axis=0),
                                           self.quant.averaging_constant, self.quant.freeze_after)
        return carry, jnp.swapaxes(hs, 0, 1)  # [B, T, d]

    def _recurrent(self, w_h: Array):
        """``h ↦ h @ w_h`` (quantized when covered) and the observer to update after the
        scan (``None``: none, or not a training step)."""
        if not qt.covered(self.quant, self.path, "w_h"):
            return (lambda h: h @ w_h), None
        var = self.variable("quant_stats", "w_h_in", qt.init_minmax, ())
        update = self.is_mutable_collection("quant_stats") and not self.is_initializing()
        stats = var.value
        s, zp = qt.activation_qparams(stats)
        if self.quant.mode == "int8":
            qw, sw = qt.weight(self, "w_h", w_h, self.quant)
            return (lambda h: qt.int8_dense(qt.quantize_activation(h, s, zp), s, zp, qw, sw),
                    var if update else None)
        wq, seen = qt.weight(self, "w_h", w_h, self.quant), stats.count > 0
        return (lambda h: jnp.where(seen, qt.fake_quant(h, s, zp), h) @ wq,
                var if update else None)


class InterpretableAttention(nn.Module):
    """Multi-head attention with per-head Q/K, one shared V, heads averaged.

    ``H̃ = (1/H) Σ_h softmax(Q_h K_hᵀ / √d_h + mask) V``; output ``W_H H̃``.
    Returns the output and the head-averaged attention weights.
    """

    heads: int
    features: int
    dropout: float = 0.0
    quant: QuantSpec | None = None

    @nn.compact
    def __call__(self, q_in: Array, kv: Array, mask: Array,
                 deterministic: bool = True) -> tuple[Array, Array]:
        H = self.heads
        dh = self.features // H
        dense = functools.partial(Dense, quant=self.quant)
        q = dense(H * dh, name="query")(q_in).reshape(q_in.shape[:-1] + (H, dh))  # [B, Tq, H, dh]
        # No key bias: q·b_k is the same for every key, and softmax ignores it.
        k = dense(H * dh, use_bias=False, name="key")(kv).reshape(kv.shape[:-1] + (H, dh))
        v = dense(dh, name="value")(kv)  # [B, T, dh], shared by all heads
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(dh).astype(q.dtype)
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
        attn = checkpoint_name(nn.softmax(logits, axis=-1), "attention_weights")  # [B, H, Tq, T]
        attn_d = nn.Dropout(self.dropout)(attn, deterministic=deterministic)
        mixed = jnp.einsum("bhqk,bkd->bqd", attn_d, v) / H  # mean over heads [B, Tq, dh]
        return dense(self.features, name="out")(mixed), attn.mean(axis=1)
