"""Your own inputs: columns of the bars file (or of a static table) as the TFT's observed,
known-future and static inputs (``--observed``, ``--known``, ``--static``,
``--categorical``; docs/covariates.md).

A :class:`Schema` is fitted on the training rows of every series together: each column's
role, whether it is a category, what the file held (numbers or text) and, for a category,
its levels (sorted; one more index, ``len(levels)``, is the unknown bucket that a level
never seen in training takes). Reals are z-scored per series by that series' own training
rows (:class:`SeriesFit`), as the built-in inputs are; static reals by their spread across
the training series. The schema rides in every checkpoint's metadata and export.

Each series' inputs (:func:`covariate_inputs`), appended to the built-in ones:

* **observed** (historical, ``[n, 2·k_o]``): each column's value at the bar and a flag that
  it was missing from the file. A missing value is carried forward from the last bar that
  had one, for at most ``--max-ffill`` bars (default one window); past that (or before the
  first value) it is *stale*: its value input is 0 (a category: the unknown bucket), and
  every window whose encoder holds a stale row is left out (:func:`drop_windows`).
* **known** (``[n, k_k]`` at each bar, ``[n, D, k_k]`` at the ``D`` calendar slots after
  each bar): the value of the row on that slot, or where the slot has no bar the last row
  before it (a schedule holds until it changes), never a row after the slot. Rows after
  the data (``--future``, the forecast's horizon) come from a table of their own
  (:func:`future_schedule`). A slot that no row reaches is unscheduled: a window whose
  decoder needs it is left out, and a forecast that needs it is refused, naming the
  column and the time.
* **static** (``[k_s]``): one value per series.

Categories enter as their index (an exact float32 integer) at their column's place; the
model embeds them (:func:`tftjax.models.tft.covariate_layout`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from tftjax.config import DataConfig
from tftjax.errors import DataError

CLIP = 10.0
"""Z-scored reals are clipped to ±CLIP (as the built-in inputs are)."""


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of your own, as trained."""

    name: str
    role: str  # static, observed or known
    categorical: bool
    dtype: str  # "number" or "text": what the training file held
    levels: tuple[str, ...] = ()
    """A category's levels in the training rows (sorted); index ``len(levels)``: unknown."""
    mean: float = 0.0
    std: float = 1.0
    """A static real's mean and spread across the training series."""

    def index(self, values: np.ndarray) -> np.ndarray:
        """Levels → float32 indices (unknown levels and missing values: the unknown bucket)."""
        lookup = {v: i for i, v in enumerate(self.levels)}
        unknown = len(self.levels)
        return np.array([lookup.get(level_of(v), unknown) for v in values], np.float32)


@dataclasses.dataclass(frozen=True)
class Schema:
    """Every column of your own, in input order (static, observed, known)."""

    columns: tuple[Column, ...] = ()

    def of(self, role: str) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.role == role)

    @property
    def widths(self) -> dict[str, int]:
        """Inputs added to each group: static, historical (value and missing flag of each
        observed column) and known."""
        return {
            "static": len(self.of("static")),
            "historical": 2 * len(self.of("observed")),
            "known": len(self.of("known")),
        }

    def categories(self, order: tuple[str, ...]) -> tuple[int, ...]:
        """Embedding rows of each categorical column in ``order`` (``--categorical``'s)."""
        by = {c.name: c for c in self.columns}
        return tuple(len(by[n].levels) + 1 for n in order)

    def to_json(self) -> list[dict]:
        return [{**dataclasses.asdict(c), "levels": list(c.levels)} for c in self.columns]

    @classmethod
    def from_json(cls, d: list[dict] | None) -> Schema:
        return cls(tuple(Column(**{**c, "levels": tuple(c["levels"])}) for c in d or ()))


@dataclasses.dataclass(frozen=True)
class SeriesFit:
    """One series' own statistics of its observed and known reals (its training rows), and
    its static values."""

    mean: dict[str, float]
    std: dict[str, float]
    static: dict[str, Any]

    def to_json(self) -> dict:
        return {"mean": self.mean, "std": self.std, "static": self.static}

    @classmethod
    def from_json(cls, d: dict | None) -> SeriesFit | None:
        return None if d is None else cls(dict(d["mean"]), dict(d["std"]), dict(d["static"]))


