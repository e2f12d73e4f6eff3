"""``python -m tftjax.export --checkpoint DIR --out DIR``: a TFT's weights as safetensors
(float32, and int8 for a ``--qat`` checkpoint or a float one with ``--calibrate N``), its
config and a few sample windows: :mod:`tftjax.serving.export` writes them, and
``docs/int8_format.md`` says what each file holds."""

from __future__ import annotations

from tftjax.cli import CommandLine, first_paragraph, quant_options
from tftjax.cli import main as cli_main
from tftjax.cli.options import ExportOptions
from tftjax.errors import ConfigError

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
