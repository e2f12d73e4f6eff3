"""``python -m tftjax.predict --checkpoint DIR``: quantile forecasts of the next bars.

    python -m tftjax.predict --checkpoint runs/tft/run_001 --out forecast.parquet
    python -m tftjax.predict --checkpoint runs/tft/run_001 --parquet-file today.parquet --as-of 2024-03-01T16:00
    python -m tftjax.predict --checkpoint runs/tft/run_001 --split test --out test.parquet
    python -m tftjax.predict --checkpoint export_dir --int8 --start 2024-01-01 --out hist.csv

DIR is a checkpoint, a run folder (its final checkpoint) or an export folder. The origin is
each series' last bar (or its last at or before ``--as-of``, read on the data's clock unless
it carries a UTC offset); ``--origins N|all`` forecasts from the last N (or every) eligible
bar up to it, and ``--start``/``--end`` or ``--split`` from a range of origins, with the
realised targets and losses where known. The forecast of an origin is the prediction
``evaluate`` scores for the same window, and no bar after the origin enters it (tested).
Writes parquet or CSV by ``--out``'s suffix (columns: :mod:`tftjax.serving.table`) and
prints each series' last origin. A thin layer over :func:`tftjax.load` (the Python API).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from tftjax.cli import CommandLine, data_files, first_paragraph
from tftjax.cli import main as cli_main
from tftjax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class PredictOptions:
    """Forecast the next bars' quantiles with a saved TFT."""

    checkpoint: Path
    """A checkpoint, a run folder (its final checkpoint) or an export folder."""
    parquet_file: tuple[Path, ...] = ()
    """The bars to forecast from: one or several files, or a long file (default: the files
    the model was trained on)."""
    dataset: str | None = None
    """Bundled sets instead of --parquet-file, comma-separated (spx,nasdaq): es (ES futures,
    1 min), spx, nasdaq (daily), btc (hourly); sources in tftjax/data/bundled/SOURCES.md;
    us-daily (12 US stocks and ETFs, daily, from a clone's data/ folder: data/SOURCES.md)."""
    instrument: str | None = None
    """The instrument of a one-series file without a symbol column (default: its file name's
    stem, a bundled set's name)."""
    unknown_instrument: Literal["refuse", "embed"] = "refuse"
    """An instrument the model was not trained on: refuse it, or embed it with the model's
    reserved unknown row (its statistics fitted on its own training rows, or for a new
    listing with none the trained series' pooled statistics; the stats_from column says)."""
    as_of: str | None = None
    """The origin: each series' last bar at or before this time (default: its last bar). No
    UTC offset: the data's own clock (its zone's wall clock for zone-aware bars)."""
    origins: str = "last"
    """last, all, or N: forecast from the last N eligible bars up to the origin (with
    --start/--end/--split: default every origin in the range)."""
    start: str | None = None
    """The first origin time of a range (historical forecasts)."""
    end: str | None = None
    """The last origin time of a range."""
    split: Literal["train", "val", "test"] | None = None
    """Origins of the model's own windows of this split (scored like evaluate's)."""
    series: str | None = None
    """Only these series (comma-separated names)."""
    stale_after: int = 1
    """Warn when more than this many calendar slots after a series' origin, up to --as-of,
    have no bar."""
    out: Path = Path("forecast.parquet")
    """The forecast file: .parquet (metadata in its schema) or .csv (metadata in FILE.json)."""
    int8: bool = False
    """The int8 inference path (a --qat checkpoint or an int8 export)."""
    plot: Path | None = None
    """Also draw each printed series' last quantile fan to this PNG (log-return units)."""


def _fmt(ns, zone) -> str:
    import numpy as np
    import pyarrow as pa

    if zone is None:
        return str(np.datetime64(int(ns), "ns").astype("datetime64[m]"))
    return pa.scalar(int(ns), pa.timestamp("ns", tz=zone)).as_py().isoformat(timespec="minutes")