@dataclasses.dataclass(frozen=True)
class Inputs:
    """One series' inputs of your own."""

    historical: np.ndarray  # [n, 2 k_o] float32
    known: np.ndarray  # [n, k_k] float32
    future: np.ndarray  # [n, D, k_k] float32
    static: np.ndarray  # [k_s] float32
    stale: np.ndarray  # [n] bool: an observed value past --max-ffill (or none yet)
    unscheduled: np.ndarray  # [n] bool: a decoder slot after this row has no known value
    stale_by: dict[str, np.ndarray]
    """Each observed column's stale rows."""
    scheduled_until: int | None = None
    """The last calendar slot with known values (the bars', or the ``--future`` table's)."""
    notes: tuple[str, ...] = ()
    """Levels of a category that training never saw (served by its unknown bucket)."""

    def why_not(
        self, row: int, encoder_steps: int, slots: np.ndarray, known: tuple
    ) -> tuple[str, str, int] | None:
        """Why an origin at ``row`` cannot be forecast: ``("stale", column, the stale
        row)`` or ``("unscheduled", columns, the first decoder step without a value)``;
        None where it can."""
        for name, gone in self.stale_by.items():
            hit = np.flatnonzero(gone[max(row - encoder_steps + 1, 0) : row + 1])
            if hit.size:
                return "stale", name, row - encoder_steps + 1 + int(hit[0])
        if self.unscheduled[row] and self.scheduled_until is not None:
            return "unscheduled", ",".join(known), self.scheduled_until - int(slots[row]) + 1
        return None


def input_names(cfg: DataConfig) -> tuple[list[str], list[str], list[str]]:
    """The names of the static, encoder (historical, then the known at past steps) and
    decoder inputs: the built-in ones, then your own columns (an observed column's value
    and its missing flag)."""
    from tftjax.data.calendar import KNOWN_NAMES
    from tftjax.data.feature_stats import STATIC_NAMES, input_history

    static = list(STATIC_NAMES) + list(cfg.static)
    observed = [x for c in cfg.observed for x in (c, f"{c} (missing)")]
    known = list(KNOWN_NAMES) + list(cfg.known)
    history = list(input_history(cfg.features, cfg.inputs))
    encoder = history + observed + [f"{n} (known)" for n in known]
    return static, encoder, known


# ------------------------------------------------------------------ reading values
def is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v))


def level_of(v: Any) -> str:
    """A category's level as text (numbers without a trailing ``.0``: 3.0 and 3 are one)."""
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def check_real(name: str, role: str, values: np.ndarray, source: str) -> None:
    if values.dtype == object:
        sample = next((v for v in values if not is_missing(v)), None)
        raise DataError(
            f"{source}: column {name!r} holds text ({sample!r}), and --{role} takes it as a "
            "real: name it in --categorical too, or give numbers"
        )
    if np.isinf(values).any():
        row = int(np.flatnonzero(np.isinf(values))[0])
        raise DataError(f"{source}: column {name!r} row {row}: value is infinite")


def first_missing(values: np.ndarray) -> int | None:
    miss = missing_mask(values)
    return int(np.flatnonzero(miss)[0]) if miss.any() else None


def missing_mask(values: np.ndarray) -> np.ndarray:
    if values.dtype == object:
        return np.array([is_missing(v) for v in values], bool)
    return np.isnan(values)


def time_text(ns: int, tz: str | None) -> str:
    t = str(np.datetime64(int(ns), "ns").astype("datetime64[s]"))
    return f"{t} UTC" if tz else f"{t} (no zone)"


