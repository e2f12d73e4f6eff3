"""The TFT's walk-forward against the baselines (``python -m tftjax.backtest``).

Each fold (:func:`tftjax.data.windows.walk_forward_times`) trains a model **from scratch**
on every bar before its validation stretch, early-stops on that stretch, and scores its own
test stretch once; the folds' test targets tile the test region. Each fold chooses its
baseline on its out-of-sample record before its test start
(:func:`tftjax.stats.verdict.record`), and the combination's weight and the best baseline
pair (the control) on its own validation stretch; nothing is chosen on a target at or after
its test start. :mod:`tftjax.stats.verdict` pools the folds into the table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tftjax.config import ConfigError, TFTConfig, TrainConfig
from tftjax.data import Dataset
from tftjax.stats import scoring, verdict
from tftjax.stats.baselines import NAMES


@dataclasses.dataclass(frozen=True)
class WalkForward:
    """How the folds are cut and scored."""

    folds: int = 5
    """Expanding-window folds (at least 2)."""
    test_fraction: float = 0.4
    """Share of the bar times (after warm-up) cut into the folds' test stretches."""
    bootstrap: int = 2000
    """Circular block bootstrap resamples of the intervals (at least 1)."""
    tune_trials: int = 0
    """Optuna trials on each fold's own training and validation stretches before it trains
    (0: no tuning)."""
    tune_epochs: int = 8
    """Epochs of each tuning trial (patience 2, median pruning)."""
    baseline_pairs: str = "all"
    """The pairs of baselines the pair control tries on each fold's validation (``a+b,c+d``
    of :data:`tftjax.stats.baselines.NAMES`), or ``all``."""

    def __post_init__(self) -> None:
        if self.folds < 2:
            raise ConfigError(
                f"--folds must be >= 2 (a walk-forward needs several), got {self.folds}"
            )
        if self.bootstrap < 1:
            raise ConfigError(f"--bootstrap must be >= 1 resample, got {self.bootstrap}")
        if not 0 < self.test_fraction < 1:
            raise ConfigError(f"--test-fraction must be in (0, 1), got {self.test_fraction}")
        if self.tune_trials < 0:
            raise ConfigError(f"--tune-trials must be >= 0 (0: no tuning), got {self.tune_trials}")
        if self.tune_trials and self.tune_epochs < 1:
            raise ConfigError(f"--tune-epochs must be >= 1, got {self.tune_epochs}")
        if self.tune_trials:
            try:
                import optuna  # noqa: F401
            except ImportError:
                raise ConfigError(
                    "--tune-trials needs optuna: pip install 'tftjax[tune]'"
                ) from None
        self.pairs(list(NAMES))  # every name known: refused before any fold trains

    def pairs(self, available: list[str]) -> list[tuple[str, str]]:
        """The pairs to try among the ``available`` baselines (a pair with a baseline this
        data has none of, HAR on intraday bars, is left out)."""
        if self.baseline_pairs == "all":
            return verdict.all_pairs(available)
        out = []
        for item in self.baseline_pairs.split(","):
            names = item.split("+")
            bad = [n for n in names if n not in NAMES]
            if len(names) != 2 or bad or names[0] == names[1]:
                raise ConfigError(
                    f"--baseline-pairs {self.baseline_pairs}: {item!r} is not a pair of two "
                    f"baselines a+b of {', '.join(NAMES)}, or all"
                )
            if all(n in available for n in names):
                out.append((names[0], names[1]))
        return out


@dataclasses.dataclass
class Tally:
    """What the folds add up to: each fold's sums, its record, per-step sums, per series."""

    scored: list = dataclasses.field(default_factory=list)
    folds: list = dataclasses.field(default_factory=list)
    steps: dict = dataclasses.field(default_factory=dict)
    by_series: dict = dataclasses.field(default_factory=dict)
    members: list = dataclasses.field(default_factory=list)
    """An ensemble's folds: each member's test-window sums alone ``[E, n, 6]``."""


