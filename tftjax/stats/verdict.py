"""The walk-forward's verdict (numpy and scipy only).

Each fold chooses its baseline on **its out-of-sample record**: its own validation stretch
and every earlier fold's validation and test stretches, each forecast by the fit of the
fold that made it, only windows whose last target lies before the fold's test start
(:func:`record`). The one of lowest P90 q-risk there is its pick, and the picks are
stitched over the folds into one forecast, "the baseline chosen per fold": the bar a model
must clear. Nothing is chosen on a target at or after a fold's test start. (Until issue 50
each fold chose on its own validation stretch alone, a short record on which the per-fold
choice scored worse than always using the quantile regression.)

The control for combination gains, which any second forecast brings (Bates & Granger): on
each fold's validation, every pair of baselines combined on the same weight grid as the
TFT's combination; the best pair's stitched forecast is a row (:data:`PAIR`), and the TFT
and its combination are compared with it.

Every model (the TFT, each baseline and the stitched choice) gets the same figures: pooled
P50/P90 q-risk and 10-90% coverage with circular-block-bootstrap intervals, the CRPS, the
80% interval score, per-quantile hit rates with Kupiec and Christoffersen tests on the
one-step-ahead forecasts, the quantile-crossing rate and the PIT counts. The model is
compared with each of the others by Diebold–Mariano on the P90 pinball loss (the metric the
choice is made on) and on the mean quantile loss, and by a paired circular-bootstrap
interval of the P90 q-risk difference (the same resampled dates for both).

Inference runs over **dates**, not windows. A panel's windows are stacked series by series,
yet its series move together on a date: DM reads the per-date cross-sectional mean of the
loss differential, and the bootstrap resamples blocks of dates with every series of a date
together. (DM over the stacked windows rejected a true null in 19% of simulated draws at a
cross-series correlation of 0.1, and 41% at 0.3.) For one series a date is a window. DM's
Newey–West bandwidth is twice the Politis–White block of that mean (at 1, 2 and 4 blocks
beside it), with Sun's fixed-b p-value: tests/stats/test_by_date.py measures its size. The
verdict rests on one test per run, the model against the stitched
choice; across runs (sets × variants), ``experiments/verdicts.py`` adjusts those by Holm
over every row reported. Holm over this run's baselines adjusts the side comparisons.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tftjax.stats import encompassing, scoring

CHOSEN = "chosen"
"""The stitched per-fold choice's name in a verdict's tables."""
MODEL = "tft"
COMBO = "combination"
"""The per-fold combination ``w · TFT + (1 - w) · the fold's chosen baseline`` (:func:`combine`)."""
PAIR = "pair"
"""The per-fold best pair of baselines ``w · a + (1 - w) · b`` (:func:`best_pair`): the
control for combination gains, which any second forecast brings (Bates & Granger 1969)."""
MODELS = (MODEL, COMBO, PAIR)
"""What is compared, never a baseline to choose."""
WEIGHTS = tuple(round(0.1 * i, 1) for i in range(11))
"""The combination weights tried on each fold's validation stretch."""
LEVEL = 0.05
"""The Holm-adjusted p-value under which a difference counts."""


@dataclasses.dataclass
class Fold:
    """One fold's scored windows: per model, per-window sums (:data:`tftjax.stats.scoring.SUMS`)
    of its validation and test windows, and its test quantiles ``[n, D, Q]`` against the
    test targets ``y [n, D]``."""

    val: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    y: np.ndarray | None  # None until the test stretch is scored
    pred: dict[str, np.ndarray]
    dates: np.ndarray | None = None
    """Each test window's forecast origin (int64 ns): inference runs over these dates, a
    date's windows of every series together (None: each window its own date, in order)."""
    val_ends: np.ndarray | None = None
    """Each validation window's last target time (int64 ns), and each test window's: what
    the choice on the out-of-sample record may read (:func:`record`)."""
    test_ends: np.ndarray | None = None
    test_start: int | None = None
    """The fold's first test time (int64 ns): no choice for it reads a target at or after it."""