# ------------------------------------------------------------------ statics
def static_values(cfg: DataConfig, name: str, bars, table: dict | None) -> dict[str, Any]:
    """A series' static values: from the static table (keyed by series name), or from its
    bars' columns, where each must hold one value.

    Raises:
      DataError: a series the table lacks, a value that varies within the series, or one
        that is missing.
    """
    out = {}
    row_of = None if table is None else table.get(name, table.get("*"))
    if table is not None and row_of is None:
        raise DataError(
            f"{cfg.static_file}: no row for series {name!r} (it has "
            f"{', '.join(map(str, list(table)[:5]))})"
        )
    for col in cfg.static:
        if row_of is not None:
            v = row_of[col]
        else:
            values = bars.columns[col]
            row = first_missing(values)
            if row is not None:
                raise DataError(
                    f"{bars.path}: column {col!r} row {row}: a --static value is missing "
                    "(a static may not be missing)"
                )
            distinct = {level_of(v) for v in values} if values.dtype == object else set(values)
            if len(distinct) > 1:
                shown = ", ".join(sorted(map(str, distinct))[:3])
                raise DataError(
                    f"{bars.path}: column {col!r} takes {len(distinct)} values within one "
                    f"series ({shown}...): a --static column holds one value per series"
                )
            v = values[0]
        if is_missing(v):
            raise DataError(f"{cfg.static_file}: series {name!r}, column {col!r}: missing value")
        out[col] = v.item() if isinstance(v, np.generic) else v
    return out


def read_static_file(cfg: DataConfig) -> dict[str, dict[str, Any]] | None:
    """``--static-file``: series name → ``{column: value}`` (None without one).

    Raises:
      DataError: an unreadable file, no symbol column (unless it has one row), a column
        it lacks, or a symbol given twice.
    """
    if cfg.static_file is None:
        return None
    from tftjax.data.bars import SYMBOL_COLUMNS, read_columns

    path = Path(cfg.static_file)
    table = read_any_table(path)
    key = next((c for c in table.column_names if c.lower() in SYMBOL_COLUMNS), None)
    values = read_columns(table, str(path), tuple(cfg.static))
    if key is None:
        if table.num_rows != 1:
            raise DataError(
                f"{path}: no symbol column ({', '.join(SYMBOL_COLUMNS[:3])}, …) to key its "
                f"{table.num_rows} rows by series"
            )
        return {"*": {c: values[c][0] for c in cfg.static}}
    names = [str(s) for s in table.column(key).to_pylist()]
    if len(set(names)) < len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise DataError(f"{path}: series {dup!r} has two rows")
    return {n: {c: values[c][i] for c in cfg.static} for i, n in enumerate(names)}


def read_any_table(path: Path):
    """A parquet or CSV table (pyarrow)."""
    import pyarrow as pa

    if not path.exists():
        raise DataError(f"{path}: file not found")
    try:
        if path.suffix.lower() == ".csv":
            import pyarrow.csv as pacsv

            return pacsv.read_csv(path)
        import pyarrow.parquet as pq

        return pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable table ({type(e).__name__}: {e})") from None


# ------------------------------------------------------------------ fitting
def fit_schema(cfg: DataConfig, series: list[tuple[str, Any, tuple[int, int], dict]]) -> Schema:
    """The schema of ``cfg``'s columns, fitted on the training rows of every series
    (``(name, bars, train_rows, static values)`` each).

    Raises:
      DataError: a non-numeric real, or a category with more than ``--max-categories``
        levels in the training rows.
    """
    columns = []
    cats = set(cfg.categorical)
    for name, role in cfg.covariates:
        parts = []
        if role == "static":
            training = np.array([s[3][name] for s in series], dtype=object)
        else:
            parts = [(b.columns[name], rows, b.path) for _, b, rows, _ in series]
            training = np.concatenate([v[a:b] for v, (a, b), _ in parts])
        text = any(isinstance(v, str) for v in training) or (
            role != "static" and any(v.dtype == object for v, _, _ in parts)
        )
        dtype = "text" if text else "number"
        if name in cats:
            levels = sorted({level_of(v) for v in training if not is_missing(v)})
            if len(levels) > cfg.max_categories:
                raise DataError(
                    f"column {name!r} has {len(levels):,} levels in the training rows, more "
                    f"than --max-categories {cfg.max_categories}: raise it, or declare a real"
                )
            columns.append(Column(name, role, True, dtype, tuple(levels)))
            continue
        if role == "static":
            real = check_static_real(name, training)
            std = float(real.std()) if real.size > 1 else 0.0
            columns.append(
                Column(name, role, False, dtype, mean=float(real.mean()), std=std or 1.0)
            )
        else:
            for v, _, path in parts:  # before fit_series reads them as numbers
                check_real(name, role, v, path)
            columns.append(Column(name, role, False, dtype))
    return Schema(tuple(columns))


