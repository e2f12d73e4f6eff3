"""The LSTM recurrence's hand-written backward pass against autodiff of the same scan (the
reference), in float32 at the highest matmul precision, and its bfloat16 form: the
recurrent kernel's gradient accumulated in float32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tftjax.models.recurrence import _project, _scan, lstm_recurrence

T, B, D, F = 7, 5, 6, 3
ARGS = ("xs", "w_i", "b", "w_h", "c0", "h0")


def inputs(dtype, B=B):
    ks = jax.random.split(jax.random.key(3), 6)
    xs = jax.random.normal(ks[0], (T, B, F)).astype(dtype)
    w_i = jax.random.normal(ks[4], (F, 4 * D)).astype(dtype)
    b = (0.1 * jax.random.normal(ks[5], (4 * D,))).astype(dtype)
    w_h = 0.5 * jax.random.normal(ks[1], (D, 4 * D))
    c0 = jax.random.normal(ks[2], (B, D))
    h0 = jax.random.normal(ks[3], (B, D)).astype(dtype)
    return xs, w_i, b, w_h, c0, h0


def loss(fn, B=B):
    # every output is used: the final carry and each step's h, with distinct weights
    wt = jnp.arange(1.0, T * B * D + 1).reshape(T, B, D) / (T * B * D)

    def f(*args):
        (c, h), hs = fn(*args)
        return (
            jnp.sum(c * c)
            + jnp.sum(jnp.sin(h.astype(jnp.float32)))
            + jnp.sum(wt * hs.astype(jnp.float32))
        )

    return f


def ref(xs, w_i, b, w_h, c0, h0):
    carry, hs, _, _ = _scan(_project(xs, w_i, b), w_h, c0, h0)
    return carry, hs


ALL = tuple(range(6))


@pytest.mark.parametrize("recompute", [False, True])
def test_values_and_gradients_equal_autodiff_float32(recompute):
    args = inputs(jnp.float32)
    fn = lambda *a: lstm_recurrence(*a, recompute)
    with jax.default_matmul_precision("highest"):
        out, want = fn(*args), ref(*args)
        g = jax.grad(loss(fn), argnums=ALL)(*args)
        g_ref = jax.grad(loss(ref), argnums=ALL)(*args)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the same forward ops
    # the backward passes differ in the order of float32 sums (a GEMM over all steps for
    # the kernel, activations recomputed from the gates): a few ulps of the largest entry
    # over T=7 steps of products of O(1) factors
    for name, a, b in zip(ARGS, g, g_ref):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, name
        assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), name


def test_bfloat16_compute_sums_the_recurrent_gradient_in_float32():
    args = inputs(jnp.bfloat16)
    g = jax.grad(loss(lstm_recurrence), argnums=ALL)(*args)
    assert [x.dtype for x in g] == [jnp.bfloat16] * 3 + [jnp.float32, jnp.float32, jnp.bfloat16]
    # against the float32 recurrence on the same (bf16-rounded) inputs: bf16 keeps 8 bits,
    # and every backward step rounds its gate gradients to bf16 once (2^-8 relative)
    args32 = [a.astype(jnp.float32) for a in args]
    with jax.default_matmul_precision("highest"):
        g32 = jax.grad(loss(lstm_recurrence), argnums=ALL)(*args32)
    for name, a, b in zip(ARGS, g, g32):
        a, b = np.asarray(a, np.float32), np.asarray(b)
        assert np.abs(a - b).max() <= T * 2.0**-6 * np.abs(b).max(), name


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_kernel_gradient_is_one_float32_gemm(dtype):
    """No scan carries the [d, 4d] kernel gradient: it is one GEMM after the backward scan,
    with bf16 operands (bf16 compute) and a float32 result."""
    args = inputs(dtype)
    jaxpr = jax.make_jaxpr(jax.grad(loss(lstm_recurrence), argnums=3))(*args).jaxpr

    def walk(j, dots, carries):
        for e in j.eqns:
            if e.primitive.name == "dot_general" and e.outvars[0].aval.shape == (D, 4 * D):
                dots.append((tuple(v.aval.dtype for v in e.invars), e.outvars[0].aval.dtype))
            if e.primitive.name == "scan":
                n0, n1 = e.params["num_consts"], e.params["num_carry"]
                carries += [v.aval.shape for v in e.invars[n0 : n0 + n1]]
            for sub in jax.core.jaxprs_in_params(e.params):
                walk(sub, dots, carries)
        return dots, carries

    dots, carries = walk(jaxpr, [], [])
    assert dots == [((dtype, dtype), jnp.float32)], dots
    assert (D, 4 * D) not in carries


@pytest.mark.parametrize("recompute,b", [(False, B), (True, B), (False, 37)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_pallas_kernels_equal_the_scans(dtype, recompute, b):
    """Both recurrences as persistent Pallas kernels (tftjax.models.kernels.pallas_lstm; Pallas'
    interpreter here, Triton on a GPU) against the scans, d = 6 padded to 16 units and B = 5
    rows to a tile of 16 (B = 37: three programs). float32: the same operations but the gates' sum (x + h·W as one
    float32 sum, not two), a few ulps as above. bfloat16: the kernel adds x and h·W in
    float32 before one rounding where the scan rounds h·W first, and takes the activations
    in float32: one bf16 rounding (u = 2⁻⁹) more or less per gate, through T = 7 steps of
    O(1) gains; 2⁻⁵ of each leaf's scale bounds it (measured: at most 2⁻⁷)."""
    from tftjax.models.kernels.mode import KernelMode
    from tftjax.models.remat import is_gpu

    args = inputs(dtype, b)
    tol = 1e-5 if dtype == jnp.float32 else 2**-5
    # interpreted here; compiled where the tests run on a GPU
    kernel = KernelMode.COMPILED if is_gpu() else KernelMode.INTERPRETED
    with jax.default_matmul_precision("highest"):
        outs = [lstm_recurrence(*args, recompute, p) for p in (kernel, KernelMode.XLA)]
        g, g_ref = (
            jax.grad(loss(lambda *a, p=p: lstm_recurrence(*a, recompute, p), b), argnums=ALL)(*args)
            for p in (kernel, KernelMode.XLA)
        )
    for a, b in zip(*(jax.tree.leaves(o) for o in outs)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert a.shape == b.shape and np.abs(a - b).max() <= tol * np.abs(b).max()
    for name, a, b in zip(ARGS, g, g_ref):
        assert a.dtype == b.dtype, name
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.any(a != 0) and np.abs(a - b).max() <= tol * np.abs(b).max(), name
