"""Calendar time: the bar interval, time zones, exchange sessions, and the times of future bars.

Known-future inputs must be what the calendar says before the forecast time,
never what the data later shows. A window whose last encoder bar is at ``T``
gets, at decoder step ``k`` (``k = 1 .. D``), the calendar features of the
``k``-th *calendar slot* after ``T``:

- without a calendar, ``T + k·Δ`` (``Δ`` the nominal bar interval); for daily bars whose
  training rows hold no weekend bar, the ``k``-th weekday after ``T`` (holidays are not
  known without a calendar: give ``--calendar`` for them);
- with an exchange calendar (``--calendar CMES``, ``XNYS``, ``24/7`` …), the
  ``k``-th slot of the calendar's sessions after ``T``: intraday bars step
  through each session's open ``+ j·Δ`` (a session with a break restarts
  the grid when it reopens), daily
  bars through the sessions themselves. Weekends, holidays, breaks and early
  closes are therefore known in advance, as they are to a trader.

Which bars actually arrived (a quiet minute has no trade-built bar) is
observed information: it enters the model only through the historical
``miss_L`` features (slots without a bar among the last ``L``), computed from
bars ``<= t`` like every other historical feature.

``Δ`` is ``--bar-interval`` when given, else the median step of the training
rows (fitted once with the feature statistics and saved with them, so that no
later bar can change it).

Time zones: time-zone-aware timestamps are instants; calendar features use
the wall clock of ``--timezone`` (default: the data's own zone). Naive
timestamps are wall clock already (of ``--timezone`` or, with a calendar and
no ``--timezone``, of the calendar's zone); without either there is one clock
and no daylight saving.

Exchange calendars come from the ``exchange_calendars`` package (optional
extra ``calendars``); ``24/7`` (UTC days) needs nothing. ``XCME`` is accepted
for CME Globex (``CMES`` in that package).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as _pc

from tftjax.data.sessions import (
    DAILY,
    NS_DAY,
    NS_HOUR,
    NS_MIN,
    NS_SEC,
    resolve_calendar_name,
    sessions,
    slots,
)
from tftjax.errors import ConfigError

_UNITS = {
    "ns": 1,
    "us": 10**3,
    "ms": 10**6,
    "s": NS_SEC,
    "sec": NS_SEC,
    "secs": NS_SEC,
    "second": NS_SEC,
    "seconds": NS_SEC,
    "m": NS_MIN,
    "min": NS_MIN,
    "mins": NS_MIN,
    "t": NS_MIN,
    "minute": NS_MIN,
    "minutes": NS_MIN,
    "h": NS_HOUR,
    "hr": NS_HOUR,
    "hrs": NS_HOUR,
    "hour": NS_HOUR,
    "hours": NS_HOUR,
    "d": NS_DAY,
    "day": NS_DAY,
    "days": NS_DAY,
    "w": 7 * NS_DAY,
    "week": 7 * NS_DAY,
    "weeks": 7 * NS_DAY,
}

pc: Any = _pc  # pyarrow.compute's functions are made at import: no stubs


def parse_interval(text: str) -> int:
    """``"1min"``, ``"5m"``, ``"1h"``, ``"1d"``, ``"30s"``, ``"500ms"`` → nanoseconds
    (``M``, a month in pandas, is refused: months have no fixed length).

    Raises:
      ConfigError: not such a duration.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*", str(text))
    unit = None if not m or m.group(2) in ("M", "MS", "Y", "Q") else _UNITS.get(m.group(2).lower())
    if m is None or unit is None or float(m.group(1)) <= 0:
        raise ConfigError(f"--bar-interval {text!r} is not a duration like 1min, 5min, 1h or 1d")
    return int(round(float(m.group(1)) * unit))


def format_interval(ns: int) -> str:
    for unit, size in (("d", NS_DAY), ("h", NS_HOUR), ("min", NS_MIN), ("s", NS_SEC)):
        if ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns}ns"


