"""``python -m tftjax.backtest``: walk-forward evaluation of the TFT against the baselines.

    python -m tftjax.backtest --dataset spx --preset small --folds 5
    python -m tftjax.backtest --dataset btc --folds 6 --test-fraction 0.5 --epochs 30

``--folds`` expanding-window folds (:func:`tftjax.data.windows.walk_forward_times`): each
fold trains a model **from scratch** on every bar before its validation stretch (feature
statistics fitted on those rows), early-stops on its own validation stretch (the best
epoch's weights), and scores its own test stretch once. The folds' test targets tile the
test region without overlap, and the forecasts are stitched across folds. Each fold chooses
its baseline on **its own validation stretch**, and the picks are stitched into the
forecast the TFT must beat; nothing is chosen on test.

Reported (:mod:`tftjax.verdict`), pooled over folds for the TFT, every baseline and the
stitched choice alike: P50/P90 q-risk and 10-90% coverage with 95% circular-block-bootstrap
intervals, CRPS, the 80% interval score, per-quantile hit rates with Kupiec and
Christoffersen tests, the crossing rate and the PIT counts; the TFT against each of them by
Diebold–Mariano on the P90 pinball loss (Holm-adjusted) and on the mean quantile loss, with
a bandwidth never shorter than the Politis–White block, and a paired bootstrap interval of
the P90 difference; and the verdict: beats, level or behind. ``--plot`` draws the TFT's PIT
histogram. Written to ``WORKDIR/backtest.json``; the table is printed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal

import numpy as np

from tftjax.cli import data_files, run_folder, tft_command_line, tft_configs
from tftjax.cli import main as cli_main
from tftjax.config import ConfigError, TFTConfig, TrainConfig
from tftjax.config.presets import PresetName

TRAIN_DEFAULTS = {"epochs": 30, "patience": 3}


@dataclasses.dataclass(frozen=True)
class BacktestOptions:
    """The walk-forward: its data, folds, tuning and outputs."""

    parquet_file: tuple[Path, ...] = ()
    """OHLCV bars (one file, several, or a long file); default: the bundled ES bars."""
    dataset: str | None = None
    """Bundled sets instead of --parquet-file, comma-separated (spx, nasdaq, btc, es; the
    us-daily panel from a clone's data/ folder)."""
    preset: PresetName = "small"
    """The model, how it runs and trains (tftjax.config.presets): small (d=32), compact (d=16,
    anchored, with --ema 0.9, 4 checks an epoch, --smooth 3, batch 32), tft225, tiny; the
    flags override single fields."""
    config: Path | None = None
    """A settings file (python -m tftjax.tune's best.json) applied over the preset; flags
    still win. The table then says the settings were tuned (once, not inside each fold)."""
    tune_trials: int = 0
    """Tune inside each fold: that many Optuna trials (python -m tftjax.tune's search) on the
    fold's own training and validation stretches before its training (0: no tuning)."""
    tune_epochs: int = 8
    """Epochs of each tuning trial (patience 2, median pruning)."""
    folds: int = 5
    """Walk-forward folds (at least 2)."""
    test_fraction: float = 0.4
    """Share of the bar times (after warm-up) cut into the folds' test stretches."""
    workdir: Path | None = None
    """Each fold's run (fold_1 …) and backtest.json go here (default: a new
    runs/backtest/run_NNN)."""
    bootstrap: int = 2000
    """Circular block bootstrap resamples of the intervals (at least 1)."""
    plot: bool = False
    """Also draw the stitched forecasts' PIT histogram (WORKDIR/pit.png)."""
    progress: bool = True
    """Show the progress bars (--no-progress hides them)."""
    tensorboard: bool = True
    """Write a TensorBoard log per fold (RUN/tensorboard)."""


COMMAND_LINE = tft_command_line("python -m tftjax.backtest", __doc__.split("\n\n")[0],
                                BacktestOptions, "small", TRAIN_DEFAULTS)


def backtest(cfg: TFTConfig, tc: TrainConfig, paths, workdir: Path, folds: int = 5,
             test_fraction: float = 0.4, reps: int = 2000, progress: bool = False,
             log=print, tune_trials: int = 0, tune_epochs: int = 8, tune_fn=None,
             tensorboard: bool = True) -> dict:
    """Train and score every fold; the stitched comparison (see the module docstring).
    ``tune_trials``: before each fold's training, search its settings with that many
    :func:`tftjax.training.search.tune` trials on the fold's training and validation
    stretches (its test windows dropped from the search's dataset), then train the fold with
    the best."""
    from tftjax import scoring, verdict
    from tftjax.data import load_dataset, to_device
    from tftjax.data.bars import read_series
    from tftjax.data.windows import walk_forward_times
    from tftjax.training import Trainer, open_checkpoint, restore_checkpoint, train_and_evaluate
    from tftjax.training.anchoring import resolve_anchor
    from tftjax.training.evaluation import baselines_forecasts, window_targets

    if folds < 2:
        raise ConfigError(f"--folds must be >= 2 (a walk-forward needs several), got {folds}")
    if reps < 1:
        raise ConfigError(f"--bootstrap must be >= 1 resample, got {reps}")
    if not 0 < test_fraction < 1:
        raise ConfigError(f"--test-fraction must be in (0, 1), got {test_fraction}")
    if tune_trials < 0:
        raise ConfigError(f"--tune-trials must be >= 0 (0: no tuning), got {tune_trials}")
    if tune_trials:
        from tftjax.config import apply_settings
        from tftjax.training.search import tune

        tune_fn = tune_fn or tune
        tune_tc = dataclasses.replace(tc, epochs=tune_epochs, patience=min(tc.patience, 2))
    files = paths if isinstance(paths, list) else [paths] if paths is not None else None
    from tftjax.data import default_parquet

    files = files or [default_parquet()]
    ts = [b.ts for p in files for b in read_series(p)]
    times = walk_forward_times(ts, cfg.data, folds, test_fraction)
    qs = cfg.head.quantiles
    scored, fold_out, steps, by_series = [], [], {}, {}
    for k, fold in enumerate(times, 1):
        ds = load_dataset(files if len(files) > 1 else files[0], cfg.data, fold=fold)
        run = workdir / f"fold_{k}"
        fold_cfg, fold_tc, chosen = cfg, tc, None
        if tune_trials:  # on this fold's training and validation stretches only
            t = tune_fn(cfg, tune_tc, None, workdir / f"tune_{k}", tune_trials, seed=k - 1,
                        progress=False, log=lambda *a: None, dataset=ds,
                        tensorboard=tensorboard)
            chosen = t["settings"]
            fold_cfg, fold_tc = apply_settings(cfg, tc, chosen, "tuning")
        train_and_evaluate(fold_cfg, fold_tc, run, dataset=ds, progress=progress,
                           log=lambda *a: None, plots=False, tensorboard=tensorboard)
        ck = open_checkpoint(run)
        _, ds, _ = resolve_anchor(ck.cfg, ds)  # the fold's anchor (auto: its own validation)
        trainer = Trainer(ck.cfg, tc, to_device(ds.features))
        variables = restore_checkpoint(ck).variables()
        entry = {"fold": k, "weights_epoch": ck.meta.get("weights_epoch"), "tuned": chosen,
                 "anchor": ck.cfg.head.anchor,
                 "train_rows": [list(s.splits.train_rows) for s in ds.series],
                 "test_from": str(np.datetime64(fold[1], "ns")),
                 "windows": {s: int(getattr(ds.splits, s).size) for s in ("train", "val", "test")}}
        f = verdict.Fold({}, {}, None, {})
        sid = {split: ds.series_of(getattr(ds.splits, split)) for split in ("val", "test")}
        entry["series"] = [ds.names[i] for i in np.unique(sid["test"])]  # scored on its test
        entry["sat_out"] = list(ds.absent)  # too little history before this fold
        chosen = None
        for split in ("val", "test"):
            starts = getattr(ds.splits, split)
            y = window_targets(ds, starts)
            preds = {"tft": trainer.predict(variables, starts)[0],
                     **baselines_forecasts(ds, qs, starts)}
            if split == "val":  # the combination's weight, with the fold's own choice
                chosen = verdict.choose(verdict.Fold({n: scoring.window_sums(y, p, qs) for n, p
                                                      in preds.items()}, {}, None, {}),
                                        [n for n in preds if n != "tft"])
                w = verdict.combine(y, preds["tft"], preds[chosen], qs)
            preds[verdict.COMBO] = w * preds["tft"] + (1 - w) * preds[chosen]
            for name, p in preds.items():
                getattr(f, split)[name] = scoring.window_sums(y, p, qs)
                if split == "test":
                    steps.setdefault(name, []).append(scoring.step_q_risk(y, p, qs))
            if split == "test":
                f.y, f.pred = y, preds
        scored.append(f)
        if len(files) > 1 or len(ds.series) > 1 or ds.absent:  # a panel: per series too
            for name, part in verdict.by_series(f, sid["val"], sid["test"]):
                by_series.setdefault(ds.names[name], []).append(part)
        entry["test"] = {name: {m: float(v) for m, v in scoring.from_sums(r).items()}
                         for name, r in f.test.items()}
        entry["val_q_risk_90"] = {name: float(scoring.from_sums(r)["q_risk_90"])
                                  for name, r in f.val.items()}
        entry["chosen"] = verdict.choose(f, [n for n in f.val if n not in verdict.MODELS])
        entry["combination_weight"] = w  # of the TFT, with the chosen baseline
        fold_out.append(entry)
        who = (f" of {len(entry['series'])} series" + (f" ({len(ds.absent)} sat out)"
                                                          if ds.absent else "")
               if len(ds.series) > 1 or ds.absent else "")
        log(f"fold {k}/{folds}: test from {entry['test_from'][:16]}, {entry['windows']['test']} "
            f"windows{who}, epoch {entry['weights_epoch']}: TFT P90 "
            f"{entry['test']['tft']['q_risk_90']:.4f}, {entry['chosen']} (chosen on its "
            f"validation) {entry['test'][entry['chosen']]['q_risk_90']:.4f}")
    out = verdict.summarize(scored, qs, cfg.data.decoder_steps, reps)
    out["folds"] = fold_out
    out["combination"] = {**verdict.brief(verdict.summarize(scored, qs, cfg.data.decoder_steps, reps,
                                                            model=verdict.COMBO),
                                          verdict.COMBO),
                          "weights": [f["combination_weight"] for f in fold_out]}
    if by_series:  # each series over the folds it was scored in, its own per-fold choice
        out["by_series"] = verdict.holm_rows(
            {n: verdict.brief(verdict.summarize(fs, qs, cfg.data.decoder_steps, reps))
             for n, fs in sorted(by_series.items())})
    for name, parts in steps.items():  # P90 q-risk per forecast step, pooled over folds
        tot = np.concatenate(parts).sum(axis=0)  # [D, 2]
        row = out["pooled"].get(name) or out["combination"]
        row["q_risk_90_by_step"] = (2 * tot[:, 0] / tot[:, 1]).tolist()
    return out


def format_table(out: dict) -> str:
    from tftjax import verdict
    from tftjax.baselines import NAMES

    table = verdict.format_table(out, NAMES)
    c = out.get("combination")
    if c:
        ci = c["vs"]["p90_diff_ci95"]
        table += (f"\n\ncombination w·TFT + (1-w)·the chosen baseline, w per fold on its "
                  f"validation ({', '.join(f'{w:g}' for w in c['weights'])}): P90 "
                  f"{c[verdict.COMBO]['q_risk_90']:.4f} against {c[verdict.CHOSEN]['q_risk_90']:.4f}"
                  f", diff {c['vs']['p90_diff']:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}], DM P90 "
                  f"{c['vs']['dm_p90']['stat']:+.2f} (p {c['vs']['dm_p90']['p']:.3g}): "
                  f"{c['verdict']}")
    return table + ("\n\n" + verdict.format_series(out["by_series"]) if "by_series" in out else "")


def run(argv: list[str] | None = None) -> int:
    parsed = COMMAND_LINE.parse(argv)
    opts = parsed.options(BacktestOptions)
    cfg, tc = tft_configs(parsed, opts.preset, train_defaults=TRAIN_DEFAULTS,
                          settings=opts.config)
    workdir = run_folder(opts.workdir, "runs/backtest", False)
    if workdir.exists() and any(workdir.iterdir()):
        raise ConfigError(f"--workdir {workdir} is not empty; choose a new folder")
    if opts.tune_trials < 0:
        raise ConfigError(f"--tune-trials must be >= 0 (0: no tuning), got {opts.tune_trials}")
    if opts.tune_trials and opts.tune_epochs < 1:
        raise ConfigError(f"--tune-epochs must be >= 1, got {opts.tune_epochs}")
    if opts.tune_trials:
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise ConfigError("--tune-trials needs optuna: pip install 'tftjax[tune]'") from None
    out = backtest(cfg, tc, data_files(opts.parquet_file, opts.dataset), workdir,
                   opts.folds, opts.test_fraction, opts.bootstrap,
                   progress=opts.progress, tune_trials=opts.tune_trials,
                   tune_epochs=opts.tune_epochs, tensorboard=opts.tensorboard)
    tuned = ("in each fold" if opts.tune_trials else "once (--config)" if opts.config else "no")
    out["settings"] = {"preset": opts.preset, "config": str(opts.config) if opts.config else None,
                       "tuned": tuned, "tune_trials": opts.tune_trials}
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "backtest.json").write_text(json.dumps(out, indent=1))
    print(f"settings tuned inside each fold ({opts.tune_trials} trials on its training and "
          "validation stretches)" if opts.tune_trials else
          "settings tuned on validation (--config " + str(opts.config) + ")" if opts.config
          else f"settings: the {opts.preset} preset as given (not tuned)")
    print(format_table(out))
    if opts.plot:
        from tftjax.plots import pit_histogram

        pit_histogram(workdir / "pit.png", out["pooled"]["tft"]["calibration"]["pit"],
                      cfg.head.quantiles)
    print(f"wrote {workdir / 'backtest.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit

    cli_exit(main())
