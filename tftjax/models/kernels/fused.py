"""The variable selection network's per-variable GRNs as one fused, recomputing kernel.

``Σ_j w_j GRN_j(x_j)`` over m variables is ≈96% of the TFT's activations and of its
step time (experiments/profile_step.py). Written as plain array code, XLA:CPU
materialises several ``[m, N, d]`` arrays (for TFT-225 at batch 64: 360 MB each),
reduces them over the variable axis (a strided reduction that XLA:CPU runs an
order of magnitude slower than a row reduction), and autodiff adds as many
again in the backward pass. This kernel instead

* runs a ``lax.scan`` over the variables, one per step (``unroll`` steps per loop
  iteration), whose working set is a few ``[N, d]`` arrays that stay in cache,
  accumulating the weighted sum in the carry (no reduction over the variable axis;
  measured, a ``vmap`` over a chunk of variables inside the step is several times
  slower: XLA:CPU runs batched dots far slower than plain ones);
* splits the GLU kernel into its value and gate halves (two ``[N, d_v] × [d_v, d]``
  dots instead of one ``[N, d_v] × [d_v, 2d]`` dot and a split, which XLA:CPU
  copies);
* has a hand-written backward pass (``jax.custom_vjp``) that recomputes each variable
  from the saved *inputs* only (x, w, the dropout mask and the parameters: nothing
  of size ``[m, N, ·]`` beyond those) and forms every column sum over rows as a
  dot, which XLA:CPU runs through its matmul library.

It computes the same function as :func:`tftjax.models.vsn.stacked_grn` (the
reference; tests compare value and every gradient against its autodiff) in
float32. The GRN of variable j, with the embedding folded in (``x`` is a scalar
per row)::

    a = x f_k + f_b;  h = ELU(a);  η = (h W_1 + b_1) ⊙ keep
    v = η V + b_v;  g = η G + b_g;  y = x s_k + s_b + σ(g) ⊙ v
    o = LayerNorm(y) γ + β;         out = Σ_j w_j o_j
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from tftjax.models.dropout import keep_prob

Array = jax.Array
EPS = 1e-6
ROW_BLOCK = 4096
"""Rows per block: the kernel's few live ``[rows, d]`` arrays stay within the L2/L3 caches."""


def stacked_shapes(m: int, dv: int, d: int) -> dict[str, tuple[int, ...]]:
    """The VSN's per-variable GRN parameters, stacked over its ``m`` variables (the layout
    :func:`fold` reads): embedding ``1 -> d_v``, the GRN's ``d_v -> d_v -> (GLU) d`` with a
    skip projection, and the layer norm."""
    return {
        "emb_k": (m, dv),
        "emb_b": (m, dv),
        "fc2_k": (m, dv, dv),
        "fc2_b": (m, dv),
        "fc1_k": (m, dv, dv),
        "fc1_b": (m, dv),
        "glu_k": (m, dv, 2 * d),
        "glu_b": (m, 2 * d),
        "skip_k": (m, dv, d),
        "skip_b": (m, d),
        "ln_scale": (m, d),
        "ln_bias": (m, d),
    }


class Folded(NamedTuple):
    """Per-variable parameters with a leading variable axis m (embedding folded in)."""

    fk: Array  # [m, d_v]   W_2 applied to the embedding kernel
    fb: Array  # [m, d_v]   W_2 applied to the embedding bias, plus b_2
    w1: Array  # [m, d_v, d_v]
    b1: Array  # [m, d_v]
    vk: Array  # [m, d_v, d]  GLU value half
    vb: Array  # [m, d]
    gk: Array  # [m, d_v, d]  GLU gate half
    gb: Array  # [m, d]
    sk: Array  # [m, d]   skip projection of the embedding kernel
    sb: Array  # [m, d]   skip projection of the embedding bias, plus the skip bias
    ln_g: Array  # [m, d]
    ln_b: Array  # [m, d]


