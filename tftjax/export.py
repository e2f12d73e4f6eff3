"""``python -m tftjax.export --checkpoint DIR --out DIR``: a TFT's weights as safetensors
(float32, and int8 for a ``--qat`` checkpoint or a float one with ``--calibrate N``), its
config and a few sample windows: :mod:`tftjax.serving.export` writes them, and
``docs/int8_format.md`` says what each file holds."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from tftjax.cli import CommandLine, first_paragraph, quant_options
from tftjax.cli import main as cli_main
from tftjax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """Export a TFT checkpoint's weights (float32 and int8) as safetensors plus its config."""

    checkpoint: Path
    """A checkpoint directory or a run folder (its final checkpoint)."""
    out: Path
    """Folder to write (must not exist or be empty)."""
    calibrate: int | None = None
    """For a float checkpoint: calibrate the int8 activation ranges on this many full training
    batches (post-training quantization) and export int8 too; default: float32 only."""
    calibration: str = "minmax"
    """How --calibrate sets the ranges: minmax, percentile:P or mse."""
    act_symmetric: bool = False
    """With --calibrate: symmetric int8 activations (zero point 0)."""
    weight_granularity: Literal["channel", "tensor"] = "channel"
    """With --calibrate: Dense and LSTM weight scales per output channel, or per tensor."""
    stacked_scales: Literal["channel", "variable"] = "channel"
    """With --calibrate: stacked GRN weight scales per (variable, channel), or per variable."""
    samples: int = 8
    """int8 exports: how many test windows samples.safetensors holds, with tftjax's int8
    outputs for them (what another runtime checks its rebuild against)."""


COMMAND_LINE = CommandLine(
    "python -m tftjax.export", first_paragraph(__doc__), {"options": ExportOptions}
)


def run(argv: list[str] | None = None) -> int:
    from tftjax.serving.export import export

    args = COMMAND_LINE.parse(argv).options(ExportOptions)
    if args.calibrate is not None and args.calibrate < 1:
        raise ConfigError(f"--calibrate must be >= 1 batch, got {args.calibrate}")
    export(
        args.checkpoint,
        args.out,
        calibrate_batches=args.calibrate or 0,
        calibration=args.calibration,
        quant_options=quant_options(
            args.act_symmetric, args.weight_granularity, args.stacked_scales
        ),
        sample_windows=args.samples,
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
