"""Training hygiene options against hand computations: the weight-decay mask, the
warm-up + cosine schedule, the LSTM forget-gate bias, non-crossing quantiles and the
volatility-style target."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tftjax.config import TrainConfig, preset
from tftjax.models.layers import LSTM
from tftjax.models.tft import init_params, monotone
from tftjax.training.optimizer import decay_mask, make_optimizer

CFG = preset("tiny")


@pytest.fixture(scope="module")
def params():
    """The TFT's parameter tree, shapes only (no compile)."""
    return jax.eval_shape(lambda k: init_params(CFG, k), jax.random.key(0))


def small_tree():
    """One leaf of every kind the TFT has, with values."""
    rng = np.random.default_rng(0)
    shapes = {
        "dense": {"kernel": (3, 4), "bias": (4,)},
        "norm": {"scale": (4,), "bias": (4,)},
        "lstm": {"w_i": (4, 8), "w_h": (2, 8), "b": (8,)},
        "vsn": {
            "emb_k": (5, 2),
            "emb_b": (5, 2),
            "fc1_k": (5, 2, 2),
            "fc1_b": (5, 2),
            "glu_k": (5, 2, 4),
            "skip_k": (5, 2, 3),
            "ln_scale": (5, 3),
        },
    }
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(size=s), jnp.float32),
        shapes,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def _names(tree):
    return {str(p[-1].key) for p, _ in jax.tree_util.tree_leaves_with_path(tree)}


def test_decay_mask_keeps_norms_biases_and_embeddings_out(params):
    mask = decay_mask(params)
    on = {str(p[-1].key) for p, m in jax.tree_util.tree_leaves_with_path(mask) if m}
    off = _names(params) - on
    assert on == {"kernel", "w_i", "w_h", "fc1_k", "fc2_k", "glu_k", "skip_k"}
    assert {"bias", "scale", "b", "emb_k", "emb_b", "ln_scale", "ln_bias"} <= off


@pytest.mark.parametrize("decay_all", [True, False])
def test_adamw_decays_exactly_the_masked_leaves(decay_all):
    params = small_tree()
    tc = TrainConfig(learning_rate=0.1, weight_decay=0.5, decay_all=decay_all)
    tx = make_optimizer(tc)
    zero = jax.tree.map(jnp.zeros_like, params)
    upd, _ = jax.jit(tx.update)(zero, tx.init(params), params)
    mask = decay_mask(params)
    for (path, u), p, m in zip(
        jax.tree_util.tree_leaves_with_path(upd), jax.tree.leaves(params), jax.tree.leaves(mask)
    ):
        # zero gradient: AdamW's step is -lr * wd * p where decayed, 0 elsewhere
        want = -0.1 * 0.5 * np.asarray(p) if (decay_all or m) else np.zeros_like(p)
        np.testing.assert_allclose(u, want, rtol=1e-6, atol=1e-8, err_msg=str(path))


def test_warmup_cosine_learning_rate_by_hand():
    tc = TrainConfig(
        learning_rate=1.0, weight_decay=0.0, grad_clip=1e9, lr_schedule="cosine", warmup_steps=10
    )
    tx = make_optimizer(tc, total_steps=110)
    p = {"w": jnp.zeros(())}
    state = tx.init(p)
    rates = []
    update = jax.jit(tx.update)
    for _ in range(111):
        # a constant gradient keeps Adam's m/sqrt(v) at 1 (bias-corrected): the update is -lr
        upd, state = update({"w": jnp.ones(())}, state, p)
        rates.append(-float(upd["w"]))
    assert rates[0] == pytest.approx(0.0, abs=1e-6)
    assert rates[5] == pytest.approx(0.5, rel=1e-4)
    assert rates[10] == pytest.approx(1.0, rel=1e-4)
    t = 60  # half-way through the cosine: 0.5 (1 + cos(pi/2)) = 0.5
    assert rates[t] == pytest.approx(0.5 * (1 + np.cos(np.pi * (t - 10) / 100)), rel=1e-3)
    assert rates[110] == pytest.approx(0.0, abs=1e-6)


