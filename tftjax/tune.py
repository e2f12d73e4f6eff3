"""``python -m tftjax.tune``: hyperparameters searched on the validation windows (Optuna).

    python -m tftjax.tune --dataset btc --preset small --trials 20
    python -m tftjax.train --dataset btc --config runs/tune/run_001/best.json

Each trial trains a model with settings drawn by Optuna's TPE sampler (``--sampler-seed``) -- learning
rate, dropout, weight decay and hidden size -- on the training windows, reports its
validation loss after every epoch, and is pruned when that falls behind the median of the
earlier trials at the same epoch (``MedianPruner``). A trial's value is its best validation
loss (early stopping on validation, as in training). **The test windows are never read.**
The best trial's settings go to ``WORKDIR/best.json``, which ``tftjax.train --config`` and
``tftjax.backtest --config`` accept (flags given after it still win); every trial is in
``WORKDIR/trials.json`` and printed as a table. Needs the ``tune`` extra (``optuna``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal

from tftjax.cli import apply_settings, data_files, parse, peek, run_folder, with_config
from tftjax.cli import main as cli_main
from tftjax.config import ConfigError, TFTConfig, TrainConfig, preset

SPACE = {
    "train.learning_rate": ("log", 1e-4, 1e-2),
    "train.weight_decay": ("log", 1e-6, 1e-2),
    "model.dropout": ("float", 0.0, 0.4),
    "model.hidden": ("choice", (16, 32, 64)),
}
"""The searched settings: ``section.field`` → (kind, range)."""


@dataclasses.dataclass
class Args:
    """Search learning rate, dropout, weight decay and hidden size on validation windows."""

    model: TFTConfig
    train: TrainConfig
    parquet_file: tuple[Path, ...] = ()
    """OHLCV bars (one file, several, or a long file); default: the bundled ES bars."""
    dataset: str | None = None
    """Bundled sets instead of --parquet-file, comma-separated (es, spx, nasdaq, btc)."""
    preset: Literal["tft225", "small", "tiny"] = "small"
    """The model the search starts from (the searched fields are drawn, the rest kept)."""
    config: Path | None = None
    """A settings file (e.g. an earlier best.json) applied before the flags."""
    trials: int = 20
    """Trials to run (at least 1)."""
    sampler_seed: int = 0
    """The TPE sampler's seed (the drawn settings are reproducible from it; --seed is each
    trial's training seed)."""
    remat: str = "full"
    workdir: Path = Path("runs/tune/run_001")
    """Trials' runs (trial_000 …), trials.json and best.json (default: a new
    runs/tune/run_NNN)."""
    no_progress: bool = False


def defaults(argv: list[str] | None) -> Args:
    pre = peek(argv, preset=None, workdir=None)
    from tftjax.config import PRESETS

    name = pre.preset if pre.preset in PRESETS else "small"
    model, train = with_config(argv, preset(name), TrainConfig(epochs=8, patience=2))
    return Args(model=model, train=train, preset=name,
                workdir=run_folder(pre.workdir, "runs/tune", False))


def suggest(trial, model: TFTConfig, train: TrainConfig):
    """The trial's configs: the searched fields drawn, the rest as given."""
    drawn = {"model": {}, "train": {}}
    for key, (kind, *rng) in SPACE.items():
        sec, name = key.split(".")
        if kind == "log":
            v = trial.suggest_float(key, rng[0], rng[1], log=True)
        elif kind == "float":
            v = trial.suggest_float(key, rng[0], rng[1])
        else:
            v = trial.suggest_categorical(key, list(rng[0]))
        drawn[sec][name] = v
    return apply_settings(model, train, drawn, "tune"), drawn


