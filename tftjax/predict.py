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

from tftjax.cli import CommandLine, data_files, first_paragraph
from tftjax.cli import main as cli_main
from tftjax.cli.options import PredictOptions
from tftjax.errors import ConfigError
from tftjax.serving.report import plot, print_last

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
        future=args.future,
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
