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

Runs under a pre-registered recipe (``backtest --preregistered``) are read by their recipe
instead: the Holm family is the recipe's ``holm_family`` (rows ``SET: TFT vs chosen`` and
``SET: combination vs best pair``, ``SET`` the recipe file's stem), every run given must
name the same family, and a family row whose set was not given counts as p = 1, which
keeps the adjustment valid (never smaller than over the full family) until it is run.
Beside the family, each set prints its strongest single row on the test stretch, its
pooled verdict without February-April 2020 where it has one, and a panel's series with
Holm over the series.

    python experiments/verdicts.py runs/prereg/spx/backtest.json runs/prereg/es/backtest.json
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


def comparison(vs: dict) -> dict:
    """A row's fields of one comparison: the P90 difference, its interval, and DM's
    statistic, p-value and lags."""
    dm = vs["dm_p90"]
    return {
        "p90_diff": vs["p90_diff"],
        "p90_diff_ci95": vs["p90_diff_ci95"],
        "dm_p90": dm["stat"],
        "p": dm["p"],
        "lags": dm["lags"],
    }


def with_holm(rows: list[dict], key: str) -> None:
    """Holm over the rows' p-values, each adjusted p under ``key`` and its verdict beside
    it (a row without a p, a set not yet run, counts as p = 1 and gets neither)."""
    from tftjax.stats import scoring, verdict

    for r, adj in zip(rows, scoring.holm([r.get("p", 1.0) for r in rows])):
        if "p" in r:
            r[key] = float(adj)
            r["verdict"] = verdict.verdict(
                {"stat": r["dm_p90"], "p": r["p"], "p_holm": float(adj)},
                r["p90_diff_ci95"],
                "p_holm",
            )


def table(runs: list[tuple[str, dict]], per_series: bool = False) -> tuple[list[dict], str]:
    from tftjax.stats import verdict

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
                    **comparison(v),
                    "dm_loss": v["dm_loss"]["stat"],
                    "p_loss": v["dm_loss"]["p"],
                }
            )
    with_holm(rows, "p_holm_table")
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


FAMILY_ROWS = {
    "TFT vs chosen": "the TFT against the baseline chosen per fold",
    "combination vs best pair": "its combination against the best baseline pair per fold",
}
"""The two rows a recipe's Holm family may name per set (``SET: ROW``)."""


def family_row(out: dict, row: str) -> tuple[float, float, dict]:
    """(the forecast's P90, the bar's P90, the comparison) for one family row of a run."""
    from tftjax.stats import verdict

    if row == "TFT vs chosen":
        pooled = out["pooled"]
        return (
            pooled[verdict.MODEL]["test"]["q_risk_90"],
            pooled[verdict.CHOSEN]["test"]["q_risk_90"],
            pooled[verdict.CHOSEN]["vs"],
        )
    c = out["combination"]
    return c[verdict.COMBO]["q_risk_90"], c[verdict.PAIR]["q_risk_90"], c["vs_pair"]


def family_of(runs: list[tuple[str, dict]]) -> tuple[list[str], dict[str, dict]]:
    """The recipes' common Holm family and the runs by set (their recipe file's stem)."""
    from tftjax.errors import DataError

    family, by_set = None, {}
    for label, out in runs:
        reg = out["preregistration"]
        if family is None:
            family = list(reg["holm_family"])
        elif list(reg["holm_family"]) != family:
            raise DataError(
                f"{label}: its recipe's holm_family differs from the first run's; a table "
                "takes one family"
            )
        key = Path(reg["path"]).stem
        if key in by_set:
            raise DataError(f"{label}: a second run of set {key!r}; give each set once")
        by_set[key] = out
    for name in family or []:
        key, _, row = name.partition(": ")
        if row not in FAMILY_ROWS:
            raise DataError(
                f"holm_family row {name!r}: a row is 'SET: " + "' or 'SET: ".join(FAMILY_ROWS) + "'"
            )
    return family or [], by_set