def check_static_real(name: str, values: np.ndarray) -> np.ndarray:
    try:
        return np.array([float(v) for v in values], np.float64)
    except (TypeError, ValueError):
        raise DataError(
            f"column {name!r} holds text ({values[0]!r}), and --static takes it as a real: "
            "name it in --categorical too, or give numbers"
        ) from None


def fit_series(
    schema: Schema, bars, train_rows: tuple[int, int], static: dict[str, Any]
) -> SeriesFit:
    """A series' mean and std of each observed and known real over its training rows (the
    values the file has; std 0 → 1)."""
    mean, std = {}, {}
    a, b = train_rows
    for c in schema.columns:
        if c.categorical or c.role == "static":
            continue
        block = bars.columns[c.name][a:b]
        block = block[np.isfinite(block)]
        mean[c.name] = float(block.mean()) if block.size else 0.0
        s = float(block.std()) if block.size else 0.0
        std[c.name] = s if s > 1e-12 else 1.0
    return SeriesFit(mean, std, static)


def pooled_fit(fits: list[SeriesFit], static: dict[str, Any]) -> SeriesFit:
    """A series without training rows of its own: the trained series' mean statistics."""
    names = list(fits[0].mean) if fits else []
    mean = {k: float(np.mean([f.mean[k] for f in fits])) for k in names}
    std = {k: float(np.mean([f.std[k] for f in fits])) for k in names}
    return SeriesFit(mean, std, static)