def record(folds: list[Fold], k: int, name: str) -> np.ndarray:
    """``name``'s out-of-sample record before fold ``k``'s test start: per-window sums of
    fold ``k``'s validation windows and of every earlier fold's validation and test windows
    (each forecast by its own fold's fit), only those whose last target lies before fold
    ``k``'s test start."""
    start = folds[k].test_start
    assert start is not None, "a fold with its test start"
    parts = []
    for j, f in enumerate(folds[: k + 1]):
        stretches = [(f.val, f.val_ends)] + ([(f.test, f.test_ends)] if j < k else [])
        for sums, ends in stretches:
            assert ends is not None, "windows with their last target times"
            parts.append(sums[name][ends < start])
    return np.concatenate(parts)


def has_record(folds: list[Fold], k: int) -> bool:
    """Fold ``k`` and the folds before it carry what :func:`record` reads (fold ``k``'s own
    test windows need not be scored yet)."""
    now = folds[k]
    return (
        now.test_start is not None
        and now.val_ends is not None
        and all(f.val_ends is not None and f.test_ends is not None for f in folds[:k])
    )


def choose(fold: Fold, candidates: list[str]) -> str:
    """The candidate of lowest P90 q-risk on the fold's validation windows (the first of a
    tie, in ``candidates``' order)."""
    scores = [scoring.from_sums(fold.val[n])["q_risk_90"] for n in candidates]
    return candidates[int(np.nanargmin(scores))]


def choose_on_record(folds: list[Fold], k: int, candidates: list[str]) -> str:
    """Fold ``k``'s pick: the candidate of lowest P90 q-risk on its out-of-sample
    :func:`record` (its validation stretch and every earlier fold's stretches), or on its
    own validation where the folds carry no record (:func:`choose`). A longer record than
    one validation stretch: the stretch-by-stretch choice scored worse than always-QR."""
    if not has_record(folds, k):
        return choose(folds[k], candidates)
    scores = [scoring.from_sums(record(folds, k, n))["q_risk_90"] for n in candidates]
    return candidates[int(np.nanargmin(scores))]


def with_choice(
    folds: list[Fold], candidates: list[str], picks: list[str] | None = None
) -> tuple[list[Fold], list[str]]:
    """Each fold with the stitched choice added as :data:`CHOSEN` (its pick's validation and
    test rows and test quantiles), and the picks (``picks``: made before, kept)."""
    picks = picks or [choose_on_record(folds, k, candidates) for k in range(len(folds))]
    out = [
        dataclasses.replace(
            f,
            val={**f.val, CHOSEN: f.val[p]},
            test={**f.test, CHOSEN: f.test[p]},
            pred={**f.pred, CHOSEN: f.pred[p]},
        )
        for f, p in zip(folds, picks)
    ]
    return out, picks


def combine(y_val: np.ndarray, model_val: np.ndarray, base_val: np.ndarray, qs) -> float:
    """The weight ``w`` (:data:`WEIGHTS`) of the model in ``w · model + (1 - w) · baseline``
    of lowest P90 q-risk on the fold's validation windows (the smallest of a tie: the
    baseline, unless the model adds something there)."""
    return weighted(y_val, model_val, base_val, qs)[0]


def weighted(y_val: np.ndarray, a_val: np.ndarray, b_val: np.ndarray, qs) -> tuple[float, float]:
    """``(w, P90 q-risk)`` of the best ``w · a + (1 - w) · b`` on the validation windows
    (:func:`combine`)."""
    scores = np.array(
        [
            scoring.from_sums(scoring.window_sums(y_val, w * a_val + (1 - w) * b_val, qs))[
                "q_risk_90"
            ]
            for w in WEIGHTS
        ]
    )
    best = np.nanmin(scores)  # within 1e-9 relative: a tie (w·b + (1-w)·b is b to an ulp)
    i = int(np.flatnonzero(scores <= best + 1e-9 * abs(best))[0])
    return WEIGHTS[i], float(scores[i])


