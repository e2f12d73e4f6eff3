"""The variable selection network's per-variable GRNs as two Pallas kernels (GPU, Triton).

The GPU twin of :mod:`tftjax.models.fused`: the same function, ``Σ_j w_j GRN_j(x_j)``
over m variables with the embedding folded in, and the same recomputing backward pass,
but laid out for a GPU instead of a CPU's caches.

* **Forward**: one program per tile of ``block_rows`` rows. It loops over the m
  variables inside the kernel, loads each variable's parameters (a few KB, from L2),
  runs its GRN on the tile and adds ``w_j ⊙ GRN_j`` to an accumulator held in registers.
  Only ``x``, ``w`` (and the dropout mask) are read and the ``[N, d]`` sum written: none
  of the ``[m, N, ·]`` tensors that the XLA program passes through HBM 30-40 times per
  step exists outside the kernel.
* **Backward**: one program per variable (times ``R`` row splits where m alone cannot
  fill the GPU). It loops over its rows' tiles, recomputes the variable's GRN from the
  saved inputs, and accumulates that variable's parameter gradients in registers; the
  ``R`` partial sums are added by XLA afterwards (one small reduction). ``dx`` and ``dw``
  are written tile by tile.

Matmul operands are in the parameters' dtype (bfloat16 under ``--precision bf16``: tensor
cores) with float32 accumulation (``preferred_element_type``); everything elementwise
(ELU, sigmoid, LayerNorm statistics, the accumulators) is float32.

Triton wants power-of-two tensor sizes for its loads, and its dots want every dimension
at least 16 (its own front end refuses smaller ``tl.dot``s; Pallas does not check): the
wrapper pads ``d_v`` and ``d`` with zeros to a power of two of at least 16 (the padded
columns stay exactly 0 through the GRN, and LayerNorm's statistics are masked to the real
``d``) and the rows to whole tiles of at least 16 (padded rows carry ``w = 0`` and
contribute nothing to any gradient). TFT-225 (``d_v`` 8, ``d`` 128) pads ``d_v`` to 16.

On CPU the kernels run in Pallas' interpreter (``interpret=True``): that is how the tests
check values and gradients against the reference VSN
(:func:`tftjax.models.vsn.stacked_grn`). Compiled for the H100 target without a GPU
(``tftjax.memory.targets``), each kernel is one ``__gpu$xla.gpu.triton`` custom call.
Its speed needs a GPU (``experiments/gpu_check.py``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from tftjax.models import multi_tensor
from tftjax.models.multi_tensor import triton_params
from tftjax.models.dropout import keep_prob
from tftjax.models.fused import EPS, Folded, fold

Array = jax.Array
BLOCK_ROWS = 64
"""Rows per forward program: the ``[rows, d]`` accumulator and the GRN's few live
``[rows, d]`` values stay in registers (64 × 128 float32 = 32 KB per program)."""
TARGET_PROGRAMS = 264
"""The backward splits rows until m × splits reaches this (2 programs per H100 SM)."""


MIN_DOT = 16
"""Triton's smallest dot dimension: padded sizes are powers of two of at least this."""


