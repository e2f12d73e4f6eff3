"""TFT model: shapes, exact parameter count, selection weights, decoder causality."""

import jax
import numpy as np
import pytest

from tftjax.config import preset
from tftjax.models.tft import TFT, causal_mask, dummy_inputs, init_params

CFG = preset("tiny")
B = 3


def dense(i, o, bias=True):
    return i * o + (o if bias else 0)


def grn(i, h, o, ctx=None):
    n = dense(i, h) + dense(h, h) + dense(h, 2 * o) + 2 * o  # fc2, fc1, GLU, LayerNorm
    n += dense(ctx, h, bias=False) if ctx else 0
    n += dense(i, o) if i != o else 0  # skip projection
    return n


def vsn(m, dv, d, ctx=None):
    per_var = 2 * dv + grn(dv, dv, d)  # Linear(1 → d_v) and GRN(d_v, d_v, d)
    return m * per_var + grn(m * dv, min(d, m), m, ctx)


def expected_params(c):
    d, dv, H = c.model.hidden, c.model.d_v, c.model.heads
    dh = d // H
    gan = dense(d, 2 * d) + 2 * d
    lstm = 8 * d * d + 4 * d
    return (
        vsn(c.model.num_static, dv, d)
        + 4 * grn(d, d, d)  # static encoders c_s, c_e, c_h, c_c
        + vsn(c.model.num_historical + c.model.num_known, dv, d, ctx=d)
        + vsn(c.model.num_known, dv, d, ctx=d)
        + 2 * lstm
        + gan  # gated skip over the LSTM
        + grn(d, d, d, ctx=d)  # static enrichment
        + dense(d, H * dh)
        + dense(d, H * dh, bias=False)  # attention: Q, K (no bias)
        + dense(d, dh)
        + dense(dh, d)  # shared V, output
        + gan
        + grn(d, d, d)
        + gan  # attention gate, position-wise GRN, output gate
        + dense(d, len(c.head.quantiles))
    )


def count(cfg):
    shapes = jax.eval_shape(lambda: TFT(cfg).init(jax.random.key(0), *dummy_inputs(cfg, 2)))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes["params"]))


@pytest.mark.parametrize("name", ["tiny", "tft225"])
def test_parameter_count_matches_hand_formula(name):
    cfg = preset(name)
    assert count(cfg) == expected_params(cfg)


def test_tiny_parameter_count_value():
    assert count(CFG) == 306_991


@pytest.fixture(scope="module")
def model():
    cfg = CFG
    key = jax.random.key(0)
    params = init_params(cfg, key)  # the library's (jitted, cached) init
    apply = jax.jit(lambda p, s, h, k: TFT(cfg).apply({"params": p}, s, h, k, True))
    return params, apply


@pytest.mark.xdist_group("model_model")
def test_settings_that_do_not_touch_the_parameters_share_one_init(model):
    # init_variables serves every model that differs only in INIT_NEUTRAL_FIELDS from one
    # compiled init: a direct init of such a model must give exactly those values.
    import dataclasses

    variant = CFG.override(
        remat="full",
        vsn_chunk=3,
        dropout=0.3,
        monotone_quantiles=True,
        vol_target=True,
        winsorize=0.0,
        target_clip=5.0,
        bar_interval="1min",
        timezone="UTC",
        calendar="24/7",
        precision="bf16",
        matmul_precision="highest",
        platform="gpu",
        instrument_dropout=0.3,
        target="cumulative",
        anchor_median="zero",
        anchor_loss="vol",
        max_ffill=3,
        max_categories=20,
        season=24,
    )
    from tftjax.config import SECTIONS
    from tftjax.config.fields import is_neutral

    def fields(cfg):
        return {
            (part, f.name): getattr(getattr(cfg, part), f.name)
            for part, cls in SECTIONS.items()
            for f in dataclasses.fields(cls)
        }

    a, b = fields(CFG), fields(variant)
    neutral = {
        (part, f.name)
        for part, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if part == "execution" or is_neutral(f)
    }
    assert {k for k in a if a[k] != b[k]} == neutral - {
        ("quant", "qat_freeze_after"),
        ("quant", "act_symmetric"),  # (those need --qat)
        ("quant", "weight_granularity"),
        ("quant", "stacked_scales"),
        # compiled Pallas kernels at platform gpu need a GPU (the interpreted ones train from
        # off's init in test_remat); a memory budget is for --remat auto only
        ("execution", "kernels"),
        ("execution", "kernels_exclude"),
        ("execution", "memory_budget"),
        ("data", "static_file"),  # needs --static, which adds inputs
    }
    assert variant.init_key() == CFG.init_key()
    direct = jax.jit(TFT(variant).init)(jax.random.key(0), *dummy_inputs(variant, 2))["params"]
    shared = init_params(variant, jax.random.key(0))
    assert jax.tree.structure(direct) == jax.tree.structure(shared)
    for a, b in zip(jax.tree.leaves(direct), jax.tree.leaves(shared)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(model[0]), jax.tree.leaves(shared)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def random_inputs(seed):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    t = CFG.data.encoder_steps + CFG.data.decoder_steps
    return (
        jax.random.normal(k1, (B, CFG.model.num_static)),
        jax.random.normal(k2, (B, CFG.data.encoder_steps, CFG.model.num_historical)),
        jax.random.normal(k3, (B, t, CFG.model.num_known)),
    )


@pytest.mark.xdist_group("model_model")
def test_output_shapes_and_weights_sum_to_one(model):
    params, apply = model
    pred, interp = apply(params, *random_inputs(1))
    te, td = CFG.data.encoder_steps, CFG.data.decoder_steps
    assert pred.shape == (B, td, len(CFG.head.quantiles))
    assert interp.static_weights.shape == (B, CFG.model.num_static)
    assert interp.historical_weights.shape == (
        B,
        te,
        CFG.model.num_historical + CFG.model.num_known,
    )
    assert interp.future_weights.shape == (B, td, CFG.model.num_known)
    assert interp.attention.shape == (B, td, te + td)
    for w in (
        interp.static_weights,
        interp.historical_weights,
        interp.future_weights,
        interp.attention,
    ):
        np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, rtol=1e-5)
        assert np.all(np.asarray(w) >= 0)
    assert np.isfinite(np.asarray(pred)).all()


@pytest.mark.xdist_group("model_model")
def test_attention_is_causal(model):
    params, apply = model
    _, interp = apply(params, *random_inputs(2))
    att = np.asarray(interp.attention)
    te = CFG.data.encoder_steps
    for k in range(CFG.data.decoder_steps):
        assert np.all(att[:, k, te + k + 1 :] == 0.0)
        assert np.all(att[:, k, : te + k + 1] > 0.0)


def test_causal_mask_by_hand():
    m = np.asarray(causal_mask(2, 3))
    np.testing.assert_array_equal(m, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])


@pytest.mark.xdist_group("model_model")
@pytest.mark.parametrize("k", [0, 2])
def test_changing_future_inputs_after_step_k_leaves_predictions_up_to_k(model, k):
    params, apply = model
    s, h, z = random_inputs(3)
    te = CFG.data.encoder_steps
    z2 = z.at[:, te + k + 1 :, :].add(
        5.0 * jax.random.normal(jax.random.key(9), z[:, te + k + 1 :].shape)
    )
    a, _ = apply(params, s, h, z)
    b, _ = apply(params, s, h, z2)
    np.testing.assert_array_equal(np.asarray(a[:, : k + 1]), np.asarray(b[:, : k + 1]))
    assert not np.allclose(np.asarray(a[:, k + 1 :]), np.asarray(b[:, k + 1 :]))
