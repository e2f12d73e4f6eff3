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

``s`` and ``zp`` broadcast against ``x`` (a scalar: per-tensor; ``[1, C]``: per-channel).

References: Jacob et al., CVPR 2018 (integer-arithmetic-only inference); Bengio et al.,
2013 (straight-through estimators).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

INT8_MIN, INT8_MAX = -128, 127
SYMMETRIC_MAX = 127  # symmetric int8 weights use [-127, 127] (zero is exact, the grid symmetric)


SCALE_FLOOR = float(jnp.finfo(jnp.float32).eps)
"""The smallest scale :func:`fake_quant` and :func:`activation_qparams` use."""


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def fake_quant(x: jax.Array, scale: jax.Array, zero_point: jax.Array, qmin: int = INT8_MIN,
               qmax: int = INT8_MAX) -> jax.Array:
    """Quantize ``x`` to integers in ``[qmin, qmax]`` with ``scale``/``zero_point`` and back.

    Args:
      x: values to quantize.
      scale: ``s > 0``, broadcastable to ``x`` (per-tensor or per-channel); floored at
        float32's eps (a scale of 0 would divide by zero).
      zero_point: integer-valued, broadcastable to ``x`` (0 for symmetric).
      qmin, qmax: the integer range (static).

    Returns:
      ``x``'s nearest grid values, clipped to the range; same shape and dtype.
    """
    return _fake_quant_fwd(x, scale, zero_point, qmin, qmax)[0]


def _fake_quant_fwd(x, scale, zero_point, qmin, qmax):
    scale = jnp.maximum(scale, SCALE_FLOOR)
    r = jnp.round(x / scale) + zero_point  # the integer x rounds to, before clipping
    inside = (r >= qmin) & (r <= qmax)
    y = (jnp.clip(r, qmin, qmax) - zero_point) * scale
    return y.astype(x.dtype), (inside, scale, zero_point)


def _fake_quant_bwd(qmin, qmax, res, g):
    inside, scale, zero_point = res
    return (jnp.where(inside, g, jnp.zeros_like(g)), jnp.zeros_like(scale),
            jnp.zeros_like(zero_point))


fake_quant.defvjp(_fake_quant_fwd, _fake_quant_bwd)


def channel_scale(w: jax.Array, axis: int | tuple[int, ...] = -1, qmax: int = SYMMETRIC_MAX,
                  eps: float = 1e-12) -> jax.Array:
    """Symmetric per-channel scales ``absmax / qmax`` with one scale per index of the kept
    ``axis`` (an int or a tuple: e.g. ``(0, 2)`` for a stacked ``[m, in, out]`` kernel);
    the other axes are reduced and kept with size 1, so the result broadcasts against
    ``w``. An all-zero channel gets ``eps``."""
    kept = {a % w.ndim for a in ((axis,) if isinstance(axis, int) else axis)}
    others = tuple(a for a in range(w.ndim) if a not in kept)
    absmax = jnp.max(jnp.abs(w), axis=others, keepdims=True)
    return jnp.maximum(absmax / qmax, eps)


def fake_quant_weight(w: jax.Array, axis: int | tuple[int, ...] = -1) -> jax.Array:
    """int8 symmetric per-output-channel fake quantization of a weight (absmax scales,
    recomputed from ``w`` and not differentiated)."""
    s = jax.lax.stop_gradient(channel_scale(w, axis))
    return fake_quant(w, s, jnp.zeros_like(s), -SYMMETRIC_MAX, SYMMETRIC_MAX)


def quantize_weight(w: jax.Array, axis: int | tuple[int, ...] = -1):
    """``(int8 weight, float32 scale)`` with ``w ≈ q · scale``, the same grid as
    :func:`fake_quant_weight` (so ``q · scale == fake_quant_weight(w)`` exactly)."""
    s = channel_scale(w, axis)
    q = jnp.clip(jnp.round(w / s), -SYMMETRIC_MAX, SYMMETRIC_MAX).astype(jnp.int8)
    return q, s.astype(jnp.float32)


# ----------------------------------------------------------------- activation observers
class MinMax(NamedTuple):
    """Moving-average min/max of what an activation has seen (a ``quant_stats`` leaf).

    Scalars for a per-tensor observer, ``[m]`` for one observer per variable of a
    stacked layer (the observed tensor's leading axes match the stats' shape)."""

    min: jax.Array  # float32
    max: jax.Array  # float32
    count: jax.Array  # int32: observations so far (one per training step)


def init_minmax(shape: tuple[int, ...] = ()) -> MinMax:
    z = jnp.zeros(shape, jnp.float32)
    return MinMax(z, z, jnp.zeros(shape, jnp.int32))