def test_lstm_forget_gate_bias():
    d = 6
    lstm = LSTM(d, forget_bias=1.0)
    carry = (jnp.zeros((2, d)), jnp.zeros((2, d)))
    b = np.asarray(lstm.init(jax.random.key(0), carry, jnp.zeros((2, 3, 4)))["params"]["b"])
    np.testing.assert_array_equal(b[d : 2 * d], 1.0)  # gates i, f, g, o
    np.testing.assert_array_equal(np.delete(b, np.s_[d : 2 * d]), 0.0)
    # and the TFT builds both of its LSTMs with the configured bias (traced, not compiled)
    seen = {}

    def spy(next_fun, args, kwargs, context):
        if isinstance(context.module, LSTM):
            seen[context.module.name] = context.module.forget_bias
        return next_fun(*args, **kwargs)

    # a value no other test uses: init_params is cached per config, and 1.0 is the default
    with nn.intercept_methods(spy):
        jax.eval_shape(
            lambda k: init_params(CFG.override(lstm_forget_bias=0.75), k), jax.random.key(0)
        )
    assert seen == {"lstm_encoder": 0.75, "lstm_decoder": 0.75}


def test_the_tft_applies_monotone_quantiles_when_asked(monkeypatch):
    import tftjax.models.tft as tft

    calls = []
    real = tft.monotone
    monkeypatch.setattr(tft, "monotone", lambda raw, m: calls.append(m) or real(raw, m))
    for flag in (False, True):
        cfg = CFG.override(monotone_quantiles=flag)
        # the forward pass of the module (init_params would share the plain model's init)
        jax.eval_shape(
            lambda k, c=cfg: tft.TFT(c).init(k, *tft.dummy_inputs(c, 2)), jax.random.key(0)
        )
    assert calls == [CFG.head.quantiles.index(0.5)]


def test_monotone_quantiles_never_cross():
    raw = jax.random.normal(jax.random.key(1), (64, 5, 7)) * 3
    q = np.asarray(monotone(raw, 3))
    assert (np.diff(q, axis=-1) > 0).all()
    np.testing.assert_array_equal(q[..., 3], raw[..., 3])
    sp = np.log1p(np.exp(np.asarray(raw, np.float64)))
    np.testing.assert_allclose(q[..., 4], raw[..., 3] + sp[..., 4], rtol=1e-5)
    np.testing.assert_allclose(
        q[..., 1], raw[..., 3] - sp[..., 2] - sp[..., 1], rtol=1e-5, atol=1e-5
    )


# ------------------------------------------------------------------ volatility-style target
def _ewma_sigma_by_hand(target, lam=0.94):
    """RiskMetrics by hand: v_t = λ v_{t-1} + (1-λ) r_t², v_{-1} = 1; σ_t = max(√v_t, 1e-3)."""
    v, out = 1.0, []
    for r in np.asarray(target, np.float64):
        v = lam * v + (1 - lam) * r * r
        out.append(max(np.sqrt(v), 1e-3))
    return np.asarray(out)


