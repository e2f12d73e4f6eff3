"""Forecasts from a saved TFT: the quantiles of the next bars from chosen origins.

An origin is a bar; its forecast is the window whose last encoder bar it is, run through the
same compiled eval step that :func:`tftjax.training.evaluate_model` scores (so a forecast and
the scored prediction of the same window agree to float32 round-off), with the decoder's known
inputs from the calendar slots after the origin (:class:`tftjax.data.calendar.Timeline`),
never from bars after it. The data is featurised with the *training* statistics saved with
the model. All origins go through the device in batches of one compiled program; no train
step is built.

Origins: each series' last bar at or before ``as_of`` (default its last bar); ``origins`` N
or ``all`` its last N or every eligible bar up to it; ``start``/``end`` (or ``split``) a
range of origins, every one in it unless ``origins`` is N. Times without a UTC offset are
read on the data's own clock (:mod:`tftjax.data.instants`). The table is
:mod:`tftjax.serving.table`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tftjax.config import WARMUP
from tftjax.data import Dataset, to_device
from tftjax.data.instants import parse_times
from tftjax.errors import ConfigError, DataError
from tftjax.serving.table import SPLITS, Forecast, build, split_of


def eligible_origins(ds: Dataset, encoder_steps: int) -> np.ndarray:
    """Global rows that can be an origin: a full encoder after its series' feature warm-up."""
    first = WARMUP + encoder_steps - 1
    return np.concatenate(
        [
            np.arange(o + first, o + len(s.bars), dtype=np.int64)
            for s, o in zip(ds.series, ds.offsets)
        ]
    )


def _count(origins: str) -> int | None:
    if origins in ("last", "all"):
        return None
    try:
        n = int(origins)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"--origins must be last, all or a number >= 1, got {origins!r}")
    return n


def choose_origins(
    ds: Dataset,
    encoder_steps: int,
    as_of: str | None = None,
    origins: str = "last",
    *,
    start: str | None = None,
    end: str | None = None,
    split: str | None = None,
    own_splits: bool = True,
    only: tuple[str, ...] | None = None,
) -> np.ndarray:
    """Origin rows of every series (see the module docstring).

    Raises:
      ConfigError: a bad time, count or split, ``start`` after ``end``, or a series without an
        eligible bar in the range.
    """
    n = _count(origins)
    times = parse_times(as_of, start, end)
    if split is not None:
        if split not in SPLITS:
            raise ConfigError(f"--split must be one of {', '.join(SPLITS)}, got {split!r}")
        if not own_splits:
            raise ConfigError(
                f"--split {split}: these bars are not the model's own data and "
                "the model has no split times (one series split by fractions): "
                "give --start/--end"
            )
    ranged = start is not None or end is not None or split is not None
    rows = eligible_origins(ds, encoder_steps)
    which = ds.series_of(rows)
    keep = np.ones(rows.size, bool) if not only else np.isin(np.array(ds.names)[which], only)
    for i, s in enumerate(ds.series):  # each series' own clock: instants or its wall clock
        mine = which == i
        ts = ds.ts[rows[mine]]
        clock = s.features.stats.clock
        for key, ok in (
            ("as_of", np.less_equal),
            ("end", np.less_equal),
            ("start", np.greater_equal),
        ):
            t = times[key]
            if t is not None:
                keep[mine] &= ok(ts, t.on_clock(s.bars.tz, clock.zone, str(s.bars.path)))
    if split is not None:
        keep &= split_of(ds, rows, encoder_steps) == split
    rows, which = rows[keep], which[keep]
    out = []
    for i, s in enumerate(ds.series):
        mine = rows[which == i]
        if only and s.name not in only:
            continue
        if mine.size == 0:
            where = " ".join(f"--{k.replace('_', '-')} {v.text}" for k, v in times.items() if v)
            where += f" --split {split}" if split else ""
            raise ConfigError(
                f"no bar of {s.bars.path} can be an origin"
                + (f" at {where}" if where else "")
                + f": an origin needs {WARMUP + encoder_steps - 1} bars before it"
            )
        out.append(mine[-n:] if n else mine if ranged or origins == "all" else mine[-1:])
    return np.concatenate(out)


