# pyright: reportOptionalSubscript=false, reportOptionalMemberAccess=false
# pyright: reportOptionalOperand=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOperatorIssue=false
# (a kernel's optional refs, b and keep, exist exactly where its static flags say; the
# checker cannot follow the flags)
"""K gated residual networks on one input as two Pallas kernels (GPU, Triton): the TFT's four
static context GRNs (``c_s``, ``c_e``, ``c_h``, ``c_c`` from the static embedding ``ζ``).

Each is ``LayerNorm(a + GLU(W_1 ELU(W_2 a + b_2) + b_1))`` with its input, hidden and
output sizes all ``d`` (no skip projection, no context), as :class:`tftjax.models.layers.GRN`
computes it. On a GPU, XLA runs each one as about 8 launches forward and 12 backward; here:

* **forward**: one program per tile of rows, looping over the K GRNs inside the kernel;
  each GRN's output tile is written once.
* **backward**: one program per (GRN, weight matrix): ``W_2``, ``W_1`` and the GLU's value
  and gate halves. Each recomputes its GRN over every row (the statics have one row a
  window: a batch of rows fits one program), and sums its matrix's gradient, and its
  bias's, in registers, so that the gradients come out whole: no partial sums for XLA to
  add. The ``W_2`` programs also write the input's gradient per GRN (XLA adds the K), the
  ``W_1`` programs the LayerNorm's.

Matmul operands are in the parameters' dtype (bfloat16 under ``--precision bf16``) with
float32 accumulation; everything element-wise is float32. Dropout on the GLU's input uses
the keep masks it is given (drawn where the layers' :class:`~tftjax.models.dropout.Dropout`
draws them, so that both paths drop the same units). Sizes: ``d`` a power of two of at least 16 (Triton's dots);
the rows are padded to whole tiles.

On CPU the kernels run in Pallas' interpreter (tested against the GRN layer there);
compiled for the H100 target each is one Triton call.
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
from tftjax.models.kernels.fused import EPS
from tftjax.models.kernels.triton_util import MIN_DOT, dot, dot_size, meta, triton_params

Array = jax.Array
NAMES = ("fc2_k", "fc2_b", "fc1_k", "fc1_b", "glu_k", "glu_b", "ln_scale", "ln_bias")
"""One GRN's parameters, in the kernels' order."""
BLOCK_ROWS = 32
PARTS = 4
"""Backward programs per GRN: W_2 (and the input's gradient), W_1 (and the LayerNorm's),
the GLU's value half, its gate half."""


MAX_WEIGHT_BYTES = 32 * 1024
"""The largest ``d × d`` weight (matmul dtype) the kernels take: compiled for the H100, the
backward kernel at d = 128 asks 416 KB of shared memory in float32 (227 KB there)."""


def supported(d: int, dtype=jnp.bfloat16) -> bool:
    """Whether the kernels take GRNs of width ``d`` with matmuls in ``dtype``: Triton's dots
    want a power of two ≥ 16, and a weight must fit :data:`MAX_WEIGHT_BYTES` (float32: d
    ≤ 64; bfloat16: d ≤ 128)."""
    return (
        d >= MIN_DOT and dot_size(d) == d and d * d * jnp.dtype(dtype).itemsize <= MAX_WEIGHT_BYTES
    )


@dataclasses.dataclass(frozen=True)
class _Static:
    k: int
    d: int
    bn: int
    tiles: int
    keep_prob: float  # 1.0: no dropout
    cd: str
    interpret: bool


class _Refs:
    """One GRN's parameter refs, each read where it is used (matmul operands in ``cd``,
    vectors in float32), so that no weight stays live from one use to the next."""

    def __init__(self, prm, cd):
        self.r, self.cd = dict(zip(NAMES, prm)), cd
        self.d = prm[0].shape[0]

    def w(self, name: str, half: int | None = None):
        r = self.r[name]
        a = r[...] if half is None else r[:, pl.ds(half * self.d, self.d)]
        return a.astype(self.cd)

    def v(self, name: str, half: int | None = None):
        r = self.r[name]
        a = r[...] if half is None else r[pl.ds(half * self.d, self.d)]
        return a.astype(jnp.float32)


def _forward(x, keep, q: _Refs, st: _Static):
    """One GRN on one tile: ``x`` [bn, d] float32, ``keep`` [bn, d] (0/1) or None."""
    cd = jnp.dtype(st.cd)
    h2 = dot(x, q.w("fc2_k"), 1, 0, cd) + q.v("fc2_b")[None, :]
    e = jnp.where(h2 > 0, h2, jnp.expm1(jnp.minimum(h2, 0.0)))
    h1 = dot(e, q.w("fc1_k"), 1, 0, cd) + q.v("fc1_b")[None, :]
    if keep is not None:  # models.dropout: kept units divided by the keep probability
        h1 = jnp.where(keep != 0, h1 / st.keep_prob, 0.0)
    v = dot(h1, q.w("glu_k", 0), 1, 0, cd) + q.v("glu_b", 0)[None, :]
    s = jax.nn.sigmoid(dot(h1, q.w("glu_k", 1), 1, 0, cd) + q.v("glu_b", 1)[None, :])
    y = x + s * v
    mean = jnp.sum(y, axis=-1, keepdims=True) / st.d
    var = jnp.maximum(0.0, jnp.sum(y * y, axis=-1, keepdims=True) / st.d - mean * mean)
    r = lax.rsqrt(var + EPS)
    yh = (y - mean) * r
    return h2, e, h1, v, s, yh, r, yh * q.v("ln_scale")[None, :] + q.v("ln_bias")[None, :]