def backtest(
    cfg: TFTConfig,
    tc: TrainConfig,
    paths,
    workdir: Path,
    plan: WalkForward = WalkForward(),
    *,
    progress: bool = False,
    log: Callable = print,
    tune_fn: Callable | None = None,
    tensorboard: bool = True,
    resume: bool = False,
    record: dict | None = None,
) -> dict:
    """Train and score every fold; the stitched comparison (see the module docstring).
    ``paths``: the bars (one file, several, or None: the bundled ES bars); ``tune_fn``: the
    search run inside each fold (default :func:`tftjax.training.search.tune`); ``resume``:
    a fold trained to its end before is scored again from its final checkpoint, one stopped
    midway continues from its latest checkpoint (:func:`train_fold`); ``record``: what
    ``workdir/walkforward.json`` holds (:func:`claim_workdir`), written before the first
    fold trains."""
    import json

    from tftjax.data import default_parquet, load_dataset
    from tftjax.data.bars import read_series
    from tftjax.data.windows import walk_forward_times

    files = paths if isinstance(paths, list) else [paths] if paths is not None else None
    files = files or [default_parquet()]
    ts = [b.ts for p in files for b in read_series(p)]
    tally = Tally()
    for k, fold in enumerate(walk_forward_times(ts, cfg.data, plan.folds, plan.test_fraction), 1):
        ds = load_dataset(files if len(files) > 1 else files[0], cfg.data, fold=fold)
        if record is not None and k == 1:  # the data read: the folder is the walk-forward's
            from tftjax.training.anchoring import resolve_anchor

            resolve_anchor(cfg, ds)  # an anchor the data cannot have: refused, nothing written
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "walkforward.json").write_text(json.dumps(record, indent=1))
        chosen, ck = train_fold(
            cfg, tc, ds, workdir, k, plan, tune_fn, progress, tensorboard, resume, log
        )
        entry = score_fold(ck, tc, ds, fold, tally, len(files) > 1, plan)
        entry.update(fold=k, tuned=chosen)
        tally.folds.append(entry)
        log(fold_line(entry, k, plan.folds, ds))
    return summarize(tally, cfg, plan.bootstrap)


RESUME_MAY_CHANGE = ("resume", "progress", "plot", "tensorboard", "bootstrap", "workdir")
"""Settings a resumed walk-forward may change: what it shows, not what it trains or scores
(the bootstrap's resamples only move the intervals)."""


def claim_workdir(workdir: Path, settings: dict, files, resume: bool) -> dict:
    """Check ``workdir`` for a walk-forward: a new one needs an empty folder; a resumed one
    (``resume``) the folder of a walk-forward with the same settings and data, by its
    ``walkforward.json``. Returns what that file holds (every setting, and each bar file's
    SHA-256), for :func:`backtest` to write once the data has been read.

    Raises:
      ConfigError: a new walk-forward in a folder with files; a resume into a folder
        without ``walkforward.json``, or of other settings or data (naming each)."""
    import hashlib
    import json

    paths = files if isinstance(files, list) else [files] if files is not None else []
    now = {k: v for k, v in settings.items() if k not in RESUME_MAY_CHANGE}
    now["data_sha256"] = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]
    now = json.loads(json.dumps(now, default=str))
    record = workdir / "walkforward.json"
    if not resume:
        if workdir.exists() and any(workdir.iterdir()):
            raise ConfigError(
                f"--workdir {workdir} is not empty; choose a new folder, or pass --resume to "
                "continue the walk-forward in it"
            )
    elif not record.exists():
        raise ConfigError(f"--resume: {workdir} holds no walk-forward ({record.name} is missing)")
    else:
        saved = json.loads(record.read_text())
        diff = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
        if diff:
            raise ConfigError(
                f"--resume: {workdir} is a walk-forward of other settings or data: "
                + "; ".join(f"{k} {now.get(k)!r}, it had {saved.get(k)!r}" for k in diff)
            )
    return now


