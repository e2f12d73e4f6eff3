# pyright: reportOptionalSubscript=false, reportOptionalMemberAccess=false
# pyright: reportOptionalOperand=false, reportArgumentType=false, reportCallIssue=false
# pyright: reportOperatorIssue=false
# (a kernel's optional refs, b and keep, exist exactly where its static flags say; the
# checker cannot follow the flags)
"""The TFT's row-wise gated blocks as Pallas kernels (GPU, Triton): the gated add & norms
``LayerNorm(a + GLU(b))`` and the temporal GRNs ``LayerNorm(a + GLU(W_1 ELU(W_2 a + b_2 +
c) + b_1))`` (the static enrichment with its context projection ``c``; the position-wise
GRN), over every row of the batch (15,360 at TFT-225), all of width ``d``. XLA runs one as
10 to 50 launches; here it is three:

* **forward**: one program per tile of rows, the output tile written once;
* **backward**: a grid of (row split, part). Each program recomputes the forward pass over
  its split's tiles and sums one weight matrix's gradient (its part's: ``W_2`` with the
  inputs' gradients, ``W_1`` with the LayerNorm's, the GLU's value and gate halves) in
  registers;
* **the splits' partial gradients summed**, all in one launch
  (:func:`tftjax.models.kernels.multi_tensor.sum_splits`).

A GRN whose weights do not fit one kernel (:data:`MAX_WEIGHTS`: float32 at d = 128) runs as
two such blocks, its MLP then its gate. Matmul operands are in the compute dtype (the
parameters may arrive float32: cast in the kernel), with float32 sums; everything
element-wise is float32. Dropout on the GLU's input takes the keep mask the layer's
:class:`~tftjax.models.dropout.Dropout` draws. On CPU the kernels run in Pallas' interpreter (tested against the
layers there).
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
from tftjax.models.kernels.fused import EPS
from tftjax.models.kernels.triton_util import (
    MIN_DOT,
    dot,
    dot_size,
    meta,
    row_splits,
    triton_params,
)

Array = jax.Array
MLP_NAMES = ("fc2_k", "fc2_b", "fc1_k", "fc1_b")
GATE_NAMES = ("glu_k", "glu_b", "ln_scale", "ln_bias")
GRN_NAMES = MLP_NAMES + GATE_NAMES
NAMES = {"grn": GRN_NAMES, "gate": GATE_NAMES, "mlp": MLP_NAMES}
PARTS = {"grn": 4, "gate": 2, "mlp": 2}
"""Backward programs per row split (and d × d weights read): one per weight matrix."""
MAX_WEIGHTS = 128 * 1024
"""The most weight bytes (compute dtype) one kernel reads: compiled for the H100, a float32
GRN at d = 128 (256 KB) asks 416 KB of shared memory (227 KB there); 128 KB fit."""
BLOCK_ROWS = 32
TARGET_PROGRAMS = 128
"""Backward programs to aim for (splits × parts): about one per SM of an H100 (132)."""


def fits(kind: str, d: int, dtype) -> bool:
    """Whether one kernel takes a ``kind`` block of width ``d`` with matmuls in ``dtype``:
    Triton's dots want a power of two ≥ 16, and the weights must fit :data:`MAX_WEIGHTS`."""
    return (
        d >= MIN_DOT
        and dot_size(d) == d
        and PARTS[kind] * d * d * jnp.dtype(dtype).itemsize <= MAX_WEIGHTS
    )


def supported(d: int, dtype) -> bool:
    """Whether the TFT's gates and GRNs (a GRN split in two where it must) run as kernels."""
    return fits("gate", d, dtype)


@dataclasses.dataclass(frozen=True)
class _Static:
    kind: str  # grn, gate or mlp
    d: int
    bn: int
    splits: int
    per: int  # tiles per split
    keep_prob: float  # 1.0: no dropout
    cd: str
    interpret: bool

    parts = property(lambda self: PARTS[self.kind])
    names = property(lambda self: NAMES[self.kind])


class _W:
    """The block's parameter refs, each read where it is used (matmul operands in the compute
    dtype, vectors float32)."""

    def __init__(self, refs, st: _Static):
        self.r, self.cd, self.d = dict(zip(st.names, refs)), jnp.dtype(st.cd), st.d

    def m(self, name: str, half: int | None = None):
        r = self.r[name]
        return (r[...] if half is None else r[:, pl.ds(half * self.d, self.d)]).astype(self.cd)

    def v(self, name: str, half: int | None = None):
        r = self.r[name]
        return (r[...] if half is None else r[pl.ds(half * self.d, self.d)]).astype(jnp.float32)


