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
    """The saved TFT at ``path`` (a run folder, checkpoint or export) as the Python API's
    :class:`~tftjax.serving.api.Model`; refusals name the flag."""
    from tftjax.serving.api import Model
    from tftjax.serving.saved import open_model

    return Model(open_model(path, flag="--tft-checkpoint"))


def tft_columns(
    model, parquet_file, val_start: int, source: str = "--tft-checkpoint"
) -> np.ndarray:
    """``[n, Q]`` float32: the TFT's first-step quantile forecast at every bar of
    ``parquet_file`` (the DQN's bars), 0 where no complete window ends yet.

    Raises:
      ConfigError: the TFT's data reaches ``val_start`` (the DQN's validation split).
    """
    end = model.trained_until()
    if end >= val_start:
        raise ConfigError(
            f"{source} {model.saved.given}: the TFT was trained and validated on bars up to "
            f"{np.datetime64(end, 'ns')} UTC, not before the DQN's validation split starts "
            f"({np.datetime64(val_start, 'ns')} UTC): its forecasts would leak; train it on data "
            "that ends earlier"
        )
    return tft_forecasts(model, parquet_file)["first"]


def tft_forecasts(model, parquet_file) -> dict:
    """A saved TFT's forecasts from the window ending at every bar of ``parquet_file``:
    ``first [n, Q]`` the first step's quantiles in its target scales, ``cum [n]`` the median
    cumulative log return over its horizon (the median step forecasts summed, or the last
    step's for a cumulative target, times the target scale), ``valid [n]`` where a complete
    window ends (0 elsewhere)."""
    vocab = (model.saved.featurisation or {}).get("vocab")
    one = vocab[0] if vocab is not None and len(vocab) == 1 else None  # a one-series TFT
    f = model.run(parquet_file, origins="all", instrument=one)
    cfg = model.saved.cfg
    pred = np.asarray(f.pred, np.float64)  # [n, D, Q], target units
    m = cfg.head.median_index
    median = pred[:, -1, m] if cfg.data.target == "cumulative" else pred[:, :, m].sum(axis=1)
    n = len(f.dataset.ts)
    out = {
        "first": np.zeros((n, pred.shape[-1]), np.float32),
        "cum": np.zeros(n),
        "valid": np.zeros(n, bool),
    }
    out["first"][f.rows] = pred[:, 0, :].astype(np.float32)
    out["cum"][f.rows] = median * float(f.dataset.features.stats.target_scale)
    out["valid"][f.rows] = True
    return out
