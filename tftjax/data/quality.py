"""What passes validation but a user should hear about: irregular steps, zero volume,
outliers, bars off the calendar."""

from __future__ import annotations

import numpy as np

from tftjax.data.bars import Bars
from tftjax.data.calendar import format_interval
from tftjax.data.features import FeatureSet


def series_warnings(bars: Bars, features: FeatureSet) -> list[str]:
    tl, clock = features.timeline, features.stats.clock
    warn = quality_warnings(bars, clock.interval, features.stats.target_scale)
    off = tl.off_calendar() if tl is not None else 0
    if off:
        warn.append(
            f"{bars.path}: {off:,} of {len(bars):,} bars fall outside the sessions of "
            f"calendar {clock.calendar} (their session inputs are the last session's)"
        )
    return warn


def quality_warnings(bars: Bars, interval: int, target_scale: float | None = None) -> list[str]:
    """What passes validation but a user should hear about, with counts: steps that are not
    a whole number of bar intervals, zero-volume bars, and (given the target scale) returns
    beyond 50 scales."""
    out: list[str] = list(getattr(bars, "notes", ()))
    step = np.diff(bars.ts)
    if step.size:
        off = np.count_nonzero(step % max(interval, 1) != 0)
        if off:
            out.append(
                f"{bars.path}: {off:,} of {step.size:,} steps are not a whole number of "
                f"the {format_interval(interval)} bar interval (irregular or mixed "
                "intervals; first at row "
                f"{int(np.flatnonzero(step % max(interval, 1) != 0)[0]) + 1})"
            )
    zero = np.count_nonzero(bars.volume == 0)
    if zero:
        out.append(
            f"{bars.path}: {zero:,} of {len(bars):,} bars have zero volume"
            + (" (all of them: the volume features carry nothing)" if zero == len(bars) else "")
        )
    if target_scale:
        r = np.abs(np.diff(np.log(bars.close))) / target_scale
        big = np.flatnonzero(r > 50)
        if big.size:
            out.append(
                f"{bars.path}: {big.size:,} returns beyond 50 target scales (largest "
                f"{r.max():.0f} at row {int(np.argmax(r)) + 1}): check for bad prints; "
                "targets are clipped at --target-clip"
            )
    return out
