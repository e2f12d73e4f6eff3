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

from tftjax.cli import CommandLine, data_files, first_paragraph, quant_options
from tftjax.cli import main as cli_main
from tftjax.cli.options import EvaluateOptions
from tftjax.errors import ConfigError

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