def _forward(a, b, keep, w: _W, st: _Static):
    """One tile: ``a`` [bn, d] (the skip; a GRN's or MLP's input), ``b`` (a gate's GLU
    input; a GRN's or MLP's context rows, or None), ``keep`` [bn, d] (0/1) or None; all
    float32. An MLP's output is ``g_in`` (the rest None)."""
    cd = w.cd
    h2 = e = None
    if st.kind != "gate":
        h2 = dot(a, w.m("fc2_k"), 1, 0, cd) + w.v("fc2_b")[None, :]
        if b is not None:
            h2 = h2 + b
        e = jnp.where(h2 > 0, h2, jnp.expm1(jnp.minimum(h2, 0.0)))
        g_in = dot(e, w.m("fc1_k"), 1, 0, cd) + w.v("fc1_b")[None, :]
        if st.kind == "mlp":
            return h2, e, g_in, None, None, None, None, g_in
    else:
        g_in = b
    if keep is not None:  # models.dropout: kept units divided by the keep probability
        g_in = jnp.where(keep != 0, g_in / st.keep_prob, 0.0)
    v = dot(g_in, w.m("glu_k", 0), 1, 0, cd) + w.v("glu_b", 0)[None, :]
    s = jax.nn.sigmoid(dot(g_in, w.m("glu_k", 1), 1, 0, cd) + w.v("glu_b", 1)[None, :])
    y = a + s * v
    mean = jnp.sum(y, axis=-1, keepdims=True) / st.d
    var = jnp.maximum(0.0, jnp.sum(y * y, axis=-1, keepdims=True) / st.d - mean * mean)
    r = lax.rsqrt(var + EPS)
    yh = (y - mean) * r
    out = yh * w.v("ln_scale")[None, :] + w.v("ln_bias")[None, :]
    return h2, e, g_in, v, s, yh, r, out


def _tile(ref, rows):
    return None if ref is None else ref[rows, :].astype(jnp.float32)


def _fwd_kernel(*refs, st: _Static, has_b: bool, has_keep: bool):
    a_ref, b_ref, keep_ref, prm, out_ref = _split(refs, st, has_b, has_keep, True)
    rows = pl.ds(pl.program_id(0) * st.bn, st.bn)
    keep = keep_ref[rows, :] if has_keep else None
    out = _forward(_tile(a_ref, rows), _tile(b_ref, rows), keep, _W(prm, st), st)[-1]
    out_ref[0][rows, :] = out.astype(out_ref[0].dtype)


def _split(refs, st: _Static, has_b: bool, has_keep: bool, fwd: bool):
    """The kernel's refs: ``a``, ``b``, ``keep`` (or None), then forward: the parameters
    and the output; backward: the output's gradient and the rest."""
    at = 1 + has_b + has_keep
    b_ref = refs[1] if has_b else None
    keep_ref = refs[1 + has_b] if has_keep else None
    if fwd:
        return refs[0], b_ref, keep_ref, refs[at : at + len(st.names)], refs[at + len(st.names) :]
    return refs[0], b_ref, keep_ref, refs[at], refs[at + 1 :]


