"""One parquet file → a :class:`Dataset`: validated bars, time-ordered splits, features
fitted on the training rows, and what passed validation but deserves a word."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from tftjax.config import WARMUP, DataConfig
from tftjax.data.bars import Bars, read_bars
from tftjax.data.bundled import default_parquet
from tftjax.data.calendar import format_interval
from tftjax.data.features import FeatureSet, FeatureStats, build_features
from tftjax.data.identity import data_identity
from tftjax.data.windows import Splits, make_splits


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


def quality_warnings(bars: Bars, interval: int, target_scale: float | None = None) -> list[str]:
    """What passes validation but a user should hear about, with counts: steps that are not
    a whole number of bar intervals, zero-volume bars, and (given the target scale) returns
    beyond 50 scales."""
    out = list(getattr(bars, "notes", ()))
    step = np.diff(bars.ts)
    if step.size:
        off = np.count_nonzero(step % max(interval, 1) != 0)
        if off:
            out.append(f"{bars.path}: {off:,} of {step.size:,} steps are not a whole number of "
                       f"the {format_interval(interval)} bar interval (irregular or mixed "
                       "intervals; first at row "
                       f"{int(np.flatnonzero(step % max(interval, 1) != 0)[0]) + 1})")
    zero = np.count_nonzero(bars.volume == 0)
    if zero:
        out.append(f"{bars.path}: {zero:,} of {len(bars):,} bars have zero volume"
                   + (" (all of them: the volume features carry nothing)" if zero == len(bars)
                      else ""))
    if target_scale:
        r = np.abs(np.diff(np.log(bars.close))) / target_scale
        big = np.flatnonzero(r > 50)
        if big.size:
            out.append(f"{bars.path}: {big.size:,} returns beyond 50 target scales (largest "
                       f"{r.max():.0f} at row {int(np.argmax(r)) + 1}): check for bad prints; "
                       "targets are clipped at --target-clip")
    return out