def fold(p: dict) -> Folded:
    """The stacked parameters of a ``VariableSelection`` (float) as :class:`Folded`.

    Plain jnp: autodiff carries the kernel's parameter gradients back to ``p``.
    """
    d = p["skip_k"].shape[-1]
    f = lambda v, k: jnp.einsum("mv,mvo->mo", v, k)
    return Folded(
        fk=f(p["emb_k"], p["fc2_k"]),
        fb=f(p["emb_b"], p["fc2_k"]) + p["fc2_b"],
        w1=p["fc1_k"],
        b1=p["fc1_b"],
        vk=p["glu_k"][..., :d],
        vb=p["glu_b"][..., :d],
        gk=p["glu_k"][..., d:],
        gb=p["glu_b"][..., d:],
        sk=f(p["emb_k"], p["skip_k"]),
        sb=f(p["emb_b"], p["skip_k"]) + p["skip_b"],
        ln_g=p["ln_scale"],
        ln_b=p["ln_bias"],
    )


def _forward(q: Folded, x: Array, keep: Array | None):
    """One variable: ``q`` without the variable axis, ``x`` [N], ``keep`` [N, d_v] (scaled)
    or None. Returns the intermediates the backward pass needs."""
    a = x[:, None] * q.fk + q.fb  # [N, d_v]
    h = jnp.where(a > 0, a, jnp.expm1(jnp.minimum(a, 0.0)))  # ELU
    eta = jnp.dot(h, q.w1) + q.b1
    if keep is not None:
        eta = eta * keep
    v = jnp.dot(eta, q.vk) + q.vb  # [N, d]
    s = jax.nn.sigmoid(jnp.dot(eta, q.gk) + q.gb)
    y = x[:, None] * q.sk + q.sb + s * v
    mu = jnp.mean(y, axis=-1, keepdims=True)
    yc = y - mu
    r = lax.rsqrt(jnp.mean(yc * yc, axis=-1, keepdims=True) + EPS)
    yh = yc * r
    return a, h, eta, v, s, yh, r


def _out(q: Folded, yh: Array) -> Array:
    return yh * q.ln_g + q.ln_b


def _fwd_sum(q: Folded, x: Array, w: Array, keep: Array | None, unroll: int) -> Array:
    n, d = x.shape[1], q.sk.shape[-1]

    def body(acc, inp):
        qj, xj, wj, kj = inp
        *_, yh, _ = _forward(qj, xj, kj)
        return acc + wj[:, None] * _out(qj, yh), None

    out, _ = lax.scan(body, jnp.zeros((n, d), x.dtype), (q, x, w, keep), unroll=unroll)
    return out


def _bwd_one(q: Folded, x: Array, w: Array, keep: Array | None, gout: Array):
    """Gradients of ``Σ w ⊙ o`` for one variable given the output cotangent ``gout`` [N, d]."""
    a, h, eta, v, s, yh, r = _forward(q, x, keep)
    d = yh.shape[-1]
    o = _out(q, yh)
    dw = jnp.sum(gout * o, axis=-1)  # [N]
    wg = w[:, None] * gout  # d o
    g_yh = gout * yh
    d_lng = jnp.dot(w, g_yh)  # Σ_n w_n gout_n ⊙ ŷ_n   [d]
    d_lnb = jnp.dot(w, gout)
    dyh = wg * q.ln_g
    m1 = jnp.mean(dyh, axis=-1, keepdims=True)
    m2 = jnp.mean(dyh * yh, axis=-1, keepdims=True)
    dy = r * (dyh - m1 - yh * m2)  # [N, d]
    dv = dy * s
    dg = dy * v * s * (1.0 - s)
    ones = jnp.ones_like(x)
    xo = jnp.stack([x, ones])  # [2, N]
    d_s = jnp.dot(xo, dy)  # [2, d]: Σ x dy, Σ dy
    d_vk = jnp.dot(eta.T, dv)  # [d_v, d]
    d_gk = jnp.dot(eta.T, dg)
    d_vb = jnp.dot(ones, dv)
    d_gb = jnp.dot(ones, dg)
    deta = jnp.dot(dv, q.vk.T) + jnp.dot(dg, q.gk.T)  # [N, d_v]
    if keep is not None:
        deta = deta * keep
    d_w1 = jnp.dot(h.T, deta)
    d_b1 = jnp.dot(ones, deta)
    dh = jnp.dot(deta, q.w1.T)
    da = dh * jnp.where(a > 0, 1.0, h + 1.0)
    d_f = jnp.dot(xo, da)  # [2, d_v]
    dx = jnp.sum(dy * q.sk, axis=-1) + jnp.sum(da * q.fk, axis=-1)
    del d
    grads = Folded(
        fk=d_f[0],
        fb=d_f[1],
        w1=d_w1,
        b1=d_b1,
        vk=d_vk,
        vb=d_vb,
        gk=d_gk,
        gb=d_gb,
        sk=d_s[0],
        sb=d_s[1],
        ln_g=d_lng,
        ln_b=d_lnb,
    )
    return grads, dx, dw