def best_pair(
    y_val: np.ndarray, preds_val: dict[str, np.ndarray], qs, pairs: list[tuple[str, str]]
) -> tuple[str, str, float]:
    """``(a, b, w)``: of ``pairs`` of baselines, the one whose best ``w · a + (1 - w) · b``
    (:func:`weighted`) has the lowest P90 q-risk on the fold's validation windows (the first
    of a tie). It reads validation targets and forecasts only: its arguments are those."""
    best: tuple[float, str, str, float] | None = None
    for a, b in pairs:
        w, score = weighted(y_val, preds_val[a], preds_val[b], qs)
        if best is None or score < best[0] - 1e-9 * abs(best[0]):
            best = (score, a, b, w)
    assert best is not None, "at least one pair"
    return best[1], best[2], best[3]


def all_pairs(names: list[str]) -> list[tuple[str, str]]:
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]


def by_series(fold: Fold, val_series: np.ndarray, test_series: np.ndarray):
    """A panel's fold split by series: ``(series index, Fold)`` for each series with test
    windows in it, its own validation and test windows for its record (the fold's pooled
    validation windows where it has none: a series that joined at the validation stretch's
    end)."""
    assert fold.y is not None, "a fold scored on its test stretch"
    cut = lambda a, m: None if a is None else a[m]
    for i in np.unique(test_series):
        v, t = val_series == i, test_series == i
        v = v if v.any() else np.ones_like(v)
        yield (
            int(i),
            Fold(
                {n: r[v] for n, r in fold.val.items()},
                {n: r[t] for n, r in fold.test.items()},
                fold.y[t],
                {n: p[t] for n, p in fold.pred.items()},
                cut(fold.dates, t),
                cut(fold.val_ends, v),
                cut(fold.test_ends, t),
                fold.test_start,
            ),
        )


def without(folds: list[Fold], start: str, end: str) -> list[Fold]:
    """The folds without their test windows whose origin lies in ``[start, end)`` (ISO
    times on the bars' clock; the validation windows kept: they chose each fold's baseline
    before its test stretch)."""
    lo, hi = (np.datetime64(t, "ns").astype(np.int64) for t in (start, end))
    out = []
    for f in folds:
        assert f.y is not None and f.dates is not None, "scored folds with their dates"
        keep = (f.dates < lo) | (f.dates >= hi)
        out.append(
            dataclasses.replace(
                f,
                test={n: r[keep] for n, r in f.test.items()},
                y=f.y[keep],
                pred={n: p[keep] for n, p in f.pred.items()},
                dates=f.dates[keep],
                test_ends=None if f.test_ends is None else f.test_ends[keep],
            )
        )
    return out


def brief(out: dict, model: str = MODEL) -> dict:
    """A verdict cut to its row: the model's and the stitched choice's test metrics, their
    comparison, the picks and the verdict (a panel's per-series rows)."""
    rows = out["pooled"]
    cut = {
        "windows": int(sum(out["fold_windows"])),
        "folds": len(out["fold_windows"]),
        "chosen_per_fold": out["chosen_per_fold"],
        "verdict": out["verdict"],
        model: {**rows[model]["test"], "ci95": rows[model]["ci95"]},
        CHOSEN: {**rows[CHOSEN]["test"], "ci95": rows[CHOSEN]["ci95"]},
        "vs": rows[CHOSEN]["vs"],
    }
    if out.get("encompassing"):
        cut["encompassing"] = out["encompassing"]
    if PAIR in rows and model != PAIR:  # the control: what any second forecast adds
        v = rows[PAIR]["vs"]
        cut[PAIR] = {**rows[PAIR]["test"], "ci95": rows[PAIR]["ci95"]}
        cut["vs_pair"] = v
        cut["verdict_vs_pair"] = verdict(v["dm_p90"], v["p90_diff_ci95"])
    return cut


