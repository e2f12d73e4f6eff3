"""Variable selection networks: m per-variable GRNs as one stacked computation.

Shape glossary: N flattened rows (B or B·T), m variables, d_v per-variable embedding
size, d hidden size.

The per-variable GRNs (pytorch-forecasting's ``Linear(1 → d_v)`` embedding then
``GRN(d_v, d_v, d)``) run variable-major (``[m, N, ·]``, per-variable matmuls as one
batched ``lax.dot_general``), optionally in checkpointed chunks of variables scanned with
``lax.scan`` (the remat knob that really saves memory on XLA:CPU, see architecture.md), or
for float models through the fused recomputing kernel (:mod:`tftjax.models.kernels.fused`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from tftjax.models.dropout import keep_mask, keep_prob
from tftjax.models.folded import EmbeddedGRN
from tftjax.models.kernels import fused, pallas_vsn
from tftjax.models.kernels.mode import KernelMode
from tftjax.models.layers import GRN, einsum_f32, norm_stats
from tftjax.quant import core as qt
from tftjax.quant.calib import calibration_stats
from tftjax.quant.core import QuantSpec

Array = jax.Array
Policy = Callable[..., Any] | None

# Stacked kernels [m, in, out]: fan-in scaling per variable.
stacked_init = nn.initializers.variance_scaling(
    1.0, "fan_in", "truncated_normal", in_axis=-2, out_axis=-1, batch_axis=(0,)
)


def _bmm(x: Array, k: Array) -> Array:
    """Per-variable matmul ``[m, N, i] × [m, i, o] → [m, N, o]`` (variable axis batched)."""
    return lax.dot_general(x, k, (((2,), (1,)), ((0,), (0,))))


STACKED_KERNELS = ("emb_k", "fc2_k", "skip_k", "fc1_k", "glu_k")
_MATMULS = ("fc1_k", "glu_k")  # real [m, N, d_v] × [m, d_v, ·] matmuls; the rest fold a scalar


def add_rows(acc: Array, extra: tuple[tuple[int, ...], Array], kernel: Array) -> Array:
    """``acc[j] += rows_j · kernel[j]`` at the categorical positions ``j`` (``[m, N, o]``)."""
    pos, rows = extra
    if len(pos) == 1:  # one table (the instrument's): a plain matmul
        return acc.at[pos[0]].add(rows[0] @ kernel[pos[0]])
    idx = np.asarray(pos)
    return acc.at[idx].add(jnp.einsum("knv,kvo->kno", rows, kernel[idx]))


class StackedQuant(NamedTuple):
    """Static quantization settings of one stacked-GRN call (closed over, not scanned)."""

    spec: QuantSpec
    covered: frozenset  # kernel names quantized
    update: bool  # record the batch's ranges (a training step)


def stacked_grn(
    p: dict,
    x: Array,
    w: Array,
    keep: Array | None,
    rate: float,
    sq: StackedQuant | None = None,
    stats: dict | None = None,
    extra: tuple[tuple[int, ...], Array] | None = None,
):
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
      extra: ``(positions, rows [k, N, d_v])``: categorical variables' table rows, added
        to their embeddings ``e_j`` (their real inputs are 0), or None.

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
        assert sq is not None and stats is not None  # covered: a quantized layer
        st = stats[name]  # as before this step: what the step quantizes with
        if sq.spec.calibrate is not None:  # a calibration pass: record, float activations
            new_stats[name] = calibration_stats(
                h, sq.spec.calibrate, st, lead=1, symmetric=sq.spec.symmetric
            )
            return _bmm(h, p[name])
        if sq.update:  # this batch's range, per variable; the step updates the observers once
            new_stats[name] = qt.batch_range(h, 1)
        s, zp = qt.activation_qparams(st, sq.spec.symmetric)
        if int8:
            return qt.int8_bmm(
                qt.quantize_activation(h, s[:, None, None], zp[:, None, None]),
                s,
                zp,
                p[name],
                p[name + "_scale"],
            )
        hq = qt.fake_quant(h, s[:, None, None], zp[:, None, None])
        return _bmm(jnp.where((st.count > 0)[:, None, None], hq, h), p[name])

    # e = x·k + b is affine in the scalar x, so W_2 e and skip(e) are too: fold
    # the embedding into them (same parameters, no [m, N, d_v] → d matmuls).
    xv = x[..., None]  # [m, N, 1]
    emb_k = kern("emb_k")

    def fold(w):
        return (
            jnp.einsum("mv,mvo->mo", emb_k, w)[:, None, :],
            jnp.einsum("mv,mvo->mo", p["emb_b"], w)[:, None, :],
        )

    sk, sb = fold(kern("skip_k"))
    skip = xv * sk + (sb + p["skip_b"][:, None, :])  # [m, N, d]
    fk, fb = fold(kern("fc2_k"))
    h = xv * fk + (fb + p["fc2_b"][:, None, :])  # [m, N, d_v]
    if extra is not None:  # e_j += table row: W e_j gains W · row
        skip = add_rows(skip, extra, kern("skip_k"))
        h = add_rows(h, extra, kern("fc2_k"))
    h = nn.elu(h)
    h = bmm("fc1_k", h) + p["fc1_b"][:, None, :]  # η_1 [m, N, d_v]
    if keep is not None:
        h = jnp.where(keep, h / keep_prob(rate), 0.0)
    z = checkpoint_name(bmm("glu_k", h) + p["glu_b"][:, None, :], "vsn_glu")  # [m, N, 2d]
    value, gate = jnp.split(z, 2, axis=-1)
    y = checkpoint_name(skip + nn.sigmoid(gate) * value, "vsn_y")  # [m, N, d]
    mean, rstd = norm_stats(y)  # float32 statistics (bf16 compute too)
    y = (y - mean.astype(y.dtype)) * rstd.astype(y.dtype)
    y = y * p["ln_scale"][:, None, :] + p["ln_bias"][:, None, :]
    # the weighted sum accumulates in float32: [N, d] float32 (the caller casts it back)
    return einsum_f32("mn,mnd->nd", w.astype(y.dtype), y), new_stats


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
    vocab: int = 0
    """Variable 0 is categorical with this many values (0: every variable is real): its
    embedding is a row of a learned ``[vocab, d_v]`` table (``instrument_table``), chosen by
    the ``index`` argument (variable 0's real value is ignored)."""
    categorical: tuple[tuple[int, int, str], ...] = ()
    """Further categorical variables ``(position, table rows, column name)``: each one's
    embedding is a row of its own learned table (``COLUMN_table``), chosen by the
    ``categories`` argument's column (their real values are ignored)."""
    fused: bool = False
    """Float per-variable GRNs through the fused recomputing kernel (tftjax.models.kernels.fused)
    instead of ``chunk``/``policy``: same function and gradients, a fraction of the time
    and memory. Quantized layers always take the stacked path."""
    kernel: KernelMode = KernelMode.XLA
    """Float per-variable GRNs through the Pallas kernels (tftjax.models.kernels.pallas_vsn) in any
    tier, compiled (GPU) or interpreted (CPU tests). Quantized layers always take the
    stacked path."""

    @nn.compact
    def __call__(
        self,
        x: Array,
        context: Array | None = None,
        deterministic: bool = True,
        index: Array | None = None,
        categories: Array | None = None,
    ) -> tuple[Array, Array]:
        m, d = self.num_vars, self.hidden
        lead = x.shape[:-1]
        xf = x.reshape(-1, m)  # [N, m]
        n = xf.shape[0]
        p = self._stacked_params()
        sq, stats, variables = self._quantize(p)
        emb_k = qt.dequantize((p["emb_k"], p["emb_k_scale"])) if "emb_k_scale" in p else p["emb_k"]
        extra = self._table_rows(index, categories, n, xf.dtype)
        if extra is not None:
            xf = xf.at[:, np.asarray(extra[0])].set(0)
        ctx = None
        if context is not None:
            ctx = jnp.broadcast_to(context, lead + context.shape[-1:]).reshape(n, -1)
        w = self._selection_weights(xf, emb_k, p["emb_b"], ctx, extra, deterministic)
        keep = None
        if not deterministic and self.dropout > 0:
            keep = keep_mask(self.make_rng("dropout"), self.dropout, (m, n, self.d_v))
        out, new_stats = self._weighted_grns(p, xf.T, w.T, keep, sq, stats, extra)
        self._record_ranges(sq, variables, new_stats)
        out = checkpoint_name(out.astype(x.dtype), "vsn_out")
        return out.reshape(lead + (d,)), w.reshape(lead + (m,))

    def _table_rows(self, index, categories, n: int, dtype):
        """``(positions, rows [k, N, d_v])`` of the categorical variables (None: none)."""
        pos, rows = [], []
        if self.vocab:
            table = self.param(
                "instrument_table", nn.initializers.normal(1.0), (self.vocab, self.d_v)
            )
            if index is None:
                raise ValueError("a categorical variable 0 needs its `index`")
            pos.append(0)
            rows.append(jnp.take(table, index.reshape(-1), axis=0, mode="clip"))
        if self.categorical:
            if categories is None:
                raise ValueError("categorical variables need their `categories`")
            cats = categories.reshape(n, len(self.categorical))
            for j, (at, size, name) in enumerate(self.categorical):
                table = self.param(f"{name}_table", nn.initializers.normal(1.0), (size, self.d_v))
                pos.append(at)
                rows.append(jnp.take(table, cats[:, j], axis=0, mode="clip"))
        if not pos:
            return None
        return tuple(pos), jnp.stack(rows).astype(dtype)

    def _stacked_params(self) -> dict:
        m, dv, d = self.num_vars, self.d_v, self.hidden
        shapes = fused.stacked_shapes(m, dv, d)
        inits = {"emb_k": nn.initializers.normal(1.0), "ln_scale": nn.initializers.ones}
        return {
            name: self.param(
                name,
                inits.get(name, stacked_init if name.endswith("_k") else nn.initializers.zeros),
                shape,
            )
            for name, shape in shapes.items()
        }

    def _quantize(self, p: dict):
        """``(StackedQuant, the observers' ranges, the observer variables)`` of the quantized
        stacked kernels (their weights fake-quantized or int8 in ``p``), or ``(None, None, {})``
        for a float layer."""
        covered = frozenset(k for k in STACKED_KERNELS if qt.covered(self.quant, self.path, k))
        if not covered:
            return None, None, {}
        assert self.quant is not None
        for k in covered:
            if self.quant.mode == "int8":
                p[k], p[k + "_scale"] = qt.weight(self, k, p[k], self.quant)
            else:
                p[k] = qt.weight(self, k, p[k], self.quant)
        variables = {
            k: self.variable("quant_stats", f"{k}_in", qt.init_minmax, (self.num_vars,))
            for k in _MATMULS
            if k in covered
        }
        update = self.is_mutable_collection("quant_batch") and not self.is_initializing()
        sq = StackedQuant(self.quant, covered, update)
        return sq, {k: v.value for k, v in variables.items()}, variables

    def _selection_weights(self, xf, emb_k, emb_b, ctx, extra, deterministic) -> Array:
        """``[N, m]`` float32: the softmax of the selection GRN of the flattened embeddings
        (and the context)."""
        m, dv, d = self.num_vars, self.d_v, self.hidden
        n = xf.shape[0]
        if m * dv != m and extra is None:
            # The embedding folded into the GRN (float and quantized alike, models.folded).
            # Its activations are [N, d] and [N, m] (no [N, m·d_v]): too small to recompute.
            logits = EmbeddedGRN(min(d, m), m, self.dropout, self.quant, name="weights")(
                xf, emb_k, emb_b, ctx, deterministic
            )
        else:
            flat = xf[:, :, None] * emb_k + emb_b  # [N, m, d_v]
            if extra is not None:
                flat = flat.at[:, np.asarray(extra[0])].add(jnp.swapaxes(extra[1], 0, 1))
            flat = flat.reshape(n, m * dv)  # [N, m·d_v]
            weight_grn = nn.remat(GRN, static_argnums=(3,)) if self.remat_weights else GRN
            logits = weight_grn(min(d, m), m, self.dropout, self.quant, name="weights")(
                flat, ctx, deterministic
            )
        return nn.softmax(logits.astype(jnp.float32), axis=-1)

    def _weighted_grns(self, p, xt, wt, keep, sq, stats, extra):
        """``Σ_j w_j GRN_j(x_j)`` over the variable-major ``xt``, ``wt`` ``[m, N]``, by the
        implementation the layer was built with: the instrument's stacked path, the Pallas
        kernels, the fused CPU kernel, stacked whole, or in chunks."""
        if extra is not None:
            return stacked_grn(p, xt, wt, keep, self.dropout, sq, stats, extra)
        if self.kernel.pallas and sq is None:
            out = pallas_vsn.weighted_grn_sum(
                p, xt, wt, keep, self.dropout, interpret=self.kernel.interpret
            )
            return out, {}
        if self.fused and sq is None:
            return fused.weighted_grn_sum(p, xt, wt, keep, self.dropout), {}
        if self.chunk is None or self.chunk >= self.num_vars:
            return stacked_grn(p, xt, wt, keep, self.dropout, sq, stats)
        return self._chunked(p, xt, wt, keep, sq, stats)

    def _record_ranges(self, sq: StackedQuant | None, variables: dict, new_stats: dict) -> None:
        """A quantized layer's observed ranges: for a PTQ calibration pass, or for the train
        step's one observer update per batch."""
        if sq is None:
            return
        if sq.spec.calibrate is not None:
            collection = "quant_calib"
            if not (self.is_mutable_collection(collection) and not self.is_initializing()):
                return
        elif sq.update:
            collection = "quant_batch"
        else:
            return
        for k in variables:
            self.variable(collection, f"{k}_in", lambda k=k: new_stats[k]).value = new_stats[k]

    def _chunked(
        self,
        p: dict,
        xt: Array,
        wt: Array,
        keep: Array | None,
        sq: StackedQuant | None,
        stats: dict | None,
    ):
        m, c = self.num_vars, self.chunk
        assert c is not None  # chunked: the layer was built with a chunk size
        k = -(-m // c)
        c = -(-m // k)  # even chunks: at most k-1 padded variables
        pad = k * c - m
        padv = lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
        chunks = lambda a: padv(a).reshape((k, c) + a.shape[1:])
        ps = jax.tree.map(chunks, p)
        keep = None if keep is None else chunks(keep)
        stats = None if stats is None else jax.tree.map(chunks, stats)
        rate = self.dropout

        def body(acc, inputs):
            pc, xc, wc, kc, sc = inputs
            out, new = stacked_grn(pc, xc, wc, kc, rate, sq, sc)
            return acc + out, new

        body = jax.checkpoint(body, policy=self.policy, prevent_cse=False)
        acc0 = jnp.zeros((xt.shape[1], self.hidden), jnp.float32)
        out, new = lax.scan(body, acc0, (ps, chunks(xt), chunks(wt), keep, stats))
        new = jax.tree.map(lambda a: a.reshape((k * c,) + a.shape[2:])[:m], new)
        return out, new