def dot_size(n: int) -> int:
    """The power of two ≥ ``n`` and ≥ :data:`MIN_DOT`: a size Triton's loads and dots take."""
    return max(MIN_DOT, 1 << max(0, n - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class _Static:
    m: int
    d: int  # real hidden size (LayerNorm's statistics are over these columns)
    rows: int  # real rows N
    bn: int  # rows per tile
    splits: int  # backward row splits R
    scale: float  # dropout's 1 / keep probability (1.0 without dropout)
    cd: str  # matmul operand dtype
    interpret: bool
    num_warps: int


def _compiler_params(st: _Static):
    return triton_params(st.interpret, st.num_warps)


def _dot(a: Array, b: Array, ca: int, cb: int, cd) -> Array:
    """``a`` contracted on axis ``ca`` with ``b`` on ``cb``: operands in ``cd``, float32 sum."""
    return lax.dot_general(a.astype(cd), b.astype(cd), (((ca,), (cb,)), ((), ())),
                           preferred_element_type=jnp.float32)


def _load(refs, j):
    """Variable ``j``'s parameters (float32 but the matmul kernels, kept in their dtype)."""
    q = Folded(*(r[j] for r in refs))
    f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
    return q._replace(fk=f32(q.fk), fb=f32(q.fb), b1=f32(q.b1), vb=f32(q.vb), gb=f32(q.gb),
                      sk=f32(q.sk), sb=f32(q.sb), ln_g=f32(q.ln_g), ln_b=f32(q.ln_b))


def _grn(q: Folded, x: Array, keep: Array | None, st: _Static, cd):
    """One variable on one tile: ``x`` [bn] float32, ``keep`` [bn, d_v] (0/1) or None."""
    a = x[:, None] * q.fk[None, :] + q.fb[None, :]  # [bn, d_v]
    h = jnp.where(a > 0, a, jnp.expm1(jnp.minimum(a, 0.0)))
    eta = _dot(h, q.w1, 1, 0, cd) + q.b1[None, :]
    if keep is not None:
        eta = eta * (keep.astype(jnp.float32) * st.scale)
    v = _dot(eta, q.vk, 1, 0, cd) + q.vb[None, :]  # [bn, d]
    s = jax.nn.sigmoid(_dot(eta, q.gk, 1, 0, cd) + q.gb[None, :])
    y = x[:, None] * q.sk[None, :] + q.sb[None, :] + s * v
    dp = y.shape[-1]
    mask = None
    if dp != st.d:  # padded columns: y is 0 there, but y - mean is not
        mask = (lax.broadcasted_iota(jnp.int32, (1, dp), 1) < st.d).astype(jnp.float32)
    mu = jnp.sum(y, axis=-1, keepdims=True) / st.d
    yc = y - mu if mask is None else (y - mu) * mask
    r = lax.rsqrt(jnp.sum(yc * yc, axis=-1, keepdims=True) / st.d + EPS)
    return a, h, eta, v, s, yc * r, r, mask


def _fwd_kernel(*refs, st: _Static, has_keep: bool):
    x_ref, w_ref = refs[:2]
    keep_ref = refs[2] if has_keep else None
    prm = refs[2 + has_keep:-1]
    out_ref = refs[-1]
    cd = jnp.dtype(st.cd)
    rows = pl.ds(pl.program_id(0) * st.bn, st.bn)

    def body(j, acc):
        q = _load(prm, j)
        x = x_ref[j, rows].astype(jnp.float32)
        keep = keep_ref[j, rows, :] if has_keep else None
        *_, yh, _, _ = _grn(q, x, keep, st, cd)
        o = yh * q.ln_g[None, :] + q.ln_b[None, :]
        return acc + w_ref[j, rows].astype(jnp.float32)[:, None] * o

    out_ref[...] = lax.fori_loop(0, st.m, body, jnp.zeros(out_ref.shape, jnp.float32))


def _bwd_kernel(*refs, st: _Static, has_keep: bool, tiles: int):
    x_ref, w_ref = refs[:2]
    keep_ref = refs[2] if has_keep else None
    go_ref = refs[2 + has_keep]
    prm = refs[3 + has_keep:3 + has_keep + 12]
    dx_ref, dw_ref, *gq_refs = refs[3 + has_keep + 12:]
    cd = jnp.dtype(st.cd)
    j, r_ = pl.program_id(0), pl.program_id(1)
    q = _load(prm, j)
    per = tiles // st.splits

    def body(t, g: Folded):
        rows = pl.ds((r_ * per + t) * st.bn, st.bn)
        x = x_ref[j, rows].astype(jnp.float32)
        w = w_ref[j, rows].astype(jnp.float32)
        keep = keep_ref[j, rows, :] if has_keep else None
        go = go_ref[rows, :].astype(jnp.float32)  # [bn, d]
        a, h, eta, v, s, yh, r, mask = _grn(q, x, keep, st, cd)
        o = yh * q.ln_g[None, :] + q.ln_b[None, :]
        dw_ref[j, rows] = jnp.sum(go * o, axis=-1)
        wg = w[:, None] * go
        dyh = wg * q.ln_g[None, :]
        m1 = jnp.sum(dyh, axis=-1, keepdims=True) / st.d
        m2 = jnp.sum(dyh * yh, axis=-1, keepdims=True) / st.d
        dy = r * (dyh - m1 - yh * m2)
        if mask is not None:
            dy = dy * mask
        dv = dy * s
        dg = dy * v * s * (1.0 - s)
        deta = _dot(dv, q.vk, 1, 1, cd) + _dot(dg, q.gk, 1, 1, cd)  # [bn, d_v]
        if keep is not None:
            deta = deta * (keep.astype(jnp.float32) * st.scale)
        da = _dot(deta, q.w1, 1, 1, cd) * jnp.where(a > 0, 1.0, h + 1.0)
        dx_ref[j, rows] = jnp.sum(dy * q.sk[None, :], axis=-1) + jnp.sum(da * q.fk[None, :],
                                                                          axis=-1)
        xs = x[:, None]
        return Folded(
            fk=g.fk + jnp.sum(xs * da, axis=0), fb=g.fb + jnp.sum(da, axis=0),
            w1=g.w1 + _dot(h, deta, 0, 0, cd), b1=g.b1 + jnp.sum(deta, axis=0),
            vk=g.vk + _dot(eta, dv, 0, 0, cd), vb=g.vb + jnp.sum(dv, axis=0),
            gk=g.gk + _dot(eta, dg, 0, 0, cd), gb=g.gb + jnp.sum(dg, axis=0),
            sk=g.sk + jnp.sum(xs * dy, axis=0), sb=g.sb + jnp.sum(dy, axis=0),
            ln_g=g.ln_g + jnp.sum(wg * yh, axis=0), ln_b=g.ln_b + jnp.sum(wg, axis=0))

    zero = Folded(*(jnp.zeros(ref.shape[2:], jnp.float32) for ref in gq_refs))
    g = lax.fori_loop(0, per, body, zero)
    for ref, val in zip(gq_refs, g):
        ref[r_, j] = val


def _specs(n: int):
    return [pl.no_block_spec] * n


def matmul_flops(m: int, rows: int, dv: int, d: int) -> int:
    """One variable-sum's forward matmul FLOPs: per variable and row, ``η = h W_1`` and the
    GLU's two halves. The backward pass does three times as much: the recomputed forward,
    the input gradients (``dη``, ``dh``) and the weight gradients."""
    return 2 * m * rows * (dv * dv + 2 * dv * d)


def _meta(flops: int) -> dict:
    """The kernel's matmul FLOPs, serialised into the compiled HLO (tftjax.memory.hlo_cost
    reads them: XLA does not look inside a Triton call)."""
    return {"matmul_flops": str(int(flops))}


def _fwd(q: Folded, x: Array, w: Array, keep: Array | None, st: _Static) -> Array:
    n_p = x.shape[1]
    dv, d = q.fk.shape[-1], q.sk.shape[-1]
    args = (x, w) + ((keep,) if keep is not None else ()) + tuple(q)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, st=st, has_keep=keep is not None),
        out_shape=jax.ShapeDtypeStruct((n_p, q.sk.shape[-1]), jnp.float32),
        grid=(n_p // st.bn,), in_specs=_specs(len(args)),
        out_specs=pl.BlockSpec((st.bn, q.sk.shape[-1]), lambda i: (i, 0)),
        interpret=st.interpret, compiler_params=_compiler_params(st),
        name="vsn_grn_sum_fwd", metadata=_meta(matmul_flops(st.m, n_p, dv, d)))(*args)


def _bwd(q: Folded, x: Array, w: Array, keep: Array | None, gout: Array, st: _Static):
    m, n_p = x.shape
    dv, d = q.fk.shape[-1], q.sk.shape[-1]
    args = (x, w) + ((keep,) if keep is not None else ()) + (gout,) + tuple(q)
    outs = (jax.ShapeDtypeStruct((m, n_p), jnp.float32),) * 2 + tuple(
        jax.ShapeDtypeStruct((st.splits,) + a.shape, jnp.float32) for a in q)
    dx, dw, *gq = pl.pallas_call(
        functools.partial(_bwd_kernel, st=st, has_keep=keep is not None, tiles=n_p // st.bn),
        out_shape=outs, grid=(m, st.splits), in_specs=_specs(len(args)),
        out_specs=_specs(len(outs)), interpret=st.interpret,
        compiler_params=_compiler_params(st), name="vsn_grn_sum_bwd",
        metadata=_meta(3 * matmul_flops(m, n_p, dv, d)))(*args)
    # the splits' partial gradients summed in one launch (XLA: one reduction each)
    gq = Folded(*multi_tensor.sum_splits(gq, [a.dtype for a in q], interpret=st.interpret))
    return gq, dx.astype(x.dtype), dw.astype(w.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _vsn_sum(q: Folded, x: Array, w: Array, keep: Array | None, st: _Static) -> Array:
    return _fwd(q, x, w, keep, st)


def _vsn_sum_fwd(q, x, w, keep, st):
    return _fwd(q, x, w, keep, st), (q, x, w, keep)


def _vsn_sum_bwd(st, res, gout):
    q, x, w, keep = res
    gq, dx, dw = _bwd(q, x, w, keep, gout, st)
    dkeep = None if keep is None else np.zeros(keep.shape, jax.dtypes.float0)
    return gq, dx, dw, dkeep


_vsn_sum.defvjp(_vsn_sum_fwd, _vsn_sum_bwd)


def _pad(q: Folded, dv: int, d: int) -> Folded:
    """Zero-pad the d_v and d axes of every parameter to ``dv`` and ``d``."""
    def to(a, *sizes):  # pad the trailing axes to sizes
        lead = a.ndim - len(sizes)
        return jnp.pad(a, [(0, 0)] * lead + [(0, s - n) for s, n in zip(sizes, a.shape[lead:])])
    return Folded(fk=to(q.fk, dv), fb=to(q.fb, dv), w1=to(q.w1, dv, dv), b1=to(q.b1, dv),
                  vk=to(q.vk, dv, d), vb=to(q.vb, d), gk=to(q.gk, dv, d), gb=to(q.gb, d),
                  sk=to(q.sk, d), sb=to(q.sb, d), ln_g=to(q.ln_g, d), ln_b=to(q.ln_b, d))


def weighted_grn_sum(p: dict, x: Array, w: Array, keep: Array | None, rate: float, *,
                     block_rows: int = BLOCK_ROWS, interpret: bool | None = None,
                     num_warps: int = 4, target_programs: int = TARGET_PROGRAMS) -> Array:
    """``Σ_j w_j GRN_j(x_j)`` ``[N, d]`` float32 through the Pallas kernels.

    Same arguments as :func:`tftjax.models.fused.weighted_grn_sum`: stacked float
    parameters ``p`` (as in ``VariableSelection``; their dtype is the matmuls' operand
    dtype), inputs ``x`` and weights ``w`` ``[m, N]``, dropout keep-mask ``keep``
    ``[m, N, d_v]`` (bool) or None. ``interpret`` None: the interpreter unless the
    default backend is a GPU. ``target_programs``: the backward pass splits rows until m ×
    splits reaches it.
    """
    if interpret is None:
        interpret = jax.default_backend() not in ("gpu", "cuda", "rocm")
    cd = jnp.result_type(*(v.dtype for v in p.values()))
    q = fold(jax.tree.map(lambda a: a.astype(jnp.float32), p))
    q = Folded(*(a.astype(cd) if a.ndim == 3 else a for a in q))  # matmul kernels in cd
    m, n = x.shape
    dv, d = q.fk.shape[-1], q.sk.shape[-1]
    dv_p, d_p = dot_size(dv), dot_size(d)
    if (dv_p, d_p) != (dv, d):
        q = _pad(q, dv_p, d_p)
    bn = min(dot_size(block_rows), dot_size(n))
    tiles = -(-n // bn)
    splits = max(1, min(tiles, -(-target_programs // m)))
    tiles = -(-tiles // splits) * splits
    n_p = tiles * bn
    rows = lambda a: jnp.pad(a, [(0, 0), (0, n_p - n)] + [(0, 0)] * (a.ndim - 2))  # noqa: E731
    x_p, w_p = rows(x.astype(jnp.float32)), rows(w.astype(jnp.float32))
    keep_p = None
    if keep is not None:
        keep_p = rows(jnp.pad(keep.astype(jnp.int8), [(0, 0), (0, 0), (0, dv_p - dv)]))
    st = _Static(m=m, d=d, rows=n, bn=bn, splits=splits,
                 scale=1.0 / keep_prob(rate) if keep is not None else 1.0,
                 cd=jnp.dtype(cd).name, interpret=bool(interpret), num_warps=num_warps)
    out = _vsn_sum(q, x_p, w_p, keep_p, st)
    return out[:n, :d]
