"""Symmetric-absolute-value CAViaR: a quantile's own recursion, fitted on the pinball loss.

Engle & Manganelli (2004) model a conditional quantile directly, without a distribution:
``f_t = β₀ + β₁ f_{t-1} + β₂ |r_t|``, the level-``q`` quantile of ``r_{t+1}`` made at ``t``
(the symmetric-absolute-value form: a large move of either sign moves the tails out). Each
level has its own ``β``, fitted by minimising the pinball loss of ``f_t`` against
``r_{t+1}`` over the training rows (a non-convex problem: Nelder-Mead from several starts,
as they do after a random search). The recursion starts at the training rows' empirical
``q``-quantile.

Steps ``h > 1`` need ``|r|`` of bars not yet seen: they use its training mean ``m``,
``f_{T,h} = β₀ + β₁ f_{T,h-1} + β₂ m``, which reverts to the long-run quantile
``(β₀ + β₂ m) / (1 - β₁)``. For a cumulative target, step ``k`` is
``sign(f_{T,1}) √(Σ_{j<=k} f_{T,j}²)`` (the quantile of a sum of independent steps of one
scale family). The levels are fitted apart, so the forecasts are sorted along them
(rearrangement).

Tested against the recursion by hand and on a simulated process whose true quantile is a
SAV recursion (``tests/stats/test_caviar.py``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.optimize import minimize
from scipy.signal import lfilter

from tftjax.stats.memo import by_content

SEARCH = 300
"""Random starting points per level (Engle and Manganelli search 10⁴ before their simplex;
returns on a tick grid make the pinball loss flat in places, where a start on the empirical
quantile alone does not move)."""
KEEP = 3
"""The best starts refined by Nelder-Mead."""
SEED = 0


@dataclasses.dataclass(frozen=True)
class SAV:
    """The fitted ``β [Q, 3]`` of every level, each level's starting quantile ``init [Q]``
    and the training rows' mean ``|r|`` (all in the units of the returns)."""

    beta: np.ndarray
    init: np.ndarray
    mean_abs: float


def recursion(r: np.ndarray, beta: np.ndarray, init: float) -> np.ndarray:
    """``f[t] = β₀ + β₁ f[t-1] + β₂ |r[t]|``, ``f[-1] = init``: the quantile of ``r[t+1]``
    made at ``t``, one linear filter."""
    b0, b1, b2 = (float(x) for x in beta)
    f, _ = lfilter([1.0], [1.0, -b1], b0 + b2 * np.abs(np.asarray(r, np.float64)), zi=[b1 * init])
    return f


def _loss(beta: np.ndarray, x: np.ndarray, q: float, init: float) -> float:
    if not abs(beta[1]) < 1.0:  # a stable recursion only
        return np.inf
    err = x[1:] - recursion(x[:-1], beta, init)
    return float(np.mean(np.maximum(q * err, (q - 1.0) * err)))


@by_content(kept=64)
def fit(r: np.ndarray, quantiles) -> SAV:
    """Each level's ``β`` on the training returns ``r`` (rescaled to unit mean square while
    fitting, so the optimiser's tolerances mean the same on any scale). A repeat of the same
    rows and levels returns the kept fit (:func:`tftjax.stats.memo.by_content`)."""
    r = np.asarray(r, np.float64)
    scale = float(np.sqrt(np.mean(r * r))) or 1.0
    x = r / scale
    m = float(np.mean(np.abs(x)))
    betas, inits = [], []
    rng = np.random.default_rng(SEED)
    for q in np.asarray(quantiles, np.float64):
        qe = float(np.quantile(x, q))
        best = None
        for start in _starts(rng, x, q, qe):
            res = minimize(
                _loss,
                start,
                args=(x, q, qe),
                method="Nelder-Mead",
                options={
                    "xatol": 1e-6,
                    "fatol": 1e-9,
                    "maxiter": 2000,
                    # steps of the search's own size, not 5% of each value
                    "initial_simplex": start + np.vstack([np.zeros(3), 0.1 * np.eye(3)]),
                },
            )
            if best is None or res.fun < best.fun:
                best = res
        assert best is not None
        betas.append(best.x * [scale, 1.0, 1.0])
        inits.append(qe * scale)
    return SAV(np.array(betas), np.array(inits), m * scale)


def _starts(rng: np.random.Generator, x: np.ndarray, q: float, qe: float) -> list[np.ndarray]:
    """The :data:`KEEP` best of :data:`SEARCH` random ``β`` by the pinball loss: ``β₁`` in
    ``[0, 0.99)``, the ``|r|`` term from minus to plus the whole long-run level, ``β₀``
    putting the long run at the empirical quantile ``qe``."""
    m = float(np.mean(np.abs(x)))
    b1 = rng.uniform(0.0, 0.99, SEARCH)
    b2 = rng.uniform(-1.0, 1.0, SEARCH) * (1.0 - b1) * max(abs(qe), m) / m
    cand = np.stack([(1.0 - b1) * qe - b2 * m, b1, b2], axis=1)
    losses = [_loss(c, x, q, qe) for c in cand]
    return [cand[i] for i in np.argsort(losses)[:KEEP]]


def quantiles(
    model: SAV, r: np.ndarray, origins: np.ndarray, horizon: int, *, cumulative: bool = False
) -> np.ndarray:
    """``[N, horizon, Q]`` forecasts at ``origins`` (rows of ``r``, the whole series, each
    level's recursion run from its ``init``), sorted along the levels."""
    origins = np.asarray(origins)
    out = np.empty((origins.size, horizon, model.beta.shape[0]))
    for j, (beta, init) in enumerate(zip(model.beta, model.init)):
        f = recursion(r, beta, init)[origins]
        for h in range(horizon):
            out[:, h, j] = f
            f = beta[0] + beta[1] * f + beta[2] * model.mean_abs
    if cumulative:
        sign = np.sign(out[:, :1, :])
        out = sign * np.sqrt(np.cumsum(out * out, axis=1))
    return np.sort(out, axis=-1)
