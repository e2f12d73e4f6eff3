"""The variable selection network's per-variable GRNs as two Pallas kernels (GPU, Triton).

The GPU twin of :mod:`tftjax.models.kernels.fused`: the same function, ``Σ_j w_j GRN_j(x_j)``
over m variables with the embedding folded in, and the same recomputing backward pass,
laid out for a GPU.

* **Forward**: one program per tile of ``block_rows`` rows, looping over the m variables
  inside the kernel: it reads each variable's parameters (a few KB, from L2), folds the
  embedding into them, runs the GRN on the tile and adds ``w_j ⊙ GRN_j`` to an accumulator
  in registers. None of the ``[m, N, ·]`` tensors that the XLA program passes through HBM
  30-40 times per step exists outside the kernel.
* **Backward**: one program per variable (times ``R`` row splits where m alone cannot fill
  the GPU), looping over its rows' tiles: it recomputes the variable's GRN, accumulates the
  folded parameters' gradients in registers, unfolds them into the stacked parameters' and
  writes its split's share; one more launch sums the splits
  (:func:`tftjax.models.kernels.multi_tensor.sum_splits`). ``dx`` and ``dw`` are written tile by
  tile.

The kernels read ``VariableSelection``'s parameters as they are: the fold, the padding and
the casts happen in registers, so nothing else runs per step. Matmul operands are in the
parameters' dtype (bfloat16 under ``--precision bf16``) with float32 sums; everything
element-wise is float32. Triton wants power-of-two tiles and dots of at least 16 a side
(Pallas does not check): ``d_v`` and ``d`` are padded in registers by masked loads (zeros,
which stay zero through the GRN; LayerNorm's statistics are masked to the real ``d``), and
rows to whole tiles (padded rows carry ``w = 0``). TFT-225 (``d_v`` 8, ``d`` 128) pads
``d_v`` to 16.

On CPU the kernels run in Pallas' interpreter: that is how the tests check values and
gradients against the reference VSN (:func:`tftjax.models.vsn.stacked_grn`). Compiled for
the H100 target without a GPU (``tftjax.memory.targets``), each is one Triton call.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from tftjax.models.dropout import keep_prob
from tftjax.models.kernels import multi_tensor
from tftjax.models.kernels.fused import EPS, Folded
from tftjax.models.kernels.triton_util import (
    dot,
    dot_size,
    meta,
    plt,
    row_splits,
    start,
    triton_params,
)
from tftjax.models.kernels.vsn_tiles import PARAMS, ParamTiles

Array = jax.Array
BLOCK_ROWS = 64
"""Rows per forward program: the ``[rows, d]`` accumulator and the GRN's few live
``[rows, d]`` values stay in registers (64 × 128 float32 = 32 KB per program)."""
TARGET_PROGRAMS = 264
"""The backward splits rows until m × splits reaches this (2 programs per H100 SM)."""


@dataclasses.dataclass(frozen=True)
class _Static:
    m: int
    dv: int  # real per-variable embedding size
    d: int  # real hidden size (LayerNorm's statistics are over these columns)
    bn: int  # rows per tile
    splits: int  # backward row splits R
    per: int  # tiles per split
    scale: float  # dropout's 1 / keep probability (1.0 without dropout)
    cd: str  # matmul operand dtype
    interpret: bool
    num_warps: int

    @property
    def dvp(self) -> int:  # the tiles' padded sizes
        return dot_size(self.dv)

    @property
    def dp(self) -> int:
        return dot_size(self.d)


def _compiler_params(st: _Static):
    return triton_params(st.interpret, st.num_warps)


def _grn(q: Folded, x: Array, keep: Array | None, st: _Static, cd):
    """One variable on one tile: ``x`` [bn] float32, ``keep`` [bn, d_v] (0/1) or None."""
    a = x[:, None] * q.fk[None, :] + q.fb[None, :]  # [bn, d_v]
    h = jnp.where(a > 0, a, jnp.expm1(jnp.minimum(a, 0.0)))
    eta = dot(h, q.w1, 1, 0, cd) + q.b1[None, :]
    if keep is not None:
        eta = eta * (keep.astype(jnp.float32) * st.scale)
    v = dot(eta, q.vk, 1, 0, cd) + q.vb[None, :]  # [bn, d]
    s = jax.nn.sigmoid(dot(eta, q.gk, 1, 0, cd) + q.gb[None, :])
    y = x[:, None] * q.sk[None, :] + q.sb[None, :] + s * v
    mask = None
    if st.dp != st.d:  # padded columns: y is 0 there, but y - mean is not
        mask = (lax.broadcasted_iota(jnp.int32, (1, st.dp), 1) < st.d).astype(jnp.float32)
    mu = jnp.sum(y, axis=-1, keepdims=True) / st.d
    yc = y - mu if mask is None else (y - mu) * mask
    r = lax.rsqrt(jnp.sum(yc * yc, axis=-1, keepdims=True) / st.d + EPS)
    return a, h, eta, v, s, yc * r, r, mask


def _keep(keep_ref, j, rows, st: _Static):
    mask = jnp.arange(st.dvp) < st.dv
    return plt().load(keep_ref.at[j, rows, pl.ds(start(), st.dvp)], mask=mask[None, :], other=0)


def _fwd_kernel(*refs, st: _Static, has_keep: bool):
    x_ref, w_ref = refs[:2]
    keep_ref = refs[2] if has_keep else None
    prm = refs[2 + has_keep : -1]
    out_ref = refs[-1]
    cd = jnp.dtype(st.cd)
    rows = pl.ds(pl.program_id(0) * st.bn, st.bn)

    def body(j, acc):
        raw = ParamTiles(prm, j, st.dv, st.d)
        q = raw.folded()
        x = x_ref[j, rows].astype(jnp.float32)
        keep = _keep(keep_ref, j, rows, st) if has_keep else None
        *_, yh, _, _ = _grn(q, x, keep, st, cd)
        o = yh * q.ln_g[None, :] + q.ln_b[None, :]
        return acc + w_ref[j, rows].astype(jnp.float32)[:, None] * o

    acc = lax.fori_loop(0, st.m, body, jnp.zeros((st.bn, st.dp), jnp.float32))
    plt().store(
        out_ref.at[rows, pl.ds(start(), st.dp)], acc, mask=(jnp.arange(st.dp) < st.d)[None, :]
    )


def _bwd_kernel(*refs, st: _Static, has_keep: bool):
    x_ref, w_ref = refs[:2]
    keep_ref = refs[2] if has_keep else None
    go_ref = refs[2 + has_keep]
    n = len(PARAMS)
    prm = refs[3 + has_keep : 3 + has_keep + n]
    dx_ref, dw_ref, *g_refs = refs[3 + has_keep + n :]
    cd = jnp.dtype(st.cd)
    j, r_ = pl.program_id(0), pl.program_id(1)
    raw = ParamTiles(prm, j, st.dv, st.d)
    q = raw.folded()
    hmask = jnp.arange(st.dp) < st.d

    def body(t, g: Folded):
        rows = pl.ds((r_ * st.per + t) * st.bn, st.bn)
        x = x_ref[j, rows].astype(jnp.float32)
        w = w_ref[j, rows].astype(jnp.float32)
        keep = _keep(keep_ref, j, rows, st) if has_keep else None
        go = (
            plt()
            .load(go_ref.at[rows, pl.ds(start(), st.dp)], mask=hmask[None, :], other=0)
            .astype(jnp.float32)
        )  # [bn, d]
        a, h, eta, v, s, yh, r, mask = _grn(q, x, keep, st, cd)
        o = yh * q.ln_g[None, :] + q.ln_b[None, :]
        dw_ref[j, rows] = jnp.sum(go * o, axis=-1).astype(dw_ref.dtype)
        wg = w[:, None] * go
        dyh = wg * q.ln_g[None, :]
        m1 = jnp.sum(dyh, axis=-1, keepdims=True) / st.d
        m2 = jnp.sum(dyh * yh, axis=-1, keepdims=True) / st.d
        dy = r * (dyh - m1 - yh * m2)
        if mask is not None:
            dy = dy * mask
        dv = dy * s
        dg = dy * v * s * (1.0 - s)
        deta = dot(dv, q.vk, 1, 1, cd) + dot(dg, q.gk, 1, 1, cd)  # [bn, d_v]
        if keep is not None:
            deta = deta * (keep.astype(jnp.float32) * st.scale)
        da = dot(deta, q.w1, 1, 1, cd) * jnp.where(a > 0, 1.0, h + 1.0)
        dx = jnp.sum(dy * q.sk[None, :], axis=-1) + jnp.sum(da * q.fk[None, :], axis=-1)
        dx_ref[j, rows] = dx.astype(dx_ref.dtype)
        xs = x[:, None]
        return Folded(
            fk=g.fk + jnp.sum(xs * da, axis=0),
            fb=g.fb + jnp.sum(da, axis=0),
            w1=g.w1 + dot(h, deta, 0, 0, cd),
            b1=g.b1 + jnp.sum(deta, axis=0),
            vk=g.vk + dot(eta, dv, 0, 0, cd),
            vb=g.vb + jnp.sum(dv, axis=0),
            gk=g.gk + dot(eta, dg, 0, 0, cd),
            gb=g.gb + jnp.sum(dg, axis=0),
            sk=g.sk + jnp.sum(xs * dy, axis=0),
            sb=g.sb + jnp.sum(dy, axis=0),
            ln_g=g.ln_g + jnp.sum(wg * yh, axis=0),
            ln_b=g.ln_b + jnp.sum(wg, axis=0),
        )

    g = lax.fori_loop(0, st.per, body, Folded(*(jnp.zeros_like(a) for a in q)))
    raw.store_grads(g_refs, r_, raw.unfold(g))


def _specs(n: int):
    return [pl.no_block_spec] * n


def matmul_flops(m: int, rows: int, dv: int, d: int) -> int:
    """One variable-sum's forward matmul FLOPs: per variable and row, ``η = h W_1`` and the
    GLU's two halves. The backward pass does three times as much: the recomputed forward,
    the input gradients (``dη``, ``dh``) and the weight gradients."""
    return 2 * m * rows * (dv * dv + 2 * dv * d)


def _fwd(prm: tuple, x: Array, w: Array, keep: Array | None, st: _Static) -> Array:
    n_p = x.shape[1]
    args = (x, w) + ((keep,) if keep is not None else ()) + tuple(prm)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, st=st, has_keep=keep is not None),
        out_shape=jax.ShapeDtypeStruct((n_p, st.d), jnp.float32),
        grid=(n_p // st.bn,),
        in_specs=_specs(len(args)),
        out_specs=pl.no_block_spec,
        interpret=st.interpret,
        compiler_params=_compiler_params(st),
        name="vsn_grn_sum_fwd",
        metadata=meta(matmul_flops(st.m, n_p, st.dvp, st.dp)),
    )(*args)


def _bwd(prm: tuple, x: Array, w: Array, keep: Array | None, gout: Array, st: _Static):
    m, n_p = x.shape
    args = (x, w) + ((keep,) if keep is not None else ()) + (gout,) + tuple(prm)
    outs = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(w.shape, w.dtype)) + tuple(
        jax.ShapeDtypeStruct((st.splits,) + a.shape, jnp.float32) for a in prm
    )
    dx, dw, *partial = pl.pallas_call(
        functools.partial(_bwd_kernel, st=st, has_keep=keep is not None),
        out_shape=outs,
        grid=(m, st.splits),
        in_specs=_specs(len(args)),
        out_specs=_specs(len(outs)),
        interpret=st.interpret,
        compiler_params=_compiler_params(st),
        name="vsn_grn_sum_bwd",
        metadata=meta(3 * matmul_flops(m, n_p, st.dvp, st.dp)),
    )(*args)
    # the splits' partial gradients summed in one launch (XLA: one reduction each)
    grads = multi_tensor.sum_splits(partial, [a.dtype for a in prm], interpret=st.interpret)
    return tuple(grads), dx, dw


def _vsn_sum_impl(prm: tuple, x: Array, w: Array, keep: Array | None, st: _Static) -> Array:
    return _fwd(prm, x, w, keep, st)


def _vsn_sum_fwd(prm, x, w, keep, st):
    return _fwd(prm, x, w, keep, st), (prm, x, w, keep)


def _vsn_sum_bwd(st, res, gout):
    prm, x, w, keep = res
    gp, dx, dw = _bwd(prm, x, w, keep, gout, st)
    dkeep = None if keep is None else np.zeros(keep.shape, jax.dtypes.float0)
    return gp, dx, dw, dkeep


_vsn_sum = jax.custom_vjp(_vsn_sum_impl, nondiff_argnums=(4,))
_vsn_sum.defvjp(_vsn_sum_fwd, _vsn_sum_bwd)


def weighted_grn_sum(
    p: dict,
    x: Array,
    w: Array,
    keep: Array | None,
    rate: float,
    *,
    block_rows: int = BLOCK_ROWS,
    interpret: bool | None = None,
    num_warps: int = 4,
    target_programs: int = TARGET_PROGRAMS,
) -> Array:
    """``Σ_j w_j GRN_j(x_j)`` ``[N, d]`` float32 through the Pallas kernels.

    Same arguments as :func:`tftjax.models.kernels.fused.weighted_grn_sum`: stacked float
    parameters ``p`` (as in ``VariableSelection``; their dtype is the matmuls' operand
    dtype), inputs ``x`` and weights ``w`` ``[m, N]``, dropout keep-mask ``keep``
    ``[m, N, d_v]`` (bool) or None. ``interpret`` None: the interpreter unless the
    default backend is a GPU. ``target_programs``: the backward pass splits rows until m ×
    splits reaches it.

    The kernels read the parameters as they are (padded and folded in registers) and write
    their gradients whole, so that nothing but the kernels and the splits' sum runs per
    step.
    """
    if interpret is None:
        interpret = jax.default_backend() not in ("gpu", "cuda", "rocm")
    cd = jnp.result_type(*(p[k].dtype for k in ("fc1_k", "glu_k")))
    m, n = x.shape
    dv, d = p["fc1_k"].shape[-1], p["skip_k"].shape[-1]
    bn = min(dot_size(block_rows), dot_size(n))
    tiles = -(-n // bn)
    splits = row_splits(tiles, max(1, -(-target_programs // m)))
    per = -(-tiles // splits)
    n_p = splits * per * bn

    def rows(a):  # padded to n_p rows (axis 1)
        return a if n_p == n else jnp.pad(a, [(0, 0), (0, n_p - n)] + [(0, 0)] * (a.ndim - 2))

    keep_p = None if keep is None else rows(keep.astype(jnp.int8))
    st = _Static(
        m=m,
        dv=dv,
        d=d,
        bn=bn,
        splits=splits,
        per=per,
        scale=1.0 / keep_prob(rate) if keep is not None else 1.0,
        cd=jnp.dtype(cd).name,
        interpret=bool(interpret),
        num_warps=num_warps,
    )
    out = _vsn_sum(tuple(p[k] for k in PARAMS), rows(x), rows(w), keep_p, st)
    return out if n_p == n else out[:n]
