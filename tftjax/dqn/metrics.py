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
    if sess is not None and span > 0:
        key = timeline.slot_key
        lo, hi = np.searchsorted(key, [timeline._key(timeline.utc[:1], timeline.wall[:1])[0],
                                       timeline._key(timeline.utc[-1:], timeline.wall[-1:])[0]])
        return float(hi - lo) / (span / _YEAR_NS), f"{timeline.clock.calendar} slots per year"
    return ((len(ts) - 1) / (span / _YEAR_NS) if span > 0 else 252.0), "the file's bars per year"


def trading_metrics(net: np.ndarray, positions: np.ndarray, annualisation: float) -> dict:
    """Total log return, annualised Sharpe, max drawdown (fraction of peak equity), turnover
    (mean |position change| per bar, the first entry from flat included)."""
    net = np.asarray(net, np.float64)
    positions = np.asarray(positions, np.float64)
    equity = np.concatenate([[0.0], np.cumsum(net)])
    drawdown = float(np.max(np.maximum.accumulate(equity) - equity))
    std = float(net.std())
    sharpe = float(net.mean() / std * math.sqrt(annualisation)) if std > 1e-15 else 0.0
    turnover = float(np.abs(np.diff(np.concatenate([[0.0], positions]))).mean())
    return {"total_log_return": float(equity[-1]), "sharpe": sharpe,
            "max_drawdown": 1.0 - math.exp(-drawdown), "turnover": turnover}


def baseline_metrics(next_ret: np.ndarray, cost: float, annualisation: float) -> dict[str, dict]:
    """Buy-and-hold (long from the first bar, one entry cost) and flat on the same bars, filled
    at the close (the closed form of :meth:`TradingEnv.baselines` without latency)."""
    next_ret = np.asarray(next_ret, np.float64)
    long = np.ones_like(next_ret)
    hold = next_ret.copy()
    hold[0] -= cost
    return {"buy_and_hold": trading_metrics(hold, long, annualisation),
            "flat": trading_metrics(np.zeros_like(next_ret), np.zeros_like(next_ret), annualisation)}
