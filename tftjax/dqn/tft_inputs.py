"""``--tft-checkpoint DIR``: a trained TFT's forecasts as DQN inputs (the original system's
pipeline fed its forecasts to the trader).

At every bar ``t`` the TFT forecasts from the window whose last encoder bar is ``t`` (its
decoder's known inputs from the calendar, never from later bars), featurised with the TFT's
*own* training statistics; the quantiles of its first forecast step, in its target scales,
become ``Q`` more feature columns of the DQN's observation (0 before the TFT's first complete
window). The TFT must have been trained and validated on data that ends before the DQN's
validation split starts: otherwise its forecasts over that split would carry what it learnt
from those very bars, and the DQN's selection and test would see through them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tftjax.errors import ConfigError


def load_tft(path: str | Path):
    """The saved TFT at ``path`` (a run folder, checkpoint or export); refusals name the flag."""
    from tftjax import export
    from tftjax.saved import open_model
    from tftjax.training.restore import load_checkpoint, open_checkpoint

    if export.is_export(path):
        return open_model(path)
    open_checkpoint(path, flag="--tft-checkpoint")  # missing, unreadable, a DQN run: one line
    return load_checkpoint(path)


def tft_data_end(saved) -> int:
    """The time (ns) of the last bar the TFT's training or validation (early stopping) used:
    the end of its validation split on its own data."""
    from tftjax.training.evaluation import saved_dataset

    ds = saved_dataset(saved)
    return max(int(s.bars.ts[s.splits.val_rows[1] - 1]) for s in ds.series)


def tft_columns(saved, parquet_file, val_start: int, source: str = "--tft-checkpoint"
                ) -> np.ndarray:
    """``[n, Q]`` float32: the TFT's first-step quantile forecast at every bar of
    ``parquet_file`` (the DQN's bars), 0 where no complete window ends yet.

    Raises:
      ConfigError: the TFT's data reaches ``val_start`` (the DQN's validation split).
    """
    end = tft_data_end(saved)
    if end >= val_start:
        raise ConfigError(
            f"{source} {saved.given}: the TFT was trained and validated on bars up to "
            f"{np.datetime64(end, 'ns')} UTC, not before the DQN's validation split starts "
            f"({np.datetime64(val_start, 'ns')} UTC): its forecasts would leak; train it on data "
            "that ends earlier")
    f = tft_forecasts(saved, parquet_file)
    return f["first"]


def tft_forecasts(saved, parquet_file) -> dict:
    """A saved TFT's forecasts from the window ending at every bar of ``parquet_file``:
    ``first [n, Q]`` the first step's quantiles in its target scales, ``cum [n]`` the median
    cumulative log return over its horizon (the median step forecasts summed, or the last
    step's for a cumulative target, times the target scale), ``valid [n]`` where a complete
    window ends (0 elsewhere)."""
    from tftjax.data import to_device
    from tftjax.forecast import eligible_origins
    from tftjax.training import Trainer
    from tftjax.training.evaluation import saved_dataset

    vocab = (saved.featurisation or {}).get("vocab")
    one = vocab[0] if vocab is not None and len(vocab) == 1 else None  # a one-series TFT
    ds = saved_dataset(saved, parquet_file, need_splits=False, instrument=one)
    cfg = saved.cfg
    rows = eligible_origins(ds, cfg.data.encoder_steps)
    starts = (rows - (cfg.data.encoder_steps - 1)).astype(np.int32)
    trainer = Trainer(cfg, saved.tc, to_device(ds.features))
    pred, _ = trainer.predict(saved.variables, starts)  # [n, D, Q], target units
    pred = np.asarray(pred, np.float64)
    n = len(ds.ts)
    m = int(np.argmin(np.abs(np.asarray(cfg.head.quantiles) - 0.5)))
    median = pred[:, -1, m] if cfg.data.target == "cumulative" else pred[:, :, m].sum(axis=1)
    out = {"first": np.zeros((n, pred.shape[-1]), np.float32), "cum": np.zeros(n),
           "valid": np.zeros(n, bool)}
    out["first"][rows] = pred[:, 0, :].astype(np.float32)
    out["cum"][rows] = median * float(ds.features.stats.target_scale)
    out["valid"][rows] = True
    return out