def train_fold(
    cfg: TFTConfig,
    tc: TrainConfig,
    ds: Dataset,
    workdir: Path,
    k: int,
    plan: WalkForward,
    tune_fn,
    progress: bool,
    tensorboard: bool,
    resume: bool = False,
    log: Callable = print,
):
    """Fold ``k``'s model, trained from scratch on ``ds`` (its settings first tuned on its
    own training and validation stretches when ``plan.tune_trials``): ``(the settings the
    tuning chose or None, its checkpoint)``.

    ``resume``: a fold whose run wrote its ``summary.json`` is not trained again; one with
    checkpoints continues from its latest (the run's own resume checks that its data and
    settings are the fold's); one without starts afresh. A tuning that ended is not run
    again (``tune_K/chosen.json``).

    Raises:
      ConfigError: (resume) a fold's tuning that was stopped before it chose."""
    from tftjax.runner.checkpoints import list_checkpoints
    from tftjax.training import open_checkpoint, train_and_evaluate

    run = workdir / f"fold_{k}"
    chosen = tuned(cfg, tc, ds, workdir / f"tune_{k}", k, plan, tune_fn, tensorboard, resume)
    if chosen is not None:
        from tftjax.config import apply_settings

        cfg, tc = apply_settings(cfg, tc, chosen, "tuning")
    if resume and (run / "summary.json").exists():
        log(f"--resume: fold {k} was trained to its end before ({run}); scored again")
        return chosen, open_checkpoint(run)
    train_and_evaluate(
        cfg,
        tc,
        run,
        data=ds,
        resume=resume and bool(list_checkpoints(run / "checkpoints")),
        progress=progress,
        log=lambda *a: None,
        plots=False,
        tensorboard=tensorboard,
    )
    return chosen, open_checkpoint(run)


def tuned(
    cfg: TFTConfig,
    tc: TrainConfig,
    ds: Dataset,
    folder: Path,
    k: int,
    plan: WalkForward,
    tune_fn,
    tensorboard: bool,
    resume: bool,
) -> dict | None:
    """The settings fold ``k``'s tuning chose (None without tuning), kept in
    ``folder/chosen.json``: read back on resume, never searched twice.

    Raises:
      ConfigError: (resume) the folder holds a tuning stopped before it chose."""
    import json

    if not plan.tune_trials:
        return None
    record = folder / "chosen.json"
    if resume and record.exists():
        return json.loads(record.read_text())
    if resume and folder.exists() and any(folder.iterdir()):
        raise ConfigError(
            f"--resume: fold {k}'s tuning in {folder} stopped before it chose its settings; "
            "move that folder away to tune the fold again"
        )
    from tftjax.training.search import tune

    tune_tc = dataclasses.replace(tc, epochs=plan.tune_epochs, patience=min(tc.patience, 2))
    t = (tune_fn or tune)(
        cfg,
        tune_tc,
        None,
        folder,
        plan.tune_trials,
        seed=k - 1,
        progress=False,
        log=lambda *a: None,
        dataset=ds,
        tensorboard=tensorboard,
    )
    folder.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(t["settings"]))
    return t["settings"]


def score_fold(
    ck, tc: TrainConfig, ds: Dataset, fold, tally: Tally, panel: bool, plan: WalkForward
) -> dict:
    """Fold ``ck``'s TFT, every baseline, the baseline chosen on its out-of-sample record,
    the combination and the best baseline pair scored on its validation and test windows
    (added to ``tally``); the fold's record. The weights and the pair are chosen on the
    fold's validation windows, the baseline on its record before its test start."""
    from tftjax.data import to_device
    from tftjax.training import Trainer, restore_checkpoint
    from tftjax.training.anchoring import resolve_anchor
    from tftjax.training.evaluation import window_ends, window_origins

    _, ds, _ = resolve_anchor(ck.cfg, ds)  # the fold's anchor (auto: its own validation)
    trainer = Trainer(ck.cfg, tc, to_device(ds.features))
    variables = restore_checkpoint(ck).variables()
    qs = ck.cfg.head.quantiles
    val, test = (
        split_forecasts(trainer, variables, ds, getattr(ds.splits, s), qs) for s in ("val", "test")
    )
    f = verdict.Fold(
        {n: scoring.window_sums(val[1], p, qs) for n, p in val[0].items()},
        {},
        None,
        {},
        val_ends=window_ends(ds, ds.splits.val),
        test_start=int(fold[1]),
    )
    names = [n for n in val[0] if n != "tft"]
    chosen = verdict.choose_on_record([*tally.scored, f], len(tally.scored), names)
    weight = verdict.combine(val[1], val[0]["tft"], val[0][chosen], qs)
    pair = verdict.best_pair(val[1], val[0], qs, plan.pairs(names) or [(chosen, chosen)])
    for split, (preds, y) in (("val", val), ("test", test)):
        a, b, w = pair
        preds[verdict.COMBO] = weight * preds["tft"] + (1 - weight) * preds[chosen]
        preds[verdict.PAIR] = w * preds[a] + (1 - w) * preds[b]
        for name, p in preds.items():
            getattr(f, split)[name] = scoring.window_sums(y, p, qs)
    f.y, f.pred = test[1], test[0]
    f.dates, f.test_ends = window_origins(ds, ds.splits.test), window_ends(ds, ds.splits.test)
    if ck.cfg.model.ensemble > 1:  # each seed alone: the spread beside their average
        tally.members.append(member_sums(ck.cfg, trainer, variables, ds.splits.test, f.y, qs))
    for name, p in f.pred.items():
        tally.steps.setdefault(name, []).append(scoring.step_q_risk(f.y, p, qs))
    tally.scored.append(f)
    sid = {split: ds.series_of(getattr(ds.splits, split)) for split in ("val", "test")}
    if panel or len(ds.series) > 1 or ds.absent:  # a panel: per series too
        for name, part in verdict.by_series(f, sid["val"], sid["test"]):
            tally.by_series.setdefault(ds.names[name], []).append(part)
    record = fold_record(ck, ds, fold, f, sid["test"], weight, chosen)
    return {**record, "pair": list(pair)}


