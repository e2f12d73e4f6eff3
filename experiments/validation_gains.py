"""What each change bought **on validation**: the TFT's validation P90 q-risk per fold across
walk-forwards of one set (the same folds), each against the first run given.

    python experiments/validation_gains.py runs/backtest/small/backtest.json:"small --anchor" \\
        runs/backtest/compact/backtest.json:compact ...

Each fold's validation stretch ends one embargo before its test stretch, so these are the
figures a choice between the variants may be made on (never the test column). Also the
per-fold combination's weight and validation P90, where the run has one. A run of other
folds than the first (another --folds, --test-fraction or window) is refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    from verdicts import load

    from tftjax.errors import DataError

    p = argparse.ArgumentParser(
        prog="python experiments/validation_gains.py", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("runs", nargs="+", help="backtest.json[:label]")
    runs = [load(a) for a in p.parse_args(argv).runs]
    base_label, base = runs[0]
    starts = [f["test_from"] for f in base["folds"]]
    for label, out in runs[1:]:
        if [f["test_from"] for f in out["folds"]] != starts:
            raise DataError(
                f"{label}: its folds are not {base_label}'s (test stretches from "
                f"{', '.join(s[:10] for s in starts)})"
            )
    head = " | ".join(f"fold {k + 1}" for k in range(len(starts)))
    print(
        f"validation P90 q-risk of the kept weights per fold (relative to {base_label}); each "
        "is the figure the run's own early stopping, anchor and combination weight were "
        "chosen on, so it flatters a variant with more checks or choices"
    )
    print(f"| run | {head} | mean |\n|---|" + "---|" * (len(starts) + 1))
    ref = [f["val_q_risk_90"]["tft"] for f in base["folds"]]
    for label, out in runs:
        v = [f["val_q_risk_90"]["tft"] for f in out["folds"]]
        cells = [
            f"{x:.4f}" + ("" if out is base else f" ({100 * (x / r - 1):+.2f}%)")
            for x, r in zip(v, ref)
        ]
        mean = sum(v) / len(v)
        rel = "" if out is base else f" ({100 * (mean / (sum(ref) / len(ref)) - 1):+.2f}%)"
        print(f"| {label} | " + " | ".join(cells) + f" | {mean:.4f}{rel} |")
        if "combination" in out:
            c = [f["val_q_risk_90"].get("combination") for f in out["folds"]]
            w = [f.get("combination_weight") for f in out["folds"]]
            print(
                f"| {label}, combination (w) | "
                + " | ".join(f"{x:.4f} (w {y:g})" for x, y in zip(c, w))
                + f" | {sum(c) / len(c):.4f} |"
            )
    return 0


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit
    from tftjax.cli import main as cli_main

    cli_exit(cli_main(main, None))
