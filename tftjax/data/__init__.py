"""Bars → features → windows: the data pipeline.

``load_dataset`` runs the whole chain for one parquet file: read and
validate the bars, split rows in time order, fit feature statistics on the
training rows only, and build the feature arrays.
"""

from __future__ import annotations

import dataclasses
import os

from tftjax.config import DataConfig
from tftjax.data.bars import (DATASETS, Bars, DataError, bundled_path, content_hash, default_parquet,
                              file_sha256, quality_warnings, read_bars, write_bars)
from tftjax.data.features import WARMUP, FeatureSet, FeatureStats, build_features
from tftjax.data.windows import (Batch, DeviceData, Splits, epoch_batches, gather, make_splits,
                                 to_device)

__all__ = [
    "DATASETS", "Bars", "Batch", "bundled_path", "DataError", "Dataset", "DeviceData", "FeatureSet", "FeatureStats", "Splits",
    "WARMUP", "build_features", "content_hash", "data_identity", "default_parquet", "file_sha256",
    "find_data_file", "epoch_batches", "gather", "load_dataset",
    "make_splits", "read_bars", "to_device", "write_bars",
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Dataset:
    bars: Bars
    features: FeatureSet
    splits: Splits
    cfg: DataConfig
    warnings: tuple[str, ...] = ()
    """What passed validation but deserves a word (irregular steps, zero volume, outliers)."""

    def identity(self, run_dir: str | os.PathLike | None = None) -> dict:
        """What a run records of its data and checks on resume and evaluate."""
        return data_identity(self.bars, run_dir)


BUNDLED = "<bundled>/"


def data_identity(bars: Bars, run_dir: str | os.PathLike | None = None) -> dict:
    """``{"file", "file_from_run", "sha256", "rows"}`` of a bar table.

    The content hash and row count identify the data (a moved file is the same
    data, an edited one is not); ``file`` (absolute, or ``<bundled>/NAME`` for
    the bundled bars) and ``file_from_run`` (relative to ``run_dir``) say where
    to find it again (:func:`find_data_file`)."""
    from pathlib import Path

    out = {"file": str(bars.path), "file_from_run": None, "sha256": content_hash(bars),
           "rows": len(bars)}
    if bars.sha256:  # read from a file
        p = Path(bars.path).resolve()
        mine = {bundled_path(n).resolve(): bundled_path(n).name for n in DATASETS}
        out["file"] = BUNDLED + mine[p] if p in mine else str(p)
        if run_dir is not None and not out["file"].startswith(BUNDLED):
            out["file_from_run"] = os.path.relpath(p, Path(run_dir).resolve())
    return out


def find_data_file(identity: dict, run_dir: str | os.PathLike) -> str:
    """The recorded data file, checked against its hash.

    Looks for it relative to ``run_dir`` first (a run folder moved together
    with its data), then at its absolute path; the bundled bars are found in
    this installation.

    Raises:
      DataError: when no candidate exists or the file's content changed.
    """
    from pathlib import Path

    f = identity["file"]
    if f.startswith(BUNDLED):
        from pathlib import PurePosixPath

        name = PurePosixPath(f).name
        candidates = [bundled_path(k) for k, v in DATASETS.items() if v == name] or [Path(f)]
    else:
        rel = identity.get("file_from_run")
        candidates = [(Path(run_dir) / rel).resolve()] if rel else []
        candidates.append(Path(f))
    found = [c for c in candidates if c.is_file()]
    if not found:
        raise DataError(f"{f}: the data file this run was trained on is not found (looked at "
                        f"{', '.join(str(c) for c in candidates)}); pass --parquet-file to use "
                        "another file on purpose")
    for c in found:
        if file_sha256(c) == identity["sha256"]:
            return str(c)
    raise DataError(f"{found[0]}: content changed since training (sha256 "
                    f"{file_sha256(found[0])[:12]}…, recorded {identity['sha256'][:12]}…); pass "
                    "--parquet-file to use another file on purpose")
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
    features = build_features(bars, cfg, train_rows=splits.train_rows, stats=stats)
    tl, clock = features.timeline, features.stats.clock
    warn = quality_warnings(bars, clock.interval, features.stats.target_scale)
    off = tl.off_calendar() if tl is not None else 0
    if off:
        warn.append(f"{path}: {off:,} of {len(bars):,} bars fall outside the sessions of "
                    f"calendar {clock.calendar} (their session inputs are the last session's)")
    return Dataset(bars, features, splits, cfg, tuple(warn))
