"""Read and validate OHLCV bars from parquet.

``read_bars(path)`` returns a :class:`Bars` table (numpy columns, float64
prices, int64 nanosecond timestamps) or raises :class:`DataError` whose
message names the file, the column and the first offending row. Every CLI
turns a ``DataError`` into one line on stderr and exit code 2.

Accepted column names (any case): time from ``ts``, ``ts_event``,
``timestamp``, ``datetime``, ``date`` (first match in that order; timestamp,
date, ISO-8601 string or integer epoch in s/ms/us/ns); prices and volume
from ``open``, ``high``, ``low``, ``close``, ``volume``. Two columns that differ only
in case (``close`` and ``Close``) are refused. A symbol column (``symbol``,
``ticker``, ``instrument`` …) whose contracts follow one another in time is one rolled
series; one whose instruments interleave or overlap in time makes a *long* file of
several series: :func:`read_bars` refuses it, :func:`read_series` splits it by symbol
(each series named by its symbol). Time-zone-aware timestamps are kept as instants with
their zone (:attr:`Bars.tz`); see :mod:`tftjax.data.calendar`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as _pc
import pyarrow.parquet as pq

from tftjax.config import WARMUP, DataConfig
from tftjax.data.sources import read_table
from tftjax.errors import DataError

TIME_COLUMNS = ("ts", "ts_event", "timestamp", "datetime", "date")
VALUE_COLUMNS = ("open", "high", "low", "close", "volume")
SYMBOL_COLUMNS = (
    "symbol",
    "ticker",
    "instrument",
    "instrument_id",
    "asset",
    "contract",
    "security",
)

pc: Any = _pc  # pyarrow.compute's functions are made at import: no stubs


@dataclasses.dataclass(frozen=True)
class Bars:
    """A validated bar table; every column has the same length ``n``."""

    path: str
    ts: np.ndarray  # [n] int64, nanoseconds since the epoch (wall-clock as stored)
    open: np.ndarray  # [n] float64
    high: np.ndarray  # [n] float64
    low: np.ndarray  # [n] float64
    close: np.ndarray  # [n] float64
    volume: np.ndarray  # [n] float64
    sha256: str = ""
    """Hash of the parquet file's bytes ("" for bars built in memory: see :func:`content_hash`)."""
    tz: str | None = None
    """The timestamps' zone when they were time-zone aware (``ts`` then holds UTC instants);
    None for naive (wall-clock) timestamps."""
    notes: tuple[str, ...] = ()
    """What reading noticed that is allowed but worth a word (e.g. a futures roll)."""
    symbol: str | None = None
    """The instrument of a series read from a long file's symbol column (None: the file
    is the series)."""
    columns: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """Your own columns read beside the bars (``--observed``, ``--known``, ``--static``), as
    the file holds them: numbers as float64 (NaN where missing), anything else as text
    (None where missing). tftjax.data.covariates makes inputs of them."""
    ahead: tuple[np.ndarray, dict[str, np.ndarray]] | None = None
    """Rows after the last bar with every price and the volume empty (a forecast's
    horizon): their times and your columns (the known values ahead), or None."""

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    def slice(self, start: int, stop: int) -> Bars:
        return dataclasses.replace(
            self,
            **{f: getattr(self, f)[start:stop] for f in ("ts",) + VALUE_COLUMNS},
            columns={k: v[start:stop] for k, v in self.columns.items()},
            ahead=self.ahead if stop >= len(self) else None,
            sha256="",
        )

    def replace(self, **columns: np.ndarray) -> Bars:
        return dataclasses.replace(self, **columns, sha256="")


def default_min_rows() -> int:
    return WARMUP + DataConfig().window  # one encoder+decoder window plus the warm-up


def _fmt_ts(ns: int) -> str:
    return str(np.datetime64(int(ns), "ns"))


def _find_column(table: pa.Table, wanted: str, path: str = "") -> str | None:
    hits = [name for name in table.column_names if name.lower() == wanted]
    if len(hits) > 1:
        raise DataError(
            f"{path}: columns {' and '.join(repr(h) for h in hits)} both present "
            f"(names are read case-insensitively): keep one"
        )
    return hits[0] if hits else None


