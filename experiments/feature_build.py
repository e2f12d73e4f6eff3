"""Time and memory of the TFT-225 feature build on ~250k synthetic ES bars.

    python experiments/feature_build.py [--days 180] [--repeats 5]

Generates the 180-session synthetic file (deterministic), then builds the
features ``--repeats`` times: wall time (median, min, max) and peak memory
of the build, measured by ``tracemalloc`` (numpy reports its buffers to it),
as a multiple of the float32 feature matrix ``[n, 225]`` it produces.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

from tftjax.config import NUM_HISTORICAL, NUM_KNOWN
from tftjax.data import build_features, make_splits, read_bars, write_bars
from tftjax.data.synthetic import generate
from tftjax.runner.provenance import write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=180)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/feature_build.json"))
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.parquet"
        write_bars(generate(args.days), path)
        t0 = time.perf_counter()
        bars = read_bars(path)
        read_s = time.perf_counter() - t0
    n = len(bars)
    splits = make_splits(n)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        fs = build_features(bars, train_rows=splits.train_rows)
        times.append(time.perf_counter() - t0)
        del fs
    tracemalloc.start()
    build_features(bars, train_rows=splits.train_rows)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    matrix = n * (NUM_HISTORICAL + NUM_KNOWN) * 4
    rec = {
        "bars": n,
        "read_s": read_s,
        "build_s_median": statistics.median(times),
        "build_s_min": min(times),
        "build_s_max": max(times),
        "peak_bytes": peak,
        "matrix_bytes": matrix,
        "peak_over_matrix": peak / matrix,
    }
    print(
        f"| bars | read + validate | feature build (median of {args.repeats}; min–max) "
        "| peak memory | float32 matrix [n, 225] | peak / matrix |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| {n:,} | {read_s:.2f} s | {rec['build_s_median']:.2f} s ({min(times):.2f}–"
        f"{max(times):.2f}) | {peak / 2**20:,.0f} MiB | {matrix / 2**20:,.0f} MiB "
        f"| {peak / matrix:.2f}× |"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, rec, args)


if __name__ == "__main__":
    main()