def print_last(f, cfg) -> list[int]:
    """Print each series' last origin's table; the rows of those origins' first step."""
    import numpy as np

    t, d = f.table, cfg.data.decoder_steps
    qs = [k for k in t if k.startswith("q")]
    what = "k-bar log ret" if cfg.data.target == "cumulative" else "log ret"
    firsts = []
    for name in dict.fromkeys(t["instrument"].tolist()):
        i0 = int(np.flatnonzero(t["instrument"] == name)[-1]) - d + 1
        firsts.append(i0)
        print(
            f"{name}: from the bar of {_fmt(t['origin_time'][i0], f.zone)} "
            f"(close {t['close_at_origin'][i0]:.6g}; times {f.meta['time_zone']})"
        )
        print("| bar | time | " + " | ".join(f"{k} ({what})" for k in qs) + " |")
        print("|---|---|" + "---|" * len(qs))
        for i in range(i0, i0 + d):
            print(
                f"| {t['horizon'][i]} | {_fmt(t['target_time'][i], f.zone)} | "
                + " | ".join(f"{t[k][i]:+.5f}" for k in qs)
                + " |"
            )
    return firsts


def plot(path: Path, f, cfg, firsts: list[int]) -> None:
    import numpy as np

    from tftjax.plots import quantile_fan

    ds, t, d, e = f.dataset, f.table, cfg.data.decoder_steps, cfg.data.encoder_steps
    k = [i // d for i in firsts]  # the origins of those rows
    starts = f.starts[k]
    scale = np.array([ds.series[j].features.stats.target_scale for j in ds.series_of(f.rows[k])])[
        :, None
    ]
    hist = ds.features.target[starts[:, None] + np.arange(e)] * scale
    real = t["realised"].reshape(-1, d)[k]
    titles = [
        f"{t['instrument'][i]}: from the bar of {_fmt(t['origin_time'][i], f.zone)}" for i in firsts
    ]
    quantile_fan(
        path,
        hist,
        real,
        f.pred[k] * scale[:, :, None],
        cfg.head.quantiles,
        titles,
        ylabel="log return",
    )


COMMAND_LINE = CommandLine(
    "python -m tftjax.predict", first_paragraph(__doc__), {"options": PredictOptions}
)


def run(argv: list[str] | None = None) -> int:
    args = COMMAND_LINE.parse(argv).options(PredictOptions)
    if args.out.suffix not in (".parquet", ".csv"):
        raise ConfigError(f"--out {args.out}: give a .parquet or .csv file")
    if args.stale_after < 0:
        raise ConfigError(f"--stale-after must be >= 0, got {args.stale_after}")
    if not args.out.parent.is_dir():  # before any work: nothing is written on a refusal
        raise ConfigError(f"--out {args.out}: no such folder {args.out.parent}")
    from tftjax.serving.api import load

    model = load(args.checkpoint, int8=args.int8)
    f = model.run(
        data_files(args.parquet_file, args.dataset) or None,
        as_of=args.as_of,
        origins=args.origins,
        start=args.start,
        end=args.end,
        split=args.split,
        series=args.series,
        unknown_instrument=args.unknown_instrument,
        instrument=args.instrument,
        stale_after=args.stale_after,
    )
    f.write(args.out)
    for w in f.warnings:
        print(f"warning: {w}")
    print(f"{model.name}: {len(f.rows)} origin(s) of {f.dataset.describe()}")
    firsts = print_last(f, model.saved.cfg)
    if args.plot:
        plot(args.plot, f, model.saved.cfg, firsts)
    print(
        f"wrote {args.out} ({len(f.table['horizon'])} rows)"
        + (f" and {args.plot}" if args.plot else "")
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


def main_exit() -> None:
    """The console script: :func:`main`, and the process ends with its exit code."""
    from tftjax.cli import exit as cli_exit

    cli_exit(main())


if __name__ == "__main__":
    main_exit()
