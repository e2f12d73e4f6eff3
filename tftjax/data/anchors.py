"""The anchor of ``--anchor`` on every row of a dataset's series.

A series' anchor (:func:`tftjax.stats.volatility.anchor`) comes from its own bars (the range
variance of its OHLC), its own target scale and the training rows its feature statistics
were fitted on (the HAR fit and the standardised quantiles; a saved model's, on the data it
was trained on), like its baselines (:func:`tftjax.training.evaluation.baselines_forecasts`
gives the same quantiles). Row ``t`` holds ``σ[t, k]`` (the anchor's forecast, made at ``t``
from rows ``<= t``, of the scale of the target ``k`` steps ahead) and the series' ``z``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tftjax.data.calendar import format_interval
from tftjax.data.features import FeatureSet
from tftjax.data.sessions import DAILY
from tftjax.errors import ConfigError, DataError


def is_daily(features: FeatureSet) -> bool:
    """Daily or coarser bars (where HAR is defined)."""
    return features.stats.clock.interval >= DAILY[0]


def series_anchor(
    name: str,
    bars,
    features: FeatureSet,
    train_rows: tuple[int, int],
    quantiles,
    horizon: int,
    cumulative: bool,
):
    """One series' :class:`tftjax.stats.volatility.Anchor` on every row (``ConfigError`` where it is
    not defined: ``har`` on bars finer than daily)."""
    from tftjax.stats.volatility import anchor, range_variance

    if name == "har" and not is_daily(features):
        raise ConfigError(
            f"--anchor har needs daily or coarser bars (HAR-RV is a daily "
            f"model); {bars.path} has bars every "
            f"{format_interval(features.stats.clock.interval)}: use range_ewma "
            "or auto"
        )
    fit = features.stats.anchor_fit  # saved with the model: fitted on its training rows
    fit = fit if fit and fit.get("name") == name else None
    a, b = train_rows
    if fit is None and not 0 <= a < b - 1 <= len(features) - 1:
        raise DataError(
            f"{bars.path}: the {name} anchor is fitted on training rows {a}..{b}, "
            f"which this file's {len(features):,} rows do not hold"
        )
    ranges = (
        range_variance(bars.open, bars.high, bars.low, bars.close) / features.stats.target_scale**2
    )
    return anchor(
        name,
        features.target,
        horizon,
        quantiles,
        train_rows,
        ranges=ranges,
        daily=is_daily(features),
        cumulative=cumulative,
        fit=fit,
    )


def with_anchor(
    features: FeatureSet,
    bars,
    train_rows: tuple[int, int],
    name: str,
    quantiles,
    horizon: int,
    cumulative: bool,
) -> FeatureSet:
    """``features`` with the anchor's arrays on every row (float32: ``anchor [n, D]``,
    ``anchor_z [n, Q]``) and its fit in the statistics (saved with a checkpoint, so that the
    model forecasts other data, or a later file of the series, with the same anchor)."""
    a = series_anchor(name, bars, features, train_rows, quantiles, horizon, cumulative)
    n = len(features)
    return dataclasses.replace(
        features,
        anchor=a.sigma.astype(np.float32),
        anchor_z=np.broadcast_to(a.z.astype(np.float32), (n, a.z.size)).copy(),
        stats=dataclasses.replace(features.stats, anchor_fit=a.fit),
    )