def _fwd_kernel(*refs, st: _Static, has_keep: bool):
    x_ref = refs[0]
    keep_ref = refs[1] if has_keep else None
    prm = refs[1 + has_keep : 1 + has_keep + 8 * st.k]
    outs = refs[1 + has_keep + 8 * st.k :]
    cd = jnp.dtype(st.cd)
    rows = pl.ds(pl.program_id(0) * st.bn, st.bn)
    x = x_ref[rows, :].astype(jnp.float32)
    for i in range(st.k):
        q = _Refs(prm[8 * i : 8 * i + 8], cd)
        keep = keep_ref[i, rows, :] if has_keep else None
        outs[i][rows, :] = _forward(x, keep, q, st)[-1].astype(outs[i].dtype)


def _bwd_kernel(*refs, st: _Static, has_keep: bool):
    x_ref = refs[0]
    keep_ref = refs[1] if has_keep else None
    go_refs = refs[1 + has_keep : 1 + has_keep + st.k]
    at = 1 + has_keep + st.k
    prm = refs[at : at + 8 * st.k]
    dx_ref, *grads = refs[at + 8 * st.k :]
    cd = jnp.dtype(st.cd)
    gi, part = pl.program_id(0), pl.program_id(1)  # read here: not inside a branch
    d = st.d

    def run(i, p):
        g_w2, g_b2, g_w1, g_b1, g_wp, g_bp, g_sc, g_bi = grads[8 * i : 8 * i + 8]

        q = _Refs(prm[8 * i : 8 * i + 8], cd)

        def body(t, acc):
            rows = pl.ds(t * st.bn, st.bn)
            x = x_ref[rows, :].astype(jnp.float32)
            keep = keep_ref[i, rows, :] if has_keep else None
            go = go_refs[i][rows, :].astype(jnp.float32)
            h2, e, h1, v, s, yh, r, _ = _forward(x, keep, q, st)
            gx = go * q.v("ln_scale")[None, :]
            m1 = jnp.sum(gx, axis=-1, keepdims=True) / d
            m2 = jnp.sum(gx * yh, axis=-1, keepdims=True) / d
            dy = r * (gx - m1 - yh * m2)
            dv = dy * s
            if p == 2:
                return (acc[0] + dot(h1, dv, 0, 0, cd), acc[1] + jnp.sum(dv, axis=0))
            dg = dy * v * s * (1.0 - s)
            if p == 3:
                return (acc[0] + dot(h1, dg, 0, 0, cd), acc[1] + jnp.sum(dg, axis=0))
            dh1 = dot(dv, q.w("glu_k", 0), 1, 1, cd) + dot(dg, q.w("glu_k", 1), 1, 1, cd)
            if keep is not None:
                dh1 = jnp.where(keep != 0, dh1 / st.keep_prob, 0.0)
            if p == 1:
                return (
                    acc[0] + dot(e, dh1, 0, 0, cd),
                    acc[1] + jnp.sum(dh1, axis=0),
                    acc[2] + jnp.sum(go * yh, axis=0),
                    acc[3] + jnp.sum(go, axis=0),
                )
            dh2 = dot(dh1, q.w("fc1_k"), 1, 1, cd) * jnp.where(h2 > 0, 1.0, e + 1.0)
            dx_ref[i, rows, :] = dy + dot(dh2, q.w("fc2_k"), 1, 1, cd)
            return (acc[0] + dot(x, dh2, 0, 0, cd), acc[1] + jnp.sum(dh2, axis=0))

        mat, vec = jnp.zeros((d, d), jnp.float32), jnp.zeros((d,), jnp.float32)
        zero = (mat, vec, vec, vec) if p == 1 else (mat, vec)
        acc = lax.fori_loop(0, st.tiles, body, zero)
        if p == 0:
            g_w2[...], g_b2[...] = (a.astype(o.dtype) for a, o in zip(acc, (g_w2, g_b2)))
        elif p == 1:
            g_w1[...], g_b1[...], g_sc[...], g_bi[...] = (
                a.astype(o.dtype) for a, o in zip(acc, (g_w1, g_b1, g_sc, g_bi))
            )
        else:
            cols = pl.ds(0 if p == 2 else d, d)
            g_wp[:, cols] = acc[0].astype(g_wp.dtype)
            g_bp[cols] = acc[1].astype(g_bp.dtype)

    for i in range(st.k):
        for p in range(PARTS):
            pl.when((gi == i) & (part == p))(functools.partial(run, i, p))


