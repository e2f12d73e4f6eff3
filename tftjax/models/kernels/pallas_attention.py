"""The TFT's interpretable attention as two Pallas kernels (GPU, Triton): per-head logits,
the mask, the softmax, dropout on the weights and the heads' shared-value mix,
``(1/H) Σ_h dropout(softmax(Q_h K_hᵀ / √d_h + mask)) V``, forward and a recomputing
backward.

The TFT attends from its 10 decoder steps over all 60 steps with 4 heads of 32: small
matrices, which XLA runs as about 25 launches forward and backward (the logits, the mask
and softmax, the dropout draw applied, the mix, and each one's transpose). Here one program
per window does all heads in registers: the ``[B, H, T_q, T]`` weights never reach HBM,
and the backward program recomputes them from ``Q``, ``K`` and ``V`` (flash attention's
way, with the whole row of keys in one tile).

Matmul operands are in the compute dtype with float32 sums; the logits and the softmax are
float32 (as :class:`tftjax.models.layers.InterpretableAttention` computes them); dropout
takes the keep mask the layer's ``Dropout`` draws (tftjax.models.dropout). Query and key counts need not be
powers of two, nor the head width: the tiles are padded to Triton's sizes by masked loads
and stores, and the padded keys get no weight. On CPU the kernels run in Pallas' interpreter (tested against
the layer there); compiled for the H100 target each is one Triton call.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jax.experimental import pallas as pl

from tftjax.models.dropout import keep_prob
from tftjax.models.kernels.triton_util import dot, dot_size, meta, plt, start, triton_params

Array = jax.Array
NEG = float(np.finfo(np.float32).min)
"""The masked logits' value (the layer's ``jnp.finfo(float32).min``)."""


@dataclasses.dataclass(frozen=True)
class _Static:
    heads: int
    dh: int
    tq: int  # real query and key counts
    tk: int
    keep_prob: float  # 1.0: no dropout
    cd: str
    interpret: bool

    @property
    def pq(self) -> int:  # padded tile sizes
        return dot_size(self.tq)

    @property
    def pk(self) -> int:
        return dot_size(self.tk)

    @property
    def pd(self) -> int:  # the head width padded
        return dot_size(self.dh)


def _masks(st: _Static):
    """Real queries, keys and head columns of the padded tiles."""
    return (jnp.arange(st.pq) < st.tq, jnp.arange(st.pk) < st.tk, jnp.arange(st.pd) < st.dh)


def _load(ref, rows_mask, *idx):
    return plt().load(ref.at[idx], mask=rows_mask, other=0)


def _weights(b, h, q_ref, k_ref, mask_ref, keep_ref, st: _Static):
    """Head ``h`` of window ``b``: its queries and keys (compute dtype), the softmax ``p``
    [pq, pk] float32 and the dropped weights ``pd`` (float32, or None: no dropout)."""
    rq, rk, rc = _masks(st)
    cols = pl.ds(start(h * st.dh), st.pd)  # dynamic: padded past the end, masked
    qh = _load(q_ref, rq[:, None] & rc[None, :], b, pl.ds(0, st.pq), cols)
    kh = _load(k_ref, rk[:, None] & rc[None, :], b, pl.ds(0, st.pk), cols)
    both = rq[:, None] & rk[None, :]
    allowed = _load(mask_ref, both, pl.ds(0, st.pq), pl.ds(0, st.pk)) != 0
    logits = dot(qh, kh, 1, 1, jnp.dtype(st.cd)) / np.sqrt(st.dh).astype(np.float32)
    logits = jnp.where(allowed, logits, NEG)
    e = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
    p = e / jnp.sum(e, axis=-1, keepdims=True)
    pd = None
    if keep_ref is not None:  # models.dropout: kept weights divided by the keep probability
        keep = _load(keep_ref, both, b, start(h), pl.ds(0, st.pq), pl.ds(0, st.pk))
        pd = jnp.where(keep != 0, p / st.keep_prob, 0.0)
    return qh, kh, p, pd


def _fwd_kernel(*refs, st: _Static, has_keep: bool):
    q_ref, k_ref, v_ref, mask_ref = refs[:4]
    keep_ref = refs[4] if has_keep else None
    out_ref = refs[-1]
    b = pl.program_id(0)
    rq, rk, rc = _masks(st)
    v = _load(v_ref, rk[:, None] & rc[None, :], b, pl.ds(0, st.pk), pl.ds(0, st.pd))
    acc = jnp.zeros((st.pq, st.pd), jnp.float32)
    for h in range(st.heads):
        _, _, p, pd = _weights(b, h, q_ref, k_ref, mask_ref, keep_ref, st)
        acc += dot(p if pd is None else pd, v, 1, 0, jnp.dtype(st.cd))
    plt().store(
        out_ref.at[b, pl.ds(0, st.pq), pl.ds(0, st.pd)],
        (acc / st.heads).astype(out_ref.dtype),
        mask=rq[:, None] & rc[None, :],
    )


def _bwd_kernel(*refs, st: _Static, has_keep: bool):
    q_ref, k_ref, v_ref, mask_ref = refs[:4]
    keep_ref = refs[4] if has_keep else None
    go_ref, dq_ref, dk_ref, dv_ref = refs[4 + has_keep :]
    b = pl.program_id(0)
    rq, rk, rc = _masks(st)
    cd = jnp.dtype(st.cd)
    kmask, qmask = rk[:, None] & rc[None, :], rq[:, None] & rc[None, :]
    v = _load(v_ref, kmask, b, pl.ds(0, st.pk), pl.ds(0, st.pd))
    g = _load(go_ref, qmask, b, pl.ds(0, st.pq), pl.ds(0, st.pd)).astype(jnp.float32)
    g = g / st.heads  # each head's share of the mean
    dv = jnp.zeros((st.pk, st.pd), jnp.float32)
    for h in range(st.heads):
        qh, kh, p, pd = _weights(b, h, q_ref, k_ref, mask_ref, keep_ref, st)
        dv += dot(p if pd is None else pd, g, 0, 0, cd)
        dp = dot(g, v, 1, 1, cd)  # [pq, pk]
        if pd is not None:
            dp = jnp.where(pd != 0, dp / st.keep_prob, 0.0)
        ds = p * (dp - jnp.sum(dp * p, axis=-1, keepdims=True))
        ds = ds / np.sqrt(st.dh).astype(np.float32)
        cols = pl.ds(start(h * st.dh), st.pd)  # dynamic: padded past the end, masked
        plt().store(
            dq_ref.at[b, pl.ds(0, st.pq), cols],
            dot(ds, kh, 1, 0, cd).astype(dq_ref.dtype),
            mask=qmask,
        )
        plt().store(
            dk_ref.at[b, pl.ds(0, st.pk), cols],
            dot(ds, qh, 0, 0, cd).astype(dk_ref.dtype),
            mask=kmask,
        )
    plt().store(dv_ref.at[b, pl.ds(0, st.pk), pl.ds(0, st.pd)], dv.astype(dv_ref.dtype), mask=kmask)


def matmul_flops(batch: int, st: _Static) -> int:
    """The forward's matmul FLOPs (per head the logits and the mix); the backward pass,
    recomputing the logits, does about three times as much."""
    return 2 * 2 * batch * st.heads * st.tq * st.tk * st.dh


def _call(kernel, name, args, outs, batch, flops, st, has_keep):
    return pl.pallas_call(
        functools.partial(kernel, st=st, has_keep=has_keep),
        out_shape=outs,
        grid=(batch,),
        in_specs=[pl.no_block_spec] * len(args),
        out_specs=[pl.no_block_spec] * len(outs),
        interpret=st.interpret,
        compiler_params=triton_params(st.interpret, 4),
        name=name,
        metadata=meta(flops),
    )(*args)


def _attend_impl(q, k, v, mask, keep, st):
    return _fwd(q, k, v, mask, keep, st)


def _fwd(q, k, v, mask, keep, st):
    args = (q, k, v, mask) + ((keep,) if keep is not None else ())
    out = jax.ShapeDtypeStruct((q.shape[0], st.tq, st.dh), v.dtype)
    return _call(
        _fwd_kernel,
        "attention_fwd",
        args,
        [out],
        q.shape[0],
        matmul_flops(q.shape[0], st),
        st,
        keep is not None,
    )[0]


def _attend_fwd(q, k, v, mask, keep, st):
    return _fwd(q, k, v, mask, keep, st), (q, k, v, mask, keep)


def _attend_bwd(st, res, g):
    q, k, v, mask, keep = res
    args = (q, k, v, mask) + ((keep,) if keep is not None else ()) + (g,)
    outs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (q, k, v)]
    dq, dk, dv = _call(
        _bwd_kernel,
        "attention_bwd",
        args,
        outs,
        q.shape[0],
        3 * matmul_flops(q.shape[0], st),
        st,
        keep is not None,
    )
    zero = lambda a: None if a is None else np.zeros(a.shape, jax.dtypes.float0)
    return dq, dk, dv, zero(mask), zero(keep)


_attend = jax.custom_vjp(_attend_impl, nondiff_argnums=(5,))
_attend.defvjp(_attend_fwd, _attend_bwd)


def attend(
    q: Array,
    k: Array,
    v: Array,
    mask: Array,
    keep: Array | None,
    rate: float,
    *,
    heads: int,
    interpret: bool,
) -> Array:
    """``(1/H) Σ_h dropout(softmax(Q_h K_hᵀ / √d_h, masked)) V`` ``[B, T_q, d_h]`` in ``v``'s
    dtype: queries ``q`` ``[B, T_q, H·d_h]``, keys ``k`` ``[B, T, H·d_h]`` (head h in columns
    ``h·d_h …``), values ``v`` ``[B, T, d_h]`` shared by the heads, ``mask`` ``[T_q, T]``
    (True: may attend; every query at least one key), ``keep`` ``[B, H, T_q, T]`` the
    weights' dropout keep mask at ``rate`` (None: none)."""
    dh = v.shape[-1]
    if q.shape[-1] != heads * dh or k.shape[-1] != heads * dh:
        raise ValueError(
            f"pallas_attention: queries and keys of {heads} heads of {dh} "
            f"columns, got {q.shape[-1]} and {k.shape[-1]}"
        )
    st = _Static(
        heads=heads,
        dh=dh,
        tq=q.shape[1],
        tk=k.shape[1],
        keep_prob=keep_prob(rate) if keep is not None else 1.0,
        cd=jnp.dtype(v.dtype).name,
        interpret=bool(interpret),
    )
    keep = None if keep is None else keep.astype(jnp.int8)
    mask_i8: Any = (
        np.asarray(mask).astype(np.int8) if not isinstance(mask, Tracer) else mask.astype(jnp.int8)
    )  # a constant mask stays a constant
    return _attend(q, k, v, mask_i8, keep, st)
