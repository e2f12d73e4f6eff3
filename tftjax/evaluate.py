"""``python -m tftjax.evaluate --checkpoint DIR``: test metrics of a saved TFT.

Restores the weights, model config and feature statistics saved in DIR (an
epoch or final checkpoint) and prints loss and q-risk on a split beside the
naive baselines. The data is the file the run was trained on, found relative
to the run folder or at its recorded path and checked against its content
hash (a missing or changed file is refused); ``--parquet-file`` evaluates on
another file on purpose, with the training statistics.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Literal

from tftjax.cli import main as cli_main


@dataclasses.dataclass
class Args:
    """Evaluate a TFT checkpoint on the test split."""

    checkpoint: Path
    """A checkpoint directory, e.g. runs/tft/checkpoints/tft_final_epoch10."""
    parquet_file: Path | None = None
    """Evaluate on this file instead of the training data (with the training statistics)."""
    split: Literal["train", "val", "test"] = "test"


def run(argv: list[str] | None = None) -> int:
    import tyro

    args = tyro.cli(Args, args=argv, prog="python -m tftjax.evaluate")
    from tftjax.train_lib import evaluate_checkpoint

    evaluate_checkpoint(args.checkpoint, args.parquet_file, args.split)
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
