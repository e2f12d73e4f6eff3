"""OHLCV bars → the TFT-225 feature set (210 historical, 10 known, 5 static).

Everything is vectorised numpy over the whole series (rolling sums by cumulative sums,
rolling extremes by log-doubling), float64 inside, float32 out, written column by column
into one preallocated matrix so that peak memory stays near the size of the result. Every
feature at row ``t`` is a function of bars ``<= t`` only (tested: changing bars after ``t``
leaves rows ``<= t`` bit-identical).

Notation: ``c, o, h, l, v`` close/open/high/low/volume; ``r_t = log(c_t /
c_{t-1})``; ``mean_L``/``sum_L``/``max_L``/``min_L`` over the ``L`` rows
ending at ``t``.

Historical features (210 = 15 families × 14 look-backs
``L ∈ {2, 3, 5, 8, 10, 13, 15, 20, 25, 30, 40, 60, 90, 120}``), column
``family * 14 + window_index``:

=========  ==================================================================
``ret``    log return over L bars, ``log c_t - log c_{t-L}``
``rvol``   realised volatility ``sqrt(mean_L r²)``
``range``  mean log range ``mean_L log(h/l)``
``clv``    close location in the L-bar channel, ``(log c - log min_L l) /
           (log max_L h - log min_L l) - 0.5``
``vz``     volume z-score of ``log(1+v)`` against its L-bar mean and std
``rsi``    RSI-style balance ``sum_L max(r, 0) / sum_L |r| - 0.5``
``sma``    distance to the moving average ``log c - mean_L log c``
``vwap``   distance to the L-bar VWAP of the typical price ``(h+l+c)/3``
``absr``   tail shape ``mean_L |r| / rvol`` (≈0.8 for Gaussian returns)
``tstat``  trend strength ``ret / (rvol · sqrt(L))``
``dhigh``  distance below the L-bar high ``log c - log max_L h``
``dlow``   distance above the L-bar low ``log c - log min_L l``
``miss``   bars missing from the calendar grid among the last L,
           ``log(1 + max(p_t - p_{t-L} - L, 0))``, ``p`` a bar's slot index
           (what the data shows about quiet, bar-less intervals: observed,
           so historical)
``body``   candle body ratio ``mean_L (c - o) / (h - l)``
``gap``    summed opening gaps ``sum_L log(o_t / c_{t-1})``
=========  ==================================================================

``--features v2`` keeps the shape (15 families × 14) and swaps two families: ``lrvol``
is ``log rvol``, and ``lpv`` replaces ``range`` with the inputs of the volatility models
that won the walk-forward (:func:`log_vol_columns`): the log of the bar's Parkinson+gap
variance, of its means over 2–120 bars (5 and 22 among them: HAR's components, so HAR's
forecast is a linear function of three of them), and the log variance of the EWMA and
range-EWMA anchors.

They are z-scored with mean/std fitted on the training rows only (``--normalise train``)
or causally, against the rows up to each one (``expanding``, or the last
``--normalise-window`` rows: ``rolling``), and clipped to ±10 (:class:`FeatureStats`,
JSON-serialisable, saved with checkpoints). The first :data:`WARMUP` rows have incomplete look-backs and
are never used as encoder rows.

Known-future features (10, :data:`tftjax.data.calendar.KNOWN_NAMES`): functions
of calendar time only (time of day, weekday, day of year and month; with an
exchange calendar, session elapsed/left and the scheduled gap before a slot).
Encoder rows get those of their bar's own time; a window's decoder steps get
those of the next ``D`` calendar slots after its last encoder bar
(:attr:`FeatureSet.future`), never of the bars that later arrived (see
:mod:`tftjax.data.calendar`). Bounded by construction, not re-scaled.

Static features (5, per series, from the training rows): the instrument (its row in
the model's vocabulary, set by the dataset), log10 mean close, log10 (1 + mean volume),
log10 std of 1-bar log returns, log10 median bar interval in minutes.

Target: the 1-bar log return ``r_t`` divided by ``target_scale``, the std of
the training rows' returns winsorised at the ``winsorize`` tail quantiles and
at least the 5 most extreme values of each tail (so that a bad print cannot
set the scale), and clipped to ``±target_clip``
scales (0: no clip);
decoder step ``k`` forecasts the bar of the ``k``-th calendar slot after the origin, missing
(NaN, masked) where the slot has no bar (:func:`~tftjax.data.feature_stats.decoder_targets`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tftjax.config import NUM_HISTORICAL, WARMUP, DataConfig
from tftjax.config.data import RETURNS
from tftjax.data.calendar import KNOWN_NAMES, NS_MIN, Clock, Timeline, calendar_features, make_clock
from tftjax.data.covariates import Inputs, Schema, SeriesFit, covariate_inputs, future_schedule
from tftjax.data.feature_stats import (
    FAMILIES,
    HISTORICAL_NAMES,
    LPV_COLUMNS,
    STATIC_NAMES,
    V2_FAMILIES,
    WINDOWS,
    FeatureStats,
    causal_z,
    column_stats,
    decoder_targets,
    finish_stats,
    historical_names,
    target_values,
    train_block,
)
from tftjax.data.rolling import Extreme, Rolling, shift
from tftjax.stats.volatility import LAMBDA, ewma_variance, range_variance

__all__ = [
    "CLIP",
    "FAMILIES",
    "HISTORICAL_NAMES",
    "historical_names",
    "KNOWN_NAMES",
    "STATIC_NAMES",
    "WINDOWS",
    "WARMUP",
    "FeatureSet",
    "FeatureStats",
    "build_features",
    "historical_columns",
    "historical_raw",
    "known_features",
    "known_inputs",
]  # the names, from their homes too

CLIP = 10.0
"""Normalised features are clipped to ±CLIP."""


# ------------------------------------------------------------------ features
def historical_raw(bars, slot: np.ndarray | None = None, features: str = "v1") -> np.ndarray:
    """The 210 historical features before normalisation, ``[n, 210]`` float32.

    Rows ``< WARMUP`` hold NaN where a look-back is incomplete.
    """
    out = np.empty((len(bars), NUM_HISTORICAL), dtype=np.float32)
    for j, col in historical_columns(bars, slot, features):
        out[:, j] = col
    return out


def grid_slots(ts: np.ndarray, interval: int = NS_MIN) -> np.ndarray:
    """Slot index of each bar on a plain grid of ``interval`` from the first bar."""
    return np.rint((ts - ts[0]) / max(int(interval), 1)).astype(np.int64)


def historical_columns(bars, slot: np.ndarray | None = None, features: str = "v1"):
    """Yield ``(column index, float64 values [n])`` for the 210 historical features of the
    set ``features`` (``v2``: :func:`log_vol_columns`).

    ``slot``: each bar's index on the calendar grid (:meth:`Timeline.slot_index`; default
    a plain 1-minute grid), for the ``miss`` family."""
    n = len(bars)
    slot = grid_slots(bars.ts) if slot is None else np.asarray(slot, np.int64)
    c, o, h, lo, v = bars.close, bars.open, bars.high, bars.low, bars.volume
    lc = np.log(c / c[0])  # relative to the first close: smaller cumsums, same differences
    lh, ll = np.log(h / c[0]), np.log(lo / c[0])
    r = np.empty(n)
    r[0] = np.nan
    r[1:] = np.diff(lc)
    lv = np.log1p(v)
    tp = (h + lo + c) / 3.0
    gap = np.empty(n)
    gap[0] = np.nan
    gap[1:] = np.log(o[1:] / c[:-1])

    R = {
        "r2": Rolling(r * r), "absr": Rolling(np.abs(r)), "rpos": Rolling(np.maximum(r, 0.0)),
        "range": Rolling(lh - ll), "lv": Rolling(lv), "lv2": Rolling(lv * lv),
        "lc": Rolling(lc), "tpv": Rolling(tp * v), "v": Rolling(v), "tp": Rolling(tp),
        "body": Rolling(np.where(h > lo, (c - o) / np.where(h > lo, h - lo, 1.0), 0.0)),
        "gap": Rolling(gap),
    }  # fmt: skip
    v2 = features == "v2"
    lpv = log_vol_columns(o, h, lo, c) if v2 else None
    hi = Extreme(lh, np.maximum, max(WINDOWS))
    lw = Extreme(ll, np.minimum, max(WINDOWS))
    nw = len(WINDOWS)
    eps = 1e-12
    for j, L in enumerate(WINDOWS):
        ret = lc - shift(lc, L)
        ret[:L] = np.nan
        miss = np.log1p(np.maximum(slot - shift(slot, L) - L, 0)).astype(np.float64)
        miss[:L] = np.nan
        rvol = np.sqrt(R["r2"].mean(L))
        mx, mn = hi(L), lw(L)
        lv_mean = R["lv"].mean(L)
        lv_std = np.sqrt(np.maximum(R["lv2"].mean(L) - lv_mean * lv_mean, 0.0))
        vwap = (R["tpv"].sum(L) + 1e-9 * R["tp"].sum(L)) / (R["v"].sum(L) + 1e-9 * L)
        cols = {
            "ret": ret,
            "rvol": rvol,
            "range": R["range"].mean(L),
            "clv": (lc - mn) / (mx - mn + eps) - 0.5,
            "vz": (lv - lv_mean) / (lv_std + 1e-3),
            "rsi": R["rpos"].sum(L) / (R["absr"].sum(L) + eps) - 0.5,
            "sma": lc - R["lc"].mean(L),
            "vwap": np.log(c / vwap),
            "absr": R["absr"].mean(L) / (rvol + eps),
            "tstat": ret / (rvol * np.sqrt(L) + eps),
            "dhigh": lc - mx,
            "dlow": lc - mn,
            "miss": miss,
            "body": R["body"].mean(L),
            "gap": R["gap"].sum(L),
        }
        if v2:
            assert lpv is not None
            cols["lrvol"], cols["lpv"] = np.log(np.maximum(rvol, 1e-12)), lpv[j]
        for f, name in enumerate(V2_FAMILIES if v2 else FAMILIES):
            yield f * nw + j, cols[name]


def log_vol_columns(o, h, lo, c, lam: float = LAMBDA) -> list[np.ndarray]:
    """``--features v2``'s ``lpv`` family (:data:`~tftjax.data.feature_stats.LPV_COLUMNS`), float64
    ``[n]`` each: with ``pv_t = log(o_t / c_{t-1})² + log(h_t / l_t)² / (4 log 2)`` (the
    Parkinson variance plus the squared opening gap; row 0 has no gap), ``log pv_t``, ``log
    mean_L pv`` for each L, and the log variance forecasts of the EWMA (``λ`` on ``r²``,
    from ``r_1²``) and range-EWMA (on ``pv``, from ``pv_0``) anchors. Every log floors its
    argument at 1e-3 of ``pv``'s mean over the rows up to that one (a flat bar has ``pv``
    0), so each column reads no later row."""
    n = c.shape[0]
    pv = range_variance(o, h, lo, c)
    floor = 1e-3 * np.cumsum(pv) / np.arange(1, n + 1) + 1e-300
    log = lambda x: np.log(np.maximum(x, floor))
    r = np.zeros(n)
    r[1:] = np.diff(np.log(c))
    ewma_r = ewma_variance(r[1:], lam, init=float(r[1] ** 2)) if n > 1 else np.zeros(0)
    roll = Rolling(pv)
    out = [log(pv)] + [log(roll.mean(int(L))) for L in LPV_COLUMNS[1:-2]]
    return out + [
        log(np.concatenate([[np.nan], ewma_r])),
        log(ewma_variance(np.sqrt(pv), lam, init=float(pv[0]))),
    ]


def known_features(ts: np.ndarray, clock: Clock | None = None) -> np.ndarray:
    """The 10 known inputs at the bars' own times, ``[n, 10]`` float32 (no calendar, plain
    wall clock unless ``clock`` says otherwise)."""
    ts = np.asarray(ts, np.int64)
    tl = Timeline(ts, clock or Clock(NS_MIN, None, None, None), 0)
    return calendar_features(tl.utc, tl.wall, tl)


def known_inputs(
    ts: np.ndarray, clock: Clock, decoder_steps: int, source: str = "data"
) -> tuple[np.ndarray, np.ndarray, Timeline]:
    """``(known [n, 10], future [n, D, 10], timeline)``: the known inputs at each bar's own
    time, and at the ``D`` calendar slots after each bar (a window's decoder inputs)."""
    tl = Timeline(np.asarray(ts, np.int64), clock, decoder_steps, source)
    fut_utc, fut_wall = tl.future(decoder_steps)
    return (calendar_features(tl.utc, tl.wall, tl), calendar_features(fut_utc, fut_wall, tl), tl)


# ----------------------------------------------------------------- features
@dataclasses.dataclass(frozen=True)
class FeatureSet:
    """Model-ready arrays for one series (host numpy; put on device once)."""

    historical: np.ndarray  # [n, 210] float32, normalised and clipped; rows < WARMUP are 0
    known: np.ndarray  # [n, 10] float32, at each bar's own time
    future: np.ndarray  # [n, D, 10] float32, at the D calendar slots after each bar
    static: np.ndarray  # [5] float32 (several series one after another: [n, 5], per row)
    target: np.ndarray  # [n] float32, r_t / target_scale, clipped to ±target_clip
    stats: FeatureStats
    timeline: Timeline | None = None
    """The bars placed in calendar time (instants, wall clock, calendar slots)."""
    scale: np.ndarray | None = None
    """Several series one after another: each one's EWMA volatility on its own returns
    ``[n]`` (None: computed from ``target`` as one series)."""
    decoder_target: np.ndarray | None = None
    """``[n, D]``: row ``t``'s decoder targets on the calendar grid, NaN where the slot has
    no bar (None: the next ``D`` rows' ``target``, a grid without gaps)."""
    anchor: np.ndarray | None = None  # [n, D], [n, Q]: tftjax.data.anchors (--anchor)
    anchor_z: np.ndarray | None = None
    instrument: np.ndarray | None = None
    """``[n]`` int32: each row's instrument, its row of the model's vocabulary (None: 0)."""
    own: Inputs | None = None
    """Your own columns' inputs (already appended to ``historical``, ``known``, ``future``
    and ``static``): which rows hold a stale observed value or an unscheduled known slot
    (:mod:`tftjax.data.covariates`). None: no columns of your own."""

    def __len__(self) -> int:
        return int(self.historical.shape[0])


def _normalise(col: np.ndarray, mean: float, std: float) -> np.ndarray:
    """Z-score and clip; NaN (warm-up rows) → 0."""
    z = np.clip((col - mean) / std, -CLIP, CLIP)
    return np.nan_to_num(z, copy=False, nan=0.0)


def build_features(
    bars,
    cfg: DataConfig = DataConfig(),
    *,
    train_rows: tuple[int, int] | None = None,
    stats: FeatureStats | None = None,
    own: tuple[Schema, SeriesFit, Any] | None = None,
) -> FeatureSet:
    """Compute the TFT-225 features of ``bars``.

    Each historical column is computed, (fitted,) normalised and written
    once, so memory peaks near the float32 result plus a few columns.

    Args:
      bars: a validated :class:`~tftjax.data.bars.Bars` table.
      cfg: the decoder length (future known inputs), clock options (``bar_interval``,
        ``timezone``, ``calendar``) and target handling (``winsorize``, ``target_clip``).
      train_rows: rows ``[start, stop)`` to fit statistics on (ignored when
        ``stats`` is given; default all rows).
      stats: statistics from a previous fit (e.g. restored from a checkpoint); their
        clock wins over ``cfg``'s options.
      own: your own columns' ``(schema, this series' fit, a table of known values after
        the bars or None)``, appended to the built-in inputs (:mod:`tftjax.data.covariates`).
    """
    n = len(bars)
    fit = stats is None
    train_rows = train_rows or (0, n)
    start, stop = train_block(train_rows) if fit else (0, 0)
    if stats is None:
        clock = make_clock(
            bars.ts,
            getattr(bars, "tz", None),
            (train_rows[0], stop),
            bar_interval=cfg.bar_interval,
            timezone=cfg.timezone,
            calendar=cfg.calendar,
        )
    else:
        # the trained clock; whether these timestamps are instants is this file's own business
        tz = getattr(bars, "tz", None)
        clock = dataclasses.replace(stats.clock, data_zone=tz, zone=stats.clock.zone or tz)
    known, future, timeline = known_inputs(bars.ts, clock, cfg.decoder_steps, str(bars.path))
    raw = target_values(bars, cfg)
    if cfg.inputs == "own":  # no engineered inputs: the target itself is the history
        hist, mean, std = np.zeros((n, 1), np.float32), np.zeros(1), np.ones(1)
    else:
        hist, mean, std = builtin_historical(bars, timeline, cfg, stats, (start, stop))
    if stats is None:
        stats = finish_stats(bars, mean, std, train_rows, start, stop, clock, cfg, raw)
    target = (raw - stats.target_loc) / stats.target_scale
    if cfg.target_clip > 0:
        target = np.clip(target, -cfg.target_clip, cfg.target_clip)
    target = target.astype(np.float32)
    if cfg.inputs == "own":
        hist[:, 0] = np.clip(target, -CLIP, CLIP)
    out = FeatureSet(
        historical=hist,
        known=known,
        future=future,
        static=stats.static.astype(np.float32),
        target=target,
        stats=stats,
        timeline=timeline,
        decoder_target=decoder_targets(
            target,
            timeline.slot_index(),
            cfg.decoder_steps,
            cfg.target == "cumulative",
            level=cfg.target_transform not in RETURNS,
        ),
    )
    return out if own is None or not own[0].columns else with_own(out, bars, cfg, *own)


def builtin_historical(bars, timeline, cfg: DataConfig, stats, block: tuple[int, int]):
    """``(hist [n, 210], mean, std)``: the engineered inputs, normalised by ``stats`` or by
    statistics fitted on the rows ``block`` (``stats`` None)."""
    n = len(bars)
    hist = np.empty((n, NUM_HISTORICAL), dtype=np.float32)
    if stats is None:
        mean, std = np.zeros(NUM_HISTORICAL), np.ones(NUM_HISTORICAL)
        which, how, window = cfg.features, cfg.normalise, cfg.normalise_window
    else:
        mean, std = stats.hist_mean, stats.hist_std
        which, how, window = stats.features, stats.normalise, stats.normalise_window
    for j, col in historical_columns(bars, timeline.slot_index(), which):
        if stats is None:
            mean[j], std[j] = column_stats(col, *block)
        hist[:, j] = (
            _normalise(col, mean[j], std[j])
            if how == "train"
            else _normalise(causal_z(col, window if how == "rolling" else None), 0.0, 1.0)
        )
    return hist, mean, std


def with_own(
    f: FeatureSet, bars, cfg: DataConfig, schema: Schema, fit: SeriesFit, future_table: Any
) -> FeatureSet:
    """``f`` with your own columns' inputs appended (and their fit kept with its statistics)."""
    assert f.timeline is not None  # built from bars: placed in calendar time
    schedule = future_schedule(cfg, future_table, bars, f.timeline.clock)  # as the bars
    own = covariate_inputs(schema, fit, bars, f.timeline.slot_index(), cfg, schedule)
    return dataclasses.replace(
        f,
        historical=np.concatenate([f.historical, own.historical], axis=1),
        known=np.concatenate([f.known, own.known], axis=1),
        future=np.concatenate([f.future, own.future], axis=2),
        static=np.concatenate([f.static, own.static]),
        stats=dataclasses.replace(f.stats, covariates=fit.to_json()),
        own=own,
    )