def forecast(  # noqa: PLR0913
    saved,
    bars: Any = None,
    *,
    as_of: str | None = None,
    origins: str = "last",
    start: str | None = None,
    end: str | None = None,
    split: str | None = None,
    series: tuple[str, ...] | None = None,
    mode: str | None = None,
    unknown: str = "refuse",
    instrument: str | None = None,
    stale_after: int = 1,
    future: Any = None,
) -> Forecast:
    """Forecast from a :class:`~tftjax.training.SavedModel`.

    Args:
      bars: parquet file(s), or a pyarrow/pandas table (default: the model's training data).
      as_of: each series' last origin at or before this time (the module docstring).
      origins: ``last``, ``all`` or a count N.
      start: the first origin time of a range.
      end: the last origin time of a range.
      split: the origins of the run's windows of this split.
      series: only these series (names of the model's vocabulary or the data's).
      mode: ``int8`` for the int8 path, ``float`` for an int8 export's float weights.
      unknown: :func:`tftjax.data.load_dataset`'s (``refuse`` or ``embed``).
      instrument: the name of a one-series file without a symbol column.
      stale_after: warn when more than this many calendar slots lie between an origin and
        the as-of with no bar (a stale last bar).
      future: a model with --known columns: their values after the bars (a table or file
        of a time column, the columns, and for several series a symbol column).

    Raises:
      DataError: an origin whose encoder holds a stale observed value, or whose decoder
        needs a known value no row gives (naming the column and the time).
    """
    from tftjax.training.evaluation import saved_dataset
    from tftjax.training.trainer import inference_config, predict_windows

    cfg = saved.cfg
    ds = saved_dataset(
        saved, bars, unknown=unknown, instrument=instrument, need_splits=False, future=future
    )
    if series:
        missing = [n for n in series if n not in ds.names]
        if missing:
            known = ", ".join(ds.names)
            raise ConfigError(
                f"--series {','.join(missing)}: not a series of this data "
                f"({known}; the model knows {', '.join(saved_vocab(saved))})"
            )
    own = (
        ds.cuts is not None
        or bars is None
        or (ds.identity().get("sha256") == (saved.data or {}).get("sha256"))
    )
    e = cfg.data.encoder_steps
    rows = choose_origins(
        ds, e, as_of, origins, start=start, end=end, split=split, own_splits=own, only=series
    )
    check_own_inputs(ds, rows, e)
    starts = (rows - (e - 1)).astype(np.int32)
    variables = saved.variables
    if mode == "float" and saved.float_variables is not None:
        variables = saved.float_variables
    pred = predict_windows(
        inference_config(cfg), saved.tc, to_device(ds.features), variables, starts, mode
    )
    assert isinstance(pred, np.ndarray)  # without interpretation: the quantiles alone
    return build(
        saved, ds, rows, starts, pred, as_of=as_of, own_splits=own, stale_after=stale_after
    )


def check_own_inputs(ds: Dataset, rows: np.ndarray, encoder_steps: int) -> None:
    """Refuse an origin whose inputs of your own are unknown: a stale observed value in its
    encoder, or a decoder step whose known value no row gives (never filled from later
    bars: tftjax.data.covariates). The origins are screened per series at once, as the
    training windows are (:func:`~tftjax.data.covariates.drop_windows`).

    Raises:
      DataError: naming the series, the column and the time of the first such origin.
    """
    from tftjax.data.covariates import drop_windows

    which = ds.series_of(rows)
    for i, s in enumerate(ds.series):
        own, tl = s.features.own, s.features.timeline
        local = rows[which == i] - ds.offsets[i]
        if own is None or tl is None or not local.size:
            continue
        starts = local - (encoder_steps - 1)
        bad = local[~np.isin(starts, drop_windows(starts, own, encoder_steps))]
        if bad.size:
            raise DataError(why_refused(ds, s, int(bad[0]), encoder_steps))


def why_refused(ds: Dataset, s, origin: int, encoder_steps: int) -> str:
    """The message for an origin whose inputs of your own are unknown (its series' row)."""
    from tftjax.data.covariates import time_text

    tl, tz = s.features.timeline, s.bars.tz
    why = s.features.own.why_not(origin, encoder_steps, tl.slot_index(), ds.cfg.known)
    assert why is not None  # screened: a stale row or an unscheduled slot
    kind, column, at = why
    if kind == "stale":
        return (
            f"{s.bars.path}: column {column!r} has had no value since before "
            f"{time_text(s.bars.ts[at], tz)}, more than --max-ffill {ds.cfg.ffill_rows} bars, "
            f"inside the encoder of the origin at {time_text(s.bars.ts[origin], tz)}"
        )
    utc, wall = tl.future(ds.cfg.decoder_steps)
    when = (utc if tz else wall)[origin, at - 1]
    return (
        f"{s.bars.path}: no value of --known {column} for decoder step {at} at "
        f"{time_text(int(when), tz)} (origin {time_text(s.bars.ts[origin], tz)}): "
        "give the known values after the bars with --future FILE (future= in Python)"
    )


def saved_vocab(saved) -> tuple[str, ...]:
    fz = saved.featurisation or {}
    return tuple(fz.get("vocab") or ()) or ("one unnamed series",)
