"""Times a user gives (``--as-of``, ``--start``, ``--end``) and how they meet a series' clock.

A time with an offset (``2024-03-01T16:00-05:00``, ``…Z``) is an instant. A time without
one is read on the data's own clock: for bars with a zone, the wall clock of that zone (so
``--as-of 2018-12-31T16:00`` on New York bars means 16:00 in New York, never 16:00 UTC);
for naive bars, their clock as stored. An instant given for naive bars is placed on the
wall clock of the model's zone (its ``--timezone`` or calendar's) and refused when it has
none: naive bars with no zone cannot be compared with an instant.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import numpy as np

from tftjax.data.calendar import to_utc, to_wall
from tftjax.errors import ConfigError

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@dataclasses.dataclass(frozen=True)
class UserTime:
    """A time as given: ``ns`` since the epoch, an instant (UTC) when ``aware``, else a wall
    clock reading."""

    text: str
    flag: str
    ns: int
    aware: bool

    def on_clock(self, data_zone: str | None, zone: str | None, source: str) -> int:
        """This time in a series' own timestamps: an instant for bars with a zone
        (``data_zone``), a wall-clock reading for naive bars (``zone``: their wall clock's
        zone, None when unknown).

        Raises:
          ConfigError: an instant given for naive bars of no known zone.
        """
        if data_zone is not None:
            return self.ns if self.aware else int(to_utc(np.array([self.ns]), data_zone)[0])
        if not self.aware:
            return self.ns
        if zone is None:
            raise ConfigError(
                f"{self.flag} {self.text}: has a UTC offset, but the bars of "
                f"{source} have no zone: give the time without an offset, on "
                "the bars' own clock"
            )
        return int(to_wall(np.array([self.ns]), zone)[0])


def parse_time(text: str, flag: str) -> UserTime:
    """``2024-03-01``, ``2024-03-01T16:00[:SS[.fff…]]`` with an optional ``Z`` or ``±HH:MM``.

    Raises:
      ConfigError: not such a time, naming the flag.
    """
    s = str(text).strip()
    frac = 0
    body = s  # Python's parser stops at microseconds: nanoseconds are split off first
    if "." in s and len(s.split(".", 1)[1]) > 6:
        head, tail = s.split(".", 1)
        digits = len(tail) - len(tail.lstrip("0123456789"))
        frac, body = int(tail[:digits].ljust(9, "0")[:9]), head + tail[digits:]
    try:
        when = dt.datetime.fromisoformat(body.replace(" ", "T", 1))
    except ValueError:
        raise ConfigError(
            f"{flag} {text!r} is not a time (e.g. 2024-03-01T16:00, or with "
            "its UTC offset 2024-03-01T16:00-05:00)"
        ) from None
    aware = when.tzinfo is not None
    delta = when - (_EPOCH_UTC if aware else _EPOCH)
    ns = (delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1000
    return UserTime(str(text), flag, ns + frac, aware)


def parse_times(as_of=None, start=None, end=None) -> dict[str, UserTime | None]:
    """``--as-of``, ``--start`` and ``--end`` parsed (one-line refusals naming the flag;
    ``start`` after ``end`` refused when both are on the same footing)."""
    out = {
        k: None if v is None else parse_time(v, f"--{k.replace('_', '-')}")
        for k, v in (("as_of", as_of), ("start", start), ("end", end))
    }
    if (
        out["start"]
        and out["end"]
        and out["start"].aware == out["end"].aware
        and out["start"].ns > out["end"].ns
    ):
        raise ConfigError(f"--start {start} is after --end {end}")
    return out