# ------------------------------------------------------------------ inputs
def forward_fill(values: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(filled, missing, stale)``: each missing value replaced by the last value before it
    when that is at most ``limit`` rows back; ``stale`` where it is further back or there is
    none (the value is then left missing)."""
    n = values.shape[0]
    missing = missing_mask(values)
    rows = np.arange(n)
    last = np.maximum.accumulate(np.where(~missing, rows, -1))
    fresh = ~missing | ((last >= 0) & (rows - last <= limit))
    filled = values.copy()
    take = missing & fresh
    filled[take] = values[last[take]]
    return filled, missing, missing & ~fresh


def real_input(values: np.ndarray, mean: float, std: float, cfg: DataConfig) -> np.ndarray:
    """Z-scored by the training rows (or causally, ``--normalise expanding|rolling``),
    clipped to ±CLIP; missing → 0."""
    from tftjax.data.feature_stats import causal_z

    x = np.asarray(values, np.float64)
    if cfg.normalise == "train":
        z = (x - mean) / std
    else:
        z = causal_z(x, cfg.normalise_window if cfg.normalise == "rolling" else None)
    return np.nan_to_num(np.clip(z, -CLIP, CLIP), nan=0.0).astype(np.float32)


def unseen_levels(c: Column, values: np.ndarray, where: str) -> list[str]:
    """A note naming the levels of ``values`` that training never saw (none: [])."""
    if not c.categorical:
        return []
    seen = {level_of(v) for v in values if not is_missing(v)}
    new = sorted(seen - set(c.levels))
    if not new:
        return []
    shown = ", ".join(new[:5]) + (f" and {len(new) - 5} more" if len(new) > 5 else "")
    return [
        f"{where}: column {c.name!r} holds level(s) {shown} not seen in the training rows: "
        "served by its unknown bucket"
    ]


def column_input(
    c: Column, values: np.ndarray, fit: SeriesFit, cfg: DataConfig, source: str = "data"
) -> np.ndarray:
    if c.categorical:
        return c.index(values)
    check_real(c.name, c.role, values, source)  # a model's real, given text: refused
    return real_input(values, fit.mean[c.name], fit.std[c.name], cfg)


def covariate_inputs(
    schema: Schema,
    fit: SeriesFit,
    bars,
    slots: np.ndarray,
    cfg: DataConfig,
    schedule: tuple[np.ndarray, dict[str, np.ndarray]] | None = None,
) -> Inputs:
    """One series' inputs of your own (the module's docstring).

    Args:
      slots: the calendar slot of every bar (:meth:`Timeline.slot_index`).
      schedule: known values after the bars (``(their slots, column → values)``,
        :func:`future_schedule`).

    Raises:
      DataError: a known value missing in the bars (naming the column and its time).
    """
    n, d = len(bars), cfg.decoder_steps
    notes = []
    for c in schema.of("observed") + schema.of("known"):
        notes += unseen_levels(c, bars.columns[c.name], str(bars.path))
        if schedule is not None and c.role == "known":
            notes += unseen_levels(c, schedule[1][c.name], f"{bars.path} --future")
    for c in schema.of("static"):
        notes += unseen_levels(c, np.array([fit.static[c.name]], dtype=object), str(bars.path))
    hist = np.zeros((n, 2 * len(schema.of("observed"))), np.float32)
    stale = np.zeros(n, bool)
    stale_by = {}
    for j, c in enumerate(schema.of("observed")):
        filled, missing, gone = forward_fill(bars.columns[c.name], cfg.ffill_rows)
        hist[:, 2 * j] = column_input(c, filled, fit, cfg, str(bars.path))
        if c.categorical:
            hist[gone, 2 * j] = len(c.levels)  # the unknown bucket
        else:
            hist[gone, 2 * j] = 0.0
        hist[:, 2 * j + 1] = missing
        stale |= gone
        stale_by[c.name] = gone
    known_cols = schema.of("known")
    known = np.zeros((n, len(known_cols)), np.float32)
    future = np.zeros((n, d, len(known_cols)), np.float32)
    unscheduled = np.zeros(n, bool)
    for j, c in enumerate(known_cols):
        values = bars.columns[c.name]
        row = first_missing(values)
        if row is not None:
            raise DataError(
                f"{bars.path}: column {c.name!r} row {row} ({time_text(bars.ts[row], bars.tz)}): "
                "a --known value is missing (known inputs are scheduled: they may not be)"
            )
        extra = None if schedule is None else schedule[1][c.name]
        all_values = values if extra is None else np.concatenate([values, extra])
        encoded = column_input(c, all_values, fit, cfg, str(bars.path))
        known[:, j] = encoded[:n]
        at, gap = slot_values(encoded, slots, d, None if schedule is None else schedule[0])
        future[:, :, j] = at
        unscheduled |= gap
    static = np.array(
        [
            c.index(np.array([fit.static[c.name]], dtype=object))[0]
            if c.categorical
            else np.clip(
                (
                    check_static_real(c.name, np.array([fit.static[c.name]], dtype=object))[0]
                    - c.mean
                )
                / c.std,
                -CLIP,
                CLIP,
            )
            for c in schema.of("static")
        ],
        np.float32,
    )
    until = None
    if known_cols and n:
        until = int(slots[-1] if schedule is None or not schedule[0].size else schedule[0][-1])
    return Inputs(hist, known, future, static, stale, unscheduled, stale_by, until, tuple(notes))


def slot_values(
    encoded: np.ndarray, slots: np.ndarray, steps: int, after: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(values [n, steps], unscheduled [n])``: at each row's ``k``-th calendar slot after
    it, the value of the last schedule row at or before that slot (the bars, then the rows
    ``after`` them); unscheduled where the slot lies past every schedule row."""
    slots = np.asarray(slots, np.int64)
    n = slots.shape[0]
    sched = slots if after is None else np.concatenate([slots, np.asarray(after, np.int64)])
    want = slots[:, None] + np.arange(1, steps + 1)
    row = np.searchsorted(sched, want, side="right") - 1
    beyond = want > sched[-1] if sched.size else np.ones_like(want, bool)
    vals = encoded[np.clip(row, 0, sched.size - 1)]
    vals = np.where(beyond, 0.0, vals).astype(np.float32)
    return vals, np.asarray(beyond.any(axis=1) if n else np.zeros(0, bool))


