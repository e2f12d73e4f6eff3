"""The fused VSN kernel, the folded selection-weight GRN and the dropout mask, each against
an independent reference: autodiff of the plain stacked computation, the GRN on the
materialised flat embeddings, and the binomial law."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals  # print_saved_residuals' data

from tftjax.models.dropout import keep_mask, keep_prob
from tftjax.models.folded import EmbeddedGRN
from tftjax.models.kernels import fused
from tftjax.models.layers import GRN
from tftjax.models.vsn import stacked_grn

M, N, DV, D = 7, 45, 4, 12


def stacked_params(key, m=M, dv=DV, d=D):
    ks = jax.random.split(key, 12)
    shapes = fused.stacked_shapes(m, dv, d)
    p = {k: 0.5 * jax.random.normal(kk, s) for kk, (k, s) in zip(ks, shapes.items())}
    p["ln_scale"] = 1.0 + p["ln_scale"]
    return p


@pytest.fixture(scope="module", autouse=True)
def highest():
    # equality at full float32 on every backend (NVIDIA GPUs default to TF32 matmuls)
    with jax.default_matmul_precision("highest"):
        yield


def assert_close(a, b, rtol=2e-5):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.abs(a - b).max() <= rtol * max(np.abs(b).max(), 1e-30), np.abs(a - b).max()


@pytest.mark.parametrize(
    "dropout,row_block,unroll,precision",
    [
        (0.0, 4096, 1, "highest"),
        (0.3, 4096, 2, "highest"),
        (0.3, 16, 1, "highest"),
        (0.3, 4096, 1, "default"),
    ],
)
def test_fused_value_and_every_gradient_equal_autodiff_of_the_stacked_grns(
    dropout, row_block, unroll, precision
):
    from conftest import matmul_mantissa_bits

    # default: the backend's (TF32 on NVIDIA GPUs), the float32 tolerance scaled by the
    # mantissa bits it gives up
    rtol = 2e-5 * (2.0 ** (24 - matmul_mantissa_bits()) if precision == "default" else 1)
    with jax.default_matmul_precision(precision):
        _fused_against_autodiff(dropout, row_block, unroll, rtol)


def _fused_against_autodiff(dropout, row_block, unroll, rtol):
    # row_block 16 < N = 45: three row blocks with padding.
    ks = jax.random.split(jax.random.key(0), 5)
    p = stacked_params(ks[0])
    x = jax.random.normal(ks[1], (M, N))
    w = jax.nn.softmax(jax.random.normal(ks[2], (M, N)), axis=0)
    keep = keep_mask(ks[3], dropout, (M, N, DV)) if dropout else None
    r = jax.random.normal(ks[4], (N, D))

    def ref(p, x, w):
        return jnp.sum(stacked_grn(p, x, w, keep, dropout)[0] * r)

    def fus(p, x, w):
        return jnp.sum(fused.weighted_grn_sum(p, x, w, keep, dropout, unroll, row_block) * r)

    v_ref, g_ref = jax.jit(jax.value_and_grad(ref, argnums=(0, 1, 2)))(p, x, w)
    v, g = jax.jit(jax.value_and_grad(fus, argnums=(0, 1, 2)))(p, x, w)
    assert_close(v, v_ref, rtol)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g), jax.tree.leaves(g_ref)):
        assert np.any(np.asarray(a) != 0), jax.tree_util.keystr(path)
        assert_close(a, b, rtol)


def test_fused_saves_only_its_inputs():
    # What the backward pass keeps: x, w, the mask and parameters; nothing [m, N, d].
    p = stacked_params(jax.random.key(0))
    x = jnp.ones((M, N))
    keep = keep_mask(jax.random.key(1), 0.2, (M, N, DV))
    saved = saved_residuals(lambda p, x: fused.weighted_grn_sum(p, x, x / M, keep, 0.2).sum(), p, x)
    biggest = max(int(np.prod(a.shape)) for a, _ in saved)
    assert biggest <= M * N * DV < M * N * D


def test_embedded_grn_equals_the_grn_on_flat_embeddings():
    ks = jax.random.split(jax.random.key(2), 5)
    n, m, dv, hidden = 30, 9, 3, 8
    x = jax.random.normal(ks[0], (n, m))
    emb_k, emb_b = jax.random.normal(ks[1], (m, dv)), jax.random.normal(ks[2], (m, dv))
    ctx = jax.random.normal(ks[3], (n, 5))
    flat = lambda x, k, b: (x[:, :, None] * k + b).reshape(n, m * dv)
    params = jax.jit(GRN(hidden, m).init)(ks[4], flat(x, emb_k, emb_b), ctx)
    folded = jax.jit(EmbeddedGRN(hidden, m).init)(ks[4], x, emb_k, emb_b, ctx)
    assert jax.tree.map(jnp.shape, folded) == jax.tree.map(jnp.shape, params)
    r = jax.random.normal(ks[0], (n, m))

    def ref(p, x, k, b):
        return jnp.sum(GRN(hidden, m).apply(p, flat(x, k, b), ctx) * r)

    def fol(p, x, k, b):
        return jnp.sum(EmbeddedGRN(hidden, m).apply(p, x, k, b, ctx) * r)

    a = jax.jit(jax.value_and_grad(fol, argnums=(0, 1, 2, 3)))(params, x, emb_k, emb_b)
    b = jax.jit(jax.value_and_grad(ref, argnums=(0, 1, 2, 3)))(params, x, emb_k, emb_b)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert_close(u, v, 1e-5)


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_keep_mask_is_bernoulli_with_its_stated_probability(impl):
    rate = 0.1
    mask = np.asarray(keep_mask(jax.random.key(3, impl=impl), rate, (101, 37, 9)))
    n = mask.size
    p = keep_prob(rate)
    assert abs(p - (1 - rate)) <= 2**-17
    # Binomial: the observed fraction within 5 standard deviations of p.
    assert abs(mask.mean() - p) <= 5 * np.sqrt(p * (1 - p) / n)
    # Different keys, different masks; odd sizes work.
    other = np.asarray(keep_mask(jax.random.key(4, impl=impl), rate, (101, 37, 9)))
    assert (mask != other).mean() > 0.1
    assert keep_mask(jax.random.key(0), 0.5, (3, 5, 1)).shape == (3, 5, 1)


def test_keep_mask_units_are_independent_of_their_neighbours_and_of_the_key():
    # The hash of consecutive indices (models.dropout): neighbours along each axis agree as
    # often as independent draws would (p² + (1-p)², within 5 standard deviations), and
    # so do the masks of two keys; every row and column keeps about p of its units.
    rate, shape = 0.3, (257, 129)
    p = keep_prob(rate)
    mask = np.asarray(keep_mask(jax.random.key(5, impl="rbg"), rate, shape))
    other = np.asarray(keep_mask(jax.random.key(6, impl="rbg"), rate, shape))
    agree = p * p + (1 - p) * (1 - p)
    for a, b in ((mask[1:], mask[:-1]), (mask[:, 1:], mask[:, :-1]), (mask, other)):
        n = a.size
        assert abs((a == b).mean() - agree) <= 5 * np.sqrt(agree * (1 - agree) / n)
    for axis, n in ((0, shape[0]), (1, shape[1])):
        worst = np.abs(mask.mean(axis=axis) - p).max()
        assert worst <= 5 * np.sqrt(p * (1 - p) / n)
