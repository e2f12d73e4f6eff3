"""pytorch-forecasting's TFT as a row of the walk-forward: the same folds, windows, features,
sizes and epoch budget as ``python -m tftjax.backtest``, scored against the same baseline
chosen per fold on its out-of-sample record (tftjax.stats.verdict.record).

    pip install -e ".[bench]"
    python experiments/peer_walk_forward.py --dataset spx --calendar XNYS --preset small \\
        --folds 5 --json peer_spx.json

It takes the backtest's flags (``--preset``, ``--folds``, ``--test-fraction``, ``--epochs``,
``--patience``, ``--batch-size``, ``--learning-rate``, the data and calendar flags). For each
fold of :func:`tftjax.data.windows.walk_forward_times`: tftjax's dataset of the fold (its
features, statistics fitted on its own training rows), handed to pytorch-forecasting as a
DataFrame with identity scalers and target normaliser, its training set the fold's training
rows, its validation set the validation rows and its test set the rows that give exactly the
fold's test windows (``E`` encoder rows before the test stretch, then the stretch). The peer
is sized like the preset (hidden size, attention heads, ``hidden_continuous_size`` = d_v,
dropout, one LSTM layer, the preset's quantiles), trained with Adam at the same learning rate
and batch for at most ``--epochs`` epochs, early-stopped on its validation loss with the
same patience, its best epoch restored; then it forecasts the validation and test windows.

Scored by :mod:`tftjax.stats.verdict` as the backtest scores tftjax (the targets tftjax's: on the
calendar grid, NaN where a slot has no bar; the peer trained on the next rows' returns, which
differ only where a session had no bar). The JSON has the backtest's shape (the peer as the
``tft`` row), so ``experiments/verdicts.py`` takes it as one more row of the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_pytorch_forecasting import dataset_settings, frame


def peer_fold(ds, cfg, tc, seed: int) -> tuple[dict, dict]:
    """Train the peer on one fold; its quantiles ``[n, D, Q]`` of the fold's validation and
    test windows, and what the training did."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
    from pytorch_forecasting import TemporalFusionTransformer, TimeSeriesDataSet
    from pytorch_forecasting.metrics import QuantileLoss

    from tftjax.errors import DataError

    if len(ds.series) != 1:
        raise DataError("the peer row takes one series (a panel: one run per series)")
    if cfg.data.target != "bar":
        raise DataError("the peer trains on each row's own return: --target bar only")
    torch.manual_seed(seed)
    E, D, f = cfg.data.encoder_steps, cfg.data.decoder_steps, ds.features
    common = dataset_settings(f, E, D)
    sp = ds.splits
    t0, t1 = sp.test_rows
    train = TimeSeriesDataSet(frame(ds, sp.train_rows), **common)
    sets = {
        "val": TimeSeriesDataSet.from_dataset(
            train, frame(ds, sp.val_rows), stop_randomization=True
        ),
        "test": TimeSeriesDataSet.from_dataset(
            train, frame(ds, (t0 - E, t1)), stop_randomization=True
        ),
    }
    for name, starts in (("val", sp.val), ("test", sp.test)):  # the same windows
        if len(sets[name]) != starts.size:
            raise DataError(
                f"the peer's {name} set holds {len(sets[name])} windows, the fold's {starts.size}"
            )
    model = TemporalFusionTransformer.from_dataset(
        train,
        hidden_size=cfg.model.hidden,
        attention_head_size=cfg.model.heads,
        dropout=cfg.model.dropout,
        hidden_continuous_size=cfg.model.d_v,
        lstm_layers=1,
        output_size=len(cfg.head.quantiles),
        loss=QuantileLoss(quantiles=list(cfg.head.quantiles)),
        learning_rate=tc.learning_rate,
        optimizer="adam",
    )
    best = ModelCheckpoint(
        monitor="val_loss", mode="min", save_top_k=1, dirpath=tempfile.mkdtemp(prefix="peer-ckpt-")
    )
    trainer = pl.Trainer(
        max_epochs=tc.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        default_root_dir=tempfile.mkdtemp(prefix="peer-"),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[best]
        + ([EarlyStopping("val_loss", patience=tc.patience, mode="min")] if tc.patience else []),
        gradient_clip_val=tc.grad_clip,
    )
    t = time.perf_counter()
    trainer.fit(
        model,
        train_dataloaders=train.to_dataloader(train=True, batch_size=tc.batch_size, num_workers=0),
        val_dataloaders=sets["val"].to_dataloader(train=False, batch_size=256, num_workers=0),
    )
    fit_s = time.perf_counter() - t
    model = TemporalFusionTransformer.load_from_checkpoint(best.best_model_path)
    model.eval()
    out = {}
    with torch.no_grad():
        for name, s in sets.items():
            preds = [
                model(x)["prediction"].float().numpy()
                for x, _ in s.to_dataloader(train=False, batch_size=256, num_workers=0)
            ]
            out[name] = np.concatenate(preds)
    epoch = int(best.best_model_path.rsplit("epoch=", 1)[1].split("-")[0]) + 1
    return out, {"epochs_run": trainer.current_epoch, "best_epoch": epoch, "fit_s": fit_s}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--json", default=None, help="also write the verdict here")
    extra, rest = own.parse_known_args(argv)
    import pytorch_forecasting
    import torch

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
    folds, runs = [], []
    for k, fold in enumerate(walk_forward_times(ts, cfg.data, args.folds, args.test_fraction), 1):
        ds = load_dataset(files if len(files) > 1 else files[0], cfg.data, fold=fold)
        peer, run = peer_fold(ds, cfg, tc, seed=tc.seed + k)
        f = verdict.Fold({}, {}, None, {}, test_start=int(fold[1]))
        for split in ("val", "test"):
            starts = getattr(ds.splits, split)
            y = window_targets(ds, starts)
            preds = {verdict.MODEL: peer[split], **baselines_forecasts(ds, qs, starts)}
            for name, p in preds.items():
                getattr(f, split)[name] = scoring.window_sums(y, p, qs)
            setattr(f, f"{split}_ends", window_ends(ds, starts))  # the choice's record
            if split == "test":
                f.y, f.pred, f.dates = y, preds, window_origins(ds, starts)
        folds.append(f)
        runs.append(run)
        print(
            f"fold {k}/{args.folds}: best epoch {run['best_epoch']} of {run['epochs_run']} "
            f"({run['fit_s']:.0f} s): peer P90 "
            f"{scoring.from_sums(f.test[verdict.MODEL])['q_risk_90']:.4f}",
            file=sys.stderr,
        )
    out = verdict.summarize(folds, qs, cfg.data.decoder_steps, args.bootstrap)
    out["folds"] = runs
    out["settings"] = {
        "peer": f"pytorch-forecasting {pytorch_forecasting.__version__}, torch {torch.__version__}",
        "preset": args.preset,
        "epochs": tc.epochs,
        "patience": tc.patience,
    }
    print(
        verdict.format_table(out, {**NAMES, verdict.MODEL: "pytorch-forecasting TFT"}).replace(
            "| TFT |", "| pytorch-forecasting TFT |"
        )
    )
    if extra.json:
        with open(extra.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit
    from tftjax.cli import main as cli_main

    cli_exit(cli_main(main, None))