def _vsn_sum_impl(q: Folded, x: Array, w: Array, keep: Array | None, unroll: int) -> Array:
    return _fwd_sum(q, x, w, keep, unroll)


def _vsn_sum_fwd(q, x, w, keep, unroll):
    return _fwd_sum(q, x, w, keep, unroll), (q, x, w, keep)


def _vsn_sum_bwd(unroll, res, gout):
    q, x, w, keep = res

    def body(_, inp):
        q_j, x_j, w_j, keep_j = inp
        return None, _bwd_one(q_j, x_j, w_j, keep_j, gout)

    _, (gq, dx, dw) = lax.scan(body, None, (q, x, w, keep), unroll=unroll)
    return gq, dx, dw, None if keep is None else jnp.zeros_like(keep)


_vsn_sum = jax.custom_vjp(_vsn_sum_impl, nondiff_argnums=(4,))
_vsn_sum.defvjp(_vsn_sum_fwd, _vsn_sum_bwd)


def weighted_grn_sum(
    p: dict,
    x: Array,
    w: Array,
    keep: Array | None,
    rate: float,
    unroll: int = 1,
    row_block: int = ROW_BLOCK,
) -> Array:
    """``Σ_j w_j GRN_j(x_j)`` ``[N, d]`` for stacked float parameters ``p`` (as in
    ``VariableSelection``), inputs ``x`` and weights ``w`` ``[m, N]``, dropout
    keep-mask ``keep`` ``[m, N, d_v]`` (bool) or None, as a scan over variables
    (``unroll`` per loop iteration); the backward pass recomputes each variable from the
    inputs. Rows run in blocks of at most ``row_block`` (a ``lax.map``) so that the
    per-variable working set stays in cache at any batch size."""
    # float32 inside (bf16 compute too): the kernel stores no [m, N, ·] activations for
    # bfloat16 to halve, and XLA:CPU has no fast bfloat16 dots
    p, x, w = jax.tree.map(lambda a: a.astype(jnp.float32), (p, x, w))
    keep_f = None if keep is None else keep.astype(x.dtype) / keep_prob(rate)
    q = fold(p)
    n = x.shape[1]
    nb = -(-n // max(1, row_block))
    if nb == 1:
        return _vsn_sum(q, x, w, keep_f, int(unroll))
    r = -(-n // nb)  # even blocks: fewer than nb padded rows
    pad = nb * r - n

    def blocks(a):  # [m, N, ...] → [nb, m, r, ...]
        a = jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
        return jnp.moveaxis(a.reshape((a.shape[0], nb, r) + a.shape[2:]), 1, 0)

    kb = None if keep_f is None else blocks(keep_f)
    out = lax.map(lambda a: _vsn_sum(q, a[0], a[1], a[2], int(unroll)), (blocks(x), blocks(w), kb))
    return out.reshape(nb * r, -1)[:n]