def observe(stats: MinMax, x: jax.Array, averaging_constant: float = 0.01,
            freeze_after: int | None = None) -> MinMax:
    """PyTorch's ``MovingAverageMinMaxObserver``: the first batch sets min and max, later
    ones move them by ``averaging_constant`` toward the batch's own min and max. After
    ``freeze_after`` observations the statistics stop moving (``None``: never). Non-finite
    values are ignored (one inf would otherwise set the range for good); a batch with none
    finite leaves the statistics as they were."""
    axes = tuple(range(stats.min.ndim, x.ndim))  # stats' leading axes are per-channel
    x = x.astype(jnp.float32)
    fin = jnp.isfinite(x)
    lo = jnp.min(jnp.where(fin, x, jnp.inf), axis=axes)
    hi = jnp.max(jnp.where(fin, x, -jnp.inf), axis=axes)
    seen = jnp.isfinite(lo)
    lo, hi = jnp.where(seen, lo, 0.0), jnp.where(seen, hi, 0.0)
    c, first = averaging_constant, stats.count == 0
    new_min = jnp.where(first, lo, stats.min + c * (lo - stats.min))
    new_max = jnp.where(first, hi, stats.max + c * (hi - stats.max))
    active = seen if freeze_after is None else seen & (stats.count < freeze_after)
    return MinMax(jnp.where(active, new_min, stats.min), jnp.where(active, new_max, stats.max),
                  stats.count + active.astype(jnp.int32))


def activation_qparams(stats: MinMax, qmin: int = INT8_MIN, qmax: int = INT8_MAX,
                       eps: float = float(jnp.finfo(jnp.float32).eps)):
    """Asymmetric ``(scale, zero_point)`` from an observed range that always includes 0 (so
    zero, e.g. padding or a ReLU's floor, is exact), PyTorch's ``per_tensor_affine``."""
    lo, hi = jnp.minimum(stats.min, 0.0), jnp.maximum(stats.max, 0.0)
    scale = jnp.maximum((hi - lo) / (qmax - qmin), eps)
    zero_point = jnp.clip(qmin - jnp.round(lo / scale), qmin, qmax)
    return scale, zero_point


def quantize_activation(x: jax.Array, scale: jax.Array, zero_point: jax.Array) -> jax.Array:
    """int8 ``clip(round(x / s) + zp, -128, 127)``: the integers :func:`fake_quant` uses."""
    return jnp.clip(jnp.round(x / scale) + zero_point, INT8_MIN, INT8_MAX).astype(jnp.int8)


# ----------------------------------------------------------------- quantized layers
# Every quantizable weight of the TFT by its parameter name, with the axes kept by its
# per-output-channel scale: Dense kernels [in, out] and LSTM kernels [in, 4d] (out), the
# stacked per-variable kernels [m, in, out] (variable and out) and the per-variable
# embeddings [m, d_v] (one scale per variable: their input is one scalar).
KERNEL_AXES = {"kernel": (1,), "w_i": (1,), "w_h": (1,), "emb_k": (0,), "fc2_k": (0, 2),
               "fc1_k": (0, 2), "glu_k": (0, 2), "skip_k": (0, 2)}
DEFAULT_LAYERS = ("*",)
MODES = ("float", "fake", "int8")


def layer_name(module_path: tuple[str, ...] | str, param: str) -> str:
    """The name a ``--qat-layers`` pattern matches: the Dense module's path
    (``encoder_vsn/weights/glu/proj``), or module path / parameter for the stacked and
    LSTM kernels (``encoder_vsn/glu_k``, ``lstm_encoder/w_h``)."""
    path = module_path if isinstance(module_path, str) else "/".join(module_path)
    return path if param == "kernel" else f"{path}/{param}"


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    """How a model quantizes (static, hashable: part of the module's attributes).

    mode: ``fake`` (QAT / calibration: fake-quant weights and activations, float
    arithmetic) or ``int8`` (int8 operands, int32 accumulation; kernels are int8
    parameters with their scales in the ``weight_scale`` collection).
    layers: fnmatch patterns over :func:`layer_name`; a matching layer is quantized.
    """

    mode: str = "fake"
    layers: tuple[str, ...] = DEFAULT_LAYERS
    freeze_after: int | None = None
    averaging_constant: float = 0.01
    calibrate: str | None = None
    """Post-training calibration pass (:mod:`tftjax.training.ptq`): activations stay float
    and each observed tensor's batch statistics go to the ``quant_calib`` collection:
    ``minmax`` its min and max, ``percentile:P`` its P-th and (100-P)-th percentiles, ``mse``
    the quantisation error of every candidate range :data:`MSE_SHRINK` × the range in
    ``quant_stats``."""

    def covers(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.layers)


def covered(quant: QuantSpec | None, module_path, param: str) -> bool:
    return quant is not None and quant.covers(layer_name(module_path, param))


def observer(mod: Any, param: str, x: jax.Array, quant: QuantSpec, *, update: bool = True,
             shape: tuple[int, ...] = ()) -> MinMax:
    """The ``quant_stats`` observer of the input of ``param`` in module ``mod``, updated
    with ``x`` when the collection is mutable (a training or calibration step; never at
    init, never in evaluation) and ``update``. Returns the statistics to quantize with."""
    v = mod.variable("quant_stats", f"{param}_in", init_minmax, shape)
    if update and mod.is_mutable_collection("quant_stats") and not mod.is_initializing():
        v.value = observe(v.value, x, quant.averaging_constant, quant.freeze_after)
    return v.value