def member_sums(cfg: TFTConfig, trainer, variables, starts, y, qs) -> np.ndarray:
    """``[E, n, 6]``: each ensemble member's per-window sums on its own (rearranged)
    forecasts of the windows at ``starts``; their average is the ensemble's forecast."""
    import jax

    from tftjax.training import Trainer

    one = Trainer(cfg.override(ensemble=1), trainer.tc, trainer.data)
    out = []
    for i in range(cfg.model.ensemble):
        pred, _ = one.predict(jax.tree.map(lambda x, i=i: x[i], variables), starts)
        out.append(scoring.window_sums(y, pred, qs))
    return np.stack(out)


def split_forecasts(trainer, variables, ds: Dataset, starts: np.ndarray, qs):
    """``({"tft": ..., baseline: ...}, targets)`` for the windows at ``starts``."""
    from tftjax.training.evaluation import baselines_forecasts, window_targets

    preds = {"tft": trainer.predict(variables, starts)[0], **baselines_forecasts(ds, qs, starts)}
    return preds, window_targets(ds, starts)


def fold_record(
    ck, ds: Dataset, fold, f, test_series: np.ndarray, weight: float, chosen: str
) -> dict:
    """What ``backtest.json`` keeps of a fold."""
    return {
        "weights_epoch": ck.meta.get("weights_epoch"),
        "anchor": ck.cfg.head.anchor,
        "train_rows": [list(s.splits.train_rows) for s in ds.series],
        "test_from": str(np.datetime64(fold[1], "ns")),
        "windows": {s: int(getattr(ds.splits, s).size) for s in ("train", "val", "test")},
        "series": [ds.names[i] for i in np.unique(test_series)],  # scored on its test
        "sat_out": list(ds.absent),  # too little history before this fold
        "test": {
            name: {m: float(v) for m, v in scoring.from_sums(r).items()}
            for name, r in f.test.items()
        },
        "val_q_risk_90": {
            name: float(scoring.from_sums(r)["q_risk_90"]) for name, r in f.val.items()
        },
        "chosen": chosen,  # on the fold's out-of-sample record (verdict.record)
        "combination_weight": weight,  # of the TFT, with the chosen baseline
    }


def fold_line(entry: dict, k: int, folds: int, ds: Dataset) -> str:
    who = (
        f" of {len(entry['series'])} series" + (f" ({len(ds.absent)} sat out)" if ds.absent else "")
        if len(ds.series) > 1 or ds.absent
        else ""
    )
    return (
        f"fold {k}/{folds}: test from {entry['test_from'][:16]}, "
        f"{entry['windows']['test']} windows{who}, epoch {entry['weights_epoch']}: TFT P90 "
        f"{entry['test']['tft']['q_risk_90']:.4f}, {entry['chosen']} (chosen on its "
        f"validation) {entry['test'][entry['chosen']]['q_risk_90']:.4f}"
    )


STRESS = ("2020-02-01", "2020-05-01")
"""February to April 2020 (origins in ``[start, end)``, compared with the windows' origin
instants: UTC for bars with a zone, the naive clock otherwise): the pooled verdict is also
given without it, where the test region reaches it."""


