"""The TFT's row-wise gated blocks as Pallas kernels (tftjax.models.kernels.pallas_gated), in Pallas'
interpreter, against the layers they replace (tftjax.models.layers.GateAddNorm and GRN,
autodiff): outputs and every gradient (the parameters' and the inputs'), with the same
dropout units (drawn where the layers draw them), the GRN with and without its context,
rows padded to whole tiles and split across the backward grid; float32, and bfloat16 inputs
with float32 parameters as the model runs them. The TFT with the kernels against ``off`` is
in tests/models/test_remat.py (``pallas:off``)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import leaf_errors

from tftjax.models.kernels import pallas_gated
from tftjax.models.kernels.params import GateParams, GRNParams
from tftjax.models.kernels.triton_util import row_splits
from tftjax.models.layers import GRN, GateAddNorm

D, RATE = 16, 0.3
# compiled Triton kernels on a GPU (gpu_check runs this file there), the interpreter elsewhere
INTERPRET = jax.default_backend() not in ("gpu", "cuda", "rocm")
KINDS = ["gate", "grn", "grn-context"]


class Block(nn.Module):
    """One block: the layer, or the kernel on the parameters declared for it. ``a`` [B, T,
    d] the skip (a GRN's input), ``b`` a gate's GLU input or a GRN's context [B, 1, d]."""

    kind: str
    kernel: bool

    @nn.compact
    def __call__(self, a, b, deterministic):
        if self.kind == "gate":
            if not self.kernel:
                return GateAddNorm(D, RATE, name="blk")(a, b, deterministic)
            prm, keep = GateParams(D, RATE, name="blk")(b, deterministic)
            return pallas_gated.gated_rows(
                prm,
                a,
                b,
                keep,
                RATE,
                grn=False,
                interpret=INTERPRET,
                block_rows=16,
                target_programs=6,
            )
        ctx = b if self.kind == "grn-context" else None
        if not self.kernel:
            return GRN(D, D, RATE, name="blk")(a, ctx, deterministic)
        prm, keep = GRNParams(D, RATE, ctx is not None, name="blk")(a, deterministic)
        if ctx is not None:
            ctx = jnp.broadcast_to(ctx @ prm["ctx_k"].astype(ctx.dtype), a.shape)
        return pallas_gated.gated_rows(
            prm,
            a,
            ctx,
            keep,
            RATE,
            grn=True,
            interpret=INTERPRET,
            block_rows=16,
            target_programs=12,
        )


@pytest.fixture(scope="module", autouse=True)
def highest():
    with jax.default_matmul_precision("highest"):
        yield


def _inputs(kind, a):
    return a[:, :1] if kind == "grn-context" else jnp.roll(a, 1, axis=0) * 0.7


def _run(kind, kernel, params, a, r, deterministic, dtype=jnp.float32):
    def f(params, a):
        a_c = a.astype(dtype)
        out = Block(kind, kernel).apply(
            {"params": params},
            a_c,
            _inputs(kind, a_c),
            deterministic,
            rngs={"dropout": jax.random.key(3)},
        )
        assert out.dtype == dtype and out.shape == a.shape
        return jnp.sum(out.astype(jnp.float32) * r)

    return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(params, a)


@pytest.fixture(scope="module")
def cases():
    # 3 windows of 25 steps: 75 rows, five tiles of 16 (the last padded); the backward grid
    # splits them (3 splits of a gate's 2 parts, 3 of a GRN's 4)
    out = {}
    for i, kind in enumerate(KINDS):
        ks = jax.random.split(jax.random.key(i), 3)
        a = jax.random.normal(ks[0], (3, 25, D))
        params = Block(kind, False).init({"params": ks[1]}, a, _inputs(kind, a), True)["params"]
        # biases and LayerNorm offsets away from their zero init, so that each term shows
        params = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(ks[2], x.shape), params)
        out[kind] = params, a, jax.random.normal(ks[2], a.shape)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_the_kernel_declares_the_layers_parameters(cases, kind):
    _, a, _ = cases[kind]
    mine = Block(kind, True).init({"params": jax.random.key(1)}, a, _inputs(kind, a), True)
    theirs = Block(kind, False).init({"params": jax.random.key(1)}, a, _inputs(kind, a), True)
    assert jax.tree.structure(mine) == jax.tree.structure(theirs)
    for x, y in zip(jax.tree.leaves(mine), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(x, y)  # the same initial values, not just shapes


@pytest.mark.parametrize("deterministic", [True, False], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("kind", KINDS)
def test_values_and_every_gradient_equal_the_layers_float32(cases, kind, deterministic):
    # The same function in another order of float32 operations: round-off only. Every value
    # is a sum of at most 75 rows or 16 columns of O(1) products through at most four matmul
    # layers and a LayerNorm: relative error a few times 75·2⁻²⁴ ≈ 5e-6 of the leaf's
    # scale; 3e-5.
    params, a, r = cases[kind]
    (v, g), (v_ref, g_ref) = (
        _run(kind, True, params, a, r, deterministic),
        _run(kind, False, params, a, r, deterministic),
    )
    assert abs(float(v) - float(v_ref)) <= 3e-5 * abs(float(v_ref))
    for name, err in leaf_errors(g, g_ref):
        assert err <= 3e-5, (name, err)


@pytest.mark.parametrize("kind", KINDS)
def test_dropout_drops_the_layers_units(cases, kind):
    # a kernel that drew other units (or none) differs by O(1), not by round-off
    params, a, r = cases[kind]
    v_drop, _ = _run(kind, True, params, a, r, False)
    v_none, _ = _run(kind, False, params, a, r, True)
    assert abs(float(v_drop) - float(v_none)) > 1e-2 * abs(float(v_none))


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_inputs_with_float32_parameters(cases, kind):
    # As the model runs them under bf16: bf16 inputs, float32 parameters cast to bf16 inside
    # the kernel for its matmuls (float32 sums), float32 parameter gradients. The reference
    # is the layer in float32 on the same bf16-rounded inputs. Each bf16 rounding of a
    # matmul operand is relative u = 2⁻⁹; a value passes at most four forward and eight
    # backward operand roundings (and the bf16 input gradient's own) through O(1) gains
    # (LayerNorm, σ', ELU' ≤ 1): error ≲ 13u·(a few) ≈ 2⁻⁴ of the leaf's scale. A dropped
    # term errs by O(1).
    params, a, r = cases[kind]
    ab = a.astype(jnp.bfloat16).astype(jnp.float32)
    (v, g), (v_ref, g_ref) = (
        _run(kind, True, params, ab, r, False, jnp.bfloat16),
        _run(kind, False, params, ab, r, False),
    )
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(g[0]))
    assert abs(float(v) - float(v_ref)) <= 2**-4 * abs(float(v_ref))
    errs = leaf_errors(g, g_ref)
    for name, err in errs:
        assert err <= 2**-4, (name, err)
    assert max(e for _, e in errs) > 1e-4  # bf16 is in play


@pytest.mark.parametrize("kind", ["grn", "grn-context"])
def test_a_grn_too_wide_for_one_kernel_runs_as_its_mlp_then_its_gate(cases, kind, monkeypatch):
    # float32 at d = 128 does not fit one kernel (pallas_gated.MAX_WEIGHTS): the GRN runs
    # as two row blocks. Forced here at d = 16 by a smaller budget (a gate's two weights
    # fit, a GRN's four do not); the same tolerance as the one-kernel case.
    monkeypatch.setattr(pallas_gated, "MAX_WEIGHTS", 2 * D * D * 4)
    assert pallas_gated.fits("gate", D, jnp.float32)
    assert not pallas_gated.fits("grn", D, jnp.float32)
    params, a, r = cases[kind]
    (v, g), (v_ref, g_ref) = (
        _run(kind, True, params, a, r, False),
        _run(kind, False, params, a, r, False),
    )
    assert abs(float(v) - float(v_ref)) <= 3e-5 * abs(float(v_ref))
    for name, err in leaf_errors(g, g_ref):
        assert err <= 3e-5, (name, err)


def test_row_splits_avoid_padding_where_a_divisor_allows():
    assert row_splits(480, 64) == 60  # TFT-225's 15,360 rows in tiles of 32
    assert row_splits(80, 64) == 40
    assert row_splits(5, 64) == 5  # fewer tiles than splits: one each
    assert row_splits(67, 64) == 64  # a prime: padded to 64 × 2 tiles


def test_bad_widths_and_a_gate_without_its_input_are_refused():
    with pytest.raises(ValueError, match="power of two"):
        pallas_gated.gated_rows(
            {}, jnp.zeros((4, 12)), jnp.zeros((4, 12)), None, 0.0, grn=False, interpret=True
        )
    assert pallas_gated.supported(128, jnp.float32)  # a gate's two weights: 128 KB
    assert not pallas_gated.supported(256, jnp.float32)
    with pytest.raises(ValueError, match="GLU input"):
        pallas_gated.gated_rows({}, jnp.zeros((4, 16)), None, None, 0.0, grn=False, interpret=True)
