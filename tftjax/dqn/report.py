"""The DQN's backtest report of one greedy pass: every trade (entry, exit, holding time,
gross and net P&L, costs), hit rate and exposure, and a PNG of the equity (gross and net),
the positions and the drawdown.

A bar's return splits at the open: the position over ``(c_t, o_{t+1}]`` (the gap) and the one
over ``(o_{t+1}, c_{t+1}]``, which differ where an order fills at the open (``--fill
next-open``) or where a session's last bar closed everything. A trade is a maximal run of one
non-zero position over these pieces; it pays ``cost · |p|`` at entry and at exit (a flip
closes one trade and opens another; a trade still open after the pass's last bar is closed
at its close, as the pass's record charges).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def pieces(env, held: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(positions, log returns, bar)`` of the gap and intrabar pieces of a greedy pass's
    held positions ``held [decisions]`` (host numpy), in time order."""
    t = env.first_decision + np.arange(held.size)
    gap = np.asarray(env.gap)[t + 1].astype(np.float64)
    intra = np.asarray(env.intra)[t + 1].astype(np.float64)
    ends = np.asarray(env.session_end)[t]
    held = np.asarray(held, np.float64)
    if env.next_open:  # over the gap, what was filled at the previous open (none after a close)
        before = np.concatenate([[0.0], held[:-1]])
        before = np.where(ends, 0.0, before)
    else:  # a close fill holds over the whole bar
        before = held
    pos = np.stack([before, held], axis=1).reshape(-1)
    ret = np.stack([gap, intra], axis=1).reshape(-1)
    return pos, ret, np.repeat(t + 1, 2)


def trades(env, held: np.ndarray, ts: np.ndarray) -> list[dict]:
    """Every trade of a greedy pass: entry and exit (the bar times), bars held, gross and net
    log return, costs."""
    pos, ret, bar = pieces(env, held)
    cost = float(env.cost)
    out, start = [], None
    for k in range(pos.size + 1):
        p = pos[k] if k < pos.size else 0.0
        if start is not None and p != pos[start]:
            q = pos[start]
            gross = float(np.sum(q * ret[start:k]))
            exited = k < pos.size  # else still open after the last bar: closed at its close
            paid = cost * abs(q) * 2
            out.append(
                {
                    "side": "long" if q > 0 else "short",
                    "entry": int(ts[bar[start]]),
                    "exit": int(ts[bar[k]]) if exited else None,
                    "closed_at_end": not exited,
                    "bars": int((bar[k - 1] - bar[start]) + 1),
                    "gross": gross,
                    "costs": paid,
                    "net": gross - paid,
                }
            )
            start = None
        if start is None and p != 0:
            start = k
    return out


def trade_stats(tr: list[dict]) -> dict:
    """Trades, their hit rate (net > 0), mean holding time and net P&L."""
    if not tr:
        return {"trades": 0, "trade_hit_rate": 0.0, "mean_bars_held": 0.0, "mean_trade_net": 0.0}
    net = np.array([t["net"] for t in tr])
    return {
        "trades": len(tr),
        "trade_hit_rate": float(np.mean(net > 0)),
        "mean_bars_held": float(np.mean([t["bars"] for t in tr])),
        "mean_trade_net": float(net.mean()),
    }


def format_trades(tr: list[dict], limit: int = 50) -> str:
    def when(x):
        return "open" if x is None else str(np.datetime64(x, "ns").astype("datetime64[m]"))

    lines = [
        "| # | side | entry (UTC) | exit (UTC) | bars | gross | costs | net |",
        "|---" * 8 + "|",
    ]
    for i, t in enumerate(tr[:limit], 1):
        lines.append(
            f"| {i} | {t['side']} | {when(t['entry'])} | {when(t['exit'])} | "
            f"{t['bars']} | {t['gross']:+.5f} | {t['costs']:.5f} | {t['net']:+.5f} |"
        )
    if len(tr) > limit:
        lines.append(f"({len(tr) - limit} more trades in trades.json)")
    return "\n".join(lines)


def report_png(path: Path, env, held: np.ndarray, net: np.ndarray, title: str) -> None:
    """Equity gross and net of costs against buy-and-hold, positions, drawdown."""
    from tftjax.plots import _plt

    plt = _plt()
    pos, ret, _ = pieces(env, held)
    gross = (pos * ret).reshape(-1, 2).sum(axis=1)
    eq = np.cumsum(net)
    fig, ax = plt.subplots(
        3, 1, figsize=(10, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1, 1]}
    )
    ax[0].plot(np.cumsum(gross), label="DQN, gross")
    ax[0].plot(eq, label="DQN, net of costs")
    ax[0].plot(np.cumsum(ret.reshape(-1, 2).sum(axis=1)), label="buy and hold (gross)", alpha=0.7)
    ax[0].axhline(0, color="grey", lw=0.8)
    ax[0].set(title=title, ylabel="cumulative log return")
    ax[0].legend(fontsize=8)
    ax[1].step(np.arange(held.size), held, where="post", lw=0.8)
    ax[1].set(ylabel="position", yticks=[-1, 0, 1])
    ax[2].fill_between(
        np.arange(eq.size),
        np.concatenate([[0.0], eq])[1:] - np.maximum.accumulate(np.concatenate([[0.0], eq]))[1:],
        0,
        color="C3",
        alpha=0.5,
    )
    ax[2].set(ylabel="drawdown", xlabel="bar")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


HEADERS = {
    "total_log_return": "total log return",
    "sharpe": "Sharpe (ann.)",
    "max_drawdown": "max drawdown",
    "return": "greedy return",
    "return_min": "worst episode",
}
FORMATS = {
    "total_log_return": "{:+.4f}",
    "sharpe": "{:+.2f}",
    "max_drawdown": "{:.2%}",
    "turnover": "{:.3f}",
    "return": "{:.1f}",
    "return_min": "{:.1f}",
}


def format_summary(summary: dict, note: str) -> str:
    """A markdown table: one row per split and policy, one column per metric."""
    rows = [(split, name, m) for split, by in summary["splits"].items() for name, m in by.items()]
    keys = list(rows[0][2])
    lines = [
        f"DQN, {note}"
        + (
            f"; median {summary['median_epoch_s']:.2f} s per epoch"
            if summary.get("median_epoch_s")
            else ""
        ),
        "| split | policy | " + " | ".join(HEADERS.get(k) or k for k in keys) + " |",
        "|---|---|" + "---|" * len(keys),
    ]
    for split, name, m in rows:
        cells = [FORMATS.get(k, "{:.4g}").format(m[k]) for k in keys]
        lines.append(f"| {split} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
