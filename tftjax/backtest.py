"""``python -m tftjax.backtest``: walk-forward evaluation of the TFT against the baselines.

    python -m tftjax.backtest --dataset spx --preset small --folds 5
    python -m tftjax.backtest --dataset btc --folds 6 --test-fraction 0.5 --epochs 30

Each fold trains a model from scratch on every bar before its validation stretch, chooses
its baseline there, and scores its own test stretch once (:mod:`tftjax.training.walkforward`);
:mod:`tftjax.stats.verdict` pools the folds: q-risk, coverage and calibration with bootstrap
intervals, Diebold-Mariano with Holm, and a verdict per row (beats, level or behind).
``--plot`` draws the TFT's PIT histogram. Written to ``WORKDIR/backtest.json``; the table is
printed.
"""

from __future__ import annotations

import json

from tftjax.cli import data_files, first_paragraph, run_folder, tft_command_line, tft_configs
from tftjax.cli import main as cli_main
from tftjax.cli.options import BacktestOptions
from tftjax.training.preregistration import settings_of
from tftjax.training.walkforward import WalkForward, backtest, claim_workdir, format_table

TRAIN_DEFAULTS = {"epochs": 30, "patience": 3}


COMMAND_LINE = tft_command_line(
    "python -m tftjax.backtest", first_paragraph(__doc__), BacktestOptions, "small", TRAIN_DEFAULTS
)


def run(argv: list[str] | None = None) -> int:
    parsed = COMMAND_LINE.parse(argv)
    opts = parsed.options(BacktestOptions)
    cfg, tc = tft_configs(
        parsed, opts.preset, train_defaults=TRAIN_DEFAULTS, settings=opts.config, anchor_auto=True
    )
    workdir = run_folder(opts.workdir, "runs/backtest", False)
    plan = WalkForward(
        opts.folds,
        opts.test_fraction,
        opts.bootstrap,
        opts.tune_trials,
        opts.tune_epochs,
        opts.baseline_pairs,
    )
    settings = settings_of(cfg.model, cfg.head, cfg.quant, cfg.execution, cfg.data, tc, opts)
    prereg = preregistered(opts, settings)  # before any fold trains
    files = data_files(opts.parquet_file, opts.dataset)
    record = claim_workdir(workdir, settings, files, opts.resume)
    out = backtest(
        cfg,
        tc,
        files,
        workdir,
        plan,
        progress=opts.progress,
        tensorboard=opts.tensorboard,
        resume=opts.resume,
        record=record,
    )
    tuned = "in each fold" if opts.tune_trials else "once (--config)" if opts.config else "no"
    out["settings"] = {
        "preset": opts.preset,
        "config": str(opts.config) if opts.config else None,
        "tuned": tuned,
        "tune_trials": opts.tune_trials,
    }
    if prereg:
        out["preregistration"] = prereg
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "backtest.json").write_text(json.dumps(out, indent=1))
    print(
        f"settings tuned inside each fold ({opts.tune_trials} trials on its training and "
        "validation stretches)"
        if opts.tune_trials
        else "settings tuned on validation (--config " + str(opts.config) + ")"
        if opts.config
        else f"settings: the {opts.preset} preset as given (not tuned)"
    )
    print(format_table(out))
    if opts.plot:
        from tftjax.plots import pit_histogram

        pit_histogram(
            workdir / "pit.png", out["pooled"]["tft"]["calibration"]["pit"], cfg.head.quantiles
        )
    print(f"wrote {workdir / 'backtest.json'}")
    return 0


def preregistered(opts: BacktestOptions, settings: dict) -> dict | None:
    """The recipe's stamp for ``backtest.json``, or None (no ``--preregistered``).

    Raises:
      ConfigError: the run is not the recipe."""
    if opts.preregistered is None:
        return None
    from tftjax.training import preregistration as pr

    recipe = pr.read_recipe(opts.preregistered)
    pr.check(recipe, settings, opts.preregistered)
    return pr.stamp(recipe, opts.preregistered)


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


def main_exit() -> None:
    """The console script: :func:`main`, and the process ends with its exit code."""
    from tftjax.cli import exit as cli_exit

    cli_exit(main())


if __name__ == "__main__":
    main_exit()
