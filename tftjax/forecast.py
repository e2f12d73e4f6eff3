"""Forecasts from a saved TFT: the quantiles of the next bars from chosen origins.

An origin is a bar; its forecast is the window whose last encoder bar it is, run through the
same compiled eval step that :func:`tftjax.training.evaluate_model` scores (so a forecast and
the scored prediction of the same window agree to float32 round-off), with the decoder's known inputs
from the calendar slots after the origin (:class:`tftjax.data.calendar.Timeline`), never from
bars after it. The data is featurised with the *training* statistics saved with the model.
"""

from __future__ import annotations

import numpy as np

from tftjax.config import WARMUP
from tftjax.data import Dataset, to_device
from tftjax.data.calendar import Timeline
from tftjax.errors import ConfigError
from tftjax.training import SavedModel, Trainer


def eligible_origins(ds: Dataset, encoder_steps: int) -> np.ndarray:
    """Global rows that can be an origin: a full encoder after its series' feature warm-up."""
    first = WARMUP + encoder_steps - 1
    return np.concatenate([np.arange(o + first, o + len(s.bars), dtype=np.int64)
                           for s, o in zip(ds.series, ds.offsets)])


def choose_origins(ds: Dataset, encoder_steps: int, as_of: str | None = None,
                   origins: str = "last") -> np.ndarray:
    """Origin rows of every series: its last bar at or before ``as_of`` (default: its last
    bar), or with ``origins`` ``N`` its last N eligible bars up to it, ``all`` every eligible
    bar up to it.

    Raises:
      ConfigError: a bad ``as_of``/``origins``, an ``as_of`` outside the data, or a series
        without an eligible bar.
    """
    n = None
    if origins not in ("last", "all"):
        try:
            n = int(origins)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"--origins must be last, all or a number >= 1, got {origins!r}")
    rows = eligible_origins(ds, encoder_steps)
    if as_of is not None:
        try:
            t = np.datetime64(as_of, "ns").astype(np.int64)
        except ValueError:
            raise ConfigError(f"--as-of {as_of!r} is not a time (e.g. 2024-03-01T16:00)") from None
        for s in ds.series:  # a stale origin is not what "as of" asks for
            last = int(s.bars.ts[-1])
            if t > last + s.features.stats.clock.interval:
                raise ConfigError(f"--as-of {as_of} is after the data: the last bar of "
                                  f"{s.bars.path} is {np.datetime64(last, 'ns')} (drop --as-of "
                                  "to forecast from each series' last bar)")
        rows = rows[ds.ts[rows] <= t]
    which = ds.series_of(rows)
    out = []
    for i, s in enumerate(ds.series):
        mine = rows[which == i]
        if mine.size == 0:
            raise ConfigError(f"no bar of {s.bars.path} can be an origin"
                              + (f" at or before --as-of {as_of}" if as_of else "")
                              + f": an origin needs {WARMUP + encoder_steps - 1} bars before it")
        out.append(mine[-1:] if origins == "last" else mine if origins == "all" else mine[-n:])
    return np.concatenate(out)


def forecast(saved: SavedModel, parquet_file=None, *, as_of: str | None = None,
             origins: str = "last", mode: str | None = None, unknown: str = "refuse",
             instrument: str | None = None) -> dict:
    """Forecast table (column name → array, one row per series, origin and horizon step)
    and the dataset it came from.

    Columns: ``instrument``, ``origin_time`` and ``target_time`` (int64 ns, the bars' clock),
    ``horizon`` (1…D), ``close_at_origin``, ``q{p}`` the quantiles of bar k's 1-bar log
    return (that series' training scale multiplied back; with ``--target cumulative``, of the
    k-bar log return from the origin) and ``price_q{p}`` = the origin's close times
    ``exp(q{p})``: bar 1's close quantiles exactly, and with a cumulative target bar k's too;
    for a per-bar target and k > 1 the origin's close moved by bar k's own return quantile (a
    per-bar quantile forecast does not determine the quantiles of the cumulative path).
    """
    from tftjax.training.evaluation import saved_dataset

    cfg = saved.cfg
    ds = saved_dataset(saved, parquet_file, unknown=unknown, instrument=instrument,
                       need_splits=False)
    e, d = cfg.encoder_steps, cfg.decoder_steps
    rows = choose_origins(ds, e, as_of, origins)
    starts = (rows - (e - 1)).astype(np.int32)
    trainer = Trainer(cfg, saved.tc, to_device(ds.features))
    variables = saved.variables
    if mode == "float" and saved.float_variables is not None:
        variables = saved.float_variables
    pred, _ = trainer.predict(variables, starts, mode)  # [n, D, Q], target units
    which = ds.series_of(rows)
    scale = np.array([s.features.stats.target_scale for s in ds.series])[which]
    q = pred.astype(np.float64) * scale[:, None, None]  # 1-bar log returns
    target_time = np.empty((rows.size, d), np.int64)
    for i, s in enumerate(ds.series):  # each series' calendar slots after its origins
        sel = which == i
        tl = Timeline(s.bars.ts, s.features.stats.clock, d, str(s.bars.path))
        fut_utc, _ = tl.future(d)
        local = rows[sel] - ds.offsets[i]
        target_time[sel] = s.bars.ts[local][:, None] + (fut_utc[local] - tl.utc[local][:, None])
    close = ds.close[rows].astype(np.float64)
    n = rows.size
    out = {
        "instrument": np.repeat(np.array(ds.names)[which], d),
        "origin_time": np.repeat(ds.ts[rows], d),
        "target_time": target_time.reshape(-1),
        "horizon": np.tile(np.arange(1, d + 1), n),
        "close_at_origin": np.repeat(close, d),
    }
    for j, p in enumerate(cfg.quantiles):
        name = f"q{p * 100:g}"
        out[name] = q[:, :, j].reshape(-1)
        out[f"price_{name}"] = np.repeat(close, d) * np.exp(out[name])
    ident = ds.identity()  # what produced the numbers: each series' own data
    shas = np.array([p["sha256"] for p in ident["series"]] if "series" in ident
                    else [ident["sha256"]])
    out["checkpoint"] = np.array([str(saved.given)] * (n * d))
    out["data_sha256"] = np.repeat(shas[which], d)
    return {"table": out, "dataset": ds, "rows": rows, "starts": starts, "pred": pred}
