"""Trading metrics of a position path: total log return, annualised Sharpe, drawdown,
turnover, and the bars per year that annualise them."""

from __future__ import annotations

import math

import numpy as np

_YEAR_NS = 365.25 * 86400 * 1e9


def bars_per_year(ts: np.ndarray, timeline=None) -> tuple[float, str]:
    """``(bars per year, how)``: the annualisation factor of a per-bar Sharpe ratio. With an
    exchange calendar, its slots per year over the data's span (what the market offers, not
    what the file happens to hold); without one, the file's own bar density."""
    span = float(ts[-1] - ts[0])
    sess = getattr(timeline, "sess", None)
    if timeline is not None and sess is not None and span > 0:
        key = timeline.slot_key
        lo, hi = np.searchsorted(
            key,
            [
                timeline._key(timeline.utc[:1], timeline.wall[:1])[0],
                timeline._key(timeline.utc[-1:], timeline.wall[-1:])[0],
            ],
        )
        return float(hi - lo) / (span / _YEAR_NS), f"{timeline.clock.calendar} slots per year"
    return ((len(ts) - 1) / (span / _YEAR_NS) if span > 0 else 252.0), "the file's bars per year"


def trading_metrics(net: np.ndarray, positions: np.ndarray, annualisation: float) -> dict:
    """Total log return, annualised Sharpe, max drawdown (fraction of peak equity), turnover
    (mean |position change| per bar, the first entry from flat and the exit to flat after the
    last bar included)."""
    net = np.asarray(net, np.float64)
    positions = np.asarray(positions, np.float64)
    equity = np.concatenate([[0.0], np.cumsum(net)])
    drawdown = float(np.max(np.maximum.accumulate(equity) - equity))
    std = float(net.std())
    sharpe = float(net.mean() / std * math.sqrt(annualisation)) if std > 1e-15 else 0.0
    turnover = float(units_traded(positions) / max(positions.size, 1))
    return {
        "total_log_return": float(equity[-1]),
        "sharpe": sharpe,
        "max_drawdown": 1.0 - math.exp(-drawdown),
        "turnover": turnover,
    }


def units_traded(positions) -> float:
    """Units of position changed over a pass that starts flat and is closed after its last
    bar."""
    p = np.asarray(positions, np.float64)
    return float(np.abs(np.diff(np.concatenate([[0.0], p, [0.0]]))).sum())


def baseline_metrics(next_ret: np.ndarray, cost: float, annualisation: float) -> dict[str, dict]:
    """Buy-and-hold (long from the first bar: the entry's cost, and the exit's after the last)
    and flat on the same bars, filled at the close (the closed form of
    :meth:`TradingEnv.baselines` without latency)."""
    next_ret = np.asarray(next_ret, np.float64)
    long = np.ones_like(next_ret)
    hold = next_ret.copy()
    hold[0] -= cost
    hold[-1] -= cost
    return {
        "buy_and_hold": trading_metrics(hold, long, annualisation),
        "flat": trading_metrics(np.zeros_like(next_ret), np.zeros_like(next_ret), annualisation),
    }


def sharpe_inference(net: np.ndarray, annualisation: float) -> dict:
    """The Sharpe ratio's standard error and the probabilistic Sharpe ratio against 0.

    Per bar, ``SR = mean / std``; Lo (2002), i.i.d. returns: ``SE = sqrt((1 + SR²/2) / T)``;
    Bailey & López de Prado (2012): ``PSR = Φ(SR · sqrt(T-1) / sqrt(1 - γ₃ SR + (γ₄-1)/4 SR²))``
    with the returns' skewness ``γ₃`` and (non-excess) kurtosis ``γ₄``: the probability that
    the true Sharpe exceeds 0. The SE is annualised like the Sharpe (× sqrt(bars per year))."""
    from scipy.stats import norm

    x = np.asarray(net, np.float64)
    t, sd = x.size, float(x.std())
    if t < 3 or sd < 1e-15:
        return {"sharpe_se": 0.0, "psr": 0.5}
    sr = float(x.mean() / sd)
    z = (x - x.mean()) / sd
    g3, g4 = float(np.mean(z**3)), float(np.mean(z**4))
    se = math.sqrt((1 + sr * sr / 2) / t)
    denom = math.sqrt(max(1 - g3 * sr + (g4 - 1) / 4 * sr * sr, 1e-12))
    return {
        "sharpe_se": se * math.sqrt(annualisation),
        "psr": float(norm.cdf(sr * math.sqrt(t - 1) / denom)),
    }


def report_metrics(
    net: np.ndarray, positions: np.ndarray, annualisation: float, cost: float
) -> dict:
    """:func:`trading_metrics` plus the Sharpe's SE and PSR, the costs paid (cost × units
    traded), the hit rate (share of bars held that made money) and the exposure (share of
    bars with a position)."""
    pos = np.asarray(positions, np.float64)
    net = np.asarray(net, np.float64)
    held = pos != 0
    out = trading_metrics(net, pos, annualisation)
    out.update(sharpe_inference(net, annualisation))
    out["costs_paid"] = float(cost * units_traded(pos))
    out["hit_rate"] = float(np.mean(net[held] > 0)) if held.any() else 0.0
    out["exposure"] = float(held.mean())
    return out
