"""``--anchor``: which volatility baseline the TFT's head starts from, and the data with it.

``auto`` takes, of the anchors defined for the data (:data:`tftjax.stats.volatility.ANCHORS`;
``har`` only where every series has daily or coarser bars), the one of lowest P90 q-risk on
the **validation** windows of the dataset it is given (a walk-forward fold's own
validation stretch); nothing is read of the test windows. Each series' anchor is fitted on
its own training rows (:mod:`tftjax.data.anchors`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tftjax.config import ConfigError, TFTConfig
from tftjax.data import Dataset
from tftjax.data.anchors import is_daily, series_anchor
from tftjax.stats import scoring
from tftjax.training.evaluation import window_targets


def anchor_forecasts(ds: Dataset, name: str, quantiles, starts: np.ndarray) -> np.ndarray:
    """``[n, D, Q]``: the anchor's own quantiles for the windows at ``starts``."""
    starts = np.asarray(starts)
    which = ds.series_of(starts)
    d, e = ds.cfg.decoder_steps, ds.cfg.encoder_steps
    out = np.empty((starts.size, d, len(quantiles)))
    for i, s in enumerate(ds.series):
        sel = which == i
        if sel.any():
            a = series_anchor(
                name,
                s.bars,
                s.features,
                s.features.stats.train_rows,
                quantiles,
                d,
                ds.cfg.target == "cumulative",
            )
            out[sel] = a.quantiles(starts[sel] - ds.offsets[i] + e - 1)
    return out


def candidates(ds: Dataset) -> list[str]:
    from tftjax.stats.volatility import ANCHORS

    daily = all(is_daily(s.features) for s in ds.series)
    return [n for n in ANCHORS if n != "har" or daily]


def resolve_anchor(cfg: TFTConfig, ds: Dataset) -> tuple[TFTConfig, Dataset, dict | None]:
    """``(cfg, ds, scores)``: ``cfg`` with ``auto`` replaced by the chosen anchor, ``ds``
    carrying that anchor's arrays on every row, and the validation P90 of each candidate
    (``auto`` only; else None). ``--anchor none`` returns both unchanged."""
    if cfg.head.anchor == "none":
        return cfg, ds, None
    scores = None
    if cfg.head.anchor == "auto":
        starts = ds.splits.val
        if starts.size == 0:
            raise ConfigError(
                "--anchor auto chooses on the validation windows and this data "
                "has none: name the anchor (--anchor range_ewma, ...) or --anchor none"
            )
        y = window_targets(ds, starts)
        scores = {
            n: float(
                scoring.from_sums(
                    scoring.window_sums(
                        y, anchor_forecasts(ds, n, cfg.head.quantiles, starts), cfg.head.quantiles
                    )
                )["q_risk_90"]
            )
            for n in candidates(ds)
        }
        cfg = cfg.override(anchor=min(scores, key=lambda n: scores[n]))
    if ds.anchor != cfg.head.dataset_anchor:  # its features (cached) rebuilt with the anchor
        ds = dataclasses.replace(ds, anchor=cfg.head.dataset_anchor)
    ds.features  # noqa: B018 - built here: an anchor the data cannot have fails before training
    return cfg, ds, scores