def tune(cfg: TFTConfig, tc: TrainConfig, paths, workdir: Path, trials: int, seed: int = 0,
         progress: bool = False, log=print) -> dict:
    """Run the search; the trials and the best settings (see the module docstring)."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("python -m tftjax.tune needs optuna: pip install 'tftjax[tune]'") from None
    from tftjax.data import load_dataset
    from tftjax.training import train_and_evaluate

    if trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {trials}")
    import numpy as np

    ds = load_dataset(paths, cfg.data)  # read once: every trial trains on the same windows
    # the test windows are not even evaluated: no trial's summary can show them
    ds = dataclasses.replace(ds, series=tuple(
        dataclasses.replace(s, splits=dataclasses.replace(s.splits, test=np.zeros(0, np.int32)))
        for s in ds.series))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=seed),
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=3,
                                                                   n_warmup_steps=1))
    rows = []

    def objective(trial):
        (model, train), drawn = suggest(trial, cfg, tc)

        def report(epoch, state, metrics, is_final):
            if metrics.get("val_loss") is None:
                return
            trial.report(metrics["val_loss"], epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()

        run = workdir / f"trial_{trial.number:03d}"
        try:
            s = train_and_evaluate(model, train, run, dataset=ds, progress=progress,
                                   callback=report, log=lambda *a: None, plots=False)
        finally:
            rows.append({"trial": trial.number, **{k: v for sec in drawn.values()
                                                   for k, v in sec.items()},
                         "run": str(run)})
        best = min(h["val_loss"] for h in s["history"] if h.get("val_loss") is not None)
        rows[-1].update(best_val_loss=best, weights_epoch=s["weights_epoch"],
                        val_q_risk_90=s["model"]["val"]["q_risk_90"])
        log(f"trial {trial.number}: val loss {best:.4f} (epoch {s['weights_epoch']}) "
            + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                        for sec in drawn.values() for k, v in sec.items()))
        return best

    study.optimize(objective, n_trials=trials, catch=())
    for r, t in zip(rows, study.trials):
        r["state"] = t.state.name.lower()
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not done:
        raise ConfigError("every trial was pruned or failed: more --trials or epochs")
    best = study.best_trial
    settings = {"model": {}, "train": {}}
    for key, v in best.params.items():
        sec, name = key.split(".")
        settings[sec][name] = v
    return {"trials": rows, "best": {"trial": best.number, "val_loss": best.value, **settings},
            "settings": settings, "searched": list(SPACE)}


def format_trials(out: dict) -> str:
    keys = [k.split(".")[1] for k in out["searched"]]
    lines = ["| trial | " + " | ".join(keys) + " | state | best val loss | epoch |",
             "|---" * (len(keys) + 4) + "|"]
    for r in out["trials"]:
        vals = [f"{r[k]:.3g}" if isinstance(r.get(k), float) else str(r.get(k)) for k in keys]
        loss = f"{r['best_val_loss']:.4f}" if "best_val_loss" in r else "–"
        lines.append(f"| {r['trial']} | " + " | ".join(vals) + f" | {r.get('state', '?')} | "
                     f"{loss} | {r.get('weights_epoch', '–')} |")
    b = out["best"]
    lines.append(f"best: trial {b['trial']}, validation loss {b['val_loss']:.4f}: "
                 + json.dumps(out["settings"]))
    return "\n".join(lines)


def run(argv: list[str] | None = None) -> int:
    args = parse(Args, argv, defaults(argv), "python -m tftjax.tune", __doc__.split("\n\n")[0])
    if args.trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {args.trials}")
    from tftjax.remat import TIERS

    if args.remat not in TIERS:
        raise ConfigError(f"--remat {args.remat!r} is not a tier; choose one of: {', '.join(TIERS)}")
    if args.workdir.exists() and any(args.workdir.iterdir()):
        raise ConfigError(f"--workdir {args.workdir} is not empty; choose a new folder")
    cfg = dataclasses.replace(args.model, remat=args.remat)
    out = tune(cfg, args.train, data_files(args.parquet_file, args.dataset), args.workdir,
               args.trials, args.sampler_seed, progress=not args.no_progress)
    args.workdir.mkdir(parents=True, exist_ok=True)
    (args.workdir / "trials.json").write_text(json.dumps(out, indent=1))
    best = {**out["settings"], "tuned": {"trials": args.trials, "sampler_seed": args.sampler_seed,
                                         "objective": "best validation loss"}}
    (args.workdir / "best.json").write_text(json.dumps(best, indent=1))
    print(format_trials(out))
    print(f"wrote {args.workdir / 'best.json'} (python -m tftjax.train --config "
          f"{args.workdir / 'best.json'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit

    cli_exit(main())
