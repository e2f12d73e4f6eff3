"""Post-training calibration records (:mod:`tftjax.quant.ptq`): what one calibration batch
says of each observed tensor, by method. A calibration pass keeps activations float and
writes these into the ``quant_calib`` collection."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.quant.core import MinMax, QuantSpec, activation_qparams, fake_quant

MSE_SHRINK = tuple(float(a) for a in np.linspace(0.2, 1.0, 41))
"""Candidate ranges of ``--calibration mse``: these fractions of the observed min/max."""


def calibration_record(mod: Any, param: str, x: jax.Array, quant: QuantSpec) -> None:
    """One calibration batch's statistics of the input of ``param`` in ``mod``
    (:func:`calibration_stats` by ``quant.calibrate``, into the ``quant_calib`` collection)."""
    if mod.is_initializing() or not mod.is_mutable_collection("quant_calib"):
        return
    name, method = f"{param}_in", quant.calibrate
    if method is None:  # not a calibration pass
        return
    ref = mod.get_variable("quant_stats", name) if method == "mse" else None
    rec = calibration_stats(x, method, ref, symmetric=quant.symmetric)
    mod.variable("quant_calib", name, lambda: rec).value = rec


def calibration_stats(
    x: jax.Array, method: str, ref: MinMax | None = None, lead: int = 0, symmetric: bool = False
) -> jax.Array:
    """What a calibration batch says of the tensor ``x`` (per index of its ``lead`` leading
    axes, e.g. one per variable of a stacked layer; non-finite values ignored):
    ``minmax``: ``[..., 2]`` its min and max; ``percentile:P``: its P-th and (100−P)-th
    percentiles (linear interpolation); ``mse``: ``[..., A]`` the summed squared error of
    fake-quantizing it with each :data:`MSE_SHRINK` fraction of the range ``ref``."""
    x = x.astype(jnp.float32)
    x = x.reshape(x.shape[:lead] + (-1,))
    fin = jnp.isfinite(x)
    if method == "mse":
        if ref is None:
            raise ValueError("mse calibration needs the min/max ranges of a first pass")
        xf = jnp.where(fin, x, 0.0)

        def err(a):  # one candidate at a time: one compiled body, the tensor's own memory
            s_, zp = activation_qparams(MinMax(ref.min * a, ref.max * a, ref.count), symmetric)
            y = fake_quant(xf, s_[..., None], zp[..., None])
            return jnp.sum(jnp.where(fin, (y - xf) ** 2, 0.0), axis=-1)

        return jnp.moveaxis(jax.lax.map(err, jnp.asarray(MSE_SHRINK, jnp.float32)), 0, -1)
    if method == "minmax":
        lo = jnp.min(jnp.where(fin, x, jnp.inf), axis=-1)
        hi = jnp.max(jnp.where(fin, x, -jnp.inf), axis=-1)
    else:  # percentile:P
        p = float(method.split(":")[1]) / 100.0
        xs = jnp.sort(jnp.where(fin, x, jnp.inf), axis=-1)  # the finite ones first
        n = jnp.sum(fin, axis=-1)
        lo, hi = _quantile_sorted(xs, n, 1.0 - p), _quantile_sorted(xs, n, p)
    return jnp.stack([lo, hi], axis=-1)


def _quantile_sorted(xs: jax.Array, n: jax.Array, q: float) -> jax.Array:
    """The ``q`` quantile (linear interpolation) of the first ``n`` values of sorted ``xs``
    (last axis)."""
    pos = q * (n - 1).astype(jnp.float32)
    i = jnp.floor(pos).astype(jnp.int32)
    j = jnp.minimum(i + 1, n - 1)
    w = pos - i
    take = lambda k: jnp.take_along_axis(xs, k[..., None], axis=-1)[..., 0]
    return take(i) * (1 - w) + take(j) * w
