"""Quantization-aware training: the fake-quant op (a clipped straight-through estimator).

:func:`fake_quant` rounds ``x`` onto an integer grid and back,

    fake_quant(x) = (clip(round(x / s) + zp, qmin, qmax) - zp) · s,

and its backward pass is the clipped straight-through estimator: the incoming
gradient passes where the *rounded* value ``round(x / s) + zp`` lies inside
``[qmin, qmax]`` and is zero elsewhere. The mask is taken on the rounded
integer, not written as ``|x| <= qmax · s``: that float comparison can put the
absmax element itself (which maps exactly to ``qmax``) outside the range
through rounding of ``qmax · s`` and wrongly freeze it. Scales and zero
points get no gradient.

``s`` and ``zp`` broadcast against ``x``: a scalar is per-tensor, a shape like
``[1, C]`` is per-channel along the last axis (:func:`channel_scale` builds
symmetric per-channel scales along any axis).

References:
  Jacob et al., "Quantization and Training of Neural Networks for Efficient
  Integer-Arithmetic-Only Inference", CVPR 2018. Bengio et al., "Estimating or
  Propagating Gradients Through Stochastic Neurons", 2013 (straight-through).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

INT8_MIN, INT8_MAX = -128, 127
SYMMETRIC_MAX = 127  # symmetric int8 weights use [-127, 127] (zero is exact, the grid symmetric)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def fake_quant(x: jax.Array, scale: jax.Array, zero_point: jax.Array, qmin: int = INT8_MIN,
               qmax: int = INT8_MAX) -> jax.Array:
    """Quantize ``x`` to integers in ``[qmin, qmax]`` with ``scale``/``zero_point`` and back.

    Args:
      x: values to quantize.
      scale: ``s > 0``, broadcastable to ``x`` (per-tensor or per-channel).
      zero_point: integer-valued, broadcastable to ``x`` (0 for symmetric).
      qmin, qmax: the integer range (static).

    Returns:
      ``x``'s nearest grid values, clipped to the range; same shape and dtype.
    """
    return _fake_quant_fwd(x, scale, zero_point, qmin, qmax)[0]


def _fake_quant_fwd(x, scale, zero_point, qmin, qmax):
    r = jnp.round(x / scale) + zero_point  # the integer x rounds to, before clipping
    inside = (r >= qmin) & (r <= qmax)
    y = (jnp.clip(r, qmin, qmax) - zero_point) * scale
    return y.astype(x.dtype), (inside, scale, zero_point)


def _fake_quant_bwd(qmin, qmax, res, g):
    inside, scale, zero_point = res
    return (jnp.where(inside, g, jnp.zeros_like(g)), jnp.zeros_like(scale),
            jnp.zeros_like(zero_point))


fake_quant.defvjp(_fake_quant_fwd, _fake_quant_bwd)


def channel_scale(w: jax.Array, axis: int = -1, qmax: int = SYMMETRIC_MAX,
                  eps: float = 1e-12) -> jax.Array:
    """Symmetric per-channel scales ``absmax / qmax`` along ``axis`` (kept as a size-1 axis
    elsewhere, so the result broadcasts against ``w``). An all-zero channel gets ``eps``."""
    axis = axis % w.ndim
    others = tuple(a for a in range(w.ndim) if a != axis)
    absmax = jnp.max(jnp.abs(w), axis=others, keepdims=True)
    return jnp.maximum(absmax / qmax, eps)


def fake_quant_weight(w: jax.Array, axis: int = -1) -> jax.Array:
    """int8 symmetric per-output-channel fake quantization of a weight (absmax scales,
    recomputed from ``w`` and not differentiated)."""
    s = jax.lax.stop_gradient(channel_scale(w, axis))
    return fake_quant(w, s, jnp.zeros_like(s), -SYMMETRIC_MAX, SYMMETRIC_MAX)


# ----------------------------------------------------------------- activation observers
class MinMax(NamedTuple):
    """Moving-average min/max of what an activation has seen (a ``quant_stats`` leaf)."""

    min: jax.Array  # shape=(), float32
    max: jax.Array  # shape=(), float32
    seen: jax.Array  # shape=(), bool: False until the first observation


def init_minmax() -> MinMax:
    z = jnp.zeros((), jnp.float32)
    return MinMax(z, z, jnp.zeros((), bool))


def observe(stats: MinMax, x: jax.Array, averaging_constant: float = 0.01) -> MinMax:
    """PyTorch's ``MovingAverageMinMaxObserver``: the first batch sets min and max, later
    ones move them by ``averaging_constant`` toward the batch's own min and max."""
    lo, hi = jnp.min(x).astype(jnp.float32), jnp.max(x).astype(jnp.float32)
    c = averaging_constant
    new_min = jnp.where(stats.seen, stats.min + c * (lo - stats.min), lo)
    new_max = jnp.where(stats.seen, stats.max + c * (hi - stats.max), hi)
    return MinMax(new_min, new_max, jnp.ones((), bool))


def activation_qparams(stats: MinMax, qmin: int = INT8_MIN, qmax: int = INT8_MAX,
                       eps: float = float(jnp.finfo(jnp.float32).eps)):
    """Asymmetric ``(scale, zero_point)`` from an observed range that always includes 0 (so
    zero, e.g. padding or a ReLU's floor, is exact), PyTorch's ``per_tensor_affine``."""
    lo, hi = jnp.minimum(stats.min, 0.0), jnp.maximum(stats.max, 0.0)
    scale = jnp.maximum((hi - lo) / (qmax - qmin), eps)
    zero_point = jnp.clip(qmin - jnp.round(lo / scale), qmin, qmax)
    return scale, zero_point
