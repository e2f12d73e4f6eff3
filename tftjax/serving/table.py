"""The forecast file: a tidy table, one row per origin and horizon step, with its metadata.

Columns (README, "Forecasting"):

- ``instrument``; ``origin_time`` and ``target_time`` in the data's zone (zone-aware
  timestamps) with ``origin_time_utc`` and ``target_time_utc`` beside them; for naive bars
  the two local columns only, naive, and the metadata says so (``time_zone``);
  ``target_time`` is the horizon's calendar slot (the exchange calendar's, DST-correct; for
  daily bars without a calendar the k-th weekday when the training rows had no weekend bar);
- ``horizon`` 1…D, ``bar_expected`` (False where the slot falls on a weekday the series
  never had a bar on: a calendar-day grid's weekend), ``split`` (``train``/``val``/``test``
  as the run split its windows; empty for a window in no split: its targets are not all in
  the data yet, or the data is not the model's own and it has no split times),
  ``missing_bars`` (slots after the origin, up to the as-of, without a bar: a stale origin);
- ``close_at_origin``, ``q{p}`` the quantiles of bar k's log return (with a cumulative
  target: of the k-bar log return from the origin) in log-return units, and with a
  cumulative target only ``price_q{p}`` = close × exp(q{p}), the k-bar close's quantiles;
- a target of your own (``--target-column``, ``--target-transform``): ``value_at_origin``
  (the column at the origin), ``q{p}`` in the transform's units (a level's or log's own
  scale, a change's), and ``level_q{p}`` in the column's own units where a quantile maps
  onto them exactly: a level (the same), a log (exp), a cumulative change (added to the
  origin's value: × exp for a log return, + for a diff);
- ``realised`` the scored target in log-return units (NaN where the slot has no bar yet:
  the target the model was scored on, clipped at ``target_clip`` training stds) and
  ``loss_q50``/``loss_q90`` its pinball loss at those levels (a per-origin loss is the mean
  over its horizons; q-risk = 2 Σ loss / Σ |realised|);
- ``stats_from``: ``trained`` (the series' saved statistics), ``own`` (an unseen series', fitted
  on its own training rows) or ``pooled`` (a new listing without training rows: the trained
  series' pooled statistics); ``data_sha256``.

Metadata (parquet schema, or a ``.json`` beside a CSV): the checkpoint, its epoch and the
SHA-256 of its weights, the data's identity, the time zone and the target.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from tftjax.data import Dataset
from tftjax.data.calendar import day_of_week
from tftjax.data.instants import parse_times
from tftjax.errors import ConfigError

SPLITS = ("train", "val", "test")


@dataclasses.dataclass(frozen=True)
class Forecast:
    """A forecast run: its tidy table (column → array, one row per origin and horizon step),
    the file metadata, and what produced it."""

    table: dict[str, np.ndarray]
    meta: dict[str, str]
    zone: str | None
    """The zone of the local time columns (None: naive bars, their clock as stored)."""
    dataset: Dataset
    rows: np.ndarray  # [n] global origin rows
    starts: np.ndarray  # [n] window starts
    pred: np.ndarray  # [n, D, Q] in target units (the series' training scale)
    warnings: tuple[str, ...] = ()

    def to_arrow(self):
        """The table as pyarrow, the metadata on its schema (keys ``tftjax.*``)."""
        return to_arrow(self)

    def write(self, path) -> None:
        """Parquet (metadata in the schema) or CSV (metadata in ``PATH.json`` beside it)."""
        write(self, path)


def split_of(ds: Dataset, rows: np.ndarray, encoder_steps: int) -> np.ndarray:
    """Each origin's split as the run's windows were split (``""``: none)."""
    out = np.full(rows.size, "", dtype=object)
    starts = rows - (encoder_steps - 1)
    for name in SPLITS:
        out[np.isin(starts, getattr(ds.splits, name))] = name
    return out


def _zone(ds) -> str | None:
    zones = {s.bars.tz for s in ds.series}
    if len(zones) == 1:
        return zones.pop()
    if None in zones:
        raise ConfigError(
            "some series have a time zone and others are naive: give every "
            "file's times with their zone, or none"
        )
    return "UTC"


def build(
    saved,
    ds,
    rows: np.ndarray,
    starts: np.ndarray,
    pred: np.ndarray,
    *,
    as_of: str | None,
    own_splits: bool,
    stale_after: int,
):
    from tftjax.training.evaluation import window_targets

    cfg = saved.cfg
    d = cfg.data.decoder_steps
    which = ds.series_of(rows)
    scale = np.array([s.features.stats.target_scale for s in ds.series])[which]
    loc = np.array([s.features.stats.target_loc for s in ds.series])[which]
    q = pred.astype(np.float64) * scale[:, None, None] + loc[:, None, None]
    n = rows.size
    origin_ts = ds.ts[rows]
    target_ts, expected = np.empty((n, d), np.int64), np.ones((n, d), bool)
    missing = np.zeros(n, np.int64)
    t_as_of = parse_times(as_of)["as_of"]
    y = window_targets(ds, starts).astype(np.float64)  # NaN: the slot has no bar (yet)
    warnings = list(ds.warnings) + zone_notes(saved, ds)
    for i, s in enumerate(ds.series):
        sel = which == i
        if not sel.any():
            continue
        tl = s.features.timeline
        fut_utc, fut_wall = tl.future(d)
        local = rows[sel] - ds.offsets[i]
        # the bars' own representation: instants for bars with a zone, else the wall clock
        target_ts[sel] = (fut_utc if s.bars.tz is not None else fut_wall)[local]
        clock = s.features.stats.clock
        if clock.calendar is None and clock.daily and not clock.weekdays:
            seen = np.unique(day_of_week(tl.wall))
            expected[sel] = np.isin(day_of_week(fut_wall[local]), seen)
        if t_as_of is not None:  # slots up to the as-of that have no bar: a stale origin
            t = t_as_of.on_clock(s.bars.tz, clock.zone, str(s.bars.path))
            missing[sel] = ((target_ts[sel] <= t) & ~np.isfinite(y[sel])).sum(axis=1)
            late = missing[sel][-1]  # its last origin's
            if late > stale_after:
                warnings.append(
                    f"{s.name}: its last bar at or before --as-of {as_of} is "
                    f"{late} calendar slots old (the data has no bar since "
                    f"{_text(origin_ts[sel][-1], s.bars.tz)})"
                )
    last = [np.flatnonzero(which == i)[-1] for i in np.unique(which)]  # each series' last origin
    if t_as_of is not None and all(missing[j] >= d for j in last):
        i = int(which[-1])
        raise ConfigError(
            f"--as-of {as_of} is after the data: the last bar of "
            f"{ds.series[i].bars.path} is {_text(origin_ts[-1], ds.series[i].bars.tz)}"
            f", and every step of every series' forecast lies before it (drop "
            "--as-of to forecast from each series' last bar)"
        )
    realised = y * scale[:, None] + loc[:, None]
    zone = _zone(ds)
    rep = lambda a: np.repeat(a, d)  # per origin → per row
    out = {
        "instrument": rep(np.array(ds.names)[which]),
        "origin_time": rep(origin_ts),
        "target_time": target_ts.reshape(-1),
    }
    if zone is not None:
        out["origin_time_utc"], out["target_time_utc"] = out["origin_time"], out["target_time"]
    split = split_of(ds, rows, cfg.data.encoder_steps) if own_splits else np.full(n, "", object)
    out.update(
        {
            "horizon": np.tile(np.arange(1, d + 1), n),
            "bar_expected": expected.reshape(-1),
            "split": rep(split),
            "missing_bars": rep(missing),
            "close_at_origin": rep(ds.close[rows]),
        }
    )
    cumulative = cfg.data.target == "cumulative"
    quantile_columns(out, q, realised, cfg.head.quantiles, cumulative and cfg.data.returns_target)
    if not cfg.data.returns_target:
        own_units(out, ds, rows, cfg)
    out["stats_from"] = rep(np.array([s.stats_from for s in ds.series])[which])
    ident = ds.identity()
    shas = np.array(
        [p["sha256"] for p in ident["series"]] if "series" in ident else [ident["sha256"]]
    )
    out["data_sha256"] = rep(shas[which])
    meta = {**table_meta(saved, ident, as_of, zone), "notes": json.dumps(warnings)}
    return Forecast(out, meta, zone, ds, rows, starts, pred, tuple(warnings))


def quantile_columns(out: dict, q: np.ndarray, realised: np.ndarray, quantiles, cumulative: bool):
    """The quantiles' columns (and their prices for a cumulative target), the realised value
    and the P50 and P90 pinball losses, row by row, into ``out``."""
    for j, p in enumerate(quantiles):
        name = f"q{p * 100:g}"
        out[name] = q[:, :, j].reshape(-1)
        if cumulative:
            out[f"price_{name}"] = out["close_at_origin"] * np.exp(out[name])
    out["realised"] = realised.reshape(-1)
    for level in (0.5, 0.9):
        j = next((j for j, p in enumerate(quantiles) if abs(p - level) < 1e-9), None)
        if j is not None:
            err = out["realised"] - q[:, :, j].reshape(-1)
            out[f"loss_q{level * 100:g}"] = np.maximum(level * err, (level - 1.0) * err)


def own_units(out: dict, ds: Dataset, rows: np.ndarray, cfg) -> None:
    """A target of your own: the column at the origin, and the quantiles in its own units
    where they map onto them exactly (the module docstring)."""
    d = cfg.data
    col = d.target_column
    values = np.concatenate(
        [
            s.bars.close if col == "close" else np.asarray(s.bars.columns[col], np.float64)
            for s in ds.series
        ]
    )
    at = np.repeat(values[rows], d.decoder_steps)
    out["value_at_origin"] = at
    how, cumulative = d.target_transform, d.target == "cumulative"
    if how in ("log_return", "diff") and not cumulative:
        return  # a bar's change: its quantiles do not add up to a level's
    for p in cfg.head.quantiles:
        name = f"q{p * 100:g}"
        v = out[name]
        out[f"level_{name}"] = {
            "level": v,
            "log": np.exp(v),
            "log_return": at * np.exp(v),
            "diff": at + v,
        }[how]


def table_meta(saved, ident: dict, as_of: str | None, zone: str | None) -> dict:
    """The file's metadata: the model, its weights' hash, the data, the clock, the target."""
    from tftjax.runner.provenance import tree_sha256

    return {
        "checkpoint": str(saved.given),
        "checkpoint_kind": saved.kind,
        "checkpoint_epoch": "" if saved.weights_epoch is None else str(saved.weights_epoch),
        "weights_sha256": tree_sha256(saved.variables),
        "data": json.dumps(ident),
        "as_of": as_of or "",
        "time_zone": zone or "none: naive bars, their clock as stored",
        "target": target_text(saved.cfg.data),
        "quantiles": json.dumps(list(saved.cfg.head.quantiles)),
    }


def target_text(d) -> str:
    """What ``q{p}`` forecasts, in words."""
    if d.returns_target:
        cumulative = d.target == "cumulative"
        return "k-bar log return from the origin" if cumulative else "1-bar log return of bar k"
    what = {
        "log_return": "log return",
        "diff": "change",
        "level": "value",
        "log": "log of the value",
    }[d.target_transform]
    span = "k bars from the origin" if d.target == "cumulative" else "bar k"
    return f"{what} of column {d.target_column!r}, {span}"


def zone_notes(saved, ds) -> list[str]:
    """How bars whose zone-awareness differs from the training bars' were read."""
    trained = (saved.featurisation or {}).get("stats", saved.feature_stats)
    out = []
    for s in ds.series:
        st = trained.get(s.name) if isinstance(trained, dict) else trained
        if st is None or (st.clock.data_zone is None) == (s.bars.tz is None):
            continue
        zone = s.features.stats.clock.zone
        out.append(
            f"{s.name}: the model was trained on "
            + (
                f"naive bars; these carry the zone {s.bars.tz}, and are read on its wall clock"
                if s.bars.tz
                else f"bars of the zone {st.clock.data_zone}; these naive bars are read as the "
                f"wall clock of {zone or 'their own clock (no zone)'}"
            )
        )
    return out


