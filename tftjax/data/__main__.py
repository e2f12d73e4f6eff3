"""``python -m tftjax.data [FILE]``: validate a parquet file and summarise its splits."""

from __future__ import annotations

import argparse
import time

import numpy as np

from tftjax.cli import data_files
from tftjax.cli import main as cli_main
from tftjax.config import DataConfig
from tftjax.data import DATASETS, load_dataset
from tftjax.data.calendar import format_interval


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tftjax.data", description=__doc__)
    parser.add_argument(
        "parquet_file",
        nargs="*",
        default=[],
        help="OHLCV bars, one or several files (default: the bundled ES bars)",
    )
    parser.add_argument(
        "--dataset",
        default=None,
        help=f"bundled sets instead of files, comma-separated ({', '.join(DATASETS)})",
    )
    parser.add_argument("--calendar", default=None, help="exchange calendar (XCME, XNYS, 24/7 ...)")
    parser.add_argument("--timezone", default=None, help="wall clock of the calendar features")
    parser.add_argument("--bar-interval", default=None, help="nominal bar interval (1min, 1h, 1d)")
    args = parser.parse_args(argv)
    path = data_files(args.parquet_file, args.dataset)
    cfg = DataConfig(calendar=args.calendar, timezone=args.timezone, bar_interval=args.bar_interval)
    t0 = time.perf_counter()
    ds = load_dataset(path, cfg)
    dt = time.perf_counter() - t0
    fmt = lambda ns: str(np.datetime64(int(ns), "ns").astype("datetime64[s]"))
    for w in ds.warnings:
        print(f"warning: {w}")
    if ds.cuts is not None:
        print(f"{ds.describe()}; split at the global times {fmt(ds.cuts[0])} and {fmt(ds.cuts[1])}")
    for ser in ds.series:
        b, s, clock = ser.bars, ser.splits, ser.features.stats.clock
        print(
            f"{b.path}: {ser.name}, {len(b):,} bars, {fmt(b.ts[0])} .. {fmt(b.ts[-1])}; "
            f"features in {dt:.2f} s; bar {format_interval(clock.interval)}, calendar "
            f"{clock.calendar or 'none'}, clock {clock.zone or 'as stored'}"
        )
        for name in ("train", "val", "test"):
            a, z = s.rows(name)
            print(f"  {name:5s} rows {a:>8,}..{z:<8,} {getattr(s, name).size:>8,} windows")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


def main_exit() -> None:
    """The console script: :func:`main`, and the process ends with its exit code."""
    from tftjax.cli import exit as cli_exit

    cli_exit(main())


if __name__ == "__main__":
    main_exit()