def drop_windows(starts: np.ndarray, inputs: Inputs, encoder_steps: int) -> np.ndarray:
    """Window starts whose encoder holds no stale observed row and whose decoder slots are
    all scheduled."""
    if not (inputs.stale.any() or inputs.unscheduled.any()):
        return starts
    csum = np.concatenate([[0], np.cumsum(inputs.stale)])
    s = np.asarray(starts, np.int64)
    clean = csum[s + encoder_steps] - csum[s] == 0
    clean &= ~inputs.unscheduled[s + encoder_steps - 1]
    return starts[clean]


def future_schedule(
    cfg: DataConfig, future, bars, clock, source: str = "--future"
) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
    """The known columns' rows after a series' last bar, as ``(their calendar slots on the
    bars' timeline, column → values)``: from ``future`` (a table: a time column, the --known
    columns, and for several series a symbol column), else from the rows after the bars in
    their own file with the prices empty (:attr:`Bars.ahead`); None without known columns
    or either.

    Raises:
      DataError: a table without a time column or the known columns, times whose zone the
        bars' do not share, or a missing value.
    """
    if not cfg.known:
        return None
    if future is not None:
        ts, values, path = future_rows(cfg, future, bars, source)
    elif bars.ahead is not None:
        ts, values, path = bars.ahead[0], bars.ahead[1], f"{bars.path} (its rows ahead)"
    else:
        return None
    later = ts > bars.ts[-1]
    ts, values = ts[later], {k: np.asarray(values[k])[later] for k in cfg.known}
    for name, v in values.items():
        row = first_missing(v)
        if row is not None:
            raise DataError(
                f"{path}: column {name!r} at {time_text(ts[row], bars.tz)}: a --known "
                "value is missing"
            )
    from tftjax.data.calendar import Timeline

    slots = Timeline(np.concatenate([bars.ts, ts]), clock, 0, path).slot_index()
    return slots[len(bars) :], values


def future_rows(cfg: DataConfig, future, bars, source: str):
    """``(times, column → values, name)`` of a ``--future`` table's rows for ``bars``'
    series, in time order."""
    import pyarrow as pa

    from tftjax.data.bars import SYMBOL_COLUMNS, _time_column, _time_to_ns, pc, read_columns
    from tftjax.data.sources import read_table

    table, _, path = read_table(future)
    path = source if path == "<table>" else path
    key = next((c for c in table.column_names if c.lower() in SYMBOL_COLUMNS), None)
    if key is not None and bars.symbol is not None:
        col = table.column(key)
        table = table.filter(pc.equal(pc.cast(col, pa.string()), bars.symbol))
    elif key is not None and len(pc.unique(table.column(key))) > 1:
        raise DataError(
            f"{path}: its column {key!r} names several series, and {bars.path} is one series "
            "without a symbol column: give its rows alone"
        )
    tname = _time_column(table, path)
    if tname is None:
        raise DataError(f"{path}: no time column (ts, timestamp, date, ...)")
    t = table.column(tname).type
    # an integer epoch counts from 1970-01-01 UTC, as the bars' reader takes it
    zoned = (pa.types.is_timestamp(t) and t.tz is not None) or pa.types.is_integer(t)
    if zoned != (bars.tz is not None):
        raise DataError(
            f"{path}: its times are "
            + (f"in the zone {getattr(t, 'tz', None) or 'UTC'}" if zoned else "naive (no zone)")
            + f", and the bars' of {bars.path} "
            + (f"carry the zone {bars.tz}" if bars.tz else "are naive")
            + ": give both with a zone, or both without"
        )
    ts = _time_to_ns(table.column(tname), path, tname)
    order = np.argsort(ts, kind="stable")
    values = read_columns(table, path, tuple(cfg.known))
    return ts[order], {k: v[order] for k, v in values.items()}, path