def strongest(out: dict) -> tuple[str, float]:
    """The single row with the lowest test P90 among the baselines, the choice and the pair
    (read on the test stretch: descriptive, never a choice the verdict rests on)."""
    from tftjax.stats import verdict

    rows = {n: r["test"]["q_risk_90"] for n, r in out["pooled"].items() if n != verdict.MODEL}
    from tftjax.stats.baselines import NAMES

    name = min(rows, key=lambda n: rows[n])
    label = {verdict.CHOSEN: "the baseline chosen per fold", verdict.PAIR: "the best pair"}
    return label.get(name, NAMES.get(name, name)), rows[name]


def preregistered(runs: list[tuple[str, dict]]) -> tuple[list[dict], str]:
    """Holm over the recipes' family; one sentence per set."""

    family, by_set = family_of(runs)
    rows = []
    for name in family:
        key, _, row = name.partition(": ")
        r: dict = {"row": name, "set": key}
        if key in by_set:
            model, bar, vs = family_row(by_set[key], row)
            r |= {"model_p90": model, "bar_p90": bar, **comparison(vs)}
        rows.append(r)
    with_holm(rows, "p_holm")
    return rows, preregistered_text(rows, by_set)


def preregistered_text(rows: list[dict], by_set: dict[str, dict]) -> str:
    run = [r for r in rows if "p" in r]
    lines = [
        f"Holm over the recipes' family of {len(rows)} rows ({len(rows) - len(run)} not yet "
        "run, counted as p = 1); DM on the per-date mean of the P90 pinball loss "
        "differential, forecast - bar (negative: the forecast is better)",
        "| row | forecast P90 | bar P90 | diff [95% CI] | DM (lags) | p | p (Holm) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "p" not in r:
            lines.append(f"| {r['row']} | not yet run | | | | | | |")
            continue
        ci = r["p90_diff_ci95"]
        lines.append(
            f"| {r['row']} | {r['model_p90']:.4f} | {r['bar_p90']:.4f} | {r['p90_diff']:+.4f} "
            f"[{ci[0]:+.4f}, {ci[1]:+.4f}] | {r['dm_p90']:+.2f} ({r['lags']}) | {r['p']:.3g} | "
            f"{r['p_holm']:.3g} | {r['verdict']} |"
        )
    lines.append("")
    for key, out in by_set.items():
        lines.append(f"- {set_sentence(out, [r for r in run if r['set'] == key])}")
        if "by_series" in out:
            from tftjax.stats import verdict

            lines += [
                "",
                f"{key}, each series (Holm over its series):",
                verdict.format_series(out["by_series"]),
            ]
    return "\n".join(lines)


WORDS = {"beats": "beats", "level": "is level with", "behind": "is behind"}


def set_sentence(out: dict, rows: list[dict]) -> str:
    """One sentence: the set's family rows at their Holm p, then what reads beside them."""
    parts = []
    for r in rows:
        row = r["row"].partition(": ")[2]
        subject, _, bar = FAMILY_ROWS[row].partition(" against ")
        parts.append(f"{subject} {WORDS[r['verdict']]} {bar} (Holm p {r['p_holm']:.2g})")
    name, p90 = strongest(out)
    text = f"{out['preregistration']['set']}: " + "; ".join(parts)
    text += f". Its strongest single row on the test stretch is {name} at P90 {p90:.4f}"
    text += f" against the TFT's {out['pooled']['tft']['test']['q_risk_90']:.4f}"
    calm = out.get("without_stress")
    if calm:
        text += (
            f"; without {calm['from']}..{calm['until']} ({calm['windows_dropped']} windows) "
            f"the TFT {WORDS[calm['verdict']]} the chosen baseline (p {calm['vs']['dm_p90']['p']:.2g})"
        )
    return text + "."


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
    runs = [load(a) for a in args.runs]
    registered = [label for label, out in runs if "preregistration" in out]
    if registered and len(registered) < len(runs):
        from tftjax.errors import DataError

        raise DataError(
            f"{registered[0]} is a pre-registered run and other runs given are not: its "
            "Holm family is the recipe's, so give pre-registered runs alone"
        )
    rows, text = preregistered(runs) if registered else table(runs, args.per_series)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit
    from tftjax.cli import main as cli_main

    cli_exit(cli_main(main, sys.argv[1:]))
