"""``python -m tftjax.dqn``: train a DQN trader on parquet bars (or verify on CartPole).

Examples:
  python -m tftjax.dqn --epochs 100
  python -m tftjax.dqn --dataset btc --calendar 24/7 --workdir runs/dqn-btc
  python -m tftjax.dqn --parquet-file bars.parquet --spread-bps 2 --fee-bps 0.5 --latency 1
  python -m tftjax.dqn --resume --workdir runs/dqn --epochs 150
  python -m tftjax.dqn --dataset spx --calendar XNYS --seeds 5
  python -m tftjax.dqn --dataset btc --calendar 24/7 --seeds 5 --folds 5
  python -m tftjax.dqn --env cartpole --workdir runs/cartpole

The flags are the fields of :class:`~tftjax.config.DQNConfig` (defaults: the
``--env``'s preset) plus the run options below. With ``--resume`` the
defaults are the checkpoint's own settings and data file: a flag that
contradicts them is refused (only ``--epochs`` may grow).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from tftjax.cli import CommandLine, Parsed, data_file, first_paragraph, run_folder
from tftjax.cli import main as cli_main
from tftjax.cli.options import ResumeFlag, resume_mode
from tftjax.dqn.config import DQN_PRESETS, DQNConfig


@dataclasses.dataclass(frozen=True)
class DQNOptions:
    """Train a DQN trader on OHLCV bars (default: the bundled ES 1-minute bars)."""

    parquet_file: Path | None = None
    """OHLCV bars for --env trading (default: the bundled ES bars, or with --resume the file
    the run was trained on)."""
    dataset: Literal["es", "spx", "nasdaq", "btc"] | None = None
    """A bundled set instead of --parquet-file: es, spx, nasdaq or btc (tftjax/data/bundled/SOURCES.md)."""
    workdir: Path | None = None
    """Checkpoints, metrics.jsonl, summary.json and plots go here (default: a new
    runs/dqn/run_NNN; with --resume, the newest of them)."""
    resume: ResumeFlag = dataclasses.field(default="no", metadata={"bare": "yes"})
    """--resume: continue the latest complete checkpoint in --workdir (agent, buffer, ε, RNG)
    with its own settings and data; refused where there is none. --resume auto: the same
    where one exists, else a fresh run (for restart scripts: a signal saves at the end of
    the epoch in flight and exits 75)."""
    seeds: int = 1
    """Train this many agents (seeds --seed, --seed+1, …) in one vmapped program and report
    per seed and mean ± sd (Sharpe with its SE and PSR, costs, beats-flat counts); every seed
    trains every epoch. Not with --resume."""
    folds: int = 0
    """Walk-forward (>= 2): K consecutive test stretches in the last --test-fraction of the
    bars, each fold trained from scratch before its own validation stretch (--seeds agents),
    the out-of-sample trades stitched (0: one train/val/test split)."""
    test_fraction: float = 0.4
    """Share of the bars cut into the walk-forward's test stretches."""
    progress: bool = True
    """Show the progress bar over epochs (--no-progress hides it)."""
    tensorboard: bool = True
    """Write a TensorBoard log (RUN/tensorboard: each epoch's numbers, the config, the plots;
    tensorboard --logdir runs/ shows every run)."""


COMMAND_LINE = CommandLine(
    "python -m tftjax.dqn",
    first_paragraph(__doc__),
    {"config": DQNConfig, "options": DQNOptions},
    {"config": DQN_PRESETS["trading"], "options": DQNOptions()},
)


def configs(parsed: Parsed) -> tuple[DQNConfig, DQNOptions]:
    """The ``--env`` preset, or on ``--resume`` the checkpoint's settings (unless another
    ``--env`` is given), with the flags given on top."""
    from tftjax.runner.resume import latest_meta, wants_checkpoint

    opts = parsed.options(DQNOptions)
    workdir = run_folder(opts.workdir, "runs/dqn", resume_mode(opts.resume))
    env = parsed.part("config").get("env")
    cfg = DQN_PRESETS.get(env or "trading", DQN_PRESETS["trading"])
    if wants_checkpoint(resume_mode(opts.resume), workdir / "checkpoints"):
        saved = latest_meta(workdir / "checkpoints", "dqn")
        was = DQNConfig.from_json(saved["identity"]["config"])
        if env in (None, was.env):
            cfg = was
    return (
        dataclasses.replace(cfg, **parsed.part("config")),
        dataclasses.replace(opts, workdir=workdir),
    )


def run(argv: list[str] | None = None) -> int:
    cfg, args = configs(COMMAND_LINE.parse(argv))
    assert args.workdir is not None  # configs() chose the run folder
    from tftjax.config import ConfigError
    from tftjax.dqn.loop import run as train

    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    if args.folds:
        if args.resume != "no":
            raise ConfigError("--folds trains afresh; --resume is for one run")
        from tftjax.dqn.walkforward import walk_forward

        walk_forward(
            cfg,
            args.seeds,
            data_file(args.parquet_file, args.dataset),
            args.workdir,
            args.folds,
            args.test_fraction,
        )
        return 0
    if args.seeds > 1:
        if args.resume != "no":
            raise ConfigError("--seeds N trains afresh (one program); --resume is for one seed")
        from tftjax.dqn.seeds import run_seeds

        run_seeds(cfg, args.seeds, args.workdir, data_file(args.parquet_file, args.dataset))
        return 0
    train(
        cfg,
        args.workdir,
        parquet_file=data_file(args.parquet_file, args.dataset),
        resume=resume_mode(args.resume),
        progress=args.progress,
        tensorboard=args.tensorboard,
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
