"""The static context GRNs as Pallas kernels (tftjax.models.kernels.pallas_grn), in Pallas'
interpreter, against the GRN layer they replace (tftjax.models.layers.GRN, autodiff):
outputs and every gradient (the parameters' and the input's), with the same dropout units
(drawn where the layer draws them), rows padded to whole tiles; float32, and bfloat16
inputs with float32 parameters as the model runs them. The TFT with the kernel against
``off`` is in tests/models/test_remat.py (``pallas:off``)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import leaf_errors

from tftjax.models.kernels import pallas_grn
from tftjax.models.kernels.params import GRNParams
from tftjax.models.layers import GRN

K, D, RATE = 2, 16, 0.3
# compiled Triton kernels on a GPU (gpu_check runs this file there), the interpreter elsewhere
INTERPRET = jax.default_backend() not in ("gpu", "cuda", "rocm")


class Layers(nn.Module):
    """K context-free GRN(d, d) on one input: the layers, or the kernels on their params."""

    kernel: bool

    @nn.compact
    def __call__(self, x, deterministic):
        if not self.kernel:
            return [GRN(D, D, RATE, name=f"g{i}")(x, None, deterministic) for i in range(K)]
        got = [GRNParams(D, RATE, name=f"g{i}")(x, deterministic) for i in range(K)]
        keeps = None if got[0][1] is None else [k for _, k in got]
        return pallas_grn.grn_stack(
            [q for q, _ in got], x, keeps, RATE, interpret=INTERPRET, block_rows=16
        )


@pytest.fixture(scope="module", autouse=True)
def highest():
    with jax.default_matmul_precision("highest"):
        yield


def _run(kernel, params, x, r, deterministic, x_dtype=jnp.float32):
    def f(params, x):
        outs = Layers(kernel).apply(
            {"params": params},
            x.astype(x_dtype),
            deterministic,
            rngs={"dropout": jax.random.key(3)},
        )
        assert all(o.dtype == x_dtype and o.shape == x.shape for o in outs)
        return sum(jnp.sum(o.astype(jnp.float32) * r[i]) for i, o in enumerate(outs))

    return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(params, x)


@pytest.fixture(scope="module")
def case():
    ks = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(ks[0], (37, D))  # 37 rows: three tiles of 16, the last padded
    params = Layers(False).init({"params": ks[1]}, x, True)["params"]
    # biases and LayerNorm offsets away from their zero init, so that each term shows
    params = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(ks[2], a.shape), params)
    r = jax.random.normal(ks[2], (K, 37, D))
    return params, x, r


def test_the_kernel_declares_the_layers_parameters(case):
    params, x, _ = case
    mine = Layers(True).init({"params": jax.random.key(1)}, x, True)["params"]
    theirs = Layers(False).init({"params": jax.random.key(1)}, x, True)["params"]
    assert jax.tree.structure(mine) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(mine), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(a, b)  # the same initial values, not just shapes


@pytest.mark.parametrize("deterministic", [True, False], ids=["no-dropout", "dropout"])
def test_values_and_every_gradient_equal_the_layers_float32(case, deterministic):
    # The same function in another order of float32 operations: round-off only. Every value
    # is a sum of at most 37 rows or 16 columns of O(1) products through four matmul layers
    # and a LayerNorm: relative error a few times 37·2⁻²⁴ ≈ 2e-6 of the leaf's scale; 2e-5.
    params, x, r = case
    (v, g), (v_ref, g_ref) = (
        _run(True, params, x, r, deterministic),
        _run(False, params, x, r, deterministic),
    )
    assert abs(float(v) - float(v_ref)) <= 2e-5 * abs(float(v_ref))
    for name, err in leaf_errors(g, g_ref):
        assert err <= 2e-5, (name, err)


def test_dropout_drops_the_layers_units(case):
    # a kernel that drew other units (or none) differs by O(1), not by round-off
    params, x, r = case
    v_drop, _ = _run(True, params, x, r, False)
    v_none, _ = _run(False, params, x, r, True)
    assert abs(float(v_drop) - float(v_none)) > 1e-2 * abs(float(v_none))


def test_bfloat16_inputs_with_float32_parameters(case):
    # As the model runs it under bf16: a bf16 input, float32 parameters cast to bf16 inside
    # the kernel for its matmuls (float32 sums), float32 gradients. The reference is the
    # layer in float32 on the same bf16-rounded input. Each bf16 rounding of a matmul operand
    # is relative u = 2⁻⁹; a value passes at most four forward and eight backward operand
    # roundings through O(1) gains (LayerNorm, σ', ELU' ≤ 1): error ≲ 12u·(a few) ≈ 2⁻⁴ of
    # the leaf's scale. A dropped term errs by O(1).
    params, x, r = case
    xb = x.astype(jnp.bfloat16).astype(jnp.float32)
    (v, g), (v_ref, g_ref) = (
        _run(True, params, xb, r, False, jnp.bfloat16),
        _run(False, params, xb, r, False),
    )
    assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(g[0]))
    assert abs(float(v) - float(v_ref)) <= 2**-4 * abs(float(v_ref))
    errs = leaf_errors(g, g_ref)
    for name, err in errs:
        assert err <= 2**-4, (name, err)
    assert max(e for _, e in errs) > 1e-4  # bf16 is in play


def test_widths_the_kernels_cannot_take_run_in_xla():
    # Triton's dots (powers of two ≥ 16); a d × d weight within 32 KB of shared memory
    # (compiled for the H100, d = 128 in float32 asks 416 KB: tests/memory/test_hlo_cost.py
    # compiles the bf16 case)
    assert pallas_grn.supported(16, jnp.float32) and pallas_grn.supported(128, jnp.bfloat16)
    assert pallas_grn.supported(64, jnp.float32) and not pallas_grn.supported(128, jnp.float32)
    assert not pallas_grn.supported(8) and not pallas_grn.supported(96)
    with pytest.raises(ValueError, match="power of two"):
        pallas_grn.grn_stack([], jnp.zeros((4, 12)), None, 0.0, interpret=True)
    from tftjax.config import preset
    from tftjax.models.compute import grn_kernel, kernel_cast, static_stack

    assert grn_kernel(preset("tiny", grn_kernel="pallas"))
    assert static_stack(preset("tiny", grn_kernel="pallas"))
    # 128 in float32: the four static GRNs each through the row kernels (pallas_gated)
    assert grn_kernel(preset("tft225", grn_kernel="pallas"))
    assert not static_stack(preset("tft225", grn_kernel="pallas"))
    assert static_stack(preset("tft225", grn_kernel="pallas", precision="bf16"))
    assert kernel_cast(preset("tft225", grn_kernel="pallas", precision="bf16")) == (
        "static_selection",
        "static_enrichment",
        "static_state_h",
        "static_state_c",
        "lstm_gate",
        "enrichment",
        "attention_gate",
        "positionwise",
        "output_gate",
    )
    assert kernel_cast(preset("tft225", precision="bf16")) == ()