def matmul_flops(k: int, rows: int, d: int) -> int:
    """The K GRNs' forward matmul FLOPs (``W_2``, ``W_1``, the GLU's halves); the backward
    pass, recomputing the forward in each of a GRN's 4 programs, does about 12 times this."""
    return 2 * k * rows * 4 * d * d


def _fwd(qs, x, keep, st: _Static):
    args = (x,) + ((keep,) if keep is not None else ()) + tuple(a for q in qs for a in q)
    n_p = x.shape[0]
    return tuple(
        pl.pallas_call(
            functools.partial(_fwd_kernel, st=st, has_keep=keep is not None),
            out_shape=[jax.ShapeDtypeStruct((n_p, st.d), x.dtype)] * st.k,
            grid=(st.tiles,),
            in_specs=[pl.no_block_spec] * len(args),
            out_specs=[pl.no_block_spec] * st.k,
            interpret=st.interpret,
            compiler_params=triton_params(st.interpret, 8),
            name="grn_stack_fwd",
            metadata=meta(matmul_flops(st.k, n_p, st.d)),
        )(*args)
    )


def _bwd(qs, x, keep, gouts, st: _Static):
    args = (
        (x,)
        + ((keep,) if keep is not None else ())
        + tuple(gouts)
        + tuple(a for q in qs for a in q)
    )
    n_p = x.shape[0]
    outs = [jax.ShapeDtypeStruct((st.k, n_p, st.d), jnp.float32)] + [
        jax.ShapeDtypeStruct(a.shape, a.dtype) for q in qs for a in q
    ]
    dx, *g = pl.pallas_call(
        functools.partial(_bwd_kernel, st=st, has_keep=keep is not None),
        out_shape=outs,
        grid=(st.k, PARTS),
        in_specs=[pl.no_block_spec] * len(args),
        out_specs=[pl.no_block_spec] * len(outs),
        interpret=st.interpret,
        compiler_params=triton_params(st.interpret, 8),
        name="grn_stack_bwd",
        metadata=meta(12 * matmul_flops(st.k, n_p, st.d)),
    )(*args)
    gq = tuple(tuple(g[8 * i : 8 * i + 8]) for i in range(st.k))
    return gq, jnp.sum(dx, axis=0).astype(x.dtype)


def _grn_stack_impl(qs, x, keep, st):
    return _fwd(qs, x, keep, st)


def _grn_stack_fwd(qs, x, keep, st):
    return _fwd(qs, x, keep, st), (qs, x, keep)


def _grn_stack_bwd(st, res, gouts):
    qs, x, keep = res
    gq, dx = _bwd(qs, x, keep, gouts, st)
    dkeep = None if keep is None else np.zeros(keep.shape, jax.dtypes.float0)
    return gq, dx, dkeep


_grn_stack = jax.custom_vjp(_grn_stack_impl, nondiff_argnums=(3,))
_grn_stack.defvjp(_grn_stack_fwd, _grn_stack_bwd)


def grn_stack(
    params: list[dict],
    x: Array,
    keeps: list[Array] | None,
    rate: float,
    *,
    interpret: bool,
    block_rows: int = BLOCK_ROWS,
) -> list[Array]:
    """The K GRNs of ``params`` (each a dict of :data:`NAMES`: the ``GRN`` layer's
    ``fc2``/``fc1`` kernels and biases, ``glu/proj``'s, ``norm``'s scale and bias) on
    ``x`` ``[N, d]``; ``keeps``: per GRN the ``[N, d]`` keep mask of the GLU's input
    dropout at ``rate`` (None: no dropout). Returns K ``[N, d]`` outputs in ``x``'s dtype."""
    n, d = x.shape
    if not supported(d, x.dtype):
        raise ValueError(
            f"pallas_grn: width {d} in {jnp.dtype(x.dtype).name} is not a power "
            f"of two of at least {MIN_DOT} whose d × d weight fits "
            f"{MAX_WEIGHT_BYTES // 1024} KB"
        )
    bn = min(dot_size(block_rows), dot_size(n))
    tiles = -(-n // bn)
    n_p = tiles * bn
    x_p = jnp.pad(x, [(0, n_p - n), (0, 0)]) if n_p != n else x
    keep = None
    if keeps is not None:
        keep = jnp.stack([k.astype(jnp.int8) for k in keeps])
        if n_p != n:
            keep = jnp.pad(keep, [(0, 0), (0, n_p - n), (0, 0)])
    st = _Static(
        k=len(params),
        d=d,
        bn=bn,
        tiles=tiles,
        keep_prob=keep_prob(rate) if keeps is not None else 1.0,
        cd=jnp.dtype(x.dtype).name,
        interpret=bool(interpret),
    )
    qs = tuple(tuple(p[name] for name in NAMES) for p in params)
    outs = _grn_stack(qs, x_p, keep, st)
    return [o[:n] for o in outs]
