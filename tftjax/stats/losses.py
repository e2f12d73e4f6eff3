"""Quantile (pinball) loss, q-risk and naive baselines.

``QL(y, ŷ, q) = max(q (y − ŷ), (q − 1)(y − ŷ))``; the training loss is its
mean over batch, horizon and quantiles (pytorch-forecasting's
``QuantileLoss`` is twice this). q-risk (the TFT paper's metric) is
``R_q = 2 Σ QL(y, ŷ_q, q) / Σ |y|`` over all windows and horizons. Coverage
is the share of targets inside the 10–90% band ``[ŷ_0.1, ŷ_0.9]`` (0.8 when the
quantiles are calibrated; NaN when the quantiles lack 0.1 or 0.9).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def pinball(y: Array, pred: Array, quantiles: Array) -> Array:
    """Per-element pinball loss: ``y [..., T]``, ``pred [..., T, Q]`` → ``[..., T, Q]``."""
    err = y[..., None] - pred
    q = jnp.asarray(quantiles, pred.dtype)
    return jnp.maximum(q * err, (q - 1.0) * err)


def observed(y: Array) -> tuple[Array, Array]:
    """``(y, ok)``: targets with the missing ones (NaN: no bar in the step's calendar slot)
    set to 0, and the mask of the observed ones."""
    ok = jnp.isfinite(y)
    return jnp.where(ok, y, 0.0), ok


def quantile_loss(
    y: Array, pred: Array, quantiles, mask: Array | None = None, denom: Array | None = None
) -> Array:
    """Mean pinball loss over batch, horizon and quantiles; ``mask [B]`` drops padded rows,
    and a missing target (NaN) adds nothing (a window's loss is its observed steps' sum over
    ``T``: every step weighs alike). ``denom``: divide the masked sum by this instead of the
    valid rows of this batch (the valid rows of the whole batch when this is one micro-batch
    of it)."""
    y, ok = observed(y)
    per_step = pinball(y, pred, quantiles).mean(axis=-1)  # [B, T]
    per_row = jnp.where(ok, per_step, 0.0).sum(axis=-1) / y.shape[-1]  # [B]
    if mask is None:
        return per_row.mean()
    m = mask.astype(per_row.dtype)
    return jnp.sum(per_row * m) / (jnp.maximum(m.sum(), 1.0) if denom is None else denom)


class MetricSums(NamedTuple):
    """Additive sums over batches; :func:`finalize` turns them into metrics. Device arrays
    from the eval step, or numpy floats from :func:`numpy_metrics`."""

    loss: Any  # Σ mean-over-(T, Q) pinball, per valid row
    count: Any  # valid rows
    ql50: Any  # Σ QL at q = 0.5 (all horizons)
    ql90: Any  # Σ QL at q = 0.9
    abs_y: Any  # Σ |y|
    inside: Any  # Σ [ŷ_0.1 <= y <= ŷ_0.9] (all horizons)
    points: Any  # Σ valid (row, horizon) points


def metric_sums(y: Array, pred: Array, quantiles, mask: Array) -> MetricSums:
    """Sums for loss and q-risk at P50/P90 (quantiles must include 0.5 and 0.9)."""
    qs = np.asarray(quantiles)
    i50, i90 = _index(qs, 0.5), _index(qs, 0.9)
    y, ok = observed(y)
    okf = ok.astype(pred.dtype)
    ql = pinball(y, pred, jnp.asarray(qs)) * okf[..., None]  # [B, T, Q], 0 at missing targets
    m = mask.astype(ql.dtype)
    hits = np.flatnonzero(np.isclose(qs, 0.1))
    if hits.size:
        inside = ((y >= pred[..., int(hits[0])]) & (y <= pred[..., i90])).astype(ql.dtype)
        inside = jnp.sum((inside * okf).sum(-1) * m)
    else:
        inside = jnp.asarray(jnp.nan, ql.dtype)
    return MetricSums(
        loss=jnp.sum(ql.mean(axis=-1).sum(axis=-1) / y.shape[-1] * m),
        count=m.sum(),
        ql50=jnp.sum(ql[..., i50].sum(-1) * m),
        ql90=jnp.sum(ql[..., i90].sum(-1) * m),
        abs_y=jnp.sum(jnp.abs(y).sum(-1) * m),
        inside=inside,
        points=jnp.sum(okf.sum(-1) * m),
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
        "coverage_80": float(s.inside) / max(float(s.points), 1.0),
    }


def numpy_metrics(y: np.ndarray, pred: np.ndarray, quantiles) -> dict[str, float]:
    """Metrics of forecasts ``pred [N, T, Q]`` on targets ``y [N, T]`` (host numpy, float64)."""
    return finalize(numpy_sums(y, pred, quantiles))


def numpy_sums(y: np.ndarray, pred: np.ndarray, quantiles) -> MetricSums:
    """:func:`metric_sums` in float64 numpy (for baselines and bootstraps)."""
    qs = np.asarray(quantiles, np.float64)
    y, pred = np.asarray(y, np.float64), np.asarray(pred, np.float64)
    ok = np.isfinite(y)  # missing targets (NaN) count nowhere
    y = np.where(ok, y, 0.0)
    err = y[..., None] - pred
    ql = np.maximum(qs * err, (qs - 1.0) * err) * ok[..., None]
    i50, i90 = _index(qs, 0.5), _index(qs, 0.9)
    hits = np.flatnonzero(np.isclose(qs, 0.1))
    inside = (
        np.sum((y >= pred[..., int(hits[0])]) & (y <= pred[..., i90]) & ok) if hits.size else np.nan
    )
    return MetricSums(
        loss=ql.mean(axis=-1).sum() / y.shape[-1],
        count=float(y.shape[0]),
        ql50=ql[..., i50].sum(),
        ql90=ql[..., i90].sum(),
        abs_y=np.abs(y).sum(),
        inside=inside,
        points=float(ok.sum()),
    )