def weight(mod: Any, param: str, w: jax.Array, quant: QuantSpec):
    """A covered kernel for the forward pass: ``fake``: the fake-quantized float weight;
    ``int8``: ``(int8 weight, scale)`` with the scale from the ``weight_scale`` collection."""
    axes = KERNEL_AXES[param]
    if quant.mode == "fake":
        return fake_quant_weight(w, axes)
    if w.dtype != jnp.int8:
        raise ValueError(f"{layer_name(mod.path, param)}: int8 mode needs int8 kernels "
                         "(tftjax.quant_tree.int8_variables)")
    return w, mod.get_variable("weight_scale", param)


def dequantize(wq) -> jax.Array:
    """Weight-only use of an int8 kernel (inputs that are one scalar per variable)."""
    q, s = wq
    return q.astype(jnp.float32) * s


def dense(mod: Any, param: str, x: jax.Array, w: jax.Array, quant: QuantSpec | None) -> jax.Array:
    """``x @ w`` over the last axis of ``x`` and the first of ``w``, quantized when
    ``quant`` covers the layer: ``fake``: ``fq(x) @ fq(w)``; ``int8``: int8 operands,
    int32 accumulation, rescaled after."""
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    if not covered(quant, mod.path, param):
        return jax.lax.dot_general(x, w, dims)
    if quant.calibrate is not None:  # record, quantize no activation
        calibration_record(mod, param, x, quant.calibrate)
        return jax.lax.dot_general(x, weight(mod, param, w, quant), dims)
    s, zp = activation_qparams(observer(mod, param, x, quant))
    if quant.mode == "fake":
        return jax.lax.dot_general(fake_quant(x, s, zp), weight(mod, param, w, quant), dims)
    qw, sw = weight(mod, param, w, quant)
    return int8_dense(quantize_activation(x, s, zp), s, zp, qw, sw)


MSE_SHRINK = tuple(float(a) for a in np.linspace(0.2, 1.0, 41))
"""Candidate ranges of ``--calibration mse``: these fractions of the observed min/max."""


def calibration_record(mod: Any, param: str, x: jax.Array, method: str) -> None:
    """One calibration batch's statistics of the input of ``param`` in ``mod``
    (:func:`calibration_stats`, into the ``quant_calib`` collection)."""
    if mod.is_initializing() or not mod.is_mutable_collection("quant_calib"):
        return
    name = f"{param}_in"
    ref = mod.get_variable("quant_stats", name) if method == "mse" else None
    rec = calibration_stats(x, method, ref)
    mod.variable("quant_calib", name, lambda: rec).value = rec


def calibration_stats(x: jax.Array, method: str, ref: MinMax | None = None,
                      lead: int = 0) -> jax.Array:
    """What a calibration batch says of the tensor ``x`` (per index of its ``lead`` leading
    axes, e.g. one per variable of a stacked layer; non-finite values ignored):
    ``minmax``: ``[..., 2]`` its min and max; ``percentile:P``: its P-th and (100−P)-th
    percentiles (linear interpolation); ``mse``: ``[..., A]`` the summed squared error of
    fake-quantizing it with each :data:`MSE_SHRINK` fraction of the range ``ref``."""
    x = x.astype(jnp.float32)
    x = x.reshape(x.shape[:lead] + (-1,))
    fin = jnp.isfinite(x)
    if method == "mse":
        xf = jnp.where(fin, x, 0.0)

        def err(a):  # one candidate at a time: one compiled body, the tensor's own memory
            s_, zp = activation_qparams(MinMax(ref.min * a, ref.max * a, ref.count))
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
    take = lambda k: jnp.take_along_axis(xs, k[..., None], axis=-1)[..., 0]  # noqa: E731
    return take(i) * (1 - w) + take(j) * w


def int8_dense(qx, s, zp, qw, sw) -> jax.Array:
    """``Σ_i s(qx_i − zp) · sw_j qw_ij`` as ``s·sw_j (qx·qw − zp Σ_i qw_ij)`` in int32."""
    acc = jax.lax.dot_general(qx, qw, (((qx.ndim - 1,), (0,)), ((), ())),
                              preferred_element_type=jnp.int32)
    corr = zp.astype(jnp.int32) * qw.astype(jnp.int32).sum(0)
    return (acc - corr).astype(jnp.float32) * (s * sw.reshape(-1))


def int8_bmm(qx, s, zp, qw, sw) -> jax.Array:
    """Per-variable ``[m, N, i] × [m, i, o]`` with per-variable activation qparams ``[m]``
    and weight scales ``[m, 1, o]``: int8 operands, int32 accumulation."""
    acc = jax.lax.dot_general(qx, qw, (((2,), (1,)), ((0,), (0,))),
                              preferred_element_type=jnp.int32)
    corr = zp.astype(jnp.int32)[:, None, None] * qw.astype(jnp.int32).sum(1, keepdims=True)
    return (acc - corr).astype(jnp.float32) * (s[:, None, None] * sw)