def _check_one_instrument(
    table: pa.Table, path: str, long: bool = False
) -> list[str] | tuple[str, list]:
    """Refuse several instruments interleaved in one file (a symbol that comes back after
    another began); a sequence of contracts one after another (futures rolls) is one series
    and only noted. Returns the notes; with ``long``, a long file's ``(column, symbols)``
    instead of refusing it."""
    notes = []
    for wanted in SYMBOL_COLUMNS:
        name = _find_column(table, wanted, path)
        if name is None:
            continue
        col = table.column(name)
        values = pc.unique(col.drop_null())
        if len(values) <= 1:
            continue
        codes = pc.index_in(col, value_set=values).to_numpy(zero_copy_only=False)
        change = np.flatnonzero(codes[1:] != codes[:-1]) + 1
        runs = change.size + 1
        shown = ", ".join(str(v) for v in values.to_pylist()[:4])
        more = f" and {len(values) - 4} more" if len(values) > 4 else ""
        if runs > len(values) or _time_goes_back(table, change, path):  # several series
            if long:
                if col.null_count:
                    row = int(np.flatnonzero(pc.is_null(col).to_numpy(zero_copy_only=False))[0])
                    raise DataError(
                        f"{path}: column '{name}' row {row}: missing symbol (a long "
                        "file needs the instrument of every row)"
                    )
                return name, values.to_pylist()
            raise DataError(
                f"{path}: column '{name}' holds {len(values)} instruments ({shown}{more}), "
                f"interleaved from row {int(change[0])}: a long file of several series; train "
                "on it (python -m tftjax.train --parquet-file) or keep one instrument's rows"
            )
        notes.append(
            f"{path}: column '{name}' changes {runs - 1} time(s) ({shown}{more}), one "
            f"after another from row {int(change[0])}: read as one rolled series (the "
            "returns across a roll are the price difference between contracts)"
        )
    return notes


def _time_to_ns(col: pa.ChunkedArray, path: str, name: str) -> np.ndarray:
    t = col.type
    try:
        if pa.types.is_timestamp(t):
            arr = pc.cast(col, pa.timestamp("ns", tz=t.tz))
        elif pa.types.is_date(t):
            arr = pc.cast(pc.cast(col, pa.timestamp("s")), pa.timestamp("ns"))
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            arr = pc.cast(col, pa.timestamp("ns"))
        elif pa.types.is_integer(t):
            ints = col.to_numpy().astype(np.int64)
            if ints.size and np.abs(ints).max() > 0:
                mag = np.abs(ints).max()
                # Seconds < 1e11 (year 5138), ms < 1e14, us < 1e17, else ns.
                scale = 10**9 if mag < 1e11 else 10**6 if mag < 1e14 else 10**3 if mag < 1e17 else 1
                ints = ints * scale
            return ints
        else:
            raise DataError(
                f"{path}: column '{name}' has type {t}, expected a timestamp, date, "
                "ISO-8601 string or integer epoch"
            )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise DataError(f"{path}: column '{name}' cannot be read as timestamps ({e})") from None
    if arr.null_count:
        row = int(np.flatnonzero(pc.is_null(arr).to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{path}: column '{name}' row {row}: missing timestamp")
    return (
        arr.to_numpy().view("int64")
        if arr.type.tz is None
        else np.asarray(pc.cast(arr, pa.int64()))
    )


def _numeric(col: pa.ChunkedArray, path: str, name: str) -> np.ndarray:
    t = col.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)):
        raise DataError(f"{path}: column '{name}' has type {t}, expected a number")
    values = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
    values = np.where(np.isnan(values), np.nan, values)  # nulls arrive as NaN
    return np.ascontiguousarray(values, dtype=np.float64)


def _first(mask: np.ndarray) -> int | None:
    return int(np.argmax(mask)) if mask.any() else None


def validate(bars: Bars, min_rows: int, prices: bool = True) -> None:
    """Raise :class:`DataError` at the first problem found (``prices`` False: a file that is
    not bars, whose time order and length alone are checked)."""
    if prices:
        check_prices(bars)
    check_times(bars, min_rows)


