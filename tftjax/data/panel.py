"""Panels: several series in one run, over time ranges that need not agree.

Real panels start (and end) at different dates: a listing in 2012 beside an index from
1998. In a walk-forward fold (:func:`~tftjax.data.windows.walk_forward_times`, cut on the
union of every series' bar times) a series **joins the fold where it has the data**: it
trains when its training stretch holds at least ``W`` complete windows (its statistics and
anchor are fitted on those rows), and it is scored on the validation and test stretches
where it has complete windows there. A series with too little history before the fold's
validation stretch sits the fold out (:attr:`Dataset.absent <tftjax.data.Dataset.absent>`
names it); the fold refuses only when no series is left to train, validate or test on.

Series that share no date with any other are not a panel (a file of one instrument after
another sorted by symbol, or two files of different eras): refused with one line.
"""

from __future__ import annotations

import numpy as np

from tftjax.config import WARMUP, DataConfig
from tftjax.data.bars import Bars
from tftjax.data.windows import Splits, fold_splits
from tftjax.errors import DataError

NS_DAY = 86_400 * 10**9


def _day(ns: int) -> str:
    return str(np.datetime64(int(ns), "ns").astype("datetime64[D]"))


def check_shared_dates(bars: list[Bars], names: list[str]) -> None:
    """Refuse series of which one shares no calendar date (UTC) with any other.

    Raises:
      DataError: naming the series, its span and the others'.
    """
    if len(bars) < 2:
        return
    days = [np.unique(np.asarray(b.ts, np.int64) // NS_DAY) for b in bars]
    for i, d in enumerate(days):
        others = np.concatenate([x for j, x in enumerate(days) if j != i])
        if not np.isin(d, others).any():
            spans = ", ".join(
                f"{n} {_day(b.ts[0])} to {_day(b.ts[-1])}"
                for j, (n, b) in enumerate(zip(names, bars))
                if j != i
            )
            raise DataError(
                f"{bars[i].path}: series {names[i]!r} ({_day(bars[i].ts[0])} to "
                f"{_day(bars[i].ts[-1])}) shares no date with the other series ({spans}): the "
                "series of one run must overlap in time; train on it alone"
            )


def fold_members(
    bars: list[Bars], fold: tuple[int, int, int], cfg: DataConfig, *, warmup: int = WARMUP
) -> list[Splits | None]:
    """Each series' splits in a walk-forward fold, or None where it sits the fold out (fewer
    than ``W`` complete training windows before the fold's validation stretch). A member's
    validation or test splits may be empty (it then trains only).

    Raises:
      DataError: no series can train, or none has a validation or test window, in the fold.
    """
    W = cfg.window
    out = []
    for b in bars:
        sp = fold_splits(b.ts, fold, cfg, warmup=warmup, source=b.path, partial=True)
        out.append(sp if sp.train.size >= W else None)
    members = [s for s in out if s is not None]
    where = f"the walk-forward fold validating from {_day(fold[0])} (test from {_day(fold[1])})"
    if not members:
        raise DataError(
            f"no series has {W} complete {W}-bar training windows before {where}: "
            "fewer folds, a smaller --test-fraction or more data"
        )
    for split in ("val", "test"):
        if not any(getattr(s, split).size for s in members):
            raise DataError(
                f"no series that trains in {where} has a complete {W}-bar window in "
                f"its {split} stretch: fewer folds or more data"
            )
    return out