def summarize(tally: Tally, cfg: TFTConfig, reps: int) -> dict:
    """The pooled table, the combination's row, each series' rows, the pooled verdict
    without :data:`STRESS` and the P90 per step."""
    qs, d = cfg.head.quantiles, cfg.data.decoder_steps
    out = verdict.summarize(tally.scored, qs, d, reps)
    calm = verdict.without(tally.scored, *STRESS)
    kept = [0 if f.dates is None else f.dates.size for f in calm]
    dropped = sum(out["fold_windows"]) - sum(kept)
    if dropped and all(kept):  # every fold keeps test windows
        out["without_stress"] = {
            "from": STRESS[0],
            "until": STRESS[1],
            "zone": "UTC for bars with a zone; the bars' own clock for naive ones",
            "windows_dropped": int(dropped),
            **verdict.brief(verdict.summarize(calm, qs, d, reps, picks=out["chosen_per_fold"])),
        }
    out["folds"] = tally.folds
    out["combination"] = {
        **verdict.brief(
            verdict.summarize(tally.scored, qs, d, reps, model=verdict.COMBO), verdict.COMBO
        ),
        "weights": [f["combination_weight"] for f in tally.folds],
    }
    if tally.by_series:  # each series over the folds it was scored in, its own choice
        out["by_series"] = verdict.holm_rows(
            {
                n: verdict.brief(verdict.summarize(fs, qs, d, reps))
                for n, fs in sorted(tally.by_series.items())
            }
        )
    if tally.members:  # the seeds alone, pooled over the folds
        p90 = [scoring.from_sums(m)["q_risk_90"] for m in np.concatenate(tally.members, axis=1)]
        out["pooled"][verdict.MODEL]["members"] = {
            "q_risk_90": [float(x) for x in p90],
            "min": float(min(p90)),
            "max": float(max(p90)),
            "sd": float(np.std(p90, ddof=1)),
        }
    for name, parts in tally.steps.items():  # P90 q-risk per forecast step, over the folds
        tot = np.concatenate(parts).sum(axis=0)  # [D, 2]
        row = out["pooled"].get(name) or out["combination"]
        row["q_risk_90_by_step"] = (2 * tot[:, 0] / tot[:, 1]).tolist()
    return out


def out_verdict(vs: dict) -> str:
    """A comparison's P90 difference, DM and verdict word in one clause."""
    ci, dm = vs["p90_diff_ci95"], vs["dm_p90"]
    word = verdict.verdict(dm, ci)
    return (
        f"diff {vs['p90_diff']:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}], DM P90 {dm['stat']:+.2f} "
        f"(p {dm['p']:.3g}): {word}"
    )


def brief_sentence(r: dict, model: str) -> str:
    """A :func:`tftjax.stats.verdict.brief` row in one line: P90s, difference, DM, verdict."""
    return (
        f"P90 {r[model]['q_risk_90']:.4f} against {r[verdict.CHOSEN]['q_risk_90']:.4f}, "
        + out_verdict(r["vs"])
    )


def format_table(out: dict) -> str:
    """The walk-forward's table as printed."""
    from tftjax.stats.baselines import NAMES

    table = verdict.format_table(out, NAMES)
    c = out.get("combination")
    if c:
        table += (
            f"\n\ncombination w·TFT + (1-w)·the chosen baseline, w per fold on its "
            f"validation ({', '.join(f'{w:g}' for w in c['weights'])}): "
            + brief_sentence(c, verdict.COMBO)
        )
    members = out["pooled"][verdict.MODEL].get("members")
    if members:
        table += (
            f"\n\nthe TFT's {len(members['q_risk_90'])} seeds alone: P90 {members['min']:.4f} "
            f"to {members['max']:.4f} (sd {members['sd']:.4f}); their averaged forecast (the "
            f"row): {out['pooled'][verdict.MODEL]['test']['q_risk_90']:.4f}"
        )
    pair = out["pooled"].get(verdict.PAIR)
    if pair and c:
        picks = ", ".join(f"{f['pair'][0]}+{f['pair'][1]} {f['pair'][2]:g}" for f in out["folds"])
        table += (
            f"\n\nthe control, the best baseline pair per fold on its validation ({picks}): "
            f"P90 {pair['test']['q_risk_90']:.4f}; the TFT against it: "
            f"{out_verdict(pair['vs'])}; the combination against it: "
            f"{out_verdict(c['vs_pair'])}"
        )
    w = out.get("without_stress")
    if w:
        table += (
            f"\n\nwithout origins from {w['from']} until {w['until']} "
            f"({w['windows_dropped']:,} windows): TFT " + brief_sentence(w, verdict.MODEL)
        )
    return table + ("\n\n" + verdict.format_series(out["by_series"]) if "by_series" in out else "")
