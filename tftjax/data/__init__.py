"""Bars → features → windows: the data pipeline.

``load_dataset`` runs the whole chain for one or more series: read and validate
the bars (:mod:`~tftjax.data.bars`), split rows in time order and fit the
feature statistics on the training rows only (:mod:`~tftjax.data.feature_stats`), and
build the feature arrays (:mod:`~tftjax.data.features`, with the calendar's
known inputs from :mod:`~tftjax.data.calendar`); :mod:`~tftjax.data.windows`
cuts windows on the device. This package re-exports the names its users need.
"""

from __future__ import annotations

from tftjax.config import WARMUP
from tftjax.data.bars import Bars, read_bars, write_bars
from tftjax.data.bundled import DATASETS, bundled_path, default_parquet
from tftjax.data.dataset import UNKNOWN_POLICIES, Dataset, Series, load_dataset, saved_featurisation
from tftjax.data.feature_stats import FeatureStats
from tftjax.data.features import FeatureSet, build_features
from tftjax.data.identity import (
    content_hash,
    data_identity,
    file_sha256,
    find_data_file,
    find_data_files,
)
from tftjax.data.quality import quality_warnings
from tftjax.data.windows import (
    Batch,
    DeviceData,
    Splits,
    epoch_batches,
    gather,
    make_splits,
    to_device,
)
from tftjax.errors import DataError

__all__ = [
    "DATASETS", "UNKNOWN_POLICIES", "Bars", "Batch", "Series", "find_data_files",
    "saved_featurisation", "bundled_path", "DataError", "Dataset", "DeviceData",
    "FeatureSet", "FeatureStats", "Splits", "WARMUP", "build_features", "content_hash",
    "data_identity", "default_parquet", "file_sha256", "find_data_file", "epoch_batches",
    "gather", "load_dataset", "make_splits", "quality_warnings", "read_bars", "to_device",
    "write_bars",
]  # fmt: skip
