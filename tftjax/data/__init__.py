"""Bars → features → windows: the data pipeline.

``load_dataset`` runs the whole chain for one parquet file: read and
validate the bars, split rows in time order, fit feature statistics on the
training rows only, and build the feature arrays.
"""

from __future__ import annotations

import dataclasses
import os

from tftjax.config import DataConfig
from tftjax.data.bars import Bars, DataError, default_parquet, read_bars, write_bars
from tftjax.data.features import WARMUP, FeatureSet, FeatureStats, build_features
from tftjax.data.windows import (Batch, DeviceData, Splits, epoch_batches, gather, make_splits,
                                 to_device)

__all__ = [
    "Bars", "Batch", "DataError", "Dataset", "DeviceData", "FeatureSet", "FeatureStats", "Splits",
    "WARMUP", "build_features", "default_parquet", "epoch_batches", "gather", "load_dataset",
    "make_splits", "read_bars", "to_device", "write_bars",
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Dataset:
    bars: Bars
    features: FeatureSet
    splits: Splits
    cfg: DataConfig


def load_dataset(path: str | os.PathLike | None = None, cfg: DataConfig = DataConfig(), *,
                 stats: FeatureStats | None = None) -> Dataset:
    """Read ``path`` (default: the bundled ES bars) into features and splits.

    Args:
      path: parquet file of OHLCV bars.
      cfg: window lengths and split fractions.
      stats: feature statistics to reuse (e.g. from a checkpoint); fitted on
        the training rows when ``None``.

    Raises:
      DataError: bad or too little data, naming the file.
    """
    path = default_parquet() if path is None else path
    bars = read_bars(path, min_rows=WARMUP + cfg.window)
    splits = make_splits(len(bars), cfg, source=str(path))
    features = build_features(bars, train_rows=splits.train_rows, stats=stats)
    return Dataset(bars, features, splits, cfg)
