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

import json

from tftjax.cli import data_files, first_paragraph, run_folder, tft_command_line, tft_configs
from tftjax.cli import main as cli_main
from tftjax.cli.options import TuneOptions
from tftjax.config import ConfigError
from tftjax.training.search import (
    SPACE,
    data_digest,
    format_trials,
    start_search,
    suggest,
    tune,
)

__all__ = ["SPACE", "format_trials", "main", "run", "suggest", "tune"]
TRAIN_DEFAULTS = {"epochs": 8, "patience": 2}


COMMAND_LINE = tft_command_line(
    "python -m tftjax.tune", first_paragraph(__doc__), TuneOptions, "small", TRAIN_DEFAULTS
)


def run(argv: list[str] | None = None) -> int:
    parsed = COMMAND_LINE.parse(argv)
    opts = parsed.options(TuneOptions)
    if opts.trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {opts.trials}")
    cfg, tc = tft_configs(parsed, opts.preset, train_defaults=TRAIN_DEFAULTS, settings=opts.config)
    workdir = run_folder(opts.workdir, "runs/tune", False)
    paths = data_files(opts.parquet_file, opts.dataset)
    search = {
        "model": cfg.to_json(),
        "train": tc.to_json(),
        "data": data_digest(paths),
        "sampler_seed": opts.sampler_seed,
    }
    journal = start_search(workdir, search, opts.resume)
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
    settings = out["settings"]
    # the inputs the trials trained on: --config best.json trains on them again
    settings["model"] = {**own_inputs(cfg), **settings["model"]}
    best = {
        **settings,
        "tuned": {
            "trials": opts.trials,
            "sampler_seed": opts.sampler_seed,
            "objective": "best validation loss",
            "covariates": out["covariates"],
        },
    }
    (workdir / "best.json").write_text(json.dumps(best, indent=1))
    print(format_trials(out))
    print(
        f"wrote {workdir / 'best.json'} (python -m tftjax.train --config {workdir / 'best.json'})"
    )
    return 0


def own_inputs(cfg) -> dict:
    """The settings of your own columns that ``cfg`` sets (their names, roles, categories)."""
    d, default = cfg.data, type(cfg.data)()
    names = ("observed", "known", "static", "categorical")
    out = {k: list(getattr(d, k)) for k in names if getattr(d, k)}
    for k in ("static_file", "max_ffill", "max_categories", "season", "target_column",
              "target_transform", "inputs"):  # fmt: skip
        if getattr(d, k) != getattr(default, k):
            out[k] = getattr(d, k)
    return out


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


def main_exit() -> None:
    """The console script: :func:`main`, and the process ends with its exit code."""
    from tftjax.cli import exit as cli_exit

    cli_exit(main())


if __name__ == "__main__":
    main_exit()
