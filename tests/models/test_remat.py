"""Remat tiers: same loss and same gradients as ``off`` for every leaf; no frozen layers."""

import jax
import numpy as np
import pytest
from conftest import random_inputs

from tftjax.config import preset
from tftjax.models import remat
from tftjax.models.tft import TFT, init_params
from tftjax.stats import losses

# "gpu:…": the GPU's plan of the tier (tftjax.models.remat.GPU_PLANS: the VSNs in checkpointed
# chunks of batched matmuls), traced and checked here on the CPU
# "pallas:…": the VSNs, LSTMs, GRNs and gates through the Pallas kernels (models.pallas_vsn,
# pallas_lstm, pallas_grn, pallas_gated), interpreted
TIERS = [
    "minimal",
    "aggressive",
    "full",
    "offload",
    "pallas:off",
    *(
        pytest.param(t, marks=pytest.mark.slow)  # the full tier: same mechanisms, GPU plans
        for t in ("gpu:minimal", "gpu:aggressive", "gpu:full")
    ),
]
B = 4


def config(tier):
    # vsn_chunk=3 chunks every VSN with padding (5 → 2×3, 10 → 4×3, 220 → 74×3).
    platform, _, tier = tier.rpartition(":")
    if platform == "pallas":
        return preset(
            "tiny",
            remat=tier,
            vsn_chunk=3,
            vsn_kernel="pallas",
            lstm_kernel="pallas",
            grn_kernel="pallas",
            attention_kernel="pallas",
        )
    return preset("tiny", remat=tier, vsn_chunk=3, platform=platform or None)


@pytest.fixture(scope="module", autouse=True)
def highest():
    # equality at full float32 on every backend (NVIDIA GPUs default to TF32 matmuls)
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture(scope="module")
def inputs():
    return random_inputs(config("off"), B)


def loss_and_grads(tier, params, inputs):
    cfg = config(tier)
    s, h, k, y = inputs

    def loss(p):
        pred, _ = TFT(cfg).apply(
            {"params": p}, s, h, k, False, rngs={"dropout": jax.random.key(7, impl="rbg")}
        )
        return losses.quantile_loss(y, pred, cfg.head.quantiles)

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.fixture(scope="module")
def reference(inputs):
    cfg = config("off")
    params = init_params(cfg, jax.random.key(1))  # the library's init (compiled once)
    loss, grads = loss_and_grads("off", params, inputs)
    return params, float(loss), grads


@pytest.mark.slow  # every tier's gradients (remat_reference, with the slow tier's GPU plans)
@pytest.mark.xdist_group("remat_reference")
@pytest.mark.parametrize("tier", TIERS)
def test_tier_gradients_equal_off_for_every_leaf(tier, inputs, reference):
    params, ref_loss, ref_grads = reference
    loss, grads = loss_and_grads(tier, params, inputs)
    assert float(loss) == pytest.approx(ref_loss, rel=1e-6)
    flat_ref = jax.tree_util.tree_flatten_with_path(ref_grads)[0]
    flat = dict(jax.tree_util.tree_flatten_with_path(grads)[0])
    assert len(flat) == len(flat_ref)
    # Relative 1e-5 per leaf, with a floor at 1e-6 of the largest gradient anywhere
    # (leaves whose gradient is tiny carry only rounding noise).
    floor = 1e-6 * max(np.abs(np.asarray(g)).max() for _, g in flat_ref)
    for path, g_ref in flat_ref:
        g = np.asarray(flat[path])
        g_ref = np.asarray(g_ref)
        name = jax.tree_util.keystr(path)
        assert np.any(g != 0), f"{tier}: gradient of {name} is all zero (frozen layer)"
        scale = np.abs(g_ref).max()
        assert np.abs(g - g_ref).max() <= max(1e-5 * scale, floor), f"{tier}: {name}"


@pytest.mark.gpu  # on CPU the default is float32's full precision: test_tier_gradients' own
@pytest.mark.xdist_group("remat_reference")
def test_tier_gradients_at_the_default_matmul_precision(inputs, reference):
    # the backend's default (TF32 on NVIDIA GPUs): the float32 tolerance scaled by the
    # mantissa bits the default gives up (conftest.matmul_mantissa_bits); run by the GPU
    # check's tests row (experiments/gpu_check.py)
    from conftest import matmul_mantissa_bits

    params, ref_loss, ref_grads = reference
    rtol = 1e-5 * 2.0 ** (24 - matmul_mantissa_bits())
    with jax.default_matmul_precision("default"):
        loss, grads = loss_and_grads("aggressive", params, inputs)
    assert float(loss) == pytest.approx(ref_loss, rel=rtol)
    flat = dict(jax.tree_util.tree_flatten_with_path(grads)[0])
    for path, g_ref in jax.tree_util.tree_flatten_with_path(ref_grads)[0]:
        g_ref = np.asarray(g_ref)
        assert np.abs(np.asarray(flat[path]) - g_ref).max() <= rtol * np.abs(g_ref).max() + 1e-30, (
            jax.tree_util.keystr(path)
        )


@pytest.mark.slow  # every tier's gradients (remat_reference, with the slow tier's GPU plans)
@pytest.mark.xdist_group("remat_reference")
def test_off_gradients_reach_every_leaf(reference):
    _, _, grads = reference
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        assert np.any(np.asarray(g) != 0), jax.tree_util.keystr(path)


