"""Is a trading record's Sharpe ratio evidence of skill? The tests a shipped policy must pass
and the figures that say what a test stretch can tell.

* :func:`psr`: the probabilistic Sharpe ratio (Bailey & López de Prado 2012), the probability
  that the true Sharpe exceeds a benchmark, with the returns' skew and kurtosis.
* :func:`deflated_sharpe`: the PSR against the Sharpe the *best of N* candidates would show by
  luck alone (Bailey & López de Prado 2014, the "false strategy theorem"), for a record
  chosen among ``N`` candidates (epochs × seeds, or the rows of a table).
* :func:`gate`: ship an agent only where its validation record's deflated Sharpe, counting
  every candidate tried, reaches ``--psr-gate`` (0.95 by default).
* :func:`min_detectable_sharpe`: the smallest annualised Sharpe a test of ``T`` bars detects
  at 5% one-sided with 80% power: what a stretch of that length can rule out.

Every Sharpe here is per bar unless it says annualised.
"""

from __future__ import annotations

import math

import numpy as np

EULER_GAMMA = 0.5772156649015329


def _moments(x: np.ndarray) -> tuple[float, float, float]:
    """``(per-bar Sharpe, skewness, kurtosis)`` (population moments, as the PSR's papers)."""
    sd = float(x.std())
    sr = float(x.mean() / sd)
    z = (x - x.mean()) / sd
    return sr, float(np.mean(z**3)), float(np.mean(z**4))


def psr(net, benchmark: float = 0.0) -> float:
    """P(true per-bar Sharpe > ``benchmark``) from the record ``net`` (0.5 for a record that
    never moves: no evidence either way)."""
    from scipy.stats import norm

    x = np.asarray(net, np.float64)
    if x.size < 3 or float(x.std()) < 1e-15:
        return 0.5 if benchmark == 0.0 else 0.0
    sr, g3, g4 = _moments(x)
    denom = math.sqrt(max(1 - g3 * sr + (g4 - 1) / 4 * sr * sr, 1e-12))
    return float(norm.cdf((sr - benchmark) * math.sqrt(x.size - 1) / denom))


def expected_max_sharpe(trials: int, variance: float) -> float:
    """The per-bar Sharpe the best of ``trials`` independent skill-less candidates reaches in
    expectation, when their Sharpes vary with ``variance``:
    ``sqrt(V) · ((1 − γ) Φ⁻¹(1 − 1/N) + γ Φ⁻¹(1 − 1/(N e)))`` (0 for one candidate)."""
    from scipy.stats import norm

    if trials <= 1:
        return 0.0
    return math.sqrt(variance) * float(
        (1 - EULER_GAMMA) * norm.ppf(1 - 1 / trials)
        + EULER_GAMMA * norm.ppf(1 - 1 / (trials * math.e))
    )


def deflated_sharpe(net, trials: int, trial_sharpes=None) -> dict:
    """The deflated Sharpe ratio of the record ``net``, the best of ``trials`` candidates.

    The candidates' Sharpe variance is the larger of their observed variance
    (``trial_sharpes``, per bar) and the sampling variance of one record of this length,
    ``(1 + SR²/2) / T`` (Lo 2002): near-copies (successive epochs of one agent) vary less
    than chance would, and the floor keeps such a family from deflating nothing.

    Returns ``{"dsr", "sr0", "trials"}``: the PSR against ``sr0``, the expected best Sharpe
    of ``trials`` skill-less candidates (per bar)."""
    x = np.asarray(net, np.float64)
    if x.size < 3 or float(x.std()) < 1e-15:
        return {"dsr": 0.5 if trials <= 1 else 0.0, "sr0": 0.0, "trials": int(trials)}
    sr = float(x.mean() / x.std())
    var = (1 + sr * sr / 2) / x.size
    if trial_sharpes is not None and len(trial_sharpes) > 1:
        var = max(var, float(np.var(np.asarray(trial_sharpes, np.float64), ddof=1)))
    sr0 = expected_max_sharpe(int(trials), var)
    return {"dsr": psr(x, sr0), "sr0": sr0, "trials": int(trials)}


def gate(val_net, trials: int, trial_sharpes=None, level: float = 0.95) -> dict:
    """Whether a validation record clears the gate: its deflated Sharpe over ``trials``
    candidates is at least ``level``. ``{"passes", "dsr", "psr", "sr0", "trials"}``."""
    d = deflated_sharpe(val_net, trials, trial_sharpes)
    return {"passes": bool(d["dsr"] >= level), "psr": psr(val_net), **d}


def min_detectable_sharpe(
    bars: int, annualisation: float, alpha: float = 0.05, power: float = 0.8
) -> float:
    """The smallest annualised Sharpe a one-sided test at ``alpha`` detects with ``power`` from
    ``bars`` i.i.d. returns: ``(z_{1-α} + z_power) · sqrt(annualisation / bars)`` (the SE of a
    small Sharpe is ``1/sqrt(T)`` per bar)."""
    from scipy.stats import norm

    if bars < 2:
        return math.inf
    return float((norm.ppf(1 - alpha) + norm.ppf(power)) * math.sqrt(annualisation / bars))


def pooled(records: list[np.ndarray], annualisation: float) -> dict:
    """The seeds that traded, pooled: the equal-weight portfolio of their records (its Sharpe,
    SE and PSR), the mean SE and PSR over them, and how many seeds never held a position
    (those carry no information about the agent; averaging their SE of 0 and PSR of 0.5 in
    would flatter the table)."""
    from tftjax.dqn.metrics import sharpe_inference

    trading = [np.asarray(r, np.float64) for r in records if float(np.std(r)) > 1e-15]
    out = {"seeds_flat": len(records) - len(trading), "seeds_trading": len(trading)}
    if not trading:
        return {
            **out,
            "pooled_sharpe": 0.0,
            "pooled_se": 0.0,
            "pooled_psr": 0.5,
            "mean_se_trading": 0.0,
            "mean_psr_trading": 0.5,
        }
    mix = np.mean(trading, axis=0)
    inf = sharpe_inference(mix, annualisation)
    sd = float(mix.std())
    each = [sharpe_inference(r, annualisation) for r in trading]
    return {
        **out,
        "pooled_sharpe": float(mix.mean() / sd * math.sqrt(annualisation)) if sd > 1e-15 else 0.0,
        "pooled_se": inf["sharpe_se"],
        "pooled_psr": inf["psr"],
        "mean_se_trading": float(np.mean([e["sharpe_se"] for e in each])),
        "mean_psr_trading": float(np.mean([e["psr"] for e in each])),
    }
