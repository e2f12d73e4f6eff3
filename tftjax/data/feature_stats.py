"""Feature statistics, fitted on the training rows only and saved with every checkpoint.

:class:`FeatureStats` holds the z-score mean and std of the 210 historical features,
the target scale (a winsorised std of the training returns, :func:`robust_scale`),
the 5 static features and the series' clock (:class:`~tftjax.data.calendar.Clock`).
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path

import numpy as np

from tftjax.config import LOOKBACKS, NUM_HISTORICAL, NUM_KNOWN, NUM_STATIC, WARMUP
from tftjax.config.data import RETURNS
from tftjax.data.calendar import KNOWN_NAMES, NS_MIN, Clock
from tftjax.errors import DataError

FAMILIES = (
    "ret", "rvol", "range", "clv", "vz", "rsi", "sma", "vwap",
    "absr", "tstat", "dhigh", "dlow", "miss", "body", "gap",
)  # fmt: skip
"""The 15 historical feature families (tftjax.data.features), each at every look-back."""
WINDOWS = LOOKBACKS
STATIC_NAMES = ("instrument", "log_price", "log_volume", "log_volatility", "log_interval")
HISTORICAL_NAMES = tuple(f"{f}_{w}" for f in FAMILIES for w in WINDOWS)
V2_FAMILIES = tuple({"rvol": "lrvol", "range": "lpv"}.get(f, f) for f in FAMILIES)
"""``--features v2``: ``rvol`` in logs, and ``lpv`` (the winners' volatility inputs) in the
place of the mean log range."""
LPV_COLUMNS = ("1", "2", "3", "5", "8", "10", "15", "22", "40", "60", "90", "120", "ewma", "rewma")
"""The ``lpv`` family's 14 columns: the log Parkinson+gap variance of the bar (``1``) and its
means over the last L bars, then the log variance of the EWMA and range-EWMA anchors."""


def historical_names(features: str = "v1") -> tuple[str, ...]:
    """The 210 historical inputs' names of a feature set (``--features``)."""
    if features == "v1":
        return HISTORICAL_NAMES
    return tuple(f"{f}_{c}" for f in V2_FAMILIES for c in (LPV_COLUMNS if f == "lpv" else WINDOWS))


def input_history(features: str = "v1", inputs: str = "builtin") -> tuple[str, ...]:
    """The built-in historical inputs' names: the 210 engineered ones, or (``--inputs
    own``) the target itself."""
    return ("target",) if inputs == "own" else historical_names(features)


assert len(HISTORICAL_NAMES) == NUM_HISTORICAL
assert len(KNOWN_NAMES) == NUM_KNOWN and len(STATIC_NAMES) == NUM_STATIC


def log_returns(close: np.ndarray) -> np.ndarray:
    """``r_t = log(c_t / c_{t-1})``, ``r_0 = 0``."""
    r = np.zeros(close.shape[0])
    r[1:] = np.diff(np.log(close))
    return r


# --------------------------------------------------------------------- stats
@dataclasses.dataclass(frozen=True)
class FeatureStats:
    """Normalisation statistics and the series' clock, fitted on the training rows only."""

    hist_mean: np.ndarray  # [210] float64
    hist_std: np.ndarray  # [210] float64
    target_scale: float  # winsorised std of 1-bar log returns on the training rows
    static: np.ndarray  # [5] float64
    train_rows: tuple[int, int]  # [start, stop) rows the statistics came from
    clock: Clock = Clock(NS_MIN, None, None, None)
    """Bar interval, zones and calendar (:mod:`tftjax.data.calendar`)."""
    anchor_fit: dict | None = None
    """The ``--anchor``'s fit on the training rows (tftjax.stats.volatility.Anchor.fit), reused
    wherever these statistics featurise other data."""
    features: str = "v1"
    """The historical inputs' set (``--features``) and how they are z-scored: by the training
    rows' ``hist_mean``/``hist_std``, or causally (``--normalise expanding|rolling``)."""
    normalise: str = "train"
    normalise_window: int = 500
    covariates: dict | None = None
    """The series' own statistics and static values of your columns
    (:class:`tftjax.data.covariates.SeriesFit`; None: none)."""
    target_loc: float = 0.0
    """Subtracted from the transformed target before the scale divides it: 0 for a change
    (log_return, diff), the training rows' mean for a level or log target."""
    inputs: str = "builtin"
    """``--inputs``: builtin (the 210 engineered inputs) or own (the target itself)."""

    def to_json(self) -> dict:
        return {
            "hist_mean": self.hist_mean.tolist(),
            "hist_std": self.hist_std.tolist(),
            "target_scale": float(self.target_scale),
            "static": self.static.tolist(),
            "train_rows": list(self.train_rows),
            "clock": self.clock.to_json(),
            "historical_names": list(input_history(self.features, self.inputs)),
            "target_loc": float(self.target_loc),
            "inputs": self.inputs,
            "features": self.features,
            "normalise": self.normalise,
            "normalise_window": self.normalise_window,
            "known_names": list(KNOWN_NAMES),
            "static_names": list(STATIC_NAMES),
            **({"anchor_fit": self.anchor_fit} if self.anchor_fit else {}),
            **({"covariates": self.covariates} if self.covariates else {}),
        }

    @classmethod
    def from_json(cls, d: dict) -> FeatureStats:
        features, inputs = d.get("features", "v1"), d.get("inputs", "builtin")
        if (
            features not in ("v1", "v2")
            or list(d.get("historical_names", ())) != list(input_history(features, inputs))
            or list(d.get("known_names", ())) != list(KNOWN_NAMES)
            or "clock" not in d
        ):
            raise DataError(
                "feature statistics were saved for a different feature set (an "
                "older tftjax: calendar-true known inputs, the miss_L features); "
                "train the model again"
            )
        return cls(
            hist_mean=np.asarray(d["hist_mean"], dtype=np.float64),
            hist_std=np.asarray(d["hist_std"], dtype=np.float64),
            target_scale=float(d["target_scale"]),
            static=np.asarray(d["static"], dtype=np.float64),
            train_rows=(int(d["train_rows"][0]), int(d["train_rows"][1])),
            clock=Clock.from_json(d["clock"]),
            anchor_fit=d.get("anchor_fit"),
            features=features,
            normalise=d.get("normalise", "train"),
            normalise_window=int(d.get("normalise_window", 500)),
            covariates=d.get("covariates"),
            target_loc=float(d.get("target_loc", 0.0)),
            inputs=inputs,
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: str | Path) -> FeatureStats:
        return cls.from_json(json.loads(Path(path).read_text()))


def _static_features(bars, start: int, stop: int, target_scale: float) -> np.ndarray:
    """The five statics. Input 0 is the instrument's slot: under a vocabulary the dataset
    sets it to 0 and the instrument rides as an int32 index (``FeatureSet.instrument``);
    only a model from before vocabularies reads the value stored here, a code of the file's
    name (kept so that such models still evaluate).

    ``log_price`` and ``log_volume`` are 0 (dropped, issue 50): bars adjusted back for
    splits and dividends, as most daily equity files are, carry in their price and volume
    levels the splits of years after the training rows, a look-ahead. The returns' scale
    and the bar interval do not depend on the adjustment. A model saved before keeps the
    levels it was trained with (they are saved with its statistics)."""
    median_ns = float(np.median(np.diff(bars.ts[start:stop])))
    return np.array([
        zlib.crc32(Path(bars.path).name.encode()) / 2.0**32 - 0.5,
        0.0,
        0.0,
        np.log10(max(target_scale, 1e-12)),
        np.log10(median_ns / NS_MIN),
    ])  # fmt: skip


def train_block(train_rows: tuple[int, int]) -> tuple[int, int]:
    start, stop = max(train_rows[0], WARMUP), train_rows[1]
    if stop - start < 2:
        raise ValueError(f"training rows {train_rows} leave fewer than 2 rows after warm-up")
    return start, stop


def column_stats(col: np.ndarray, start: int, stop: int) -> tuple[float, float]:
    block = col[start:stop]
    mean, std = float(block.mean()), float(block.std())
    return mean, (std if std > 1e-12 else 1.0)


MIN_TAIL = 5
"""Winsorising always clips at least this many values in each tail (one bad print in a short
training split is far beyond a 0.1% quantile's reach otherwise)."""


def robust_scale(r: np.ndarray, winsorize: float) -> float:
    """Std of ``r`` winsorised at its ``winsorize`` and ``1 - winsorize`` quantiles, and at
    least the :data:`MIN_TAIL` most extreme values of each tail (``winsorize`` 0: the plain
    std); 1.0 for a constant series."""
    r = np.asarray(r, np.float64)
    n = r.size
    if winsorize > 0 and n > 4 * MIN_TAIL:
        m = max(int(np.ceil(winsorize * n)), MIN_TAIL)
        part = np.partition(r, (m, n - 1 - m))
        r = np.clip(r, part[m], part[n - 1 - m])
    scale = float(r.std()) if n else 0.0
    return scale if scale > 0 else 1.0


def finish_stats(bars, mean, std, train_rows, start, stop, clock, cfg, raw) -> FeatureStats:
    """The statistics of one series' training rows ``[start, stop)``; ``raw``: its
    transformed target (:func:`target_values`), whose scale (and, for a level or log
    target, location) they fit."""
    change = cfg.target_transform in RETURNS
    block = raw[max(start, 1) : stop] if change else raw[start:stop]
    loc = 0.0 if change else float(np.mean(block))
    scale = robust_scale(block - loc, cfg.winsorize)
    static = _static_features(bars, train_rows[0], stop, scale)
    return FeatureStats(
        mean,
        std,
        scale,
        static,
        (int(train_rows[0]), int(stop)),
        clock,
        features=cfg.features,
        normalise=cfg.normalise,
        normalise_window=cfg.normalise_window,
        target_loc=loc,
        inputs=cfg.inputs,
    )


def target_values(bars, cfg) -> np.ndarray:
    """The target column transformed (``--target-column``, ``--target-transform``), float64
    ``[n]``: a change's first row is 0.

    Raises:
      DataError: a missing value, or a value of zero or less under a log transform
        (naming the file, the column and the row).
    """
    col = cfg.target_column
    raw = bars.close if col == "close" and cfg.inputs == "builtin" else bars.columns[col]
    if raw.dtype == object:
        raise DataError(f"{bars.path}: column {col!r} (--target-column) holds text, not numbers")
    x = np.asarray(raw, np.float64)
    if (row := first_true(~np.isfinite(x))) is not None:
        raise DataError(f"{bars.path}: column {col!r} row {row}: the target is missing")
    how = cfg.target_transform
    if how in ("log_return", "log") and (row := first_true(x <= 0)) is not None:
        raise DataError(
            f"{bars.path}: column {col!r} row {row}: value {float(x[row])!r} is zero or less, "
            f"and --target-transform {how} takes its log: use diff or level"
        )
    if how == "log_return":
        return log_returns(x)
    if how == "diff":
        return np.concatenate([[0.0], np.diff(x)])
    return np.log(x) if how == "log" else x.astype(np.float64)


def first_true(mask: np.ndarray) -> int | None:
    return int(np.argmax(mask)) if mask.any() else None


def pooled_stats(stats: list[FeatureStats]) -> FeatureStats:
    """The statistics of several series' training rows taken together (each weighted by its
    training row count): what a new listing without training rows of its own is featurised
    with. Means and variances pool exactly; the target scale pools as a root mean square; the
    anchor's fit is the first series' (the pooled rows have none of their own)."""
    w = np.array([max(b - a, 1) for a, b in (s.train_rows for s in stats)], np.float64)
    w /= w.sum()
    mean = sum(wi * s.hist_mean for wi, s in zip(w, stats))
    second = sum(wi * (s.hist_std**2 + s.hist_mean**2) for wi, s in zip(w, stats))
    std = np.sqrt(np.maximum(second - mean**2, 0.0))
    first = stats[0]
    return dataclasses.replace(
        first,
        hist_mean=mean,
        hist_std=np.where(std > 0, std, 1.0),
        target_scale=float(np.sqrt(sum(wi * s.target_scale**2 for wi, s in zip(w, stats)))),
        static=sum(wi * s.static for wi, s in zip(w, stats)),
        target_loc=float(sum(wi * s.target_loc for wi, s in zip(w, stats))),
        covariates=None,  # a series' own statics: never another's (tftjax.data.dataset)
        train_rows=(0, 0),
    )


def causal_z(col: np.ndarray, window: int | None, min_rows: int = 20) -> np.ndarray:
    """Each row's z-score against the mean and std of the finite values of the rows up to it
    (``window``: the last ``window`` rows; None: all); NaN with fewer than ``min_rows`` of
    them. Float64 sums, centred on the first finite value so that they stay small."""
    x = np.asarray(col, np.float64)
    ok = np.isfinite(x)
    if not ok.any():
        return np.full(x.shape, np.nan)
    x = np.where(ok, x - x[np.argmax(ok)], 0.0)
    sums = [np.concatenate([[0.0], np.cumsum(a)]) for a in (ok.astype(np.float64), x, x * x)]
    t = np.arange(1, x.size + 1)
    lo = np.zeros_like(t) if window is None else np.maximum(t - window, 0)
    n, s1, s2 = (c[t] - c[lo] for c in sums)
    mean = s1 / np.maximum(n, 1)
    std = np.sqrt(np.maximum(s2 / np.maximum(n, 1) - mean * mean, 0.0))
    z = (x - mean) / np.where(std > 1e-12, std, 1.0)
    return np.where(ok & (n >= min_rows), z, np.nan)


def decoder_targets(
    target: np.ndarray,
    slot: np.ndarray | None,
    steps: int,
    cumulative: bool = False,
    level: bool = False,
) -> np.ndarray:
    """Every row's decoder targets on the calendar grid, ``[n, steps]`` float32.

    Row ``t`` (a window's last encoder bar, on slot ``p_t``) gets at step ``k`` the bar on
    slot ``p_t + k`` (the last such row if several share it), provided it lies within the
    ``steps`` rows after ``t`` (a window's own rows); else NaN. Its value is the sum of the
    per-bar ``target`` since the previous bar (``cumulative``: since ``t``); with no gap that
    is ``target[t + k]`` exactly (``cumulative``: ``Σ target[t+1 .. t+k]``).
    ``slot`` None: no gaps (step ``k`` is row ``t + k``). ``level``: a level target's
    value on the slot itself (no sum: a level is not a change)."""
    target = np.asarray(target, np.float32)
    n = target.shape[0]
    t = np.arange(n, dtype=np.int64)[:, None]
    k = np.arange(1, steps + 1, dtype=np.int64)
    if slot is None:
        want = t + k
        row = want
        prev = want - 1
        ok = want < n
    else:
        slot = np.asarray(slot, np.int64)
        want = slot[:, None] + k  # the slots
        row = np.searchsorted(slot, want, side="right") - 1  # last bar at or before the slot
        prev = np.searchsorted(slot, want, side="left") - 1  # last bar before the slot
        ok = (row >= 0) & (slot[np.clip(row, 0, n - 1)] == want) & (row <= t + steps)
    row, prev = np.clip(row, 0, n - 1), np.clip(prev, 0, n - 1)
    csum = np.concatenate([[0.0], np.cumsum(target, dtype=np.float64)])  # csum[i] = Σ target[:i]
    if level:
        val = target[row]
    elif cumulative:
        val = csum[row + 1] - csum[t + 1]
    else:  # one bar since the previous: the bar's own target, exactly
        val = np.where(prev == row - 1, target[row], csum[row + 1] - csum[prev + 1])
    return np.where(ok, val, np.nan).astype(np.float32)