def _bwd_kernel(*refs, st: _Static, has_b: bool, has_keep: bool):
    a_ref, b_ref, keep_ref, go_ref, rest = _split(refs, st, has_b, has_keep, False)
    n = len(st.names)
    w = _W(rest[:n], st)
    da_ref, *grads = rest[n:]
    db_ref = grads.pop(0) if has_b else None
    g = dict(zip(st.names, grads))
    split, part = pl.program_id(0), pl.program_id(1)  # read here: not inside a branch
    cd, d = w.cd, st.d

    def run(p):
        def body(t, acc):
            rows = pl.ds((split * st.per + t) * st.bn, st.bn)
            a, b = _tile(a_ref, rows), _tile(b_ref, rows)
            keep = keep_ref[rows, :] if has_keep else None
            go = go_ref[rows, :].astype(jnp.float32)
            h2, e, g_in, v, s, yh, r, _ = _forward(a, b, keep, w, st)
            if st.kind == "mlp":  # go is dh1: W_1 (part 1), or W_2 and the inputs (part 0)
                return _mlp_part(p, a, e, h2, go, rows, acc)
            gx = go * w.v("ln_scale")[None, :]
            m1 = jnp.sum(gx, axis=-1, keepdims=True) / d
            m2 = jnp.sum(gx * yh, axis=-1, keepdims=True) / d
            dy = r * (gx - m1 - yh * m2)
            dv = dy * s
            ln = (jnp.sum(go * yh, axis=0), jnp.sum(go, axis=0))
            if p == 0 and st.kind == "gate":  # the value half, the inputs, the LayerNorm
                da_ref[rows, :] = dy
                db_ref[rows, :] = _glu_input_grad(dv, dy * v * s * (1.0 - s), keep)
                return (
                    acc[0] + dot(g_in, dv, 0, 0, cd),
                    acc[1] + jnp.sum(dv, axis=0),
                    acc[2] + ln[0],
                    acc[3] + ln[1],
                )
            if p == (2 if st.kind == "grn" else None):
                return acc[0] + dot(g_in, dv, 0, 0, cd), acc[1] + jnp.sum(dv, axis=0)
            dg = dy * v * s * (1.0 - s)
            if p == (3 if st.kind == "grn" else 1):
                return acc[0] + dot(g_in, dg, 0, 0, cd), acc[1] + jnp.sum(dg, axis=0)
            dh1 = _glu_input_grad(dv, dg, keep)
            if p == 1:
                return (
                    acc[0] + dot(e, dh1, 0, 0, cd),
                    acc[1] + jnp.sum(dh1, axis=0),
                    acc[2] + ln[0],
                    acc[3] + ln[1],
                )
            return _w2_part(dy, a, e, h2, dh1, rows, acc)

        def _w2_part(dy, a, e, h2, dh1, rows, acc):
            dh2 = dot(dh1, w.m("fc1_k"), 1, 1, cd) * jnp.where(h2 > 0, 1.0, e + 1.0)
            da = dot(dh2, w.m("fc2_k"), 1, 1, cd)
            da_ref[rows, :] = da if dy is None else dy + da
            if has_b:
                db_ref[rows, :] = dh2
            return acc[0] + dot(a, dh2, 0, 0, cd), acc[1] + jnp.sum(dh2, axis=0)

        def _mlp_part(p, a, e, h2, dh1, rows, acc):
            if p == 1:
                return acc[0] + dot(e, dh1, 0, 0, cd), acc[1] + jnp.sum(dh1, axis=0)
            return _w2_part(None, a, e, h2, dh1, rows, acc)

        def _glu_input_grad(dv, dg, keep):
            dgi = dot(dv, w.m("glu_k", 0), 1, 1, cd) + dot(dg, w.m("glu_k", 1), 1, 1, cd)
            if keep is not None:
                dgi = jnp.where(keep != 0, dgi / st.keep_prob, 0.0)
            return dgi

        mat, vec = jnp.zeros((d, d), jnp.float32), jnp.zeros((d,), jnp.float32)
        four = (p == 1 and st.kind == "grn") or (p == 0 and st.kind == "gate")
        acc = lax.fori_loop(0, st.per, body, (mat, vec, vec, vec) if four else (mat, vec))
        if st.kind != "gate" and p in (0, 1):
            k, bias = ("fc2_k", "fc2_b") if p == 0 else ("fc1_k", "fc1_b")
            g[k][split] = acc[0]
            g[bias][split] = acc[1]
        else:
            cols = pl.ds(0 if p == (2 if st.kind == "grn" else 0) else d, d)
            g["glu_k"][split, :, cols] = acc[0]
            g["glu_b"][split, cols] = acc[1]
        if four:
            g["ln_scale"][split] = acc[2]
            g["ln_bias"][split] = acc[3]

    for p in range(st.parts):
        pl.when(part == p)(functools.partial(run, p))


def matmul_flops(kind: str, rows: int, d: int) -> int:
    """The forward matmul FLOPs: the GLU's halves, ``W_2`` and ``W_1``, as the kind has."""
    return 2 * rows * (4 if kind == "grn" else 2) * d * d


def _args(a, b, keep):
    return (a,) + ((b,) if b is not None else ()) + ((keep,) if keep is not None else ())


