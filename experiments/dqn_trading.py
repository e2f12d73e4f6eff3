"""The DQN trader across data sets, seeds and folds, with and without a TFT's forecasts
(issue 26): ``python experiments/dqn_trading.py [--sets es,spx,btc] [--seeds 5] [--folds 5]
[--epochs 40] [--out runs/dqn_trading]``.

For each set (its calendar and the cost defaults of ``tftjax.dqn.config.COSTS``): the
walk-forward of ``python -m tftjax.dqn --folds K --seeds N`` without TFT inputs, then with
them. The TFT (``small`` preset) is trained once per set on the bars before the *first*
fold's validation stretch (its own train/validation split inside them), so that no fold's
validation or test bars ever reached it (the DQN refuses otherwise). Writes
``OUT/SET_{plain,tft}/walk_forward.{json,md}`` and ``OUT/dqn_trading.md``: per set and
variant the mean ± sd over seeds of the stitched out-of-sample Sharpe, its SE and PSR, total
net log return, costs paid, and how many seeds beat flat and buy-and-hold.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tftjax.config import TrainConfig, preset  # noqa: E402
from tftjax.data import bundled_path, load_dataset, read_bars, write_bars  # noqa: E402
from tftjax.data.windows import walk_forward_times  # noqa: E402
from tftjax.dqn.config import DQN_PRESETS  # noqa: E402
from tftjax.dqn.loop import data_config  # noqa: E402
from tftjax.dqn.walkforward import walk_forward  # noqa: E402

CALENDARS = {"es": "XCME", "spx": "XNYS", "nasdaq": "XNYS", "btc": "24/7"}


def early_tft(name: str, cfg, folds: int, test_fraction: float, out: Path) -> Path:
    """A small TFT trained on the bars before the first fold's validation stretch."""
    from tftjax.training import train_and_evaluate

    bars = read_bars(bundled_path(name))
    first = walk_forward_times([bars.ts], data_config(cfg), folds, test_fraction)[0]
    ds0 = load_dataset(bundled_path(name), data_config(cfg), fold=first)
    stop = int(ds0.splits.val_rows[0]) - cfg.window  # one DQN window of margin
    head = out / f"{name}_head.parquet"
    write_bars(bars.slice(0, stop), head)
    tcfg = preset("small", calendar=CALENDARS[name])
    run_dir = out / f"{name}_tft_model"
    train_and_evaluate(tcfg, TrainConfig(epochs=20, patience=3), run_dir,
                       dataset=load_dataset(head, tcfg.data), progress=False,
                       log=lambda *a: None, plots=False)
    return run_dir


def summary_row(name: str, variant: str, wf: dict) -> str:
    m = {k: np.array([s[k] for s in wf["per_seed"]]) for k in
         ("sharpe", "sharpe_se", "psr", "total_log_return", "costs_paid", "turnover")}
    a = np.array([s["total_log_return"] for s in wf["agents"]])
    c, n = wf["counts"], len(wf["per_seed"])
    hold = wf["baselines"]["buy_and_hold"]
    sd = lambda x: x.std(ddof=1) if x.size > 1 else 0.0  # noqa: E731
    return (f"| {name} | {variant} | {m['sharpe'].mean():+.2f} ± {sd(m['sharpe']):.2f} | "
            f"{m['sharpe_se'].mean():.2f} | {m['psr'].mean():.3f} | "
            f"{m['total_log_return'].mean():+.4f} ± {sd(m['total_log_return']):.4f} | "
            f"{a.mean():+.4f} | {m['costs_paid'].mean():.4f} | {m['turnover'].mean():.3f} | "
            f"{c['beats_flat']}/{n} | {c['beats_buy_and_hold']}/{n} | "
            f"{hold['sharpe']:+.2f} / {hold['total_log_return']:+.4f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="es,spx,btc")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--test-fraction", type=float, default=0.4)
    ap.add_argument("--out", type=Path, default=Path("runs/dqn_trading"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, timing = [], {}
    for name in args.sets.split(","):
        cfg = dataclasses.replace(DQN_PRESETS["trading"], calendar=CALENDARS[name],
                                  epochs=args.epochs)
        for variant in ("plain", "tft"):
            t0 = time.perf_counter()
            c = cfg
            if variant == "tft":
                c = dataclasses.replace(cfg, tft_checkpoint=str(early_tft(
                    name, cfg, args.folds, args.test_fraction, args.out)))
            wf = walk_forward(c, args.seeds, bundled_path(name), args.out / f"{name}_{variant}",
                              args.folds, args.test_fraction, log=print)
            timing[f"{name}_{variant}"] = time.perf_counter() - t0
            rows.append(summary_row(name, "with TFT inputs" if variant == "tft" else
                                    "without", wf))
            print(rows[-1], flush=True)
    head = ("| data | DQN | Sharpe (mean ± sd) | SE | PSR | total net log return (mean ± sd) | "
            "agent's own return | costs paid | turnover | beats flat | beats buy-and-hold | "
            "buy-and-hold Sharpe / return |\n" + "|---" * 12 + "|")
    text = (f"{args.seeds} seeds x {args.folds} folds, {args.epochs} epochs, test stretches "
            "stitched (out of sample); the shipped policy of each seed (flat where its "
            "validation did not beat flat)\n\n" + head + "\n" + "\n".join(rows))
    (args.out / "dqn_trading.md").write_text(text + "\n")
    (args.out / "timing.json").write_text(json.dumps(timing, indent=1))
    print(text)


if __name__ == "__main__":
    main()