def check_prices(bars: Bars) -> None:
    path = bars.path
    for name in VALUE_COLUMNS:
        values = getattr(bars, name)
        row = _first(~np.isfinite(values))
        if row is not None:
            what = "NaN or missing" if np.isnan(values[row]) else "infinite"
            raise DataError(f"{path}: column '{name}' row {row}: value is {what}")
    for name in ("open", "high", "low", "close"):
        row = _first(getattr(bars, name) <= 0)
        if row is not None:
            raise DataError(
                f"{path}: column '{name}' row {row}: price {float(getattr(bars, name)[row])!r} is not positive"
            )
    row = _first(bars.volume < 0)
    if row is not None:
        raise DataError(
            f"{path}: column 'volume' row {row}: negative volume {float(bars.volume[row])!r}"
        )
    top = np.maximum(bars.open, bars.close)
    row = _first(bars.high < top)
    if row is not None:
        raise DataError(
            f"{path}: column 'high' row {row}: high {float(bars.high[row])!r} is below "
            f"max(open, close) = {float(top[row])!r}"
        )
    bottom = np.minimum(bars.open, bars.close)
    row = _first(bars.low > bottom)
    if row is not None:
        raise DataError(
            f"{path}: column 'low' row {row}: low {float(bars.low[row])!r} is above "
            f"min(open, close) = {float(bottom[row])!r}"
        )


def check_times(bars: Bars, min_rows: int) -> None:
    path = bars.path
    step = np.diff(bars.ts)
    row = _first(step <= 0)
    if row is not None:
        kind = "duplicate" if step[row] == 0 else "unsorted"
        raise DataError(
            f"{path}: column 'ts' row {row + 1}: {kind} timestamp {_fmt_ts(bars.ts[row + 1])} "
            f"(previous row {row}: {_fmt_ts(bars.ts[row])})"
            + (
                "; several instruments in one file? a long file needs a symbol column ("
                + ", ".join(SYMBOL_COLUMNS[:3])
                + ", …) naming each row's instrument"
                if kind == "duplicate"
                else ""
            )
        )
    if len(bars) < min_rows:
        raise DataError(
            f"{path}: {len(bars)} rows, need at least {min_rows} (the {WARMUP}-bar feature "
            f"warm-up, then {min_rows - WARMUP} for a window)"
        )


def read_bars(
    path: str | os.PathLike,
    *,
    min_rows: int | None = None,
    columns: tuple[str, ...] = (),
    target: str | None = None,
) -> Bars:
    """Read a parquet file of one series' OHLCV bars and validate it (``min_rows``: fewest
    rows accepted; default one window plus the feature warm-up; ``columns``: your own
    columns to read beside them, :attr:`Bars.columns`).

    Raises:
      DataError: naming the file, the column and the first offending row.
    """
    table, sha, path_s = read_table(path)
    notes = _check_one_instrument(table, path_s)
    return _from_table(table, path_s, sha, tuple(notes), min_rows, columns, target)


def read_series(
    path: str | os.PathLike,
    *,
    min_rows: int | None = None,
    columns: tuple[str, ...] = (),
    target: str | None = None,
) -> list[Bars]:
    """The series of a parquet file: one, or for a long file (a symbol column whose
    instruments interleave or overlap in time) one per symbol, in the order of their names,
    each validated on its own (``path`` reads ``FILE[SYMBOL]`` in messages). ``target``:
    a file that need not be OHLCV bars (``--inputs own``), whose rows are those where this
    column of ``columns`` has a value (the prices, where the file has them, are read but
    not checked)."""
    table, sha, path = read_table(path)
    found = _check_one_instrument(table, path, long=True)
    if isinstance(found, list):
        return [_from_table(table, path, sha, tuple(found), min_rows, columns, target)]
    name, symbols = found
    col = table.column(name)
    out = []
    for sym in sorted(symbols, key=str):
        part = table.filter(pc.equal(col, pa.scalar(sym, col.type)))
        out.append(
            dataclasses.replace(
                _from_table(part, f"{path}[{sym}]", sha, (), min_rows, columns, target),
                symbol=str(sym),
            )
        )
    return out


