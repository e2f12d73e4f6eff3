"""The attention as Pallas kernels (tftjax.models.kernels.pallas_attention), in Pallas' interpreter,
against the layer's own XLA path (tftjax.models.layers.InterpretableAttention, autodiff):
outputs, the weights it reports and every gradient (the projections' parameters and the
inputs'), with the same dropout units (drawn where the layer draws them), query and key
counts and a head width that are not powers of two (masked tiles), a causal mask; float32, and bfloat16
inputs as the model runs them. The TFT with the kernel against ``off`` is in
tests/models/test_remat.py (``pallas:off``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import leaf_errors

from tftjax.models.kernels import pallas_attention
from tftjax.models.kernels.mode import KernelMode
from tftjax.models.layers import InterpretableAttention
from tftjax.models.tft import causal_mask

# 2 heads of 12 columns, 12 keys and 5 queries: each padded to Triton's 16 (masked tiles)
H, D, RATE, TE, TD = 2, 24, 0.3, 7, 5
INTERPRET = jax.default_backend() not in ("gpu", "cuda", "rocm")
KERNEL = KernelMode.INTERPRETED if INTERPRET else KernelMode.COMPILED


@pytest.fixture(scope="module", autouse=True)
def highest():
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture(scope="module")
def case():
    ks = jax.random.split(jax.random.key(0), 4)
    theta = jax.random.normal(ks[0], (3, TE + TD, D))
    layer = InterpretableAttention(H, D, RATE)
    params = layer.init({"params": ks[1]}, theta[:, TE:], theta, causal_mask(TE, TD))["params"]
    params = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(ks[2], a.shape), params)
    return params, theta, jax.random.normal(ks[3], (3, TD, D))


def _run(kernel, params, theta, r, deterministic, dtype=jnp.float32):
    def f(params, theta):
        t = theta.astype(dtype)
        p = jax.tree.map(lambda a: a.astype(dtype), params)
        out, w = InterpretableAttention(
            H, D, RATE, kernel=KERNEL if kernel else KernelMode.XLA
        ).apply(
            {"params": p},
            t[:, TE:],
            t,
            causal_mask(TE, TD),
            deterministic,
            rngs={"dropout": jax.random.key(3)},
        )
        assert out.dtype == dtype and out.shape == r.shape
        return jnp.sum(out.astype(jnp.float32) * r), w

    return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(params, theta)


@pytest.mark.parametrize("deterministic", [True, False], ids=["no-dropout", "dropout"])
def test_values_weights_and_every_gradient_equal_the_layers_float32(case, deterministic):
    # The same function in another order of float32 operations: round-off only. Every value
    # is a sum of at most 12 keys, 2 heads or 24 columns of O(1) products through the
    # projections, a softmax and the mix: relative error a few times 32·2⁻²⁴ ≈ 2e-6 of the
    # leaf's scale; 2e-5.
    params, theta, r = case
    ((v, w), g), ((v_ref, w_ref), g_ref) = (
        _run(True, params, theta, r, deterministic),
        _run(False, params, theta, r, deterministic),
    )
    assert abs(float(v) - float(v_ref)) <= 2e-5 * abs(float(v_ref))
    np.testing.assert_allclose(w, w_ref, rtol=0, atol=1e-6)  # the reported weights (XLA's)
    for name, err in leaf_errors(g, g_ref):
        assert err <= 2e-5, (name, err)


def test_dropout_drops_the_layers_units(case):
    params, theta, r = case
    (v_drop, _), _ = _run(True, params, theta, r, False)
    (v_none, _), _ = _run(False, params, theta, r, True)
    assert abs(float(v_drop) - float(v_none)) > 1e-2 * abs(float(v_none))


def test_bfloat16_as_the_model_runs_it(case):
    # bf16 operands with float32 sums, logits and softmax, against the layer in float32 on
    # the same bf16-rounded inputs and parameters: each bf16 rounding (an operand, a
    # projection's output, the dropped weights, the gradients) is relative u = 2⁻⁹, about
    # ten of them on a path through O(1) gains: error ≲ 2⁻⁴ of the leaf's scale.
    params, theta, r = case
    pb = jax.tree.map(lambda a: a.astype(jnp.bfloat16).astype(jnp.float32), params)
    tb = theta.astype(jnp.bfloat16).astype(jnp.float32)
    ((v, _), g), ((v_ref, _), g_ref) = (
        _run(True, pb, tb, r, False, jnp.bfloat16),
        _run(False, pb, tb, r, False),
    )
    assert abs(float(v) - float(v_ref)) <= 2**-4 * abs(float(v_ref))
    errs = leaf_errors(g, g_ref)
    for name, err in errs:
        assert err <= 2**-4, (name, err)
    assert max(e for _, e in errs) > 1e-4  # bf16 is in play


def test_heads_that_do_not_match_the_values_are_refused():
    with pytest.raises(ValueError, match="of 2 heads of 8 columns"):
        pallas_attention.attend(
            jnp.zeros((1, 2, 24)),
            jnp.zeros((1, 3, 24)),
            jnp.zeros((1, 3, 8)),
            jnp.ones((2, 3), bool),
            None,
            0.0,
            heads=2,
            interpret=True,
        )
