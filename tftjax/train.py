"""``python -m tftjax.train``: train a TFT on parquet OHLCV bars.

Examples:
  python -m tftjax.train --epochs 3
  python -m tftjax.train --preset tiny --epochs 1 --workdir runs/tiny
  python -m tftjax.train --resume --workdir runs/tft
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Literal

import tyro

from tftjax.config import PRESETS, preset
from tftjax.remat import AUTO, CHOICES


@dataclasses.dataclass
class Args:
    """Train a Temporal Fusion Transformer on OHLCV bars (default: the bundled ES 1-minute bars)."""

    parquet_file: Path | None = None
    """OHLCV bars (columns ts/timestamp/date, open, high, low, close, volume)."""
    epochs: int = 10
    batch_size: int = 64
    learning_rate: float = 1e-3
    preset: Literal["tft225", "tiny"] = "tft225"
    hidden_size: int | None = None
    """Override the preset's hidden size d."""
    seed: int = 0
    workdir: Path = Path("runs/tft")
    """Checkpoints, metrics.jsonl, summary.json and plots go here."""
    patience: int = 5
    """Early stop after this many epochs without a better validation loss (0: off)."""
    resume: bool = False
    """Continue from the latest complete checkpoint in --workdir."""
    max_steps_per_epoch: int | None = None
    remat: str = "off"
    """Rematerialisation tier: off, minimal, aggressive, full, offload, or auto (with
    --memory-budget) -- see tftjax.remat."""
    memory_budget: str | None = None
    """Device memory budget for --remat auto, e.g. 24GB or 16GiB."""
    profile: Path | None = None
    """Write a jax.profiler trace of a few steps here (TensorBoard / XProf)."""
    no_progress: bool = False
    """Hide the per-epoch progress bar."""


def fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, prog="python -m tftjax.train")
    from tftjax.data import DataError

    if args.remat not in CHOICES:
        return fail(f"--remat {args.remat!r} is not a tier; choose one of: {', '.join(CHOICES)}")
    if args.remat == AUTO and not args.memory_budget:
        return fail("--remat auto needs --memory-budget (e.g. --memory-budget 24GB)")
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            return fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.learning_rate <= 0:
        return fail(f"--learning-rate must be > 0, got {args.learning_rate}")
    if args.max_steps_per_epoch is not None and args.max_steps_per_epoch < 1:
        return fail("--max-steps-per-epoch must be >= 1")
    if args.preset not in PRESETS:
        return fail(f"--preset must be one of {', '.join(PRESETS)}")
    overrides = {"remat": "off" if args.remat == AUTO else args.remat}
    if args.hidden_size is not None:
        overrides["hidden"] = args.hidden_size
    try:
        cfg = preset(args.preset, **overrides)
    except ValueError as e:
        return fail(str(e))

    from tftjax.train_lib import ConfigError, TrainConfig, TrainingDiverged, train_and_evaluate

    if args.remat == AUTO:
        from tftjax.data import default_parquet, read_bars
        from tftjax.memory import parse_bytes, plan_auto

        try:
            budget = parse_bytes(args.memory_budget)
        except ValueError:
            return fail(f"--memory-budget {args.memory_budget!r} is not a size like 24GB")
        try:
            rows = len(read_bars(args.parquet_file or default_parquet()))
            tier, batch = plan_auto(cfg, budget, args.batch_size, rows)
        except (DataError, ValueError) as e:
            return fail(str(e))
        cfg = dataclasses.replace(cfg, remat=tier)
        args.batch_size = batch
    tc = TrainConfig(epochs=args.epochs, batch_size=args.batch_size,
                     learning_rate=args.learning_rate, seed=args.seed, patience=args.patience,
                     max_steps_per_epoch=args.max_steps_per_epoch, resume=args.resume,
                     profile_dir=str(args.profile) if args.profile else None,
                     progress=not args.no_progress)
    try:
        train_and_evaluate(cfg, tc, args.workdir, parquet_file=args.parquet_file)
    except (DataError, ConfigError) as e:
        return fail(str(e))
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.profile:
        print(f"profile trace written under {args.profile} (open with TensorBoard/XProf)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
