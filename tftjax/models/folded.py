"""The variable selection's weight GRN with the per-variable embedding folded into its two
input matmuls: ``[N, m] × [m, out]`` instead of ``[N, m·d_v] × [m·d_v, out]``, in float,
fake-quant (QAT, calibration) and int8 alike.

The flattened embeddings ``concat_j (x_j k_j + b_j)`` are affine in the m scalar inputs
``x``, so ``flat @ K = x @ A + b @ K`` with ``A_j = k_j K_j`` (``[m, out]``). Quantized,
the observer watches ``x`` itself (the raw inputs, ``[N, m]``) and the weight quantized is
the folded ``A`` (int8 symmetric per output channel; ``k`` as the VSN uses it, itself
fake-quantized when ``emb_k`` is covered); ``b @ K`` stays a float bias. The int8
tree (:func:`tftjax.quant.tree.int8_variables`) holds ``A`` as the int8 ``kernel`` and
``b @ K`` as ``fold_bias``. For TFT-225's encoder VSN this is the largest dense matmul of
the model: folding it makes the int8 path as lean as the float one.
"""

from __future__ import annotations

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name

from tftjax.models.layers import GLU, Dense, LayerNorm
from tftjax.quant import core as qt
from tftjax.quant.calib import calibration_record
from tftjax.quant.core import QuantSpec
from tftjax.quant.tree import fold_kernel

Array = jax.Array


class FoldedDense(nn.Module):
    """``Dense`` (same parameter, shape and initialiser) applied to the flattened embeddings
    ``concat_j (x_j k_j + b_j)`` of m scalar inputs, without forming them; quantized when
    ``quant`` covers its path (the input ``x`` observed, the folded kernel int8)."""

    features: int
    use_bias: bool = True
    quant: QuantSpec | None = None

    @nn.compact
    def __call__(self, x: Array, emb_k: Array, emb_b: Array) -> Array:
        m, dv = emb_k.shape
        q = self.quant if qt.covered(self.quant, self.path, "kernel") else None
        if q is not None and q.mode == "int8":  # the int8 tree holds A and b @ K already
            qa, sa = (
                self.get_variable("params", "kernel"),
                self.get_variable("weight_scale", "kernel"),
            )
            s, zp = qt.activation_qparams(qt.observer(self, "kernel", x, q), q.symmetric)
            y = qt.int8_dense(qt.quantize_activation(x, s, zp), s, zp, qa, sa)
            y = y + self.get_variable("params", "fold_bias")
        else:
            kernel = self.param("kernel", nn.initializers.lecun_normal(), (m * dv, self.features))
            a, const = fold_kernel(emb_k, kernel), emb_b.reshape(-1) @ kernel
            if q is None:
                y = x @ a + const
            elif q.calibrate is not None:  # record, quantize no activation
                calibration_record(self, "kernel", x, q)
                y = x @ qt.fake_quant_weight(a, q.axes("kernel")) + const
            else:
                xq = qt.quantize_observed(x, qt.observer(self, "kernel", x, q), q.symmetric)
                y = xq @ qt.fake_quant_weight(a, q.axes("kernel")) + const
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,))
        return y


class EmbeddedGRN(nn.Module):
    """:class:`tftjax.models.layers.GRN` (same parameters and names) over the flattened
    per-variable embeddings of ``x`` ``[N, m]``, with its two input matmuls folded
    (:class:`FoldedDense`). ``emb_k``: the embeddings the VSN uses (fake-quantized or
    dequantized where they are quantized); quantized, the folded kernel is quantized again."""

    hidden: int
    output: int
    dropout: float = 0.0
    quant: QuantSpec | None = None

    @nn.compact
    def __call__(
        self,
        x: Array,
        emb_k: Array,
        emb_b: Array,
        context: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        q = self.quant
        skip = FoldedDense(self.output, quant=q, name="skip")(x, emb_k, emb_b)
        h = FoldedDense(self.hidden, quant=q, name="fc2")(x, emb_k, emb_b)
        if context is not None:
            h = h + Dense(self.hidden, use_bias=False, quant=q, name="context")(context)
        h = checkpoint_name(nn.elu(h), "grn_hidden")
        h = Dense(self.hidden, quant=q, name="fc1")(h)
        g = GLU(self.output, self.dropout, q, name="glu")(h, deterministic)
        return LayerNorm(name="norm")(skip + g)
