"""GJR-GARCH(1,1) with filtered historical simulation: a volatility baseline with leverage.

The model of the one-bar return ``r_t`` (zero mean, in target units):
``σ²_t = ω + (α + γ·1[r_{t-1} < 0]) r²_{t-1} + β σ²_{t-1}`` (Glosten, Jagannathan & Runkle
1993), fitted by Gaussian quasi-maximum likelihood on the training rows (:func:`fit`). Its
quantile forecasts are **filtered historical simulation** (Barone-Adesi et al. 1999): the
standardised residuals ``r_t / σ_t`` of the training rows are resampled into paths that run
the GJR recursion forward from the origin, so that the asymmetry reaches steps 2 and on
(:func:`fhs_quantiles`); step 1 is ``σ_{T+1}`` times their empirical quantiles exactly.

Tested against the ``arch`` package (its GJR-GARCH fit and analytic variance forecasts) and
against a by-hand recursion (``tests/stats/test_garch.py``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.optimize import minimize
from scipy.signal import lfilter

from tftjax.stats.memo import by_content

PATHS = 500
"""Simulated paths per origin (common to every origin: the same resampled residuals)."""
SEED = 0


@dataclasses.dataclass(frozen=True)
class GJR:
    """Fitted parameters, the recursion's starting variance and the training rows'
    standardised residuals."""

    omega: float
    alpha: float
    gamma: float
    beta: float
    init: float
    residuals: np.ndarray

    @property
    def persistence(self) -> float:
        """``α + γ/2 + β``: the decay of a variance shock (symmetric residuals)."""
        return self.alpha + self.gamma / 2 + self.beta


def variance(
    r: np.ndarray, omega: float, alpha: float, gamma: float, beta: float, init: float
) -> np.ndarray:
    """``v[t]``: the GJR variance forecast of ``r[t+1]`` made at ``t`` (from ``r[0..t]``),
    ``v[-1] = init``. The recursion is linear in the variance given the returns, so it runs
    as one filter: ``v[t] = ω + (α + γ·1[r_t < 0]) r_t² + β v[t-1]``."""
    r = np.asarray(r, np.float64)
    shock = omega + (alpha + gamma * (r < 0)) * r * r
    v, _ = lfilter([1.0], [1.0, -beta], shock, zi=[beta * init])
    return v


def _neg_loglik(theta: np.ndarray, r: np.ndarray, init: float) -> float:
    omega, alpha, gamma, beta = theta
    v = np.concatenate([[init], variance(r[:-1], omega, alpha, gamma, beta, init)])
    v = np.maximum(v, 1e-300)
    return 0.5 * float(np.sum(np.log(v) + r * r / v))


@by_content(kept=64)
def fit(r: np.ndarray) -> GJR:
    """Gaussian QML on the returns ``r`` (the training rows), the starting variance their
    mean square. Constraints: ``ω > 0``, ``α >= 0``, ``α + γ >= 0``, ``β >= 0`` and
    stationarity ``α + γ/2 + β < 1``. A repeat of the same rows returns the kept fit
    (:func:`tftjax.stats.memo.by_content`)."""
    r = np.asarray(r, np.float64)
    var = float(np.mean(r * r)) or 1e-12
    scale = np.sqrt(var)
    x = r / scale  # unit variance: the optimiser's tolerances mean the same on any scale
    cons = [
        {"type": "ineq", "fun": lambda t: t[1] + t[2]},
        {"type": "ineq", "fun": lambda t: 0.9999 - (t[1] + t[2] / 2 + t[3])},
    ]
    best = None
    for start in ([0.05, 0.05, 0.1, 0.85], [0.2, 0.1, 0.0, 0.7]):
        res = minimize(
            _neg_loglik,
            np.array(start),
            args=(x, 1.0),
            method="SLSQP",
            bounds=[(1e-8, None), (0.0, 1.0), (-1.0, 1.0), (0.0, 1.0)],
            constraints=cons,
            options={"ftol": 1e-10, "maxiter": 500},
        )
        if best is None or res.fun < best.fun:
            best = res
    assert best is not None
    omega, alpha, gamma, beta = (float(v) for v in best.x)
    v = np.concatenate([[1.0], variance(x[:-1], omega, alpha, gamma, beta, 1.0)])
    return GJR(omega * var, alpha, gamma, beta, var, x / np.sqrt(v))


def fhs_quantiles(
    model: GJR,
    r: np.ndarray,
    origins: np.ndarray,
    horizon: int,
    quantiles,
    *,
    cumulative: bool = False,
    paths: int = PATHS,
    seed: int = SEED,
    chunk: int = 1024,
) -> np.ndarray:
    """``[N, horizon, Q]`` quantile forecasts at ``origins`` (rows of ``r``, the whole
    series, filtered from ``model.init``): step 1 is ``σ_{T+1}`` times the residuals'
    empirical quantiles; later steps the empirical quantiles of ``paths`` simulated returns
    (residuals resampled with replacement, the same draws at every origin), or of their
    running sums (``cumulative``)."""
    qs = np.asarray(quantiles, np.float64)
    v = variance(r, model.omega, model.alpha, model.gamma, model.beta, model.init)
    z = model.residuals
    draws = z[np.random.default_rng(seed).integers(0, z.size, size=(paths, horizon))]
    out = np.empty((len(origins), horizon, qs.size))
    for lo in range(0, len(origins), chunk):
        o = np.asarray(origins[lo : lo + chunk])
        var = np.repeat(v[o, None], paths, axis=1)  # [n, paths]: σ² of the next return
        total = np.zeros_like(var)
        for h in range(horizon):
            step = np.sqrt(var) * draws[None, :, h]
            total = total + step
            out[lo : lo + o.size, h] = np.quantile(total if cumulative else step, qs, axis=1).T
            shock = (model.alpha + model.gamma * (step < 0)) * step * step
            var = model.omega + shock + model.beta * var
    # step 1 exactly (a sum of one step too): σ_{T+1} times the residuals' quantiles
    out[:, 0] = np.sqrt(v[np.asarray(origins)])[:, None] * np.quantile(z, qs)[None, :]
    return out