def test_unknown_tier_lists_the_tiers():
    with pytest.raises(
        ValueError, match="choose one of: off, minimal, aggressive, full, offload, fastest, auto"
    ):
        remat.plan("sideways")


def test_offload_on_cpu_says_it_is_aggressive():
    p = remat.plan("offload", backend="cpu")
    assert "behaves exactly like 'aggressive'" in p.note
    a = remat.plan("aggressive")
    assert (p.lstm, p.encoders, p.attention, p.vsn, p.vsn_scan, p.policy) == (
        a.lstm,
        a.encoders,
        a.attention,
        a.vsn,
        a.vsn_scan,
        a.policy,
    )
    assert remat.plan("offload", backend="gpu").note == ""


def test_tier_order_is_documented():
    assert remat.ORDER == ("off", "minimal", "aggressive", "full")
    assert [remat.plan(t).vsn for t in remat.ORDER] == [False, False, False, True]
    # aggressive keeps every VSN residual (no recompute), only chunks the computation.
    assert remat.plan("aggressive").vsn_scan and not remat.plan("aggressive").vsn


# What each tier saves for the backward pass, read from the jaxpr of its VJP (the data of
# jax.ad_checkpoint.print_saved_residuals). Equal gradients alone cannot tell a tier from a
# no-op; these counts can: a tier that checkpointed nothing would save what `off` saves.
def saved_shapes(tier, params, inputs):
    from collections import Counter

    from jax._src.ad_checkpoint import saved_residuals

    cfg = config(tier)
    s, h, k, y = inputs

    def loss(p):
        pred, _ = TFT(cfg).apply(
            {"params": p}, s, h, k, False, rngs={"dropout": jax.random.key(7, impl="rbg")}
        )
        return losses.quantile_loss(y, pred, cfg.head.quantiles)

    return Counter(
        tuple(a.shape)
        for a, src in saved_residuals(loss, params)
        if not src.startswith("from the argument")
    )


@pytest.mark.slow  # every tier's gradients (remat_reference, with the slow tier's GPU plans)
@pytest.mark.xdist_group("remat_reference")
@pytest.mark.parametrize("tier", remat.ORDER)
def test_tier_saves_what_it_says(tier, inputs, reference):
    cfg = config(tier)
    te, td, d, m = (
        cfg.data.encoder_steps,
        cfg.data.decoder_steps,
        cfg.model.hidden,
        cfg.model.num_historical + cfg.model.num_known,
    )
    shapes = saved_shapes(tier, reference[0], inputs)
    per_step_lstm = shapes[(te, B, d)]  # gates/activations stacked over encoder steps
    attention_weights = shapes[(B, cfg.model.heads, td, te + td)]
    static_contexts = shapes[(B, d)]  # inside the four static encoder GRNs
    vsn_per_variable = sum(n for s, n in shapes.items() if np.prod(s) >= m * B * te * d)
    p = remat.plan(tier)
    # LSTM: every tier runs the recurrence with its hand-written backward pass, which keeps
    # its (time-major) inputs, cell states and outputs ([T, B, d] each; autodiff kept 8 or
    # more), and the gates ([T, B, 4d]) unless the tier rematerialises the LSTM.
    assert per_step_lstm <= 3, (tier, per_step_lstm)
    assert (shapes[(te, B, 4 * d)] == 0) == p.lstm, (tier, shapes[(te, B, 4 * d)])
    # Attention and the encoder GRNs: nothing of theirs survives when rematerialised.
    assert (attention_weights == 0) == p.attention, (tier, attention_weights)
    # (the two LSTMs keep their initial states, c and h, four [B, d] residuals: the
    # recurrence's backward pass needs them)
    assert (static_contexts <= 1 + 4) == p.encoders, (tier, static_contexts)
    assert (static_contexts >= 20) == (not p.encoders), (tier, static_contexts)
    # VSN: full keeps no [m, N, d] activation of the per-variable GRNs; the others keep several.
    assert (vsn_per_variable == 0) == p.vsn, (tier, vsn_per_variable)
    assert (vsn_per_variable >= 5) == (not p.vsn), (tier, vsn_per_variable)


@pytest.mark.slow  # every tier's gradients (remat_reference, with the slow tier's GPU plans)
@pytest.mark.xdist_group("remat_reference")
def test_tiers_save_less_and_less(inputs, reference):
    sizes = [
        sum(int(np.prod(s)) * n for s, n in saved_shapes(t, reference[0], inputs).items())
        for t in remat.ORDER
    ]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes), sizes
    assert sizes[-1] < sizes[0] / 4, sizes


@pytest.mark.slow  # every tier's gradients (remat_reference, with the slow tier's GPU plans)
@pytest.mark.xdist_group("remat_reference")
def test_offload_moves_the_vsn_chunk_residuals_on_a_device_with_host_memory(inputs, reference):
    p = remat.plan("offload", backend="gpu")
    assert p.vsn_scan and not p.vsn and p.note == ""
    # The per-variable GRN's big intermediates carry the names the offload policy moves.
    assert {"vsn_glu", "vsn_y"} <= set(remat.OFFLOAD_NAMES)
    cfg = config("aggressive")
    s, h, k, _ = inputs
    jaxpr = str(jax.make_jaxpr(lambda prm: TFT(cfg).apply({"params": prm}, s, h, k))(reference[0]))
    for name in ("vsn_glu", "vsn_y", "lstm_gates", "attention_weights", "grn_hidden"):
        assert f"name={name}" in jaxpr, name
