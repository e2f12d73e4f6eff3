"""Rebuild ``lean_us_daily_1998-2021.parquet`` from a checkout of QuantConnect/Lean.

    python data/build_lean_panel.py PATH/TO/Lean [--rev REV]

The daily trade bars of ``Data/equity/usa/daily/{ticker}.zip`` (prices in deci-cents,
unadjusted) are adjusted for splits and dividends with ``Data/equity/usa/factor_files``:
a factor row dated ``d`` holds the price and split factors of every trading day after the
previous row's date up to and including ``d``; a bar's adjusted price is raw / 10,000 ×
price factor × split factor and its volume raw / split factor. Each series starts at the
first date of its ``map_files`` entry (the zip of a ticker whose listing began later holds
rows of an earlier security before that date) or after the last date it traded under
another ticker (GOOG's when-issued GOOCV days), and after its last hole of more than 30
days (QQQ traded as QQQQ from 2004-12 to 2011-03, and Lean holds no QQQQ file). Written as one long file: ``symbol``,
``ts`` (the session's date at 00:00, America/New_York, no zone), ``open``, ``high``,
``low``, ``close``, ``volume``, sorted by symbol then time.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TICKERS = ("aapl", "aig", "bac", "bno", "eem", "fb", "goog", "ibm", "iwm", "qqq", "spy", "uso")
MAX_GAP_DAYS = 30
"""A longer hole in a series' dates (a ticker change whose files Lean lacks) starts it anew
after the hole."""
OUT = Path(__file__).with_name("lean_us_daily_1998-2021.parquet")


def git_show(repo: Path, rev: str, path: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"{rev}:{path}"], check=True, capture_output=True
    ).stdout


def factors(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = [r.split(",") for r in text.strip().splitlines()]
    d = np.array([int(r[0]) for r in rows])
    return d, np.array([float(r[1]) for r in rows]), np.array([float(r[2]) for r in rows])


def series(repo: Path, rev: str, ticker: str) -> dict[str, np.ndarray]:
    z = zipfile.ZipFile(io.BytesIO(git_show(repo, rev, f"Data/equity/usa/daily/{ticker}.zip")))
    raw = np.loadtxt(io.StringIO(z.read(z.namelist()[0]).decode()), delimiter=",", dtype=str)
    day = np.array([int(s.split(" ")[0]) for s in raw[:, 0]])
    ohlc = raw[:, 1:5].astype(np.float64) / 10_000.0
    vol = raw[:, 5].astype(np.float64)
    rows = [
        r.split(",")
        for r in git_show(repo, rev, f"Data/equity/usa/map_files/{ticker}.csv")
        .decode()
        .strip()
        .splitlines()
    ]
    other = [int(r[0]) for r in rows if r[1] != ticker]  # traded under another ticker up to it
    listed = max(other) + 1 if other else int(rows[0][0])
    keep = day >= listed
    day, ohlc, vol = day[keep], ohlc[keep], vol[keep]
    dates = np.array(
        [np.datetime64(f"{d // 10000:04d}-{d // 100 % 100:02d}-{d % 100:02d}") for d in day]
    )
    hole = np.flatnonzero(np.diff(dates).astype(int) > MAX_GAP_DAYS)
    if hole.size:  # e.g. QQQ traded as QQQQ 2004-12 to 2011-03, files absent: the last stretch
        day, ohlc, vol, dates = (a[hole[-1] + 1 :] for a in (day, ohlc, vol, dates))
    fd, pf, sf = factors(git_show(repo, rev, f"Data/equity/usa/factor_files/{ticker}.csv").decode())
    i = np.minimum(np.searchsorted(fd, day, side="left"), fd.size - 1)
    i = np.where(day > fd[-1], fd.size - 1, i)
    ohlc = ohlc * (pf[i] * sf[i])[:, None]
    ts = dates.astype("datetime64[us]")
    return {
        "ts": ts,
        "open": ohlc[:, 0],
        "high": ohlc[:, 1],
        "low": ohlc[:, 2],
        "close": ohlc[:, 3],
        "volume": vol / sf[i],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "lean", type=Path, help="a git checkout (or bare repository) of QuantConnect/Lean"
    )
    ap.add_argument("--rev", default="HEAD")
    a = ap.parse_args()
    parts = []
    for t in TICKERS:
        s = series(a.lean, a.rev, t)
        parts.append(pa.table({"symbol": [t.upper()] * s["ts"].size, **s}))
        print(f"{t.upper():5s} {s['ts'].size:6,} bars {s['ts'][0]} to {s['ts'][-1]}")
    pq.write_table(pa.concat_tables(parts), OUT, compression="zstd", compression_level=19)
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
