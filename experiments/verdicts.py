"""Holm over every row a README table reports: several walk-forwards (sets × model variants),
each the TFT against the baseline chosen per fold on its out-of-sample record, and the
per-fold combination (w · TFT + (1 - w) · that baseline, w chosen on validation) as a row of
its own; with ``--per-series``, a panel's series too.

    python experiments/verdicts.py runs/backtest/spx/backtest.json:"S&P daily, small" \\
        runs/backtest/btc/backtest.json:"BTC hourly, small" --json verdicts.json

Each argument is a ``backtest.json`` of ``python -m tftjax.backtest`` (optionally ``:label``).
A row's p-value is its Diebold–Mariano p on the per-window P90 pinball loss against the
stitched choice (bandwidth at least the Politis–White block; :mod:`tftjax.stats.verdict`); Holm's
step-down adjustment runs over all the rows given, so a row counts as "beats" or "behind"
only at a family-wise 5% over the whole table (and where its paired bootstrap interval of
the P90 difference excludes 0 on the same side). Prints one Markdown row per run and one plain
sentence each. A file that is not a verdict of this version (no ``chosen_per_fold``) is
refused with one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(arg: str) -> tuple[str, dict]:
    from tftjax.errors import DataError

    path, _, label = arg.partition(":") if not Path(arg).is_file() else (arg, "", "")
    try:
        out = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable backtest.json ({type(e).__name__}: {e})") from None
    if "chosen_per_fold" not in out or "verdict" not in out:
        raise DataError(
            f"{path}: a backtest.json from before the per-fold choice (no "
            "chosen_per_fold): run python -m tftjax.backtest again"
        )
    return label or str(Path(path).parent.name), out


def table(runs: list[tuple[str, dict]], per_series: bool = False) -> tuple[list[dict], str]:
    from tftjax.stats import scoring, verdict

    rows = []
    for label, out in runs:
        parts = [
            (
                label,
                out["pooled"]["tft"]["test"]["q_risk_90"],
                out["pooled"][verdict.CHOSEN]["test"]["q_risk_90"],
                out["pooled"][verdict.CHOSEN]["vs"],
                out["chosen_per_fold"],
            )
        ]
        if "combination" in out:  # its own row: the combination against the same choice
            c = out["combination"]
            parts.append(
                (
                    f"{label}, combination",
                    c[verdict.COMBO]["q_risk_90"],
                    c[verdict.CHOSEN]["q_risk_90"],
                    c["vs"],
                    c["chosen_per_fold"],
                )
            )
        if per_series:  # a panel's series, each its own row
            for name, r in out.get("by_series", {}).items():
                parts.append(
                    (
                        f"{label}: {name}",
                        r["tft"]["q_risk_90"],
                        r[verdict.CHOSEN]["q_risk_90"],
                        r["vs"],
                        r["chosen_per_fold"],
                    )
                )
        for run, tft, chosen, v, picks in parts:
            rows.append(
                {
                    "run": run,
                    "tft_p90": tft,
                    "chosen_p90": chosen,
                    "picks": picks,
                    "p90_diff": v["p90_diff"],
                    "p90_diff_ci95": v["p90_diff_ci95"],
                    "dm_p90": v["dm_p90"]["stat"],
                    "p": v["dm_p90"]["p"],
                    "lags": v["dm_p90"]["lags"],
                    "dm_loss": v["dm_loss"]["stat"],
                    "p_loss": v["dm_loss"]["p"],
                }
            )
    for r, adj in zip(rows, scoring.holm([r["p"] for r in rows])):
        r["p_holm_table"] = float(adj)
        r["verdict"] = verdict.verdict(
            {"stat": r["dm_p90"], "p": r["p"], "p_holm": float(adj)}, r["p90_diff_ci95"], "p_holm"
        )
    lines = [
        f"Holm over {len(rows)} rows (DM on the per-window P90 loss, TFT - the baseline "
        "chosen per fold; negative: the TFT is better)",
        "| run | TFT P90 | chosen P90 | diff [95% CI] | DM P90 (lags) | p | p (Holm, table) "
        "| DM loss (p) | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ci = r["p90_diff_ci95"]
        lines.append(
            f"| {r['run']} | {r['tft_p90']:.4f} | {r['chosen_p90']:.4f} | "
            f"{r['p90_diff']:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}] | {r['dm_p90']:+.2f} "
            f"({r['lags']}) | {r['p']:.3g} | {r['p_holm_table']:.3g} | "
            f"{r['dm_loss']:+.2f} ({r['p_loss']:.3g}) | {r['verdict']} |"
        )
    lines.append("")
    lines += [f"- {r['run']}: {verdict.SENTENCE[r['verdict']]}." for r in rows]
    return rows, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python experiments/verdicts.py", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("runs", nargs="+", help="backtest.json[:label]")
    p.add_argument("--json", default=None, help="also write the rows here")
    p.add_argument(
        "--per-series",
        action="store_true",
        help="a panel's per-series rows too (each in the Holm family)",
    )
    args = p.parse_args(argv)
    rows, text = table([load(a) for a in args.runs], args.per_series)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit
    from tftjax.cli import main as cli_main

    cli_exit(cli_main(main, sys.argv[1:]))