def _fwd(prm, a, b, keep, st: _Static):
    args = _args(a, b, keep) + tuple(prm)
    n_p = a.shape[0]
    return pl.pallas_call(
        functools.partial(_fwd_kernel, st=st, has_b=b is not None, has_keep=keep is not None),
        out_shape=[jax.ShapeDtypeStruct(a.shape, a.dtype)],
        grid=(n_p // st.bn,),
        in_specs=[pl.no_block_spec] * len(args),
        out_specs=[pl.no_block_spec],
        interpret=st.interpret,
        compiler_params=triton_params(st.interpret, 8),
        name="gated_rows_fwd",
        metadata=meta(matmul_flops(st.kind, n_p, st.d)),
    )(*args)[0]


def _bwd(prm, a, b, keep, go, st: _Static):
    args = _args(a, b, keep) + (go,) + tuple(prm)
    n_p = a.shape[0]
    rows = [jax.ShapeDtypeStruct(a.shape, jnp.float32)] * (1 + (b is not None))
    parts = [jax.ShapeDtypeStruct((st.splits,) + p.shape, jnp.float32) for p in prm]
    # each part recomputes the forward pass; the input and weight gradients about twice more
    out = pl.pallas_call(
        functools.partial(_bwd_kernel, st=st, has_b=b is not None, has_keep=keep is not None),
        out_shape=rows + parts,
        grid=(st.splits, st.parts),
        in_specs=[pl.no_block_spec] * len(args),
        out_specs=[pl.no_block_spec] * len(rows + parts),
        interpret=st.interpret,
        compiler_params=triton_params(st.interpret, 8),
        name="gated_rows_bwd",
        metadata=meta((st.parts + 2) * matmul_flops(st.kind, n_p, st.d)),
    )(*args)
    da, db, partial = out[0], out[1] if b is not None else None, out[len(rows) :]
    grads = multi_tensor.sum_splits(partial, [p.dtype for p in prm], interpret=st.interpret)
    return tuple(grads), da.astype(a.dtype), None if b is None else db.astype(b.dtype)


_gated = jax.custom_vjp(_fwd, nondiff_argnums=(4,))


def _gated_bwd(st, res, go):
    prm, a, b, keep = res
    dkeep = None if keep is None else np.zeros(keep.shape, jax.dtypes.float0)
    return *_bwd(prm, a, b, keep, go, st), dkeep


_gated.defvjp(
    lambda prm, a, b, keep, st: (_fwd(prm, a, b, keep, st), (prm, a, b, keep)), _gated_bwd
)


def gated_rows(
    params: dict,
    a: Array,
    b: Array | None,
    keep: Array | None,
    rate: float,
    *,
    grn: bool,
    interpret: bool,
    block_rows: int = BLOCK_ROWS,
    target_programs: int = TARGET_PROGRAMS,
) -> Array:
    """A gate ``LayerNorm(a + GLU(b))`` (``grn=False``; ``params``: :data:`GATE_NAMES`) or a
    GRN ``LayerNorm(a + GLU(W_1 ELU(W_2 a + b_2 + b) + b_1))`` (``grn=True``; ``b``: its
    context's projection per row, or None; ``params``: :data:`GRN_NAMES`) over rows ``a``
    ``[..., d]``; ``keep``: the GLU input's dropout keep mask at ``rate`` (None: none).
    Returns ``[..., d]`` in ``a``'s dtype. A GRN whose weights do not fit one kernel
    (:data:`MAX_WEIGHTS`) runs as its MLP's kernels, then the gate's."""
    d = a.shape[-1]
    if not supported(d, a.dtype):
        raise ValueError(
            f"pallas_gated: width {d} in {jnp.dtype(a.dtype).name} is not a "
            f"power of two of at least {MIN_DOT} whose two d × d weights fit "
            f"{MAX_WEIGHTS // 1024} KB"
        )
    if not grn and b is None:
        raise ValueError("pallas_gated: a gate needs its GLU input b")
    kw = dict(interpret=interpret, block_rows=block_rows, target_programs=target_programs)
    if grn and not fits("grn", d, a.dtype):
        h1 = _rows("mlp", {k: params[k] for k in MLP_NAMES}, a, b, None, rate, **kw)
        return _rows("gate", {k: params[k] for k in GATE_NAMES}, a, h1, keep, rate, **kw)
    return _rows("grn" if grn else "gate", params, a, b, keep, rate, **kw)


def _rows(kind, params, a, b, keep, rate, *, interpret, block_rows, target_programs):
    lead, d = a.shape[:-1], a.shape[-1]
    flat = lambda x: None if x is None else x.reshape(-1, d)
    a2, b2, k2 = flat(a), flat(b), flat(keep)
    n = a2.shape[0]
    bn = min(dot_size(block_rows), dot_size(n))
    tiles = -(-n // bn)
    splits = row_splits(tiles, max(1, target_programs // PARTS[kind]))
    per = -(-tiles // splits)
    n_p = splits * per * bn
    pad = lambda x: x if x is None or n_p == n else jnp.pad(x, [(0, n_p - n), (0, 0)])
    if k2 is not None:
        k2 = k2.astype(jnp.int8)
    st = _Static(
        kind=kind,
        d=d,
        bn=bn,
        splits=splits,
        per=per,
        keep_prob=keep_prob(rate) if keep is not None else 1.0,
        cd=jnp.dtype(a.dtype).name,
        interpret=bool(interpret),
    )
    prm = tuple(params[k] for k in st.names)
    out = _gated(prm, pad(a2), pad(b2), pad(k2), st)
    return out[:n].reshape(lead + (d,))
