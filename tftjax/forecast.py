"""Forecasts from a saved TFT: the quantiles of the next bars from chosen origins.

An origin is a bar; its forecast is the window whose last encoder bar it is, run through the
same compiled eval step that :func:`tftjax.training.evaluate_model` scores (so a forecast and
the scored prediction of the same window are bit-identical), with the decoder's known inputs
from the calendar slots after the origin (:class:`tftjax.data.calendar.Timeline`), never from
bars after it. The data is featurised with the *training* statistics saved with the model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tftjax.config import WARMUP
from tftjax.data import Dataset, load_dataset, to_device
from tftjax.data.calendar import Timeline
from tftjax.errors import ConfigError
from tftjax.training import SavedModel, Trainer

def eligible_origins(ds: Dataset, encoder_steps: int) -> np.ndarray:
    """Rows that can be an origin: a full encoder after the feature warm-up."""
    first = WARMUP + encoder_steps - 1
    return np.arange(first, len(ds.features), dtype=np.int64)


def choose_origins(ds: Dataset, encoder_steps: int, as_of: str | None = None,
                   origins: str = "last") -> np.ndarray:
    """Origin rows: the last bar at or before ``as_of`` (default: the last bar), or with
    ``origins`` ``N`` the last N eligible bars up to it, ``all`` every eligible bar up to it.

    Raises:
      ConfigError: a bad ``as_of``/``origins``, or no eligible bar.
    """
    rows = eligible_origins(ds, encoder_steps)
    if as_of is not None:
        try:
            t = np.datetime64(as_of, "ns").astype(np.int64)
        except ValueError:
            raise ConfigError(f"--as-of {as_of!r} is not a time (e.g. 2024-03-01T16:00)") from None
        rows = rows[ds.bars.ts[rows] <= t]
    if rows.size == 0:
        raise ConfigError(f"no bar of {ds.bars.path} can be an origin"
                          + (f" at or before --as-of {as_of}" if as_of else "")
                          + f": an origin needs {WARMUP + encoder_steps - 1} bars before it")
    if origins == "last":
        return rows[-1:]
    if origins == "all":
        return rows
    try:
        n = int(origins)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"--origins must be last, all or a number >= 1, got {origins!r}")
    return rows[-n:]


def forecast(saved: SavedModel, parquet_file: str | Path | None = None, *,
             as_of: str | None = None, origins: str = "last", mode: str | None = None) -> dict:
    """Forecast table (column name → array, one row per origin and horizon step) and the
    dataset it came from.

    Columns: ``instrument``, ``origin_time`` and ``target_time`` (int64 ns, the bars' clock),
    ``horizon`` (1…D), ``close_at_origin``, ``q{p}`` the quantiles of bar k's 1-bar log
    return (the training scale multiplied back) and ``price_q{p}`` = the origin's close
    times ``exp(q{p})``: bar 1's close quantiles exactly; for k > 1 the origin's close moved
    by bar k's own return quantile (a per-bar quantile forecast does not determine the
    quantiles of the cumulative path).
    """
    cfg = saved.cfg
    from tftjax.data.identity import find_data_file

    path = parquet_file or find_data_file(saved.data, saved.run_dir)
    ds = load_dataset(path, cfg.data, stats=saved.feature_stats)
    e, d = cfg.encoder_steps, cfg.decoder_steps
    rows = choose_origins(ds, e, as_of, origins)
    starts = (rows - (e - 1)).astype(np.int32)
    trainer = Trainer(cfg, saved.tc, to_device(ds.features))
    variables = saved.variables
    if mode == "float" and saved.float_variables is not None:
        variables = saved.float_variables
    pred, _ = trainer.predict(variables, starts, mode)  # [n, D, Q], target units
    scale = float(saved.feature_stats.target_scale)
    q = pred.astype(np.float64) * scale  # 1-bar log returns
    tl = Timeline(ds.bars.ts, saved.feature_stats.clock, d, str(ds.bars.path))
    fut_utc, _ = tl.future(d)
    target_time = ds.bars.ts[rows][:, None] + (fut_utc[rows] - tl.utc[rows][:, None])
    close = ds.bars.close[rows].astype(np.float64)
    n = rows.size
    out = {
        "instrument": np.array([Path(ds.bars.path).stem] * (n * d)),
        "origin_time": np.repeat(ds.bars.ts[rows], d),
        "target_time": target_time.reshape(-1),
        "horizon": np.tile(np.arange(1, d + 1), n),
        "close_at_origin": np.repeat(close, d),
    }
    for j, p in enumerate(cfg.quantiles):
        name = f"q{p * 100:g}"
        out[name] = q[:, :, j].reshape(-1)
        out[f"price_{name}"] = np.repeat(close, d) * np.exp(out[name])
    ident = ds.identity()  # what produced the numbers
    out["checkpoint"] = np.array([str(saved.given)] * (n * d))
    out["data_sha256"] = np.array([str(ident["sha256"])] * (n * d))
    return {"table": out, "dataset": ds, "rows": rows, "starts": starts, "pred": pred}
