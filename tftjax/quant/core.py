"""Quantization-aware training: the fake-quant op (a clipped straight-through estimator).

:func:`fake_quant` rounds ``x`` onto an integer grid and back,

    fake_quant(x) = (clip(round(x · (1/s)) + zp, qmin, qmax) - zp) · s,

(``x · (1/s)`` with the reciprocal in float32, as PyTorch's kernels compute it: XLA rewrites
a division by a broadcast scale into that product in some programs and not others, and a
value on a rounding boundary would round differently in jitted and eager code),

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
from typing import Any, NamedTuple, TypeGuard

import jax
import jax.numpy as jnp

INT8_MIN, INT8_MAX = -128, 127
SYMMETRIC_MAX = 127  # symmetric int8 weights use [-127, 127] (zero is exact, the grid symmetric)


SCALE_FLOOR = float(jnp.finfo(jnp.float32).eps)
"""The smallest scale :func:`fake_quant` and :func:`activation_qparams` use."""


def _fake_quant(
    x: jax.Array,
    scale: jax.Array,
    zero_point: jax.Array,
    qmin: int = INT8_MIN,
    qmax: int = INT8_MAX,
) -> jax.Array:
    """Quantize ``x`` to integers in ``[qmin, qmax]`` with ``scale``/``zero_point`` and back.

    Args:
      x: values to quantize.
      scale: ``s > 0``, broadcastable to ``x`` (per-tensor or per-channel); floored at
        float32's eps (a scale of 0 would divide by zero).
      zero_point: integer-valued, broadcastable to ``x`` (0 for symmetric).
      qmin: the integer range's low end, and ``qmax`` its high end (both static).

    Returns:
      ``x``'s nearest grid values, clipped to the range; same shape and dtype.
    """
    return _fake_quant_fwd(x, scale, zero_point, qmin, qmax)[0]


def _fake_quant_fwd(x, scale, zero_point, qmin, qmax):
    scale = jnp.maximum(scale, SCALE_FLOOR)
    r = jnp.round(x * (1.0 / scale)) + zero_point  # the integer x rounds to, before clipping
    inside = (r >= qmin) & (r <= qmax)
    y = (jnp.clip(r, qmin, qmax) - zero_point) * scale
    return y.astype(x.dtype), (inside, scale, zero_point)


def _fake_quant_bwd(qmin, qmax, res, g):
    inside, scale, zero_point = res
    return (
        jnp.where(inside, g, jnp.zeros_like(g)),
        jnp.zeros_like(scale),
        jnp.zeros_like(zero_point),
    )


fake_quant = jax.custom_vjp(_fake_quant, nondiff_argnums=(3, 4))
fake_quant.defvjp(_fake_quant_fwd, _fake_quant_bwd)


def channel_scale(
    w: jax.Array,
    axis: int | tuple[int, ...] = -1,
    qmax: int = SYMMETRIC_MAX,
    eps: float = SCALE_FLOOR,
) -> jax.Array:
    """Symmetric per-channel scales ``absmax / qmax`` with one scale per index of the kept
    ``axis`` (an int or a tuple: e.g. ``(0, 2)`` for a stacked ``[m, in, out]`` kernel);
    the other axes are reduced and kept with size 1, so the result broadcasts against
    ``w``. Floored at ``eps`` (:func:`fake_quant`'s floor: the two agree on tiny channels)."""
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
    q = jnp.clip(jnp.round(w * (1.0 / s)), -SYMMETRIC_MAX, SYMMETRIC_MAX).astype(jnp.int8)
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


def observe(
    stats: MinMax, x: jax.Array, averaging_constant: float = 0.01, freeze_after: int | None = None
) -> MinMax:
    """PyTorch's ``MovingAverageMinMaxObserver``: the first batch sets min and max, later
    ones move them by ``averaging_constant`` toward the batch's own min and max. After
    ``freeze_after`` observations the statistics stop moving (``None``: never). Non-finite
    values are ignored (one inf would otherwise set the range for good); a batch with none
    finite leaves the statistics as they were."""
    r = batch_range(x, stats.min.ndim)
    return observe_range(stats, r[..., 0], r[..., 1], averaging_constant, freeze_after)


def batch_range(x: jax.Array, lead: int = 0) -> jax.Array:
    """``[..., 2]``: the min and max of the finite values of ``x`` per index of its ``lead``
    leading axes (``+inf, -inf`` where none is finite). Reduced over micro-batches by
    :func:`merge_ranges`, a training step's observers update once from it."""
    x = x.astype(jnp.float32)
    axes = tuple(range(lead, x.ndim))
    fin = jnp.isfinite(x)
    return jnp.stack(
        [
            jnp.min(jnp.where(fin, x, jnp.inf), axis=axes),
            jnp.max(jnp.where(fin, x, -jnp.inf), axis=axes),
        ],
        axis=-1,
    )


def merge_ranges(a: jax.Array, b: jax.Array) -> jax.Array:
    """The range of two batches' :func:`batch_range` together."""
    return jnp.stack(
        [jnp.minimum(a[..., 0], b[..., 0]), jnp.maximum(a[..., 1], b[..., 1])], axis=-1
    )


def observe_range(
    stats: MinMax,
    lo: jax.Array,
    hi: jax.Array,
    averaging_constant: float = 0.01,
    freeze_after: int | None = None,
) -> MinMax:
    """:func:`observe` of a batch whose finite values span ``[lo, hi]`` (``lo = +inf``:
    nothing finite, no update)."""
    seen = jnp.isfinite(lo)
    lo, hi = jnp.where(seen, lo, 0.0), jnp.where(seen, hi, 0.0)
    c, first = averaging_constant, stats.count == 0
    new_min = jnp.where(first, lo, stats.min + c * (lo - stats.min))
    new_max = jnp.where(first, hi, stats.max + c * (hi - stats.max))
    active = seen if freeze_after is None else seen & (stats.count < freeze_after)
    return MinMax(
        jnp.where(active, new_min, stats.min),
        jnp.where(active, new_max, stats.max),
        stats.count + active.astype(jnp.int32),
    )


def activation_qparams(
    stats: MinMax,
    symmetric: bool = False,
    qmin: int = INT8_MIN,
    qmax: int = INT8_MAX,
    eps: float = float(jnp.finfo(jnp.float32).eps),
):
    """``(scale, zero_point)`` of an observed range, PyTorch's conventions. Asymmetric
    (``per_tensor_affine``): the range widened to include 0 (so zero, e.g. padding or a
    ReLU's floor, is exact), ``s = (hi − lo)/255``, ``zp = clip(−128 − round(lo/s))``.
    Symmetric (``per_tensor_symmetric``, for int8 kernels without zero points):
    ``s = max(|lo|, |hi|)/127.5``, ``zp = 0``. The scale is floored at ``eps``."""
    lo, hi = jnp.minimum(stats.min, 0.0), jnp.maximum(stats.max, 0.0)
    if symmetric:
        scale = jnp.maximum(jnp.maximum(-lo, hi) / ((qmax - qmin) / 2), eps)
        return scale, jnp.zeros_like(scale)
    scale = jnp.maximum((hi - lo) / (qmax - qmin), eps)
    zero_point = jnp.clip(qmin - jnp.round(lo * (1.0 / scale)), qmin, qmax)
    return scale, zero_point


def quantize_activation(x: jax.Array, scale: jax.Array, zero_point: jax.Array) -> jax.Array:
    """int8 ``clip(round(x · (1/s)) + zp, -128, 127)``: the integers :func:`fake_quant` uses."""
    return jnp.clip(jnp.round(x * (1.0 / scale)) + zero_point, INT8_MIN, INT8_MAX).astype(jnp.int8)


# ----------------------------------------------------------------- quantized layers
# Every quantizable weight of the TFT by its parameter name, with the axes kept by its
# per-output-channel scale: Dense kernels [in, out] and LSTM kernels [in, 4d] (out), the
# stacked per-variable kernels [m, in, out] (variable and out) and the per-variable
# embeddings [m, d_v] (one scale per variable: their input is one scalar).
KERNEL_AXES = {
    "kernel": (1,),
    "w_i": (1,),
    "w_h": (1,),
    "emb_k": (0,),
    "fc2_k": (0, 2),
    "fc1_k": (0, 2),
    "glu_k": (0, 2),
    "skip_k": (0, 2),
}
DENSE_KERNELS = ("kernel", "w_i", "w_h")
STACKED_MATMUL_KERNELS = ("fc2_k", "fc1_k", "glu_k", "skip_k")
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
    """Post-training calibration pass (:mod:`tftjax.quant.ptq`,
    :mod:`tftjax.quant.calib`): activations stay float, each observed tensor's batch
    statistics go to the ``quant_calib`` collection."""

    act_symmetric: bool = False
    """Symmetric activations (zero point 0; ``--act-symmetric``)."""
    weight_granularity: str = "channel"
    """Dense and LSTM kernels: one scale per output channel, or one per ``tensor``."""
    stacked_scales: str = "channel"
    """The stacked per-variable kernels: one scale per (variable, output channel), or one
    per ``variable``."""

    @property
    def symmetric(self) -> bool:
        return self.act_symmetric

    def axes(self, param: str) -> tuple[int, ...]:
        """The axes the scale of kernel ``param`` keeps (:data:`KERNEL_AXES` by default)."""
        axes = KERNEL_AXES[param]
        if param in STACKED_MATMUL_KERNELS and self.stacked_scales == "variable":
            return (0,)
        if param in DENSE_KERNELS and self.weight_granularity == "tensor":
            return ()
        return axes

    def covers(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.layers)


def covered(quant: QuantSpec | None, module_path, param: str) -> TypeGuard[QuantSpec]:
    return quant is not None and quant.covers(layer_name(module_path, param))


def observer(
    mod: Any,
    param: str,
    x: jax.Array,
    quant: QuantSpec,
    *,
    update: bool = True,
    shape: tuple[int, ...] = (),
) -> MinMax:
    """The ``quant_stats`` observer of the input of ``param`` in module ``mod``, as it was
    before this step (what the step quantizes with). In a training step (the ``quant_batch``
    collection mutable; never at init, never in evaluation) and with ``update``, ``x``'s
    range is recorded in ``quant_batch``: the step merges its micro-batches' ranges and
    updates every observer once (:func:`update_observers`), whatever ``--accumulate``."""
    v = mod.variable("quant_stats", f"{param}_in", init_minmax, shape)
    if update and mod.is_mutable_collection("quant_batch") and not mod.is_initializing():
        rec = batch_range(x, len(shape))
        mod.variable("quant_batch", f"{param}_in", lambda: rec).value = rec
    return v.value


def update_observers(stats: Any, ranges: Any, quant: QuantSpec) -> Any:
    """Every observer of ``stats`` (a ``quant_stats`` tree) moved once by its batch range in
    ``ranges`` (the ``quant_batch`` tree of the step, micro-batches merged); observers the
    step did not record keep their values."""
    if isinstance(stats, MinMax):
        if ranges is None:
            return stats
        return observe_range(
            stats, ranges[..., 0], ranges[..., 1], quant.averaging_constant, quant.freeze_after
        )
    return {k: update_observers(v, (ranges or {}).get(k), quant) for k, v in stats.items()}


def quantize_observed(x: jax.Array, stats: MinMax, symmetric: bool = False) -> jax.Array:
    """``fake_quant`` with an observer's range; an observer that has seen nothing yet (the
    first training step) lets ``x`` through unquantized."""
    s, zp = activation_qparams(stats, symmetric)
    return jnp.where(stats.count > 0, fake_quant(x, s, zp), x)


def weight(mod: Any, param: str, w: jax.Array, quant: QuantSpec) -> Any:
    """A covered kernel for the forward pass: ``fake``: the fake-quantized float weight;
    ``int8``: ``(int8 weight, scale)`` with the scale from the ``weight_scale`` collection."""
    axes = quant.axes(param)
    if quant.mode == "fake":
        return fake_quant_weight(w, axes)
    if w.dtype != jnp.int8:
        raise ValueError(
            f"{layer_name(mod.path, param)}: int8 mode needs int8 kernels "
            "(tftjax.quant.tree.int8_variables)"
        )
    return w, mod.get_variable("weight_scale", param)


def dequantize(wq) -> jax.Array:
    """Weight-only use of an int8 kernel (inputs that are one scalar per variable)."""
    q, s = wq
    return q.astype(jnp.float32) * s


def int8_dense(qx, s, zp, qw, sw) -> jax.Array:
    """``Σ_i s(qx_i − zp) · sw_j qw_ij`` as ``s·sw_j (qx·qw − zp Σ_i qw_ij)`` in int32."""
    acc = jax.lax.dot_general(
        qx, qw, (((qx.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.int32
    )
    corr = zp.astype(jnp.int32) * qw.astype(jnp.int32).sum(0)
    return (acc - corr).astype(jnp.float32) * (s * sw.reshape(-1))


def int8_bmm(qx, s, zp, qw, sw) -> jax.Array:
    """Per-variable ``[m, N, i] × [m, i, o]`` with per-variable activation qparams ``[m]``
    and weight scales ``[m, 1, o]``: int8 operands, int32 accumulation."""
    acc = jax.lax.dot_general(
        qx, qw, (((2,), (1,)), ((0,), (0,))), preferred_element_type=jnp.int32
    )
    corr = zp.astype(jnp.int32)[:, None, None] * qw.astype(jnp.int32).sum(1, keepdims=True)
    return (acc - corr).astype(jnp.float32) * (s[:, None, None] * sw)
