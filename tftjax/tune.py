"""``python -m tftjax.tune``: hyperparameters searched on the validation windows (Optuna).

    python -m tftjax.tune --dataset btc --preset small --trials 20
    python -m tftjax.train --dataset btc --config runs/tune/run_001/best.json

Each trial trains a model with settings drawn by Optuna's TPE sampler (``--sampler-seed``) -- learning
rate, dropout, weight decay and hidden size -- on the training windows, reports its
validation loss after every epoch, and is pruned when that falls behind the median of the
earlier trials at the same epoch (``MedianPruner``). A trial's value is its best validation
loss (early stopping on validation, as in training). **The test windows are never read.**
The best trial's settings go to ``WORKDIR/best.json``, which ``tftjax.train --config`` and
``tftjax.backtest --config`` accept (flags given after it still win); every trial is in
``WORKDIR/trials.json`` and printed as a table. Needs the ``tune`` extra (``optuna``).

The study is kept in ``WORKDIR/study.journal`` (Optuna's journal file) and the settings it
started with in ``WORKDIR/search.json``: a search stopped part way (a closed laptop, a lost
job) goes on with ``--resume`` and the same flags, up to ``--trials`` in all; a trial cut
off mid-run counts as failed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal

from tftjax.cli import data_files, parse, peek, run_folder, with_config
from tftjax.cli import main as cli_main
from tftjax.config import ConfigError, TFTConfig, TrainConfig, preset, preset_training
from tftjax.training.search import SPACE, format_trials, suggest, tune

__all__ = ["SPACE", "format_trials", "main", "run", "suggest", "tune"]

@dataclasses.dataclass
class Args:
    """Search learning rate, dropout, weight decay and hidden size on validation windows."""

    model: TFTConfig
    train: TrainConfig
    parquet_file: tuple[Path, ...] = ()
    """OHLCV bars (one file, several, or a long file); default: the bundled ES bars."""
    dataset: str | None = None
    """Bundled sets instead of --parquet-file, comma-separated (es, spx, nasdaq, btc; the
    us-daily panel from a clone's data/ folder)."""
    preset: Literal["tft225", "small", "tiny", "compact"] = "small"
    """The model the search starts from (the searched fields are drawn, the rest kept)."""
    config: Path | None = None
    """A settings file (e.g. an earlier best.json) applied before the flags."""
    trials: int = 20
    """Trials to run (at least 1)."""
    sampler_seed: int = 0
    """The TPE sampler's seed (the drawn settings are reproducible from it; --seed is each
    trial's training seed)."""
    remat: str = "full"
    workdir: Path = Path("runs/tune/run_001")
    """Trials' runs (trial_000 …), trials.json and best.json (default: a new
    runs/tune/run_NNN)."""
    resume: bool = False
    """Go on with the search stopped in --workdir (its study.journal): run the trials left
    of --trials, with the settings it was started with."""
    no_progress: bool = False
    no_tensorboard: bool = False
    """Write no TensorBoard log (RUN/tensorboard: each epoch's numbers, the config, the
    plots; tensorboard --logdir runs/ shows every run)."""


def defaults(argv: list[str] | None) -> Args:
    pre = peek(argv, preset=None, workdir=None)
    from tftjax.config import PRESETS

    name = pre.preset if pre.preset in PRESETS else "small"
    model, train = with_config(argv, preset(name), preset_training(name, epochs=8, patience=2))
    return Args(model=model, train=train, preset=name,
                workdir=run_folder(pre.workdir, "runs/tune", False))


def data_digest(paths) -> list[str]:
    """The bars a search reads, by content (sha256; a missing file by its name: reading it
    fails with one line later): a resume that would read other bars is refused, under any
    path spelling."""
    from tftjax.data import default_parquet
    from tftjax.data.identity import file_sha256

    files = [default_parquet()] if paths is None else list(paths) if isinstance(
        paths, (list, tuple)) else [paths]
    return [file_sha256(p) if Path(p).is_file() else str(p) for p in files]


def flat(d: dict) -> dict:
    """``{"model": {"hidden": 32}}`` → ``{"model.hidden": 32}``."""
    return {f"{sec}.{k}" if isinstance(v, dict) else sec: (v[k] if isinstance(v, dict) else v)
            for sec, v in d.items() for k in (v if isinstance(v, dict) else [None])}


def run(argv: list[str] | None = None) -> int:
    args = parse(Args, argv, defaults(argv), "python -m tftjax.tune", __doc__.split("\n\n")[0])
    if args.trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {args.trials}")
    from tftjax.remat import TIERS

    if args.remat not in TIERS:
        raise ConfigError(f"--remat {args.remat!r} is not a tier; choose one of: {', '.join(TIERS)}")
    journal, started = args.workdir / "study.journal", args.workdir / "search.json"
    cfg = dataclasses.replace(args.model, remat=args.remat)
    paths = data_files(args.parquet_file, args.dataset)
    search = json.loads(json.dumps({"model": dataclasses.asdict(cfg),
                                    "train": dataclasses.asdict(args.train),
                                    "data": data_digest(paths),
                                    "sampler_seed": args.sampler_seed}, default=str))
    if args.resume:
        if not journal.is_file() or not started.is_file():
            raise ConfigError(f"--resume: {args.workdir} holds no search to go on with "
                              f"(no study.journal and search.json)")
        was, now = flat(json.loads(started.read_text())), flat(search)
        changed = [k for k in now if was.get(k) != now[k]]
        if changed:
            raise ConfigError(f"--resume: {', '.join(changed)} differ from the search started in "
                              f"{args.workdir}; give the same settings, or a new --workdir")
    elif args.workdir.exists() and any(p != started for p in args.workdir.iterdir()):
        raise ConfigError(f"--workdir {args.workdir} is not empty; choose a new folder, or "
                          f"--resume to go on with its search")
    args.workdir.mkdir(parents=True, exist_ok=True)
    if not args.resume:
        started.write_text(json.dumps(search, indent=1))
    out = tune(cfg, args.train, paths, args.workdir, args.trials, args.sampler_seed,
               progress=not args.no_progress, journal=journal,
               tensorboard=not args.no_tensorboard)
    (args.workdir / "trials.json").write_text(json.dumps(out, indent=1))
    best = {**out["settings"], "tuned": {"trials": args.trials, "sampler_seed": args.sampler_seed,
                                         "objective": "best validation loss"}}
    (args.workdir / "best.json").write_text(json.dumps(best, indent=1))
    print(format_trials(out))
    print(f"wrote {args.workdir / 'best.json'} (python -m tftjax.train --config "
          f"{args.workdir / 'best.json'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit

    cli_exit(main())
