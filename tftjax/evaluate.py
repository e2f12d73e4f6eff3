"""``python -m tftjax.evaluate --checkpoint DIR``: test metrics of a saved TFT.

Restores the weights, model config and feature statistics saved in DIR (an
epoch or final checkpoint) and prints loss and q-risk on a split beside the
naive baselines. The data is the file the run was trained on, found relative
to the run folder or at its recorded path and checked against its content
hash (a missing or changed file is refused); ``--parquet-file`` evaluates on
another file on purpose, with the training statistics.

``--int8`` adds the int8 inference path (int8 operands, int32 accumulation) beside
the float weights run without quantization: for a ``--qat`` checkpoint as
trained, for a float one with ``--calibrate N`` (post-training quantization on
N training batches). DIR may also be a folder written by ``python -m
tftjax.export`` (its int8 model beside its float32 weights).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from tftjax.cli import CommandLine, data_files, first_paragraph, quant_options
from tftjax.cli import main as cli_main
from tftjax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class EvaluateOptions:
    """Evaluate a TFT checkpoint on the test split."""

    checkpoint: Path
    """A checkpoint directory (runs/tft/run_001/checkpoints/tft_final_epoch10), a run folder
    (its final checkpoint) or an export folder."""
    parquet_file: tuple[Path, ...] = ()
    """Evaluate on these files instead of the training data (with each series' training
    statistics)."""
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
    split: Literal["train", "val", "test"] = "test"
    int8: bool = False
    """Also run the int8 inference path (a --qat checkpoint, or a float one with --calibrate)."""
    calibrate: int | None = None
    """Post-training quantization of a float checkpoint: calibrate the int8 activation ranges
    on this many full training batches (with --int8)."""
    calibration: str = "minmax"
    """How --calibrate sets the ranges: minmax (running min/max), percentile:P (e.g.
    percentile:99.99) or mse (least squared quantisation error)."""
    act_symmetric: bool = False
    """With --calibrate: symmetric int8 activations (zero point 0)."""
    weight_granularity: Literal["channel", "tensor"] = "channel"
    """With --calibrate: Dense and LSTM weight scales per output channel, or per tensor."""
    stacked_scales: Literal["channel", "variable"] = "channel"
    """With --calibrate: stacked GRN weight scales per (variable, channel), or per variable."""


COMMAND_LINE = CommandLine(
    "python -m tftjax.evaluate", first_paragraph(__doc__), {"options": EvaluateOptions}
)


def run(argv: list[str] | None = None) -> int:
    from tftjax.serving.saved import evaluate_checkpoint

    args = COMMAND_LINE.parse(argv).options(EvaluateOptions)
    if args.calibrate is not None and args.calibrate < 1:
        raise ConfigError(f"--calibrate must be >= 1 batch, got {args.calibrate}")
    evaluate_checkpoint(
        args.checkpoint,
        data_files(args.parquet_file, args.dataset),
        args.split,
        int8=args.int8,
        calibrate_batches=args.calibrate or 0,
        unknown=args.unknown_instrument,
        instrument=args.instrument,
        calibration=args.calibration,
        quant_options=quant_options(
            args.act_symmetric, args.weight_granularity, args.stacked_scales
        ),
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