def _text(ns: int, tz: str | None) -> str:
    import pyarrow as pa

    return (
        str(pa.scalar(int(ns), pa.timestamp("ns", tz=tz)).as_py())
        if tz
        else str(np.datetime64(int(ns), "ns"))
    )


def to_arrow(f):
    """The table as pyarrow, with the metadata on its schema (keys ``tftjax.*``)."""
    import pyarrow as pa

    cols = {}
    for k, v in f.table.items():
        if k.endswith("_utc"):
            cols[k] = pa.array(v, pa.timestamp("ns", tz="UTC"))
        elif k in ("origin_time", "target_time"):
            cols[k] = pa.array(v, pa.timestamp("ns", tz=f.zone))
        elif v.dtype == object:
            cols[k] = pa.array(v.tolist(), pa.string())
        else:
            cols[k] = pa.array(v)
    t = pa.table(cols)
    return t.replace_schema_metadata({f"tftjax.{k}": v for k, v in f.meta.items()})


def write(f, path) -> None:
    """Parquet (metadata in the schema) or CSV (metadata in ``PATH.json`` beside it)."""
    path = Path(path)
    t = to_arrow(f)
    if path.suffix == ".csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(t, path)
        path.with_name(path.name + ".json").write_text(json.dumps(f.meta, indent=2) + "\n")
    else:
        import pyarrow.parquet as pq

        pq.write_table(t, path)
