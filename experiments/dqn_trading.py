"""The DQN trader against the bar it must clear (issue 39): ``python experiments/dqn_trading.py
[--sets spx,btc] [--seeds 5] [--folds 5] [--epochs 40] [--out runs/dqn_trading]``.

For each set (its calendar and the cost defaults of ``tftjax.dqn.config.COSTS``), one
walk-forward (5 folds over the last 40% of the bars, test stretches stitched), every row
through the same fills and costs:

* flat and buy-and-hold;
* the forecast rule (:mod:`tftjax.dqn.rule`): long/short on the sign of the TFT's median
  cumulative forecast where it exceeds the round-trip cost, with hysteresis, thresholds
  chosen on each fold's validation;
* the DQN; the DQN with ``--action-augment``; the DQN with out-of-fold TFT inputs.

The TFT forecasts are out of fold (:mod:`tftjax.dqn.oof`): one ``--tft-preset`` TFT per fold
trained on the bars before that fold's validation stretch, and ``--tft-before`` earlier ones
for the first fold's training rows. Each DQN seed is shipped only where its validation
record clears the deflated-Sharpe gate (``--psr-gate``, counting epochs x seeds).

Writes ``OUT/SET/...`` (each walk-forward's ``walk_forward.{json,md}``, the rule's
``rule.json``) and ``OUT/dqn_trading.{md,json}``: per row the stitched out-of-sample Sharpe
(seeds that traded, pooled; mean ± sd over seeds), SE, PSR, the deflated Sharpe (the row's
record against the best of every candidate in the table: the rule and each DQN seed), turnover,
costs paid, and how many seeds stayed flat; and what each set's test length can detect.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tftjax.data import bundled_path, read_bars
from tftjax.data.windows import walk_forward_times
from tftjax.dqn import oof
from tftjax.dqn.config import DQN_PRESETS
from tftjax.dqn.loop import data_config
from tftjax.dqn.metrics import report_metrics
from tftjax.dqn.rule import walk_forward_rule
from tftjax.dqn.significance import deflated_sharpe, min_detectable_sharpe, pooled
from tftjax.dqn.walkforward import walk_forward

CALENDARS = {"es": "XCME", "spx": "XNYS", "nasdaq": "XNYS", "btc": "24/7"}
ES_NOTE = "smoke test: about 14 hours of test bars, no statistical power"


def row(
    name: str,
    records: list[np.ndarray],
    helds: list[np.ndarray],
    annual: float,
    cost: float,
    agents: list[np.ndarray] | None = None,
) -> dict:
    """A table row: the seeds that traded pooled, mean ± sd over seeds, flat seeds; for a DQN
    (``agents``: each seed's own stitched record, gated or not) its agents pooled too."""
    each = [report_metrics(n, h, annual, cost) for n, h in zip(records, helds)]
    p = pooled(records, annual)
    sh = np.array([m["sharpe"] for m in each])
    mix = (
        np.mean([r for r in records if np.std(r) > 1e-15], axis=0)
        if p["seeds_trading"]
        else np.zeros_like(records[0])
    )
    return {
        "policy": name,
        "pooled": p,
        "mix": mix,
        "sharpe_mean": float(sh.mean()),
        "sharpe_sd": float(sh.std(ddof=1)) if sh.size > 1 else 0.0,
        "turnover": float(np.mean([m["turnover"] for m in each])),
        "costs_paid": float(np.mean([m["costs_paid"] for m in each])),
        "total_log_return": float(np.mean([m["total_log_return"] for m in each])),
        "seeds": len(records),
        "agents_pooled": None if agents is None else pooled(agents, annual),
    }


def table(
    name: str, rows: list[dict], candidates: list[np.ndarray], annual: float, bars: int
) -> list[str]:
    per_bar = [float(c.mean() / c.std()) for c in candidates if c.std() > 1e-15]
    out = []
    for r in rows:
        d = (
            deflated_sharpe(r["mix"], len(candidates), per_bar)
            if r["pooled"]["seeds_trading"]
            else {"dsr": float("nan")}
        )
        r["dsr"] = d["dsr"]
        p = r["pooled"]
        sd = f" ± {r['sharpe_sd']:.2f}" if r["seeds"] > 1 else ""
        a = r["agents_pooled"]
        own = "–" if a is None else f"{a['pooled_sharpe']:+.2f} (PSR {a['pooled_psr']:.3f})"
        out.append(
            f"| {name} | {r['policy']} | {p['pooled_sharpe']:+.2f} | "
            f"{r['sharpe_mean']:+.2f}{sd} | {p['pooled_se']:.2f} | {p['pooled_psr']:.3f} | "
            f"{d['dsr']:.3f} | {r['total_log_return']:+.4f} | {r['turnover']:.3f} | "
            f"{r['costs_paid']:.4f} | {p['seeds_flat']}/{r['seeds']} | {own} |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="spx,btc")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--test-fraction", type=float, default=0.4)
    ap.add_argument("--tft-preset", default="small")
    ap.add_argument("--tft-epochs", type=int, default=20)
    ap.add_argument("--tft-before", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/dqn_trading"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    lines, timing, record = [], {}, {}
    for name in args.sets.split(","):
        t0 = time.perf_counter()
        out = args.out / name
        path = bundled_path(name)
        cfg = dataclasses.replace(
            DQN_PRESETS["trading"], calendar=CALENDARS[name], epochs=args.epochs
        )
        bars = read_bars(path)
        times = walk_forward_times([bars.ts], data_config(cfg), args.folds, args.test_fraction)
        fit, predict = oof.tft_model(
            out / "oof", path, CALENDARS[name], args.tft_preset, args.tft_epochs
        )
        blocks = oof.build(bars, times, fit, predict, before=args.tft_before)
        timing[f"{name}_tft"] = time.perf_counter() - t0
        rule = walk_forward_rule(cfg, path, times, blocks)
        (out / "rule.json").write_text(json.dumps(rule["folds"], indent=1))
        annual, cost = rule["annualisation"], rule["cost"]
        wfs = {}
        for variant, c, extra in [
            ("DQN", cfg, None),
            ("DQN, action augmentation", dataclasses.replace(cfg, action_augment=True), None),
            (
                "DQN, out-of-fold TFT inputs",
                cfg,
                lambda k, fold, ds: oof.for_fold(blocks, ds.bars.ts, fold[0])["columns"],
            ),
        ]:
            t1 = time.perf_counter()
            slug = variant.split(", ")[-1].replace(" ", "_").replace("-", "_")
            wfs[variant] = walk_forward(
                c,
                args.seeds,
                path,
                out / slug,
                args.folds,
                args.test_fraction,
                log=print,
                extra=extra,
                keep_records=True,
            )
            timing[f"{name}_{slug}"] = time.perf_counter() - t1
        base = wfs["DQN"]
        rows = [
            row(
                b,
                [np.asarray(base["baseline_records"][b][0])],
                [np.asarray(base["baseline_records"][b][1])],
                annual,
                cost,
            )
            for b in ("flat", "buy_and_hold")
        ]
        rows.append(row("forecast rule", [rule["net"]], [rule["held"]], annual, cost))
        candidates = [rule["net"]]
        for variant, wf in wfs.items():
            nets = [np.asarray(n) for n in wf["shipped_records"]["net"]]
            rows.append(
                row(
                    variant,
                    nets,
                    [np.asarray(h) for h in wf["shipped_records"]["held"]],
                    annual,
                    cost,
                    [np.asarray(n) for n in wf["agent_records"]["net"]],
                )
            )
            candidates += [np.asarray(n) for n in wf["agent_records"]["net"]]
        n_bars = rule["net"].size
        mds = min_detectable_sharpe(n_bars, annual)
        lines += table(name.upper(), rows, candidates, annual, n_bars)
        psr_rule = rows[2]["pooled"]["pooled_psr"]
        record[name] = {
            "rows": [{k: v for k, v in r.items() if k != "mix"} for r in rows],
            "test_bars": n_bars,
            "min_detectable_sharpe": mds,
            "rule_folds": rule["folds"],
            "candidates": len(candidates),
            "note": ES_NOTE if name == "es" else None,
        }
        print(
            f"{name}: {n_bars:,} test bars detect an annualised Sharpe of {mds:.2f}; the "
            f"forecast rule's PSR {psr_rule:.3f}"
            + (
                ""
                if psr_rule >= 0.95
                else ": below 0.95, so no agent should trade this set on these forecasts"
            ),
            flush=True,
        )
        timing[name] = time.perf_counter() - t0
    head = (
        "| data | policy | Sharpe (pooled) | Sharpe (mean ± sd over seeds) | SE | PSR | "
        "deflated Sharpe | total net log return | turnover | costs paid | seeds flat | "
        "the agents' own record, ungated (pooled Sharpe) |\n" + "|---" * 12 + "|"
    )
    text = (
        f"{args.seeds} seeds x {args.folds} folds, {args.epochs} epochs; test stretches "
        "stitched (out of sample); each seed's shipped policy (flat where its validation "
        "record did not clear the gate)\n\n"
        + head
        + "\n"
        + "\n".join(lines)
        + "\n\n"
        + "\n".join(
            f"{k}: {v['test_bars']:,} test bars, minimum detectable Sharpe "
            f"{v['min_detectable_sharpe']:.2f}"
            for k, v in record.items()
        )
    )
    (args.out / "dqn_trading.md").write_text(text + "\n")
    (args.out / "dqn_trading.json").write_text(
        json.dumps(
            {
                "record": record,
                "timing_s": timing,
                "args": {k: str(v) for k, v in vars(args).items()},
            },
            indent=1,
            default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x),
        )
    )
    print(text)


if __name__ == "__main__":
    main()