@pytest.fixture(scope="module")
def regime_data():
    """Random features whose targets switch from calm (σ 0.3) to wild (σ 3) half-way."""
    from tftjax.data import FeatureSet, to_device
    from tftjax.data.features import FeatureStats

    n, d = 400, CFG.data.decoder_steps
    rng = np.random.default_rng(5)
    target = (rng.normal(size=n) * np.where(np.arange(n) < n // 2, 0.3, 3.0)).astype(np.float32)
    known = rng.normal(size=(n, 10)).astype(np.float32)
    future = known[np.minimum(np.arange(n)[:, None] + 1 + np.arange(d), n - 1)]
    stats = FeatureStats(np.zeros(210), np.ones(210), 1.0, np.zeros(5), (0, n))
    fs = FeatureSet(
        rng.normal(size=(n, 210)).astype(np.float32),
        known,
        future,
        np.zeros(5, np.float32),
        target,
        stats,
    )
    return fs, to_device(fs)


def test_window_scale_is_the_ewma_volatility_at_the_forecast_time(regime_data):
    from tftjax.data import gather

    fs, data = regime_data
    sigma = _ewma_sigma_by_hand(fs.target)
    np.testing.assert_allclose(data.scale, sigma, rtol=1e-6)
    starts = np.array([0, 150, 190, 300, 370], np.int32)
    e = CFG.data.encoder_steps
    batch = gather(data, jnp.asarray(starts), e, CFG.data.decoder_steps)
    np.testing.assert_allclose(batch.scale, sigma[starts + e - 1], rtol=1e-6)
    assert sigma[370] > 5 * sigma[150]  # the regimes differ: the scale follows them
    # causal: rewriting every target after a window's forecast time leaves its scale
    from tftjax.stats.baselines import ewma_scale

    t = 150 + e - 1
    later = fs.target.copy()
    later[t + 1 :] *= 10
    np.testing.assert_array_equal(ewma_scale(later)[: t + 1], ewma_scale(fs.target)[: t + 1])


def test_vol_target_loss_is_the_pinball_of_scaled_outputs(regime_data):
    from tftjax.data import gather
    from tftjax.training.steps import _loss_fn

    _, data = regime_data
    starts = jnp.asarray([10, 120, 250, 330], jnp.int32)
    batch = gather(data, starts, CFG.data.encoder_steps, CFG.data.decoder_steps)
    qs = np.asarray(CFG.head.quantiles, np.float32)
    raw = (
        np.random.default_rng(2)
        .normal(size=(4, CFG.data.decoder_steps, qs.size))
        .astype(np.float32)
    )
    fake_apply = lambda v, *a, **k: ((jnp.asarray(raw), None), {})
    mask = jnp.asarray([True, True, True, False])
    y, s = np.asarray(batch.target, np.float64), np.asarray(batch.scale, np.float64)
    for vol in (False, True):
        loss, _ = _loss_fn(
            {}, {}, fake_apply, batch, mask, qs, None, cfg=CFG.override(vol_target=vol)
        )
        pred = raw * (s[:, None, None] if vol else 1.0)
        err = y[..., None] - pred
        want = np.maximum(qs * err, (qs - 1) * err).mean(axis=(1, 2))[:3].mean()
        np.testing.assert_allclose(float(loss), want, rtol=1e-5)


def test_vol_target_eval_forecasts_are_raw_outputs_times_scale(regime_data):
    from tftjax.training import make_eval_step

    fs, data = regime_data
    variables = {"params": init_params(CFG, jax.random.key(3))}
    idx = jnp.asarray([5, 160, 240, 320], jnp.int32)
    _, plain, _ = make_eval_step(CFG)(variables, data, idx)
    _, scaled, _ = make_eval_step(CFG.override(vol_target=True))(variables, data, idx)
    sigma = _ewma_sigma_by_hand(fs.target)[np.asarray(idx) + CFG.data.encoder_steps - 1]
    np.testing.assert_allclose(
        scaled, np.asarray(plain) * sigma[:, None, None], rtol=1e-5, atol=1e-7
    )


def test_eval_forecasts_are_rearranged_and_never_lose_to_the_crossing_ones(regime_data):
    # an untrained network's quantiles cross; the eval step (every table, backtest, predict
    # and API forecast) sorts them: the same values per window and step, in order
    from tftjax.data import gather
    from tftjax.models.tft import apply_fn
    from tftjax.training import make_eval_step

    fs, data = regime_data
    cfg = CFG.override(matmul_precision="highest")  # float32 matmuls on a GPU too (not TF32)
    variables = {"params": init_params(cfg, jax.random.key(3))}
    idx = jnp.asarray([5, 160, 240, 320], jnp.int32)
    _, pred, _ = make_eval_step(cfg)(variables, data, idx)
    batch = gather(data, idx, cfg.data.encoder_steps, cfg.data.decoder_steps)
    with jax.default_matmul_precision("highest"):
        raw, _ = apply_fn(cfg)(
            variables, batch.static, batch.historical, batch.known, True, batch.instrument
        )
    raw = np.asarray(raw, np.float64)  # op by op, unsorted: the reference
    assert (np.diff(raw, axis=-1) < 0).any()  # it crosses: the test can fail
    pred = np.asarray(pred, np.float64)
    assert (np.diff(pred, axis=-1) >= 0).all()
    # float32 forwards, jitted and op by op: 1e-5 relative (the vol-target test's bound)
    np.testing.assert_allclose(pred, np.sort(raw, axis=-1), rtol=1e-5, atol=1e-6)
    # the pinball loss's cross-difference in (level, value) is decreasing, so the sorted
    # assignment of values to levels is never worse, for every target (the rearrangement
    # inequality): the sum over levels per window and step, in numpy
    qs = np.asarray(CFG.head.quantiles, np.float64)
    y = np.asarray(batch.target, np.float64)[..., None]

    def loss(p):
        err = y - p
        return np.maximum(qs * err, (qs - 1) * err).sum(axis=-1)

    assert (loss(pred) <= loss(raw) + 1e-5).all()