def check_zone(zone: str) -> str:
    """A valid IANA zone name, or ConfigError."""
    try:
        pc.local_timestamp(pa.array([0], pa.timestamp("ns", tz=zone)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowKeyError):
        raise ConfigError(
            f"--timezone {zone!r} is not a time zone name (e.g. America/Chicago, "
            "Europe/London, UTC)"
        ) from None
    return zone


def to_wall(utc: np.ndarray, zone: str | None) -> np.ndarray:
    """Instants (ns since the epoch, UTC) → the wall clock of ``zone`` (ns, naive)."""
    if zone is None:
        return np.asarray(utc, np.int64)
    arr = pa.array(np.asarray(utc, np.int64).ravel(), pa.int64()).cast(pa.timestamp("ns", tz=zone))
    return pc.local_timestamp(arr).cast(pa.int64()).to_numpy().reshape(np.shape(utc))


def to_utc(wall: np.ndarray, zone: str | None) -> np.ndarray:
    """Wall clock of ``zone`` → instants. At a daylight-saving change a repeated wall time
    takes its first instant and a skipped one moves forward (naive timestamps cannot say
    more; store time-zone-aware ones to be exact)."""
    if zone is None:
        return np.asarray(wall, np.int64)
    arr = pa.array(np.asarray(wall, np.int64).ravel(), pa.int64()).cast(pa.timestamp("ns"))
    out = pc.assume_timezone(arr, timezone=zone, ambiguous="earliest", nonexistent="latest")
    return out.cast(pa.int64()).to_numpy().reshape(np.shape(wall))


# ------------------------------------------------------------------------------ the clock
@dataclasses.dataclass(frozen=True)
class Clock:
    """Everything needed to place a bar in calendar time (fitted once; saved with the
    feature statistics)."""

    interval: int
    """Nominal bar interval (ns)."""
    zone: str | None
    """Wall-clock zone of the calendar features (None: naive data as stored)."""
    data_zone: str | None
    """The zone of the data's own timestamps (None: naive)."""
    calendar: str | None
    weekdays: bool = False
    """Daily bars without a calendar whose training rows hold no Saturday or Sunday bar: the
    slots are Monday to Friday (holidays unknown). False: every calendar day is a slot (24/7
    daily data, and models saved before this field)."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Clock:
        return cls(
            int(d["interval"]),
            d.get("zone"),
            d.get("data_zone"),
            d.get("calendar"),
            bool(d.get("weekdays", False)),
        )

    @property
    def daily(self) -> bool:
        return DAILY[0] <= self.interval <= DAILY[1]


def make_clock(
    ts: np.ndarray,
    data_zone: str | None,
    train_rows: tuple[int, int],
    *,
    bar_interval: str | None = None,
    timezone: str | None = None,
    calendar: str | None = None,
) -> Clock:
    """The clock of a series: ``Δ`` from ``bar_interval`` or the median step of the
    training rows, the wall-clock zone from ``timezone``, the data, or the calendar."""
    if bar_interval:
        interval = parse_interval(bar_interval)
    else:
        a, b = train_rows
        steps = np.diff(ts[a:b])
        interval = int(np.median(steps)) if steps.size else NS_MIN
    if timezone:
        zone = check_zone(timezone)
    elif data_zone:
        zone = data_zone
    elif calendar:
        zone = (
            sessions(calendar, int(ts[0]), int(ts[0])).zone
            if resolve_calendar_name(calendar) != "24/7"
            else "UTC"
        )
    else:
        zone = None
    if calendar and interval > DAILY[1]:
        raise ConfigError(
            f"--calendar {calendar}: bars of {format_interval(interval)} are longer "
            "than a session; a calendar works with intraday or daily bars (leave "
            "--calendar out for weekly bars)"
        )
    weekdays = False
    if not calendar and DAILY[0] <= interval <= DAILY[1]:  # trading days or every day?
        a, b = train_rows
        wall = ts[a:b] if data_zone is None else to_wall(ts[a:b], zone)
        weekdays = bool(wall.size) and not np.any(day_of_week(wall) >= 5)
    return Clock(max(interval, 1), zone, data_zone, calendar, weekdays)


def day_of_week(wall: np.ndarray) -> np.ndarray:
    """Monday 0 … Sunday 6 of wall-clock times (ns; 1970-01-01 was a Thursday)."""
    return (np.floor_divide(np.asarray(wall, np.int64), NS_DAY) + 3) % 7


class Timeline:
    """Bars placed in calendar time: the instants and wall clock of every bar, and the
    calendar slots (with an exchange calendar)."""

    def __init__(self, ts: np.ndarray, clock: Clock, future: int, source: str = "data"):
        self.clock = clock
        if clock.data_zone is not None:  # instants
            self.utc = np.asarray(ts, np.int64)
            self.wall = to_wall(self.utc, clock.zone)
        else:  # wall clock as stored
            self.wall = np.asarray(ts, np.int64)
            self.utc = to_utc(self.wall, clock.zone)
        self.sess = None
        if clock.calendar:
            horizon = (future + 2) * max(clock.interval, NS_DAY)
            self.sess = sessions(clock.calendar, int(self.utc[0]), int(self.utc[-1]) + horizon)
            if clock.daily:  # compare dates: a daily bar is stamped with its session's date
                self.slot_key = self.sess.label
            else:
                self.slot_key = slots(self.sess, clock.interval)

    # -- positions
    def _key(self, utc: np.ndarray, wall: np.ndarray) -> np.ndarray:
        if self.clock.daily:
            return wall - wall % NS_DAY
        return utc

    @staticmethod
    def _days(wall: np.ndarray) -> np.ndarray:
        """Wall-clock dates, a weekend date rolled back to its Friday (its latest slot)."""
        d = (np.floor_divide(wall, NS_DAY)).astype("datetime64[D]")
        return np.busday_offset(d, 0, roll="backward")

    def slot_index(self) -> np.ndarray:
        """Position of every bar on the slot grid (for the ``miss_L`` features): the latest
        calendar slot at or before the bar, or ``round((t - t_0) / Δ)`` without a calendar."""
        if self.sess is None:
            if self.clock.daily and self.clock.weekdays:  # Monday-Friday slots
                days = self._days(self.wall)
                return np.busday_count(days[0], days).astype(np.int64)
            base = self.wall if self.clock.daily else self.utc
            return np.rint((base - base[0]) / self.clock.interval).astype(np.int64)
        key = self._key(self.utc, self.wall)
        return np.searchsorted(self.slot_key, key, side="right").astype(np.int64) - 1

    def off_calendar(self) -> int:
        """How many bars fall outside every session of the calendar."""
        if self.sess is None:
            return 0
        if self.clock.daily:
            key = self._key(self.utc, self.wall)
            return int(np.count_nonzero(~np.isin(key, self.sess.label)))
        i = np.searchsorted(self.sess.open, self.utc, side="right") - 1
        i = np.clip(i, 0, None)
        inside = (self.utc >= self.sess.open[i]) & (self.utc < self.sess.close[i])
        inside &= ~((self.utc >= self.sess.break_start[i]) & (self.utc < self.sess.break_end[i]))
        return int(np.count_nonzero(~inside))

    # -- future slots
    def future(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """``(utc, wall)`` ``[n, steps]``: the ``k``-th calendar slot after every bar."""
        k = np.arange(1, steps + 1, dtype=np.int64)
        if self.sess is None:
            if self.clock.daily and self.clock.weekdays:  # the k-th weekday after the bar
                days = np.busday_offset(self._days(self.wall)[:, None], k, roll="backward")
                wall = days.astype("datetime64[ns]").view(np.int64) + (self.wall % NS_DAY)[:, None]
                return to_utc(wall, self.clock.zone), wall
            if self.clock.daily:  # calendar days of the wall clock
                wall = self.wall[:, None] + k * self.clock.interval
                return to_utc(wall, self.clock.zone), wall
            utc = self.utc[:, None] + k * self.clock.interval
            return utc, to_wall(utc, self.clock.zone)
        p = self.slot_index()
        idx = p[:, None] + k
        if idx.max() >= self.slot_key.size:  # pragma: no cover - the margin covers it
            raise ConfigError("calendar span too short for the forecast horizon")
        if self.clock.daily:
            wall = self.slot_key[idx]
            return self.sess.open[idx], wall
        utc = self.slot_key[idx]
        return utc, to_wall(utc, self.clock.zone)


KNOWN_NAMES = (
    "tod_sin", "tod_cos", "dow_sin", "dow_cos", "doy_sin", "doy_cos",
    "dom", "session_elapsed", "session_left", "sched_gap",
)  # fmt: skip
"""The 10 known-future inputs, all functions of calendar time:

time of day, day of week and day of year (sin/cos of the wall clock), day of
month (centred); with a calendar: days since the session opened and days until
it closes (both clipped to [0, 1]; an early close shows as less time left;
for daily bars ``session_elapsed`` is 0 and ``session_left`` the session's
length), and ``sched_gap``, the log of the scheduled time since the previous
slot in bar intervals (0 inside a session; overnight, weekends and holidays
show here, before they happen). Without a calendar the last three are 0."""


def calendar_features(utc: np.ndarray, wall: np.ndarray, timeline: Timeline) -> np.ndarray:
    """The known inputs at instants ``utc`` with wall clock ``wall`` (any shape) →
    ``[..., 10]`` float32."""
    shape = np.shape(wall)
    utc, wall = np.asarray(utc, np.int64).ravel(), np.asarray(wall, np.int64).ravel()
    out = np.zeros((wall.size, len(KNOWN_NAMES)), np.float32)
    two_pi = 2.0 * np.pi
    # daily bars carry no time of day (a date, whatever hour it is stamped with)
    tod = np.zeros(wall.shape) if timeline.clock.daily else (wall % NS_DAY) / NS_DAY
    days = wall // NS_DAY
    dow = ((days + 3) % 7 + tod) / 7.0  # 1970-01-01 was a Thursday; Monday = 0
    d = wall.astype("datetime64[ns]").astype("datetime64[D]")
    doy = (d - d.astype("datetime64[Y]")).astype(np.int64) / 365.25
    dom = (d - d.astype("datetime64[M]")).astype(np.int64)
    out[:, 0], out[:, 1] = np.sin(two_pi * tod), np.cos(two_pi * tod)
    out[:, 2], out[:, 3] = np.sin(two_pi * dow), np.cos(two_pi * dow)
    out[:, 4], out[:, 5] = np.sin(two_pi * doy), np.cos(two_pi * doy)
    out[:, 6] = dom / 30.0 - 0.5
    sess = timeline.sess
    if sess is not None:
        iv = timeline.clock.interval
        key = timeline._key(utc, wall)
        if timeline.clock.daily:
            i = np.clip(np.searchsorted(sess.label, key, side="right") - 1, 0, None)
            out[:, 8] = np.clip((sess.close[i] - sess.open[i]) / NS_DAY, 0.0, 1.0)
            prev = sess.label[np.clip(i - 1, 0, None)]
            gap = np.where(i > 0, sess.label[i] - prev, iv)
        else:
            i = np.clip(np.searchsorted(sess.open, utc, side="right") - 1, 0, None)
            out[:, 7] = np.clip((utc - sess.open[i]) / NS_DAY, 0.0, 1.0)
            out[:, 8] = np.clip((sess.close[i] - utc) / NS_DAY, 0.0, 1.0)
            grid = timeline.slot_key
            p = np.clip(np.searchsorted(grid, key, side="right") - 1, 0, None)
            gap = np.where(p > 0, grid[p] - grid[np.clip(p - 1, 0, None)], iv)
        out[:, 9] = np.log(np.maximum(gap, iv) / iv)
    return out.reshape(shape + (len(KNOWN_NAMES),))
