"""The LSTM recurrence as two persistent Pallas kernels (GPU, Triton): all T steps in one
launch each way.

:func:`tftjax.models.recurrence.lstm_recurrence` runs its forward and backward recurrences
as ``lax.scan``s: on a GPU each step is about seven kernel launches each way (a GEMM, an
element-wise fusion, the stacked outputs, the loop counter), 844 of TFT-225's 1,700
launches per step, compiled for the H100 target. Here each recurrence is one kernel:

* one program per tile of ``block_rows`` batch rows (rows are independent), looping over
  the steps inside the kernel with ``c`` and ``h`` in registers;
* the four gates as four ``[rows, d] × [d, d]`` dots against column blocks of ``W_h``
  (read from L2 each step), so that no register tensor is ever sliced: Triton cannot;
* forward: the gates (compute dtype), cell states (float32) and outputs are written per
  step, as the scan's stacked outputs were;
* backward: the same step as the scan's (activations recomputed in float32 from the saved
  gates), writing ``dgates`` per step; ``dh_{t-1} = Σ_k dgates_k W_kᵀ`` in float32. The
  kernels' gradients stay one GEMM each over all steps after the kernel
  (``tftjax.models.recurrence``).

Triton wants power-of-two sizes, and dots of at least 16 in every dimension: ``d`` is padded
with zero units to such a size (their gates are 0, so ``g = tanh 0 = 0`` keeps their ``c``
and ``h`` exactly 0, and their gradients are 0) and the rows to whole tiles of at least 16. On CPU the kernels run in Pallas' interpreter (the tests); compiled for
a GPU target each is one ``__gpu$xla.gpu.triton`` call.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tftjax.models.kernels.triton_util import dot_size, triton_params

Array = jax.Array
F32 = jnp.float32
BLOCK_ROWS = 16
"""Batch rows per program: Triton's smallest dot tile (M ≥ 16); TFT-225 at batch 256 runs
16 programs, each holding ``c``, ``h`` and four gate blocks of [16, 128] in registers."""


def dot(a, b, ca, cb):
    return lax.dot_general(a, b, (((ca,), (cb,)), ((), ())), preferred_element_type=F32)


def _fwd_kernel(xp_ref, wh_ref, c0_ref, h0_ref, g_ref, cs_ref, hs_ref, *, steps, bn, d):
    rows = pl.ds(pl.program_id(0) * bn, bn)
    cd = hs_ref.dtype

    def body(t, carry):
        c, h = carry
        gates = []
        for k in range(4):  # i, f, g, o
            cols = pl.ds(k * d, d)
            gk = (xp_ref[t, rows, cols].astype(F32) + dot(h, wh_ref[:, cols], 1, 0)).astype(cd)
            g_ref[t, rows, cols] = gk
            gates.append(gk.astype(F32))
        i, f, g, o = gates
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = (jax.nn.sigmoid(o) * jnp.tanh(c)).astype(cd)
        cs_ref[t, rows, :] = c
        hs_ref[t, rows, :] = h
        return c, h

    lax.fori_loop(0, steps, body, (c0_ref[rows, :].astype(F32), h0_ref[rows, :]))


def _bwd_kernel(
    g_ref,
    cs_ref,
    c0_ref,
    dhs_ref,
    dc_ref,
    dh_ref,
    wh_ref,
    dg_ref,
    dc0_ref,
    dh0_ref,
    *,
    steps,
    bn,
    d,
):
    rows = pl.ds(pl.program_id(0) * bn, bn)
    cd = dg_ref.dtype
    c0 = c0_ref[rows, :]

    def body(s, carry):
        dc, dh = carry
        t = steps - 1 - s
        dh = dh + dhs_ref[t, rows, :].astype(F32)
        i, f, g, o = (g_ref[t, rows, pl.ds(k * d, d)].astype(F32) for k in range(4))
        si, sf, tg, so = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
        ct = cs_ref[t, rows, :]
        cp = jnp.where(t > 0, cs_ref[jnp.maximum(t - 1, 0), rows, :], c0)
        tc = jnp.tanh(ct)
        dc = dc + dh * so * (1.0 - tc * tc)
        dgs = (
            dc * tg * si * (1.0 - si),
            dc * cp * sf * (1.0 - sf),
            dc * si * (1.0 - tg * tg),
            dh * tc * so * (1.0 - so),
        )
        dh_prev = jnp.zeros_like(dh)
        for k, dgk in enumerate(dgs):
            cols = pl.ds(k * d, d)
            dgk = dgk.astype(cd)
            dg_ref[t, rows, cols] = dgk
            dh_prev = dh_prev + dot(dgk, wh_ref[:, cols], 1, 1)
        return dc * sf, dh_prev

    dc, dh = lax.fori_loop(0, steps, body, (dc_ref[rows, :], dh_ref[rows, :]))
    dc0_ref[rows, :] = dc
    dh0_ref[rows, :] = dh


def _pad_gates(a: Array, d: int, dp: int) -> Array:
    """``[..., 4d]`` → ``[..., 4dp]``: each gate block padded with zero units."""
    lead = a.shape[:-1]
    a = a.reshape(lead + (4, d))
    return jnp.pad(a, [(0, 0)] * len(lead) + [(0, 0), (0, dp - d)]).reshape(lead + (4 * dp,))


def _unpad_gates(a: Array, d: int, dp: int) -> Array:
    lead = a.shape[:-1]
    return a.reshape(lead + (4, dp))[..., :d].reshape(lead + (4 * d,))


def _shape(b: int, d: int, block_rows: int):
    bn = min(dot_size(block_rows), dot_size(b))
    return bn, -(-b // bn) * bn, dot_size(d)


def forward(
    xp: Array, w_h: Array, c0: Array, h0: Array, *, interpret: bool, block_rows: int = BLOCK_ROWS
):
    """``(gates, cs, hs)`` ``[T, B, ·]`` of the recurrence over ``xp`` ``[T, B, 4d]`` (the
    compute dtype, bias included), ``w_h`` ``[d, 4d]`` (in the compute dtype), ``c0``
    float32 and ``h0`` ``[B, d]``: what ``recurrence._scan`` returns, from one kernel."""
    steps, b, g4 = xp.shape
    d = g4 // 4
    cd = xp.dtype
    bn, bp, dp = _shape(b, d, block_rows)
    xp_p = jnp.pad(_pad_gates(xp, d, dp), [(0, 0), (0, bp - b), (0, 0)])
    wh_p = jnp.pad(_pad_gates(w_h.astype(cd), d, dp), [(0, dp - d), (0, 0)])
    rows = lambda a: jnp.pad(a, [(0, bp - b), (0, dp - d)])
    gates, cs, hs = pl.pallas_call(
        functools.partial(_fwd_kernel, steps=steps, bn=bn, d=dp),
        out_shape=(
            jax.ShapeDtypeStruct((steps, bp, 4 * dp), cd),
            jax.ShapeDtypeStruct((steps, bp, dp), F32),
            jax.ShapeDtypeStruct((steps, bp, dp), cd),
        ),
        grid=(bp // bn,),
        in_specs=[pl.no_block_spec] * 4,
        out_specs=[pl.no_block_spec] * 3,
        interpret=interpret,
        compiler_params=triton_params(interpret),
        name="lstm_fwd",
        metadata={"matmul_flops": str(2 * steps * bp * dp * 4 * dp)},
    )(xp_p, wh_p, rows(c0.astype(F32)), rows(h0.astype(cd)))
    return (_unpad_gates(gates[:, :b], d, dp), cs[:, :b, :d], hs[:, :b, :d])


def backward(
    gates: Array,
    cs: Array,
    c0: Array,
    dhs: Array,
    dc: Array,
    dh: Array,
    w_h: Array,
    *,
    interpret: bool,
    block_rows: int = BLOCK_ROWS,
):
    """``(dgates [T, B, 4d] compute dtype, dc0, dh0 [B, d] float32)``: the backward
    recurrence of ``recurrence._bwd`` from the saved ``gates`` and cell states ``cs``, the
    outputs' cotangents ``dhs`` and the final carry's ``dc``, ``dh``."""
    steps, b, g4 = gates.shape
    d = g4 // 4
    cd = gates.dtype
    bn, bp, dp = _shape(b, d, block_rows)
    seq = lambda a: jnp.pad(a, [(0, 0), (0, bp - b), (0, dp - d)])
    rows = lambda a: jnp.pad(a.astype(F32), [(0, bp - b), (0, dp - d)])
    g_p = jnp.pad(_pad_gates(gates, d, dp), [(0, 0), (0, bp - b), (0, 0)])
    wh_p = jnp.pad(_pad_gates(w_h.astype(cd), d, dp), [(0, dp - d), (0, 0)])
    dg, dc0, dh0 = pl.pallas_call(
        functools.partial(_bwd_kernel, steps=steps, bn=bn, d=dp),
        out_shape=(
            jax.ShapeDtypeStruct((steps, bp, 4 * dp), cd),
            jax.ShapeDtypeStruct((bp, dp), F32),
            jax.ShapeDtypeStruct((bp, dp), F32),
        ),
        grid=(bp // bn,),
        in_specs=[pl.no_block_spec] * 7,
        out_specs=[pl.no_block_spec] * 3,
        interpret=interpret,
        compiler_params=triton_params(interpret),
        name="lstm_bwd",
        metadata={"matmul_flops": str(2 * steps * bp * dp * 4 * dp)},
    )(g_p, seq(cs.astype(F32)), rows(c0), seq(dhs), rows(dc), rows(dh), wh_p)
    return _unpad_gates(dg[:, :b], d, dp), dc0[:b, :d], dh0[:b, :d]
