"""``python -m tftjax.predict --checkpoint DIR``: quantile forecasts of the next bars.

    python -m tftjax.predict --checkpoint runs/tft/run_001 --out forecast.parquet
    python -m tftjax.predict --checkpoint runs/tft/run_001 --parquet-file today.parquet --as-of 2024-03-01T16:00
    python -m tftjax.predict --checkpoint export_dir --int8 --origins 250 --out backtest.csv

DIR is a checkpoint, a run folder (its final checkpoint) or an export folder. The origin is
the last bar of the file (or the last at or before ``--as-of``); ``--origins N|all`` forecasts
from the last N (or every) eligible bar up to it, batched on the device. The forecast of an
origin is the prediction ``evaluate`` scores for the same window, bit for bit (tested), and
no bar after the origin enters it (tested). Writes parquet or CSV by ``--out``'s suffix
(columns: README, "Forecasting") and prints the last origin's table.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from tftjax.cli import data_files
from tftjax.cli import main as cli_main
from tftjax.errors import ConfigError


@dataclasses.dataclass
class Args:
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
    reserved unknown row (its statistics fitted on its own training rows)."""
    as_of: str | None = None
    """The origin: the last bar at or before this time (default: the last bar)."""
    origins: str = "last"
    """last, all, or N: forecast from the last N eligible bars up to the origin."""
    out: Path = Path("forecast.parquet")
    """The forecast file: .parquet or .csv."""
    int8: bool = False
    """The int8 inference path (a --qat checkpoint or an int8 export)."""
    plot: Path | None = None
    """Also draw the last origin's quantile fan to this PNG."""


def _minute(ns) -> str:
    import numpy as np

    return str(np.datetime64(int(ns), "ns").astype("datetime64[m]"))


def write_table(table: dict, out: Path) -> None:
    import pyarrow as pa

    cols = dict(table)
    for k in ("origin_time", "target_time"):
        cols[k] = pa.array(cols[k].astype("datetime64[ns]"))
    t = pa.table(cols)
    if out.suffix == ".csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(t, out)
    else:
        import pyarrow.parquet as pq

        pq.write_table(t, out)


def run(argv: list[str] | None = None) -> int:
    import tyro

    args = tyro.cli(Args, args=argv, prog="python -m tftjax.predict")
    if args.out.suffix not in (".parquet", ".csv"):
        raise ConfigError(f"--out {args.out}: give a .parquet or .csv file")
    from tftjax.forecast import forecast
    from tftjax.saved import open_model

    saved = open_model(args.checkpoint)
    if args.int8 and saved.kind != "int8" and not saved.cfg.qat:
        raise ConfigError(f"--int8: {args.checkpoint} is a float model (train with --qat, or "
                          "export one calibrated with --calibrate N)")
    mode = "int8" if args.int8 or saved.kind == "int8" else None  # an int8 export is int8
    if not args.out.parent.is_dir():  # before any work: nothing is written on a refusal
        raise ConfigError(f"--out {args.out}: no such folder {args.out.parent}")
    f = forecast(saved, data_files(args.parquet_file, args.dataset), as_of=args.as_of,
                 origins=args.origins, mode=mode, unknown=args.unknown_instrument,
                 instrument=args.instrument)
    t = f["table"]
    write_table(t, args.out)
    import numpy as np

    qs = [k for k in t if k.startswith("q")]
    d = saved.cfg.decoder_steps
    last = slice(len(t["horizon"]) - d, None)
    print(f"{saved.what}: {len(f['rows'])} origin(s) of {f['dataset'].describe()}; the last "
          f"of {t['instrument'][last][0]} the bar of {_minute(t['origin_time'][last][0])} "
          f"(close {t['close_at_origin'][last][0]:.6g})")
    what = "k-bar log ret" if saved.cfg.target == "cumulative" else "log ret"
    print("| bar | time | " + " | ".join(f"{k} ({what})" for k in qs) + " |")
    print("|---|---|" + "---|" * len(qs))
    for i in range(len(t["horizon"]))[last]:
        print(f"| {t['horizon'][i]} | {_minute(t['target_time'][i])} | "
              + " | ".join(f"{t[k][i]:+.5f}" for k in qs) + " |")
    if args.plot:
        from tftjax.plots import quantile_fan

        ds, s = f["dataset"], f["starts"][-1:]
        e = saved.cfg.encoder_steps
        origin = np.datetime64(int(ds.ts[f["rows"][-1]]), "ns").astype("datetime64[m]")
        quantile_fan(args.plot, ds.features.target[s[:, None] + np.arange(e)],
                     np.full((1, d), np.nan), f["pred"][-1:], saved.cfg.quantiles,
                     [f"{t['instrument'][-1]}: forecast from the bar of {origin}"])
    print(f"wrote {args.out} ({len(t['horizon'])} rows)" + (f" and {args.plot}" if args.plot else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit

    cli_exit(main())
