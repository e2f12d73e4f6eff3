"""The Python API: load a trained TFT and forecast from a table, in a notebook.

    import tftjax

    model = tftjax.load("runs/tft/run_001")            # a run folder, checkpoint or export
    df = model.forecast(bars_df, as_of="2024-03-01T16:00")   # a pandas DataFrame
    df = model.forecast(split="test")                  # its own data's test windows, scored
    f = model.run(bars_df, origins="all")              # the Forecast: table, metadata, arrays

``bars`` is a pandas DataFrame (a time index or a time column), a pyarrow Table, parquet
file(s), or None (the data the model was trained on); a one-instrument model reads a
DataFrame or Arrow table without a ``symbol`` column as its own instrument. :meth:`Model.forecast` returns a pandas
DataFrame on every path: a tidy table (one row per series, origin and horizon step;
columns: :mod:`tftjax.serving.table`) with the metadata in ``df.attrs["tftjax"]``
(:meth:`Model.run`'s ``Forecast.to_arrow()`` is the Arrow table). Its quantiles never cross
(monotone rearrangement: :func:`tftjax.training.steps.rearranged`). Errors name this
API's arguments (``as_of``, not the command line's ``--as-of``). ``python -m
tftjax.predict`` is a thin layer over :meth:`Model.run`; both write the same file.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from tftjax.errors import ConfigError, DataError, on_command_line

if TYPE_CHECKING:
    import pandas as pd

PYTHON_NAMES = {
    "--unknown-instrument embed": "unknown_instrument='embed'",
    "--as-of": "as_of",
    "--origins": "origins",
    "--start/--end": "start/end",
    "--start": "start",
    "--end": "end",
    "--split": "split",
    "--series": "series",
    "--instrument": "instrument",
    "--unknown-instrument": "unknown_instrument",
    "--stale-after": "stale_after",
    "--int8": "int8",
}
"""The command line's flags in the shared layers' messages, and this API's arguments."""
_FLAG = re.compile("|".join(re.escape(k) for k in PYTHON_NAMES) + r"(?![\w-])")

F = TypeVar("F", bound=Callable[..., Any])


def python_names(fn: F) -> F:
    """Re-raise ``fn``'s :class:`ConfigError` and :class:`DataError` with the API's argument
    names for the command line's flags (the layers below serve both and speak the CLI's)."""

    @functools.wraps(fn)
    def wrapper(*args, **kw):
        try:
            return fn(*args, **kw)
        except (ConfigError, DataError) as e:
            text = _FLAG.sub(lambda m: PYTHON_NAMES[m.group(0)], str(e))
            if text == str(e) or on_command_line():  # the CLIs over this API keep flags
                raise
            raise type(e)(text) from None

    return wrapper  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True)
class Model:
    """A saved TFT ready to forecast (:func:`load`)."""

    saved: Any
    """The :class:`~tftjax.training.SavedModel`: configs, weights, statistics."""
    int8: bool = False

    @property
    def name(self) -> str:
        return self.saved.what

    @property
    def quantiles(self) -> tuple[float, ...]:
        return tuple(self.saved.cfg.head.quantiles)

    @property
    def series(self) -> tuple[str, ...]:
        """The instruments the model was trained on."""
        from tftjax.serving.forecast import saved_vocab

        return saved_vocab(self.saved)

    def trained_until(self) -> int:
        """The time (ns since the epoch, UTC) of the last bar the model's training or its
        early stopping read: the end of the validation split of its own data. A model fed
        these forecasts must be selected and tested on later bars only."""
        from tftjax.training.evaluation import saved_dataset

        ds = saved_dataset(self.saved)
        return max(int(s.bars.ts[s.splits.val_rows[1] - 1]) for s in ds.series)

    @python_names
    def run(
        self,
        bars: Any = None,
        *,
        as_of: str | None = None,
        origins: str | int = "last",
        start: str | None = None,
        end: str | None = None,
        split: Literal["train", "val", "test"] | None = None,
        series: str | tuple[str, ...] | None = None,
        unknown_instrument: Literal["refuse", "embed"] = "refuse",
        instrument: str | None = None,
        stale_after: int = 1,
        future: Any = None,
    ):
        """The :class:`~tftjax.serving.forecast.Forecast` (table, metadata, dataset, raw
        arrays).

        Args:
          bars: a pandas DataFrame (a time index or column), a pyarrow Table, parquet
            file(s), or None: the data the model was trained on.
          as_of: each series' last origin at or before this time (ISO; without a UTC offset,
            on the data's own clock).
          origins: ``"last"``, ``"all"`` or a count N of each series' last origins.
          start: the first origin time of a range.
          end: the last origin time of a range.
          split: the origins of the run's own windows of this split.
          series: one series name, several (a tuple or comma-separated), or None: all.
          unknown_instrument: a series the model was not trained on: ``"refuse"``, or
            ``"embed"`` (the vocabulary's unknown row, its own statistics).
          instrument: the name of a one-series table without a ``symbol`` column (a
            one-instrument model reads such a table as its own instrument).
          stale_after: warn when more than this many calendar slots without a bar lie
            between an origin and ``as_of``.
          future: a model trained with known columns of your own: their values after the
            bars (a pandas DataFrame, pyarrow Table or parquet file: a time column, the
            columns, and a ``symbol`` column for several series).

        Raises:
          ConfigError: a bad argument value (named as this method's argument).
          DataError: bad bars, or an instrument the model does not know.
        """
        from tftjax.serving.forecast import forecast

        if unknown_instrument not in ("refuse", "embed"):
            raise ConfigError(
                f"unknown_instrument must be refuse or embed, got {unknown_instrument!r}"
            )
        if isinstance(series, str):
            series = tuple(x for x in series.split(",") if x)
        mode = "int8" if self.int8 or self.saved.kind == "int8" else None
        return forecast(
            self.saved,
            bars,
            as_of=as_of,
            origins=str(origins),
            start=start,
            end=end,
            split=split,
            series=series or None,
            mode=mode,
            unknown=unknown_instrument,
            instrument=instrument,
            stale_after=stale_after,
            future=future,
        )

    def forecast(self, bars: Any = None, **kw: Any) -> pd.DataFrame:
        """The forecast table as a pandas DataFrame, whatever ``bars`` is, with the metadata
        in ``df.attrs["tftjax"]``. Arguments: :meth:`run`'s."""
        f = self.run(bars, **kw)
        df = f.to_arrow().to_pandas()
        df.attrs["tftjax"] = dict(f.meta)
        return df


@python_names
def load(path: str | Path, *, int8: bool = False) -> Model:
    """A trained TFT from a run folder (its final checkpoint), a checkpoint or an export
    folder; ``int8``: run the int8 inference path (a ``--qat`` model or an int8 export).

    Raises:
      DataError: no such model, or not a TFT.
      ConfigError: ``int8`` for a float model.
    """
    from tftjax.serving.saved import open_model

    saved = open_model(path)
    if int8 and saved.kind != "int8" and not saved.cfg.quant.qat:
        raise ConfigError(
            f"--int8: {path} is a float model (train with --qat, or export one "
            "calibrated with --calibrate N)"
        )
    return Model(saved, int8)