def holm_rows(rows: dict) -> dict:
    """:func:`brief` rows with the DM P90 p-values Holm-adjusted over all of them
    (``p_holm``) and each verdict taken at the adjusted p."""
    names = list(rows)
    for n, adj in zip(names, scoring.holm([rows[n]["vs"]["dm_p90"]["p"] for n in names])):
        v = rows[n]["vs"]
        v["dm_p90"]["p_holm"] = float(adj)
        rows[n]["verdict"] = verdict(v["dm_p90"], v["p90_diff_ci95"], "p_holm")
    return rows


def format_series(rows: dict) -> str:
    """A panel's per-series table (:func:`brief` rows by series name)."""
    lines = [
        "per series (each over the folds it was scored in, its baseline chosen per fold "
        "on its own record; Holm over the series):",
        "| series | folds | windows | TFT P90 | chosen P90 | P90 diff [95% CI] | DM P90 (p, Holm) "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, r in rows.items():
        v, ci = r["vs"], r["vs"]["p90_diff_ci95"]
        lines.append(
            f"| {n} | {r['folds']} | {r['windows']:,} | {r[MODEL]['q_risk_90']:.4f} | "
            f"{r[CHOSEN]['q_risk_90']:.4f} | {v['p90_diff']:+.4f} [{ci[0]:+.4f}, "
            f"{ci[1]:+.4f}] | {v['dm_p90']['stat']:+.2f} ({v['dm_p90']['p']:.3g}, "
            f"{v['dm_p90'].get('p_holm', float('nan')):.3g}) | "
            f"{r['verdict']} |"
        )
    return "\n".join(lines)


NW_MULTIPLES = (1, 2, 4)
"""Newey–West bandwidths reported beside the verdict's, in Politis–White blocks."""
NW_MULTIPLE = 2
"""The verdict's own bandwidth in blocks. On an AR(0.9) differential of 1,950 dates under
a true null (2,000 draws), fixed-b DM rejected 6.9% at 5% at 1 block (the Bartlett
estimator's bias), 6.1% at 2 and 5.8% at 4; wider bandwidths cost power."""


def dm(
    a: np.ndarray,
    b: np.ndarray,
    horizon: int,
    dates: np.ndarray | None = None,
    multiple: int = NW_MULTIPLE,
) -> dict:
    """Diebold–Mariano of ``a - b`` (per-window losses; negative: ``a`` is better) on the
    per-date cross-sectional mean of the differential (``dates``: each window's origin;
    None: each window its own date), with a Newey–West bandwidth of ``multiple`` times the
    Politis–White block of that mean (never under the forecast overlap) and Sun's fixed-b
    p-value (:func:`tftjax.stats.scoring.diebold_mariano`). Overlapping ``horizon``-step
    forecasts and slowly varying volatility make the differences dependent over far more
    windows than Newey–West's rule of thumb allows; a panel's series move together on a
    date, which the mean over the date's series carries into one observation."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    sums, counts = scoring.by_date(d, dates)
    d = sums / counts
    block = scoring.block_length(d)
    lags = max(scoring.default_lags(d.size, horizon), multiple * block)
    out = scoring.diebold_mariano(d, np.zeros_like(d), horizon, lags=lags, fixed_b=True)
    return {**out, "block": block, "dates": int(d.size)}


def compare(
    a: np.ndarray,
    b: np.ndarray,
    horizon: int,
    reps: int,
    seed: int = 0,
    dates: np.ndarray | None = None,
) -> dict:
    """Model ``a`` against model ``b`` on the same windows (per-window sums ``[n, 6]``): DM
    on the P90 pinball loss (at 1, 2 and 4 blocks beside the verdict's) and on the mean
    quantile loss, and the P90 q-risk difference ``a - b`` with its paired 95%
    circular-block-bootstrap interval, resampling dates (every series of a date together;
    ``dates=None``: windows)."""
    seen = a[:, 5] > 0  # windows with an observed target (the same for every model)
    a, b = a[seen], b[seen]
    dates = None if dates is None else np.asarray(dates)[seen]
    out: dict[str, Any] = {
        "dm_p90": dm(a[:, 2], b[:, 2], horizon, dates),
        "dm_loss": dm(a[:, 0], b[:, 0], horizon, dates),
    }
    by_bandwidth = {  # robustness: the verdict's test at other bandwidths (its own reused)
        m: out["dm_p90"] if m == NW_MULTIPLE else dm(a[:, 2], b[:, 2], horizon, dates, m)
        for m in NW_MULTIPLES
    }
    out["dm_p90_by_bandwidth"] = {
        f"{m}x": {k: r[k] for k in ("stat", "p", "lags")} for m, r in by_bandwidth.items()
    }
    block = out["dm_p90"]["block"]
    sa, _ = scoring.by_date(a, dates)
    sb, _ = scoring.by_date(b, dates)
    idx = scoring.circular_bootstrap_index(sa.shape[0], block, reps, seed)
    diffs = np.array(
        [scoring.from_sums(sa[i])["q_risk_90"] - scoring.from_sums(sb[i])["q_risk_90"] for i in idx]
    )
    point = scoring.from_sums(a)["q_risk_90"] - scoring.from_sums(b)["q_risk_90"]
    out["p90_diff"] = float(point)
    out["p90_diff_ci95"] = [float(np.quantile(diffs, 0.025)), float(np.quantile(diffs, 0.975))]
    return out


def calibration(y: np.ndarray, pred: np.ndarray, qs, dates: np.ndarray | None = None) -> dict:
    """Calibration and sharpness of stitched quantile forecasts ``pred [n, D, Q]`` of the
    targets ``y [n, D]`` (NaN: not observed): CRPS, the 80% interval score, crossing rate,
    PIT counts, and the one-step-ahead hits of every quantile but the median (Kupiec's
    coverage and Christoffersen's independence tests, which read the hits as one series in
    time order).

    ``dates`` (each window's origin): also ``by_date``, the coverage test a panel needs. A
    panel's series miss together on a date, so Kupiec's binomial over the stacked hits
    overstates the evidence; ``by_date`` tests the per-date mean hit rate against its level
    with the DM machinery (Newey-West at twice the Politis-White block, fixed-b p)."""
    qarr = np.asarray(qs, np.float64)
    out = {
        "crossing_rate": scoring.crossing_rate(pred),
        "crps": float(np.nanmean(scoring.crps_from_quantiles(y, pred, qs))),  # NaN: no y
        "missing_targets": float(np.mean(~np.isfinite(y))),
        "hits": {},
    }
    i10, i90 = scoring.level(qs, 0.1, required=False), scoring.level(qs, 0.9, required=False)
    if i10 is not None and i90 is not None:
        out["interval_score_80"] = float(
            np.nanmean(scoring.interval_score(y, pred[..., i10], pred[..., i90], 0.2))
        )
    y1, p1 = y[:, 0], pred[:, 0]
    seen = np.isfinite(y1)
    y1, p1 = y1[seen], p1[seen]
    for j, q in enumerate(qarr):  # y below a lower quantile, or above an upper one
        if q == 0.5:
            continue
        hits = y1 < p1[:, j] if q < 0.5 else y1 > p1[:, j]
        p = q if q < 0.5 else 1 - q
        out["hits"][f"{q:g}"] = {
            "kupiec": scoring.kupiec(hits, p),
            "christoffersen": scoring.christoffersen(hits),
        }
        if dates is not None:
            t = dm(hits - p, np.zeros(hits.size), 1, np.asarray(dates)[seen])
            out["hits"][f"{q:g}"]["by_date"] = {
                "rate": float(hits.mean()),
                **{k: t[k] for k in ("stat", "p", "lags", "dates")},
            }
    counts, expected = scoring.pit_counts(y, pred, qs)
    out["pit"] = {"counts": counts.tolist(), "expected": expected.tolist()}
    return out


def _metrics(sums: np.ndarray) -> dict:
    return {k: float(v) for k, v in scoring.from_sums(sums).items()}


def summarize(
    folds: list[Fold],
    qs,
    horizon: int,
    reps: int,
    model: str | None = MODEL,
    block: int | None = None,
    picks: list[str] | None = None,
) -> dict:
    """The verdict of a walk-forward (see the module docstring): ``pooled`` (a row per model:
    validation and test metrics, intervals, calibration, and ``vs``: the model against it),
    ``chosen_per_fold``, ``block``, ``comparisons`` and, with a ``model``, ``verdict``.
    ``model=None``: the baselines alone (no comparison). ``block``: the intervals' bootstrap
    block (default: Politis–White on the model's P90 loss differential with the stitched
    choice, or on the choice's own P90 loss without a model). ``picks``: the folds' choices
    made before (a subset of the test windows keeps the choices of the whole)."""
    baselines = [n for n in folds[0].val if n != model and n not in MODELS]
    folds, picks = with_choice(folds, baselines, picks)
    controls = [n for n in (PAIR,) if n != model and n in folds[0].test]
    names = ([model] if model else []) + baselines + [CHOSEN] + controls
    cat = lambda part, n: np.concatenate([getattr(f, part)[n] for f in folds])
    test = {n: cat("test", n) for n in names}
    dates = (
        np.concatenate([f.dates for f in folds if f.dates is not None])
        if has_dates(folds)
        else None
    )
    seen = test[CHOSEN][:, 5] > 0
    ref = test[model][:, 2] - test[CHOSEN][:, 2] if model else test[CHOSEN][:, 2]
    ref_sums, ref_n = scoring.by_date(ref[seen], None if dates is None else dates[seen])
    block = block or scoring.block_length(ref_sums / ref_n)
    y = np.concatenate([f.y for f in folds if f.y is not None])
    table = {}
    for n in names:
        s = test[n]
        per_date, _ = scoring.by_date(s, dates)  # a date's series resampled together
        table[n] = {
            "val": _metrics(cat("val", n)),
            "test": _metrics(s),
            "ci95": {
                m: scoring.bootstrap_interval(
                    lambda x, m=m: scoring.from_sums(x)[m], per_date, block, reps
                )
                for m in ("q_risk_50", "q_risk_90", "coverage_80")
            },
            "calibration": calibration(y, cat("pred", n), qs, dates),
        }
        if model and n != model:
            table[n]["vs"] = compare(test[model], s, horizon, reps, dates=dates)
    out = {
        "pooled": table,
        "chosen_per_fold": picks,
        "block": block,
        "fold_windows": [len(f.y) if f.y is not None else 0 for f in folds],
        "inference": {
            "unit": "window" if dates is None else "date",
            "windows": int(seen.sum()),
            "dates": int(ref_n.size),
        },
    }
    if model:  # the side comparisons, one per baseline: Holm over this run's baselines
        for n, adj in zip(
            baselines, scoring.holm([table[n]["vs"]["dm_p90"]["p"] for n in baselines])
        ):
            table[n]["vs"]["dm_p90"]["p_holm"] = float(adj)
        out["comparisons"] = len(baselines)
        main = table[CHOSEN]["vs"]  # the one test the verdict rests on (Holm across runs:
        out["verdict"] = verdict(main["dm_p90"], main["p90_diff_ci95"])  # verdicts.py)
        # does the model add information the chosen baseline lacks, and the reverse?
        pred = {n: cat("pred", n) for n in (model, CHOSEN)}
        out["encompassing"] = encompassing.both_ways(
            y, pred[model], pred[CHOSEN], qs, dates, horizon
        )
    return out


def has_dates(folds: list[Fold]) -> bool:
    return all(f.dates is not None for f in folds)


def verdict(dm_p90: dict, ci95, p_key: str = "p") -> str:
    """``beats``, ``level`` or ``behind``: the model against the stitched choice on P90. A
    difference counts where the DM p-value (``p_key``: raw for one run, Holm-adjusted across
    a table) is below :data:`LEVEL` **and** the paired bootstrap interval of the P90
    difference excludes 0 on the same side (a model that kept the anchor's weights differs
    from it by float32 rounding only, which a DM statistic alone can call significant)."""
    p, stat = dm_p90.get(p_key, dm_p90["p"]), dm_p90["stat"]
    if not np.isfinite(p) or p >= LEVEL:
        return "level"
    if stat < 0 and ci95[1] < 0:
        return "beats"
    return "behind" if stat > 0 and ci95[0] > 0 else "level"


SENTENCE = {
    "beats": "the TFT beats the baseline chosen per fold on validation",
    "level": "the TFT is level with the baseline chosen per fold on validation "
    "(no significant difference)",
    "behind": "the TFT is behind the baseline chosen per fold on validation "
    "(significantly worse): not beaten",
}


def unit(out: dict) -> str:
    return out.get("inference", {}).get("unit", "window")


def inference_text(out: dict) -> str:
    """``'1,234 dates (2,468 windows of every series on them)'`` or ``'1,234 windows'``."""
    inf = out.get("inference")
    if not inf or inf["dates"] == inf["windows"]:
        return f"{inf['windows']:,} windows" if inf else "windows"
    return f"{inf['dates']:,} dates ({inf['windows']:,} windows, every series of a date together)"


def format_table(out: dict, names: dict | None = None) -> str:
    """The pooled table in Markdown, the stitched choice last, and the verdict's sentence."""
    names = names or {}
    picks = out["chosen_per_fold"]

    def label(n: str) -> str:
        fixed = {
            MODEL: "TFT",
            CHOSEN: "baseline chosen per fold",
            PAIR: "best baseline pair per fold",
        }
        return fixed[n] if n in fixed else str(names.get(n, n))

    lines = [
        f"pooled over {len(picks)} folds; choice per fold on its out-of-sample record: "
        + ", ".join(names.get(p, p) for p in picks)
        + f"; inference over {inference_text(out)}; 95% circular block bootstrap (block "
        f"{out['block']} {unit(out)}s); DM: TFT - row (negative: the TFT is better), "
        f"Newey-West lags {NW_MULTIPLE}x the Politis-White block, fixed-b p-values; "
        f"Holm over the {out.get('comparisons', 0)} baselines (the stitched choice's p is "
        "the verdict's own test)",
        "| model | P50 q-risk | P90 q-risk [95% CI] | cover 10-90 | CRPS | P90 diff [95% CI] "
        "| DM P90 (p, Holm) | DM loss (p) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, r in out["pooled"].items():
        t, ci = r["test"], r["ci95"]["q_risk_90"]
        v = r.get("vs")
        cells = "– | – | – |"
        if v:
            d, dl, di = v["dm_p90"], v["dm_loss"], v["p90_diff_ci95"]
            cells = (
                f"{v['p90_diff']:+.4f} [{di[0]:+.4f}, {di[1]:+.4f}] | {d['stat']:+.2f} "
                f"({d['p']:.3g}, " + (f"{d['p_holm']:.3g}" if "p_holm" in d else "–") + f") | "
                f"{dl['stat']:+.2f} ({dl['p']:.3g}) |"
            )
        lines.append(
            f"| {label(n)} | {t['q_risk_50']:.4f} | {t['q_risk_90']:.4f} [{ci[0]:.4f}, "
            f"{ci[1]:.4f}] | {t['coverage_80']:.3f} | {r['calibration']['crps']:.4f} | " + cells
        )
    if "verdict" in out:
        lines.append("")
        lines.append(f"verdict: {SENTENCE[out['verdict']]}.")
    if out.get("encompassing"):
        lines.append(encompassing_text(out["encompassing"]))
    return "\n".join(lines)


def encompassing_text(e: dict) -> str:
    """One line: the Giacomini-Komunjer tests both ways against the stitched choice."""
    m, b = e["model_adds"], e["baseline_adds"]
    if m["theta"] is None or b["theta"] is None:
        return f"encompassing at P{round(100 * e['level'])}: {m.get('note') or b.get('note')}"
    return (
        f"encompassing at P{round(100 * e['level'])} (Giacomini-Komunjer, by date): the TFT "
        f"adds to the chosen baseline p {m['p']:.3g} (weight {m['theta'][2]:+.2f}); the "
        f"baseline adds to the TFT p {b['p']:.3g} (weight {b['theta'][2]:+.2f})"
    )
