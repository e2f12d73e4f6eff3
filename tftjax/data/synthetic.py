"""Deterministic ES-like 1-minute bars for scale runs and tests.

``python -m tftjax.data.synthetic --days 180 --out es_180d.parquet`` writes
about 250k bars (180 CME Globex sessions of 1,380 minutes: 17:00 the day
before to 16:00, Monday to Friday, weekends closed).

Calibrated on the bundled real ES bars (:func:`calibrate`): start price,
1-minute return volatility, per-hour-of-day volatility and volume profiles
(the intraday U-shape and the quiet overnight hours), bar range relative to
volatility and the dispersion of volume. Two days of bars cannot pin down
slow dynamics, so volatility clustering is an assumed log-volatility AR(1)
(half-life about 2 hours, stationary std 0.35) and session opens add a gap
of 10 one-minute volatilities. Prices sit on the 0.25 tick grid; OHLC are
consistent by construction. The same ``seed`` gives the same file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from tftjax.data.bars import Bars, read_bars, write_bars
from tftjax.data.bundled import default_parquet

TICK = 0.25
SESSION_MINUTES = 1380  # 17:00 → 16:00 next day
_NS_MIN = 60 * 10**9


@dataclasses.dataclass(frozen=True)
class Calibration:
    start_price: float
    sigma: float  # std of 1-minute log returns within sessions
    vol_profile: np.ndarray  # [24] relative volatility by hour of day
    volume_mean: float
    volume_profile: np.ndarray  # [24] relative mean volume by hour of day
    volume_dispersion: float  # std of log(1+v) around the profile
    range_ratio: float  # mean log(h/l) / sigma


def calibrate(bars: Bars | None = None) -> Calibration:
    """Fit the generator's marginals on real 1-minute bars (default: bundled ES)."""
    bars = read_bars(default_parquet()) if bars is None else bars
    r = np.diff(np.log(bars.close))
    step = np.diff(bars.ts)
    r = np.where(step <= 5 * _NS_MIN, r, np.nan)  # drop session gaps
    hour = ((bars.ts[1:] // _NS_MIN) % 1440) // 60
    sigma = float(np.nanstd(r))
    vol_profile = np.ones(24)
    volume_profile = np.full(24, float(bars.volume.mean()))  # hours without data: average
    vol_hour = ((bars.ts // _NS_MIN) % 1440) // 60
    for hr in range(24):
        sel = r[hour == hr]
        sel = sel[np.isfinite(sel)]
        if sel.size >= 20:
            vol_profile[hr] = max(sel.std() / sigma, 0.2)
        v = bars.volume[vol_hour == hr]
        if v.size >= 20:
            volume_profile[hr] = max(v.mean(), 1.0)
    volume_mean = float(bars.volume.mean())
    volume_profile /= volume_mean
    lv = np.log1p(bars.volume) - np.log(volume_profile[vol_hour] * volume_mean)
    rng_ratio = float(np.mean(np.log(bars.high / bars.low)) / sigma)
    return Calibration(
        start_price=float(bars.close[0]), sigma=sigma, vol_profile=vol_profile,
        volume_mean=volume_mean, volume_profile=volume_profile,
        volume_dispersion=float(np.std(lv)), range_ratio=rng_ratio,
    )  # fmt: skip


def session_timestamps(days: int, first_session: str = "2013-09-01T17:00") -> np.ndarray:
    """Minute timestamps (ns) of ``days`` weekday sessions from ``first_session``."""
    start = np.datetime64(first_session, "ns").astype(np.int64)
    day_ns = 1440 * _NS_MIN
    opens = []
    k = 0
    while len(opens) < days:
        t = start + k * day_ns
        trade_date = (t + 7 * 60 * _NS_MIN) // day_ns  # the session's trading date
        if (trade_date + 3) % 7 < 5:  # Monday..Friday
            opens.append(t)
        k += 1
    opens = np.asarray(opens, dtype=np.int64)
    return (opens[:, None] + np.arange(SESSION_MINUTES, dtype=np.int64) * _NS_MIN).ravel()


def generate(days: int, seed: int = 0, calibration: Calibration | None = None) -> Bars:
    """ES-like bars over ``days`` sessions; deterministic in ``seed``."""
    if days < 1:
        raise ValueError("days must be >= 1")
    cal = calibrate() if calibration is None else calibration
    rng = np.random.default_rng(seed)
    ts = session_timestamps(days)
    n = ts.shape[0]
    hour = ((ts // _NS_MIN) % 1440) // 60

    # Volatility clustering: log-vol AR(1), phi per minute, stationary std s.
    phi, s = 0.5 ** (1 / 120), 0.35
    shocks = rng.standard_normal(n) * s * np.sqrt(1 - phi * phi)
    h = np.empty(n)
    acc = rng.standard_normal() * s
    for i, e in enumerate(shocks.tolist()):  # recursion: one cheap pass
        acc = phi * acc + e
        h[i] = acc
    sigma_t = cal.sigma * cal.vol_profile[hour] * np.exp(h - s * s / 2)
    r = sigma_t * rng.standard_t(5, size=n) / np.sqrt(5 / 3)  # fat tails, unit variance
    session_open = np.zeros(n, bool)
    session_open[::SESSION_MINUTES] = True
    gap = np.where(session_open, 10 * cal.sigma * rng.standard_normal(n), 0.0)
    gap[0] = 0.0

    logp = np.log(cal.start_price) + np.cumsum(r + gap)
    close = np.maximum(np.round(np.exp(logp) / TICK) * TICK, TICK)
    prev_close = np.concatenate([[close[0]], close[:-1]])
    open_ = np.where(session_open, np.round(prev_close * np.exp(gap) / TICK) * TICK, prev_close)
    open_ = np.maximum(open_, TICK)
    extra = cal.range_ratio * sigma_t * close / 2
    high = np.maximum(open_, close) + TICK * np.floor(rng.exponential(size=n) * extra / TICK)
    low = np.minimum(open_, close) - TICK * np.floor(rng.exponential(size=n) * extra / TICK)
    low = np.maximum(low, TICK)
    activity = np.sqrt(sigma_t / (cal.sigma * cal.vol_profile[hour]))
    lam = cal.volume_mean * cal.volume_profile[hour] * activity
    d = cal.volume_dispersion
    volume = np.round(lam * np.exp(d * rng.standard_normal(n) - d * d / 2))
    return Bars(
        path=f"synthetic_es_{days}d_seed{seed}",
        ts=ts,
        open=open_,
        high=high,
        low=low,
        close=close,
        volume=volume,
    )


def run(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tftjax.data.synthetic",
        description="Write deterministic ES-like 1-minute bars (calibrated on the bundled ES file).",
    )
    parser.add_argument("--days", type=int, default=180, help="weekday sessions (1,380 bars each)")
    parser.add_argument("--out", type=Path, required=True, help="parquet file to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.days < 1:
        parser.error(f"--days must be >= 1, got {args.days}")
    if args.out.exists() and args.out.is_dir():
        parser.error(f"--out {args.out} is a directory")
    if not args.out.parent.exists():
        parser.error(f"--out: folder {args.out.parent} does not exist")
    bars = generate(args.days, args.seed)
    tmp = args.out.with_name(args.out.name + ".tmp")
    write_bars(bars, tmp)
    tmp.replace(args.out)  # never leave a half-written file under the real name
    print(f"wrote {len(bars):,} bars ({args.days} sessions) to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from tftjax.cli import main as cli_main

    return cli_main(run, argv)


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit

    cli_exit(main())
