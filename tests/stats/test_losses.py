"""Pinball loss, q-risk and baselines against hand computations."""

import jax.numpy as jnp
import numpy as np
import pytest

from tftjax.stats import losses

QS = (0.1, 0.5, 0.9)


def test_pinball_by_hand():
    y = np.array([[1.0, -2.0]])
    pred = np.array([[[0.0, 0.0, 0.0], [0.0, -1.0, 1.0]]])
    got = np.asarray(losses.pinball(jnp.asarray(y), jnp.asarray(pred), QS))
    # y - ŷ: row 0: 1, 1, 1 → q·1; row 1: -2, -1, -3 → (q-1)·err
    want = [[[0.1, 0.5, 0.9], [0.9 * 2, 0.5 * 1, 0.1 * 3]]]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_masked_mean_and_qrisk():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(6, 4))
    pred = rng.normal(size=(6, 4, 3))
    mask = np.array([1, 1, 1, 1, 0, 0], bool)
    loss = float(losses.quantile_loss(jnp.asarray(y), jnp.asarray(pred), QS, jnp.asarray(mask)))
    err = y[:4, :, None] - pred[:4]
    q = np.array(QS)
    ql = np.maximum(q * err, (q - 1) * err)
    assert loss == pytest.approx(ql.mean(), rel=1e-5)
    m = losses.finalize(
        losses.metric_sums(jnp.asarray(y), jnp.asarray(pred), QS, jnp.asarray(mask))
    )
    assert m["loss"] == pytest.approx(ql.mean(), rel=1e-5)
    assert m["q_risk_50"] == pytest.approx(2 * ql[..., 1].sum() / np.abs(y[:4]).sum(), rel=1e-5)
    assert m["q_risk_90"] == pytest.approx(2 * ql[..., 2].sum() / np.abs(y[:4]).sum(), rel=1e-5)


def test_coverage_and_numpy_metrics_by_hand():
    y = np.array([[0.0, 2.0], [-1.0, 0.5]])
    pred = np.array([[[-1, 0, 1], [-1, 0, 1]], [[-0.5, 0, 0.5], [-0.5, 0, 0.5]]], float)
    # inside [q10, q90]: 0 yes, 2 no, -1 no, 0.5 yes (edges count) → 2 of 4
    m = losses.numpy_metrics(y, pred, QS)
    assert m["coverage_80"] == pytest.approx(0.5)
    j = losses.finalize(
        losses.metric_sums(jnp.asarray(y), jnp.asarray(pred), QS, jnp.ones(2, bool))
    )
    for k in ("loss", "q_risk_50", "q_risk_90", "coverage_80"):
        assert j[k] == pytest.approx(m[k], rel=1e-6)
    # zero forecast: P50 pinball is |y|/2, so q-risk P50 is exactly 1
    zero = losses.numpy_metrics(y, np.zeros_like(pred), QS)
    assert zero["q_risk_50"] == pytest.approx(1.0)
    no10 = losses.numpy_metrics(y, pred[..., 1:], (0.5, 0.9))
    assert np.isnan(no10["coverage_80"])


def test_qrisk_needs_the_quantiles():
    with pytest.raises(ValueError, match="must include 0.9"):
        losses.metric_sums(jnp.ones((1, 2)), jnp.ones((1, 2, 2)), (0.1, 0.5), jnp.ones(1, bool))
