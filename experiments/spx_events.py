"""The covariates issue's worked example, its data: the bundled S&P 500 daily bars with two
columns of your own (docs/covariates.md, "A worked example"):

* ``event``, known in advance: ``opex`` on the month's third Friday (US equity options
  expire), ``qend`` on the quarter's last weekday, ``none`` otherwise. Both are scheduled
  by the calendar alone (holidays aside: a third Friday or quarter-end that is an exchange
  holiday has no bar, and its label is on no row);
* ``dispersion``, observed at each close: the cross-sectional standard deviation of the
  day's log returns of the 12 stocks and ETFs of the us-daily panel (``data/``), where at
  least 5 of them traded that day and the day before (missing otherwise: carried forward
  by ``--max-ffill``).

    python experiments/spx_events.py --out runs/examples/spx_events.parquet
    python -m tftjax.train --preset compact --calendar XNYS \\
        --parquet-file runs/examples/spx_events.parquet \\
        --known event --categorical event --observed dispersion --workdir runs/examples/with
    python -m tftjax.train --preset compact --calendar XNYS \\
        --parquet-file runs/examples/spx_events.parquet --workdir runs/examples/without

The two runs differ in those flags only; ``variable_importance.png`` and ``summary.json``
say what each input bought on validation, and ``backtest`` with the same flags gives the
walk-forward verdict with and without them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
PANEL = ROOT / "data" / "lean_us_daily_1998-2021.parquet"
MIN_NAMES = 5


def events(days: np.ndarray) -> np.ndarray:
    """``opex`` (third Friday), ``qend`` (the quarter's last weekday) or ``none``."""
    days = days.astype("datetime64[D]")
    dom = (days - days.astype("datetime64[M]")).astype(int) + 1
    friday = (days.view("int64") - 1) % 7 == 0  # 1970-01-02 was a Friday
    third_friday = friday & (dom >= 15) & (dom <= 21)
    month = days.astype("datetime64[M]")
    last_weekday = np.busday_offset(month + 1, -1, roll="backward").astype("datetime64[D]")
    quarter_end = (days == last_weekday) & (month.astype(int) % 3 == 2)
    return np.where(third_friday, "opex", np.where(quarter_end, "qend", "none")).astype(object)


def dispersion(days: np.ndarray) -> np.ndarray:
    """The panel's cross-sectional std of log returns on each of ``days`` (NaN: fewer than
    :data:`MIN_NAMES` names with a return that day)."""
    t = pq.read_table(PANEL)
    sym = np.asarray(t.column("symbol").to_pylist())
    ts = t.column("ts").to_numpy().astype("datetime64[D]")
    close = t.column("close").to_numpy()
    grid = np.unique(ts)
    table = np.full((grid.size, np.unique(sym).size), np.nan)
    for j, s in enumerate(np.unique(sym)):
        mine = sym == s
        order = np.argsort(ts[mine])
        table[np.searchsorted(grid, ts[mine][order]), j] = close[mine][order]
    r = np.diff(np.log(table), axis=0)  # NaN where either day is missing
    names = np.isfinite(r).sum(axis=1)
    with np.errstate(invalid="ignore"):
        sd = np.where(names >= MIN_NAMES, np.nanstd(r, axis=1), np.nan)
    out = np.full(days.size, np.nan)
    at = np.searchsorted(grid[1:], days)
    hit = (at < grid.size - 1) & (grid[1:][np.clip(at, 0, grid.size - 2)] == days)
    out[hit] = sd[at[hit]]
    return out


def build(out: Path) -> pa.Table:
    from tftjax.data import bundled_path

    spx = pq.read_table(bundled_path("spx"))
    days = spx.column("ts").to_numpy().astype("datetime64[D]")
    table = spx.append_column("event", pa.array(events(days).tolist())).append_column(
        "dispersion", pa.array(dispersion(days))
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return table


def weights(run: str, top: int = 8) -> str:
    """The mean variable-selection weights of a trained run on its validation windows: its
    own columns' and the largest others', static, encoder and decoder (what each input
    bought, with the validation loss beside them)."""
    from tftjax.data import to_device
    from tftjax.data.covariates import input_names
    from tftjax.serving.api import load
    from tftjax.training.evaluation import saved_dataset
    from tftjax.training.trainer import inference_config, predict_windows

    saved = load(run).saved
    ds = saved_dataset(saved)
    _, interp = predict_windows(
        inference_config(saved.cfg), saved.tc, to_device(ds.features), saved.variables,
        ds.splits.val, interpretation=True,
    )  # fmt: skip
    names = input_names(saved.cfg.data)
    mine = set(saved.cfg.data.observed + saved.cfg.data.known + saved.cfg.data.static)
    lines = []
    for what, w, cols in zip(
        ("static", "encoder", "decoder"),
        (interp.static_weights.mean(0), interp.historical_weights.mean((0, 1)),
         interp.future_weights.mean((0, 1))),
        names,
    ):  # fmt: skip
        order = np.argsort(-w)
        own = [i for i, c in enumerate(cols) if c.split(" (")[0] in mine]
        shown = sorted(set(order[:top].tolist()) | set(own), key=lambda i: -w[i])
        lines.append(
            f"{what} ({len(cols)} inputs, uniform {1 / len(cols):.4f}): "
            + ", ".join(f"{cols[i]} {w[i]:.4f} (rank {int(np.where(order == i)[0][0]) + 1})"
                        for i in shown)
        )  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python experiments/spx_events.py", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("runs/examples/spx_events.parquet"))
    p.add_argument("--weights", default=None, help="print a trained run's variable weights")
    args = p.parse_args(argv)
    if args.weights:
        print(weights(args.weights))
        return 0
    t = build(args.out)
    ev = np.asarray(t.column("event").to_pylist())
    disp = t.column("dispersion").to_numpy()
    print(
        f"wrote {args.out}: {t.num_rows:,} bars, {np.sum(ev == 'opex')} opex and "
        f"{np.sum(ev == 'qend')} quarter-end days, dispersion missing on "
        f"{int(np.isnan(disp).sum())} days"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
