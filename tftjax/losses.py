"""Quantile (pinball) loss, q-risk and naive baselines.

``QL(y, ŷ, q) = max(q (y − ŷ), (q − 1)(y − ŷ))``; the training loss is its
mean over batch, horizon and quantiles (pytorch-forecasting's
``QuantileLoss`` is twice this). q-risk (the TFT paper's metric) is
``R_q = 2 Σ QL(y, ŷ_q, q) / Σ |y|`` over all windows and horizons.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def pinball(y: Array, pred: Array, quantiles: Array) -> Array:
    """Per-element pinball loss: ``y [..., T]``, ``pred [..., T, Q]`` → ``[..., T, Q]``."""
    err = y[..., None] - pred
    q = jnp.asarray(quantiles, pred.dtype)
    return jnp.maximum(q * err, (q - 1.0) * err)


def quantile_loss(y: Array, pred: Array, quantiles, mask: Array | None = None) -> Array:
    """Mean pinball loss over batch, horizon and quantiles; ``mask [B]`` drops padded rows."""
    per_row = pinball(y, pred, quantiles).mean(axis=(-2, -1))  # [B]
    if mask is None:
        return per_row.mean()
    m = mask.astype(per_row.dtype)
    return jnp.sum(per_row * m) / jnp.maximum(m.sum(), 1.0)


class MetricSums(NamedTuple):
    """Additive sums over batches; :func:`finalize` turns them into metrics."""

    loss: Array  # Σ mean-over-(T, Q) pinball, per valid row
    count: Array  # valid rows
    ql50: Array  # Σ QL at q = 0.5 (all horizons)
    ql90: Array  # Σ QL at q = 0.9
    abs_y: Array  # Σ |y|


def metric_sums(y: Array, pred: Array, quantiles, mask: Array) -> MetricSums:
    """Sums for loss and q-risk at P50/P90 (quantiles must include 0.5 and 0.9)."""
    qs = np.asarray(quantiles)
    i50, i90 = _index(qs, 0.5), _index(qs, 0.9)
    ql = pinball(y, pred, qs)  # [B, T, Q]
    m = mask.astype(ql.dtype)
    return MetricSums(
        loss=jnp.sum(ql.mean(axis=(-2, -1)) * m),
        count=m.sum(),
        ql50=jnp.sum(ql[..., i50].sum(-1) * m),
        ql90=jnp.sum(ql[..., i90].sum(-1) * m),
        abs_y=jnp.sum(jnp.abs(y).sum(-1) * m),
    )


def _index(qs: np.ndarray, q: float) -> int:
    hits = np.flatnonzero(np.isclose(qs, q))
    if hits.size == 0:
        raise ValueError(f"quantiles {tuple(qs)} must include {q} for q-risk")
    return int(hits[0])


def add(a: MetricSums, b: MetricSums) -> MetricSums:
    return MetricSums(*(x + y for x, y in zip(a, b)))


def finalize(s: MetricSums) -> dict[str, float]:
    s = jax.device_get(s)
    count, abs_y = float(s.count), float(s.abs_y)
    return {
        "loss": float(s.loss) / max(count, 1.0),
        "q_risk_50": 2.0 * float(s.ql50) / max(abs_y, 1e-12),
        "q_risk_90": 2.0 * float(s.ql90) / max(abs_y, 1e-12),
    }


def baseline_metrics(y: np.ndarray, quantiles, constant: np.ndarray) -> dict[str, float]:
    """Metrics of a constant forecast ``constant [Q]`` on targets ``y [N, T]``."""
    pred = np.broadcast_to(np.asarray(constant, np.float64), y.shape + (len(quantiles),))
    return finalize(metric_sums(jnp.asarray(y), jnp.asarray(pred), quantiles,
                                jnp.ones(y.shape[0], bool)))


def naive_baselines(train_targets: np.ndarray, y: np.ndarray, quantiles) -> dict[str, dict]:
    """The two naive forecasts on targets ``y``: zero return, train empirical quantiles."""
    qs = np.asarray(quantiles)
    return {
        "zero": baseline_metrics(y, qs, np.zeros(len(qs))),
        "train_quantiles": baseline_metrics(y, qs, np.quantile(train_targets, qs)),
    }
