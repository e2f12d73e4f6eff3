"""The layers' parameters declared for the Pallas kernels that run the layers themselves
(:mod:`tftjax.models.kernels.pallas_grn`, :mod:`tftjax.models.kernels.pallas_gated`): the same names,
shapes, initialisers and tree as :mod:`tftjax.models.layers` declares them, and the GLU's
dropout keep mask drawn where the layer's ``Dropout`` draws it (the same units dropped),
so that checkpoints, initial values and masks are the layers' whichever path runs."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tftjax.models.dropout import Dropout

Array = jax.Array


class _DenseParams(nn.Module):
    """:class:`~tftjax.models.layers.Dense`'s parameters (names, shapes, initialisers,
    order), declared only; without a bias: ``(kernel, None)``."""

    features: int
    use_bias: bool = True

    @nn.compact
    def __call__(self, fan_in: int) -> tuple[Array, Array | None]:
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (fan_in, self.features))
        if not self.use_bias:
            return kernel, None
        return kernel, self.param("bias", nn.initializers.zeros, (self.features,))


class _GLUParams(nn.Module):
    """:class:`~tftjax.models.layers.GLU`'s parameters and its input dropout's keep mask, drawn where GLU draws it
    (its ``Dropout_0``: the same units dropped)."""

    features: int
    dropout: float = 0.0

    @nn.compact
    def __call__(self, shape: tuple, deterministic: bool):
        keep = Dropout(self.dropout)(
            jax.ShapeDtypeStruct(shape, jnp.float32), deterministic, mask_only=True
        )
        return (*_DenseParams(2 * self.features, name="proj")(shape[-1]), keep)


class GRNParams(nn.Module):
    """A ``GRN(d, d)``'s parameters as :class:`~tftjax.models.layers.GRN` declares them (the
    same tree and initial values) and its dropout keep mask. Returns ``({name: parameter},
    keep mask or None)``; with ``context``, the context's kernel as ``ctx_k``."""

    hidden: int
    dropout: float = 0.0
    context: bool = False

    @nn.compact
    def __call__(self, a: Array, deterministic: bool = True):
        d = self.hidden
        fc2_k, fc2_b = _DenseParams(d, name="fc2")(a.shape[-1])
        ctx = {}
        if self.context:
            ctx["ctx_k"] = _DenseParams(d, use_bias=False, name="context")(d)[0]
        fc1_k, fc1_b = _DenseParams(d, name="fc1")(d)
        glu_k, glu_b, keep = _GLUParams(d, self.dropout, name="glu")(
            a.shape[:-1] + (d,), deterministic
        )
        scale, bias = _LayerNormParams(name="norm")(d)
        return dict(
            fc2_k=fc2_k,
            fc2_b=fc2_b,
            fc1_k=fc1_k,
            fc1_b=fc1_b,
            glu_k=glu_k,
            glu_b=glu_b,
            ln_scale=scale,
            ln_bias=bias,
            **ctx,
        ), keep


class GateParams(nn.Module):
    """:class:`~tftjax.models.layers.GateAddNorm`'s parameters (its GLU's and LayerNorm's)
    and its dropout keep mask. Returns ``({name: parameter}, keep mask or None)``."""

    hidden: int
    dropout: float = 0.0

    @nn.compact
    def __call__(self, b: Array, deterministic: bool = True):
        glu_k, glu_b, keep = _GLUParams(self.hidden, self.dropout, name="glu")(
            b.shape, deterministic
        )
        scale, bias = _LayerNormParams(name="norm")(self.hidden)
        return dict(glu_k=glu_k, glu_b=glu_b, ln_scale=scale, ln_bias=bias), keep


class _LayerNormParams(nn.Module):
    """:class:`~tftjax.models.layers.LayerNorm`'s parameters, declared only."""

    @nn.compact
    def __call__(self, d: int) -> tuple[Array, Array]:
        return (
            self.param("scale", nn.initializers.ones, (d,)),
            self.param("bias", nn.initializers.zeros, (d,)),
        )
