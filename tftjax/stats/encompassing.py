"""Does a second quantile forecast add information? Giacomini and Komunjer's encompassing test.

Giacomini & Komunjer (2005, JBES) ask whether forecast ``f₁`` of the level-``q`` quantile
**encompasses** ``f₂``: whether the best combination ``θ₀ + θ₁ f₁ + θ₂ f₂`` (by the
pinball loss) puts no weight on ``f₂``. The combination is a linear quantile regression of
the outcome on both forecasts (its first-order conditions are their GMM moments with the
regressors as instruments), and the test is on ``θ₂ = 0``:

- ``θ̂`` solves the regression exactly, as a linear program (HiGHS, on its dual);
- its covariance is the sandwich ``H⁻¹ Ω H⁻¹``: ``H = Σ f̂ᵢ xᵢxᵢ'`` with Powell's kernel
  estimate of each outcome's density at its quantile (``f̂ᵢ = 1{|uᵢ| <= h} / 2h``, the
  Hall-Sheather bandwidth in Koenker's scaling), and ``Ω`` the Newey-West long-run variance
  of the scores ``ψᵢ = (q - 1{uᵢ < 0}) xᵢ`` **summed per date** first: a panel's series of
  one date, and a window's steps, move together (Driscoll and Kraay's scheme; the same
  dates as the Diebold-Mariano test of :mod:`tftjax.stats.verdict`);
- the bandwidth is twice the Politis-White block of the per-date mean hit, never under the
  forecast overlap, and the p-value is Sun's fixed-b one, as for DM.

``p < 0.05`` for "the baseline encompasses the TFT" says that the TFT adds information the
baseline lacks (even where its own loss is no lower); for "the TFT encompasses the
baseline", that the baseline adds to the TFT.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats
from scipy.optimize import linprog

from tftjax.stats import scoring

NW_MULTIPLE = 2
"""The bandwidth in Politis-White blocks (as :data:`tftjax.stats.verdict.NW_MULTIPLE`)."""


def quantile_regression(x: np.ndarray, y: np.ndarray, q: float) -> np.ndarray:
    """``θ`` minimising ``Σ ρ_q(yᵢ - xᵢθ)`` exactly, from the dual linear program (Koenker
    2005, 6.2): ``max y'a`` subject to ``x'a = (1 - q) x'1``, ``0 <= a <= 1``, whose
    equality constraints' multipliers are ``θ``. It has ``k`` constraints where the primal
    has ``n``: HiGHS solves 80,000 rows in about a second instead of minutes."""
    res = linprog(-y, A_eq=x.T, b_eq=(1.0 - q) * x.sum(axis=0), bounds=(0, 1), method="highs")
    if res.status != 0:  # pragma: no cover - a bounded, feasible LP
        raise RuntimeError(f"quantile regression: {res.message}")
    return -np.asarray(res.eqlin.marginals)


def bandwidth(residuals: np.ndarray, q: float) -> float:
    """Hall and Sheather's bandwidth (in quantile units, at 5%) mapped to the residuals'
    units by Koenker's rule: ``κ (Φ⁻¹(q + h) - Φ⁻¹(q - h))``, ``κ = min(sd, IQR / 1.34)``."""
    n = residuals.size
    z = stats.norm.ppf(q)
    h = (
        n ** (-1.0 / 3.0)
        * stats.norm.ppf(0.975) ** (2.0 / 3.0)
        * (1.5 * stats.norm.pdf(z) ** 2 / (2.0 * z * z + 1.0)) ** (1.0 / 3.0)
    )
    h = min(h, q - 1e-6, 1.0 - q - 1e-6)
    iqr = np.subtract(*np.quantile(residuals, [0.75, 0.25]))
    kappa = min(float(np.std(residuals)), iqr / 1.34) or float(np.std(residuals))
    return float(kappa * (stats.norm.ppf(q + h) - stats.norm.ppf(q - h)))


