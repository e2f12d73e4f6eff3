"""``python -m tftjax.dqn``: train a DQN trader on parquet bars (or verify on CartPole).

Examples:
  python -m tftjax.dqn --epochs 100
  python -m tftjax.dqn --parquet-file bars.parquet --cost-bps 0.5 --workdir runs/dqn-btc
  python -m tftjax.dqn --resume --workdir runs/dqn --epochs 150
  python -m tftjax.dqn --env cartpole --workdir runs/cartpole
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Literal

import tyro

from tftjax.config import DQN_PRESETS


@dataclasses.dataclass
class Args:
    """Train a DQN trader on OHLCV bars (default: the bundled ES 1-minute bars)."""

    epochs: int = 100
    """Epochs; one epoch = as many env steps as the training split has bars."""
    parquet_file: Path | None = None
    """OHLCV bars (columns ts/timestamp/date, open, high, low, close, volume)."""
    env: Literal["trading", "cartpole"] = "trading"
    """trading: the bars; cartpole: gymnax CartPole-v1 through the same agent and loop."""
    patience: int = 10
    """Early stop after this many epochs without a better validation Sharpe (CartPole:
    greedy return); 0: off."""
    seed: int | None = None
    """Init, exploration and episode sampling (default 0; on --resume: the checkpoint's)."""
    workdir: Path = Path("runs/dqn")
    """Checkpoints, metrics.jsonl, summary.json and plots go here."""
    resume: bool = False
    """Continue from the latest complete checkpoint in --workdir (agent, buffer, ε, RNG)."""
    cost_bps: float | None = None
    """Transaction cost in basis points per unit of position change (default 1)."""
    num_envs: int | None = None
    """Parallel episodes (default 8; CartPole 16)."""
    window: int | None = None
    """Bars in one observation (default 16)."""
    episode_len: int | None = None
    """Decisions per training episode (default 256)."""
    steps_per_epoch: int | None = None
    """Env steps per epoch (default: the training split's length; CartPole 10,000)."""
    learning_rate: float | None = None
    batch_size: int | None = None
    gamma: float | None = None
    hidden: tuple[int, ...] | None = None
    """Q-network hidden sizes, e.g. --hidden 128 128."""
    no_progress: bool = False
    """Hide the progress bar."""


def fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


_OVERRIDES = ("seed", "cost_bps", "num_envs", "window", "episode_len", "steps_per_epoch",
              "learning_rate", "batch_size", "gamma", "hidden")


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, prog="python -m tftjax.dqn")
    from tftjax.data import DataError
    from tftjax.dqn.train import ConfigError, TrainingDiverged, run

    if args.parquet_file is not None and args.env == "cartpole":
        return fail("--parquet-file is for --env trading; CartPole has no bars")
    given = {k: getattr(args, k) for k in _OVERRIDES if getattr(args, k) is not None}
    try:
        base = DQN_PRESETS[args.env]
        cfg = dataclasses.replace(base, epochs=args.epochs, **given)
    except ValueError as e:
        return fail(str(e))
    try:
        run(cfg, args.workdir, parquet_file=args.parquet_file, resume=args.resume,
            patience=args.patience, progress=not args.no_progress,
            explicit=set(given) | {"env"})
    except (DataError, ConfigError) as e:
        return fail(str(e))
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
