"""The Python API: load a trained TFT and forecast from a table, in a notebook.

    import tftjax

    model = tftjax.load("runs/tft/run_001")            # a run folder, checkpoint or export
    df = model.forecast(bars_df, as_of="2024-03-01T16:00")   # pandas in, pandas out
    df = model.forecast(split="test")                  # its own data's test windows, scored
    f = model.run(bars_df, origins="all")              # the Forecast: table, metadata, arrays

``bars`` is a pandas DataFrame (a time index or a time column), a pyarrow Table, parquet
file(s), or None (the data the model was trained on). The result is a tidy table (one row
per series, origin and horizon step; columns: :mod:`tftjax.serving.table`) of the input's
kind: pandas for pandas, else pyarrow, with the metadata on the Arrow schema
(``table.schema.metadata``) or ``df.attrs["tftjax"]``. ``python -m tftjax.predict`` is a
thin layer over :meth:`Model.run`; both write the same file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tftjax.data.sources import is_table
from tftjax.errors import ConfigError


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

    def run(
        self,
        bars: Any = None,
        *,
        as_of: str | None = None,
        origins: str | int = "last",
        start: str | None = None,
        end: str | None = None,
        split: str | None = None,
        series: str | tuple[str, ...] | None = None,
        unknown_instrument: str = "refuse",
        instrument: str | None = None,
        stale_after: int = 1,
    ):
        """The :class:`~tftjax.serving.forecast.Forecast` (table, metadata, dataset, raw arrays).

        Args are :func:`tftjax.serving.forecast.forecast`'s; ``series`` one name or several.
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
        )

    def forecast(self, bars: Any = None, **kw):
        """The forecast table: pandas when ``bars`` is a pandas DataFrame, else pyarrow."""
        f = self.run(bars, **kw)
        table = f.to_arrow()
        if is_table(bars) and not hasattr(bars, "schema"):  # pandas in, pandas out
            df = table.to_pandas()
            df.attrs["tftjax"] = dict(f.meta)
            return df
        return table


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