def newey_west(g: np.ndarray, lags: int) -> np.ndarray:
    """``Σ_t g_t g_t' + Σ_{l<=lags} (1 - l/(lags+1)) Σ_t (g_t g_{t-l}' + g_{t-l} g_t')`` of
    per-date score sums ``g [T, k]`` (no centring: the scores sum to ~0 at the optimum)."""
    omega = g.T @ g
    for lag in range(1, min(lags, g.shape[0] - 1) + 1):
        c = g[lag:].T @ g[:-lag]
        omega += (1.0 - lag / (lags + 1)) * (c + c.T)
    return omega


def encompasses(
    y: np.ndarray,
    first: np.ndarray,
    second: np.ndarray,
    q: float,
    dates: np.ndarray | None = None,
    horizon: int = 1,
) -> dict:
    """H₀: ``first`` encompasses ``second`` at level ``q`` (``θ₂ = 0``).

    Args:
      y, first, second: outcomes and the two forecasts of their ``q``-quantile, any equal
        shape (a window's steps as its trailing axis); NaN outcomes are left out.
      dates: each row's date (a leading-axis array; None: each row its own date, in order).
      horizon: the forecasts' overlap in dates (the bandwidth is never under it).

    Returns ``theta`` (``θ₀, θ₁, θ₂``), ``stat`` (the fixed-b t of ``θ₂``), ``p``, ``lags``
    and ``dates``.
    """
    y, first, second = (np.asarray(a, np.float64) for a in (y, first, second))
    row_dates = np.arange(y.shape[0]) if dates is None else np.asarray(dates)
    row_dates = np.broadcast_to(row_dates.reshape((-1,) + (1,) * (y.ndim - 1)), y.shape)
    ok = np.isfinite(y)
    y, first, second, row_dates = y[ok], first[ok], second[ok], row_dates[ok]
    x = np.column_stack([np.ones(y.size), first, second])
    if np.linalg.matrix_rank(x) < 3:  # a constant forecast, or two forecasts on one line
        return {
            "theta": None,
            "stat": float("nan"),
            "p": float("nan"),
            "lags": 0,
            "dates": int(np.unique(row_dates).size),
            "note": "not identified: the forecasts are collinear (a constant forecast?)",
        }
    theta = quantile_regression(x, y, q)
    u = y - x @ theta
    h = bandwidth(u, q)
    near = np.abs(u) <= h
    hess = (x[near].T @ x[near]) / (2.0 * h)
    # the solution interpolates k outcomes (u = 0 up to rounding): those count as not below,
    # whatever the sign their rounding left
    below = u < -1e-9 * float(np.max(np.abs(y)))
    scores = (q - below)[:, None] * x
    g, counts = scoring.by_date(scores, row_dates)
    hits, _ = scoring.by_date(below.astype(np.float64), row_dates)
    block = scoring.block_length(hits / counts)
    lags = max(scoring.default_lags(g.shape[0], horizon), NW_MULTIPLE * block)
    hinv = np.linalg.pinv(hess)  # singular only where too few outcomes lie near the fit
    cov = hinv @ newey_west(g, lags) @ hinv
    t = theta[2] / math.sqrt(cov[2, 2]) if cov[2, 2] > 0 else float("nan")
    b = min((lags + 1) / g.shape[0], 1.0)
    df = max(math.ceil(1.5 / b), 1)
    stat = t * math.exp(-b / 2)
    return {
        "theta": [float(v) for v in theta],
        "stat": float(stat),
        "p": float(2.0 * stats.t.sf(abs(stat), df=df)),
        "lags": int(lags),
        "dates": int(g.shape[0]),
    }


def both_ways(
    y: np.ndarray,
    model: np.ndarray,
    baseline: np.ndarray,
    qs,
    dates: np.ndarray | None,
    horizon: int,
    q: float = 0.9,
) -> dict | None:
    """The test both ways at level ``q`` on stitched forecasts ``[n, D, Q]`` of outcomes
    ``y [n, D]`` (None without that level): ``model_adds`` (H₀: the baseline encompasses the
    model) and ``baseline_adds`` (H₀: the model encompasses the baseline)."""
    j = scoring.level(qs, q, required=False)
    if j is None:
        return None
    a, b = np.asarray(model)[..., j], np.asarray(baseline)[..., j]
    return {
        "level": q,
        "model_adds": encompasses(y, b, a, q, dates, horizon),
        "baseline_adds": encompasses(y, a, b, q, dates, horizon),
    }
