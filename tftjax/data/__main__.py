"""``python -m tftjax.data [FILE]``: validate a parquet file and summarise its splits."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from tftjax.cli import main as cli_main
from tftjax.data import default_parquet, load_dataset


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tftjax.data", description=__doc__)
    parser.add_argument("parquet_file", nargs="?", default=None,
                        help="OHLCV bars (default: the bundled ES 1-minute bars)")
    args = parser.parse_args(argv)
    path = args.parquet_file or default_parquet()
    t0 = time.perf_counter()
    ds = load_dataset(path)
    dt = time.perf_counter() - t0
    b, s = ds.bars, ds.splits
    fmt = lambda ns: str(np.datetime64(int(ns), "ns").astype("datetime64[s]"))  # noqa: E731
    print(f"{path}: {len(b):,} bars, {fmt(b.ts[0])} .. {fmt(b.ts[-1])}; features in {dt:.2f} s")
    for name in ("train", "val", "test"):
        a, z = s.rows(name)
        print(f"  {name:5s} rows {a:>8,}..{z:<8,} {getattr(s, name).size:>8,} windows")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