def read_columns(table: pa.Table, path: str, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Your own columns of ``table`` as the file holds them: numbers (and booleans) as
    float64 with NaN where missing, anything else as text with None where missing.

    Raises:
      DataError: a column the file lacks (naming the file and what it has).
    """
    out = {}
    for name in names:
        actual = name if name in table.column_names else _find_column(table, name.lower(), path)
        if actual is None:
            raise DataError(
                f"{path}: no column {name!r} (named by --target-column, --observed, --known "
                "or --static; "
                f"found {', '.join(table.column_names)})"
            )
        col = table.column(actual)
        t = col.type
        if pa.types.is_boolean(t):
            col, t = pc.cast(col, pa.float64()), pa.float64()
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
            out[name] = _numeric(col, path, actual)
        else:
            if pa.types.is_dictionary(t):
                col = pc.cast(col, t.value_type)
            text = pc.cast(col, pa.string()) if not pa.types.is_string(col.type) else col
            out[name] = np.asarray(text.to_pylist(), dtype=object)
    return out


def _time_goes_back(table: pa.Table, change: np.ndarray, path: str) -> bool:
    """Whether time goes back where the symbol changes (instruments one after another but
    each over its own time range: a long file sorted by symbol)."""
    time_name = _time_column(table, path)
    if time_name is None or not change.size:
        return False
    try:
        ts = _time_to_ns(table.column(time_name), path, time_name)
    except DataError:
        return False
    return bool(np.any(ts[change] <= ts[change - 1]))


def _time_column(table: pa.Table, path: str) -> str | None:
    return next(
        (_find_column(table, c, path) for c in TIME_COLUMNS if _find_column(table, c, path)), None
    )


def _from_table(
    table: pa.Table,
    path_s: str,
    sha: str | None,
    notes: tuple,
    min_rows: int | None,
    columns: tuple[str, ...] = (),
    target: str | None = None,
) -> Bars:
    time_name = _time_column(table, path_s)
    if time_name is None:
        raise DataError(
            f"{path_s}: no time column (looked for {', '.join(TIME_COLUMNS)}; "
            f"found {', '.join(table.column_names) or 'no columns'})"
        )
    cols: dict[str, Any] = {}
    for name in VALUE_COLUMNS:
        actual = _find_column(table, name, path_s)
        if actual is None and target is not None:  # not bars: no prices needed
            cols[name] = np.full(table.num_rows, np.nan)
            continue
        if actual is None:
            raise DataError(
                f"{path_s}: missing column '{name}' (found {', '.join(table.column_names)})"
            )
        cols[name] = _numeric(table.column(actual), path_s, actual)
    ts = _time_to_ns(table.column(time_name), path_s, time_name)
    own = read_columns(table, path_s, columns)
    ahead = None
    if columns:  # rows after the last bar with no prices (target): the known values ahead
        empty = (
            np.all([np.isnan(cols[c]) for c in VALUE_COLUMNS], axis=0)
            if target is None
            else empty_values(own[target], path_s, target)
        )
        ts, cols, own, ahead = split_ahead(ts, cols, own, empty)
    t = table.column(time_name).type
    # an integer epoch counts from 1970-01-01 UTC: instants, not a wall clock
    tz = t.tz if pa.types.is_timestamp(t) and t.tz else "UTC" if pa.types.is_integer(t) else None
    bars = Bars(
        path=path_s,
        ts=np.ascontiguousarray(ts, dtype=np.int64),
        **cols,
        sha256=sha or "",
        tz=tz,
        notes=notes,
        columns=own,
        ahead=ahead,
    )
    validate(bars, default_min_rows() if min_rows is None else min_rows, target is None)
    return bars


def empty_values(values: np.ndarray, path: str, name: str) -> np.ndarray:
    """Where a target column of your own has no value (it must hold numbers)."""
    if values.dtype == object:
        raise DataError(f"{path}: column {name!r} (--target-column) holds text, not numbers")
    return np.isnan(values)


def split_ahead(ts: np.ndarray, cols: dict, own: dict, empty: np.ndarray):
    """``(ts, cols, own, ahead)``: the trailing ``empty`` rows (no prices, or no target)
    cut off as ``ahead`` (their times and your columns; None when there are none)."""
    filled = np.flatnonzero(~empty)
    n = int(filled[-1]) + 1 if filled.size else 0
    if n == ts.size:
        return ts, cols, own, None
    cut = lambda d: {k: v[:n] for k, v in d.items()}
    return ts[:n], cut(cols), cut(own), (ts[n:], {k: v[n:] for k, v in own.items()})


def write_bars(bars: Bars, path: str | os.PathLike) -> None:
    """Write bars as parquet with the canonical column names (``ts`` in us; with its zone
    when the bars have one)."""
    table = pa.table(
        {
            "ts": pa.array(bars.ts // 1000, type=pa.int64()).cast(pa.timestamp("us", tz=bars.tz)),
            **{name: pa.array(getattr(bars, name), type=pa.float64()) for name in VALUE_COLUMNS},
        }
    )
    pq.write_table(table, path)
