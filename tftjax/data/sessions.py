"""Exchange sessions from ``exchange_calendars`` (or ``24/7``), by the exchange's regular
rules only (:func:`regular_calendar`), and their slot grid.

A *slot* is where a bar of the nominal interval can start: ``open + j·Δ`` inside each
trading segment of a session (a session with a break restarts the grid when it
reopens), or for daily bars one slot per session. :mod:`tftjax.data.calendar` places
bars and the decoder's future steps on this grid.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tftjax.errors import ConfigError

NS_SEC = 10**9
NS_MIN = 60 * NS_SEC
NS_HOUR = 60 * NS_MIN
NS_DAY = 24 * NS_HOUR
DAILY = (20 * NS_HOUR, 36 * NS_HOUR)
"""Intervals in this band are daily bars: one slot per session, stamped with its date."""

ALIASES = {"XCME": "CMES", "CME": "CMES", "GLOBEX": "CMES", "NYSE": "XNYS", "24/7": "24/7"}


@dataclasses.dataclass(frozen=True)
class Sessions:
    """An exchange's sessions, sorted: instants (UTC ns) and their dates (wall-clock midnight)."""

    name: str
    zone: str
    label: np.ndarray  # [S] session date, wall-clock midnight (ns)
    open: np.ndarray  # [S] UTC ns
    close: np.ndarray  # [S]
    break_start: np.ndarray  # [S] (== close when the session has no break)
    break_end: np.ndarray  # [S]


def resolve_calendar_name(name: str) -> str:
    return ALIASES.get(name.upper(), ALIASES.get(name, name))


def sessions(name: str, first_utc: int, last_utc: int) -> Sessions:
    """The sessions of calendar ``name`` covering ``[first_utc, last_utc]`` plus a margin.

    Raises:
      ConfigError: unknown calendar, the package missing, or a span the calendar lacks.
    """
    real = resolve_calendar_name(name)
    lo = np.datetime64(int(first_utc) - 10 * NS_DAY, "ns").astype("datetime64[D]")
    hi = np.datetime64(int(last_utc) + 60 * NS_DAY, "ns").astype("datetime64[D]")
    if real == "24/7":
        days = np.arange(lo, hi + 1).astype("datetime64[ns]").astype(np.int64)
        return Sessions("24/7", "UTC", days, days, days + NS_DAY, days + NS_DAY, days + NS_DAY)
    try:
        import exchange_calendars as xc
    except ImportError:
        raise ConfigError(
            f"--calendar {name}: install the calendars extra "
            "(pip install 'tftjax[calendars]', i.e. exchange_calendars); "
            "--calendar 24/7 needs nothing"
        ) from None
    try:
        cal = regular_calendar(type(xc.get_calendar(real)))(start=str(lo), end=str(hi))
    except xc.errors.InvalidCalendarName:  # pyright: ignore[reportAttributeAccessIssue]
        raise ConfigError(
            f"--calendar {name!r} is not an exchange calendar (e.g. XCME, XNYS, "
            "XLON, 24/7; exchange_calendars.get_calendar_names())"
        ) from None
    except (ValueError, xc.errors.DateOutOfBounds) as e:  # pyright: ignore[reportAttributeAccessIssue]  # pragma: no cover - span limits
        raise ConfigError(f"--calendar {name}: cannot cover {lo} to {hi} ({e})") from None
    s = cal.schedule

    def ns(col):
        return s[col].to_numpy(dtype="datetime64[ns]").astype(np.int64)

    close = ns("close")
    if "break_start" in s and "break_end" in s:
        has = (s["break_start"].notna() & s["break_end"].notna()).to_numpy()
        bs = np.where(has, ns("break_start"), close)
        be = np.where(has, ns("break_end"), close)
    else:
        bs = be = close
    label = s.index.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    return Sessions(
        real,
        str(cal.tz),
        label,
        ns("open"),
        close,
        np.asarray(bs, np.int64),
        np.asarray(be, np.int64),
    )


def regular_calendar(cls: type) -> type:
    """An exchange calendar class by its **regular rules only**: without the ad hoc closures,
    early closes and late opens (9/11, hurricane Sandy, state funerals …) that
    ``exchange_calendars`` records after the fact. A forecast made before such a closure was
    announced could not know it; the package does not record announcement dates, so none
    of them is known at any origin (the missing bars then show in the observed ``miss_L``
    features, as any missing bar does)."""
    none = property(lambda self: [])
    return type(
        f"{cls.__name__}Regular",
        (cls,),
        {"adhoc_holidays": none, "special_closes_adhoc": none, "special_opens_adhoc": none},
    )


def slots(sess: Sessions, interval: int) -> np.ndarray:
    """Every calendar slot (UTC ns, sorted): ``start + j·interval`` inside each trading
    segment (a session, or its two halves around a break); for daily intervals, one slot
    per session (its open)."""
    if DAILY[0] <= interval <= DAILY[1]:
        return sess.open.copy()
    brk = sess.break_start < sess.break_end
    starts = np.concatenate([sess.open, sess.break_end[brk]])
    ends = np.concatenate([np.where(brk, sess.break_start, sess.close), sess.close[brk]])
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    counts = np.maximum(-(-(ends - starts) // interval), 0)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(starts, counts) + (np.arange(int(counts.sum())) - first) * interval
