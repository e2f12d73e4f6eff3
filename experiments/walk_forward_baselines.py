"""Every baseline of a walk-forward, scored on the same folds as ``python -m tftjax.backtest``
without training a TFT: the rows of the README's walk-forward table for the baselines that
were not the one chosen on validation.

    python experiments/walk_forward_baselines.py --dataset spx --calendar XNYS --block 36
    python experiments/walk_forward_baselines.py --dataset btc --calendar 24/7 --block 164

It takes the backtest's own flags (``--preset``, ``--folds``, ``--test-fraction``, the data
and calendar flags) and the same code: the folds of
:func:`tftjax.data.windows.walk_forward_times`, each fold's dataset with statistics fitted on
its own training rows, :func:`tftjax.training.evaluation.baselines_forecasts` on its
validation and test windows, and :mod:`tftjax.stats.scoring`'s pooled metrics and circular block
bootstrap, and :mod:`tftjax.stats.verdict`'s per-fold choice (each fold's baseline chosen on its
out-of-sample record before its test start, stitched). The baselines do not depend on the TFT, so these rows are
the backtest's; only the bootstrap block is the backtest's choice (Politis–White on the
TFT's per-window P90 loss differences with the stitched choice): give it with ``--block``
(the table's block column), or leave it out for Politis–White on the stitched choice's own
per-window P90 loss.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--block", type=int, default=None)
    own.add_argument("--json", default=None, help="also write the rows here")
    extra, rest = own.parse_known_args(argv)
    from tftjax.config import ConfigError

    if extra.block is not None and extra.block < 1:
        raise ConfigError(f"--block must be >= 1 window, got {extra.block}")

    from tftjax import backtest as bt
    from tftjax.cli import data_files, tft_configs
    from tftjax.data import default_parquet, load_dataset
    from tftjax.data.bars import read_series
    from tftjax.data.windows import walk_forward_times
    from tftjax.stats import scoring, verdict
    from tftjax.stats.baselines import NAMES
    from tftjax.training.evaluation import (
        baselines_forecasts,
        window_ends,
        window_origins,
        window_targets,
    )

    parsed = bt.COMMAND_LINE.parse(rest)
    args = parsed.options(bt.BacktestOptions)
    cfg, tc = tft_configs(
        parsed, args.preset, train_defaults=bt.TRAIN_DEFAULTS, settings=args.config
    )
    files = data_files(args.parquet_file, args.dataset)
    files = (
        files if isinstance(files, list) else [files] if files is not None else [default_parquet()]
    )
    ts = [b.ts for p in files for b in read_series(p)]
    qs = cfg.head.quantiles
    folds = []
    for k, fold in enumerate(walk_forward_times(ts, cfg.data, args.folds, args.test_fraction), 1):
        ds = load_dataset(files if len(files) > 1 else files[0], cfg.data, fold=fold)
        f = verdict.Fold({}, {}, None, {}, test_start=int(fold[1]))
        for split in ("val", "test"):
            starts = getattr(ds.splits, split)
            y = window_targets(ds, starts)
            preds = baselines_forecasts(ds, qs, starts)
            for name, p in preds.items():
                getattr(f, split)[name] = scoring.window_sums(y, p, qs)
            setattr(f, f"{split}_ends", window_ends(ds, starts))  # the choice's record
            if split == "test":
                f.y, f.pred, f.dates = y, preds, window_origins(ds, starts)
        folds.append(f)
        print(f"fold {k}/{args.folds}: {ds.splits.test.size} test windows", file=sys.stderr)
    out = verdict.summarize(
        folds, qs, cfg.data.decoder_steps, args.bootstrap, model=None, block=extra.block
    )
    picks = out["chosen_per_fold"]
    print(
        f"{args.folds} folds, {sum(out['fold_windows'])} test windows; chosen per fold on its "
        f"out-of-sample record: {', '.join(NAMES.get(p, p) for p in picks)}; 95% circular block "
        f"bootstrap (block {out['block']}"
        + (
            ""
            if extra.block is not None
            else ": Politis-White on the stitched choice's P90 "
            "loss; the backtest's is on the TFT's differential with it"
        )
        + ")"
    )
    print("| baseline | val P90 | P50 [95% CI] | P90 [95% CI] | cover 10-90 [95% CI] | CRPS |")
    print("|---|---|---|---|---|---|")
    rows = out["pooled"]
    for n in sorted(rows, key=lambda n: rows[n]["test"]["q_risk_90"]):
        r, ci = rows[n], rows[n]["ci95"]

        def cell(m, r=r, ci=ci):
            digits = 3 if m == "coverage_80" else 4
            return f"{r['test'][m]:.{digits}f} [{ci[m][0]:.{digits}f}, {ci[m][1]:.{digits}f}]"

        name = "baseline chosen per fold" if n == verdict.CHOSEN else NAMES.get(n, n)
        print(
            f"| {name} | {r['val']['q_risk_90']:.4f} | {cell('q_risk_50')} | "
            f"{cell('q_risk_90')} | {cell('coverage_80')} | {r['calibration']['crps']:.4f} |"
        )
    if extra.json:
        with open(extra.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit
    from tftjax.cli import main as cli_main

    cli_exit(cli_main(main, None))
