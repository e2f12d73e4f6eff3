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

from tftjax.cli import data_files, first_paragraph, run_folder, tft_command_line, tft_configs
from tftjax.cli import main as cli_main
from tftjax.config import ConfigError, TFTConfig
from tftjax.config.presets import PresetName
from tftjax.runner.resume import identity_diff
from tftjax.training.search import SPACE, format_trials, suggest, tune

__all__ = ["SPACE", "format_trials", "main", "run", "suggest", "tune"]
TRAIN_DEFAULTS = {"epochs": 8, "patience": 2}


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    """The search: its data, where it starts from, how many trials."""

    parquet_file: tuple[Path, ...] = ()
    """OHLCV bars (one file, several, or a long file); default: the bundled ES bars."""
    dataset: str | None = None
    """Bundled sets instead of --parquet-file, comma-separated (es, spx, nasdaq, btc; the
    us-daily panel from a clone's data/ folder)."""
    preset: PresetName = "small"
    """The model the search starts from (the searched fields are drawn, the rest kept)."""
    config: Path | None = None
    """A settings file (e.g. an earlier best.json) applied before the flags."""
    trials: int = 20
    """Trials to run (at least 1)."""
    sampler_seed: int = 0
    """The TPE sampler's seed (the drawn settings are reproducible from it; --seed is each
    trial's training seed)."""
    workdir: Path | None = None
    """Trials' runs (trial_000 …), trials.json and best.json (default: a new
    runs/tune/run_NNN)."""
    resume: bool = False
    """Go on with the search stopped in --workdir (its study.journal): run the trials left
    of --trials, with the settings it was started with."""
    progress: bool = True
    """Show the progress bars (--no-progress hides them)."""
    tensorboard: bool = True
    """Write a TensorBoard log per trial (RUN/tensorboard)."""


COMMAND_LINE = tft_command_line(
    "python -m tftjax.tune", first_paragraph(__doc__), TuneOptions, "small", TRAIN_DEFAULTS
)


def data_digest(paths) -> list[str]:
    """The bars a search reads, by content (sha256; a missing file by its name: reading it
    fails with one line later): a resume that would read other bars is refused, under any
    path spelling."""
    from tftjax.data import default_parquet
    from tftjax.data.identity import file_sha256

    files = (
        [default_parquet()]
        if paths is None
        else list(paths)
        if isinstance(paths, (list, tuple))
        else [paths]
    )
    return [file_sha256(p) if Path(p).is_file() else str(p) for p in files]


def run(argv: list[str] | None = None) -> int:
    parsed = COMMAND_LINE.parse(argv)
    opts = parsed.options(TuneOptions)
    if opts.trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {opts.trials}")
    cfg, tc = tft_configs(parsed, opts.preset, train_defaults=TRAIN_DEFAULTS, settings=opts.config)
    workdir = run_folder(opts.workdir, "runs/tune", False)
    journal, started = workdir / "study.journal", workdir / "search.json"
    paths = data_files(opts.parquet_file, opts.dataset)
    search = json.loads(
        json.dumps(
            {
                "model": cfg.to_json(),
                "train": tc.to_json(),
                "data": data_digest(paths),
                "sampler_seed": opts.sampler_seed,
            },
            default=str,
        )
    )
    if opts.resume:
        if not journal.is_file() or not started.is_file():
            raise ConfigError(
                f"--resume: {workdir} holds no search to go on with "
                f"(no study.journal and search.json)"
            )
        was = json.loads(started.read_text())
        was["model"] = TFTConfig.from_json(was["model"]).to_json()  # any schema
        changed = [
            path.split(":")[0].rsplit(".", 1)[-1]  # a field's name, as its flag
            for path in identity_diff(was, search)
        ]
        if changed:
            raise ConfigError(
                f"--resume: {', '.join(changed)} differ from the search started in "
                f"{workdir}; give the same settings, or a new --workdir"
            )
    elif workdir.exists() and any(p != started for p in workdir.iterdir()):
        raise ConfigError(
            f"--workdir {workdir} is not empty; choose a new folder, or "
            f"--resume to go on with its search"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    if not opts.resume:
        started.write_text(json.dumps(search, indent=1))
    out = tune(
        cfg,
        tc,
        paths,
        workdir,
        opts.trials,
        opts.sampler_seed,
        progress=opts.progress,
        journal=journal,
        tensorboard=opts.tensorboard,
    )
    (workdir / "trials.json").write_text(json.dumps(out, indent=1))
    best = {
        **out["settings"],
        "tuned": {
            "trials": opts.trials,
            "sampler_seed": opts.sampler_seed,
            "objective": "best validation loss",
        },
    }
    (workdir / "best.json").write_text(json.dumps(best, indent=1))
    print(format_trials(out))
    print(
        f"wrote {workdir / 'best.json'} (python -m tftjax.train --config {workdir / 'best.json'})"
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
