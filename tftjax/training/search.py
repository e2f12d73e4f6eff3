"""The hyperparameter search of ``python -m tftjax.tune`` and ``backtest --tune-trials``
(Optuna's TPE sampler and median pruning on the validation windows; the test windows are
never read). See :mod:`tftjax.tune`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tftjax.config import ConfigError, TFTConfig, TrainConfig, apply_settings

SPACE = {
    "train.learning_rate": ("log", 1e-4, 1e-2),
    "train.weight_decay": ("log", 1e-6, 1e-2),
    "model.dropout": ("float", 0.0, 0.4),
    "model.hidden": ("choice", (16, 32, 64)),
}
"""The searched settings: ``section.field`` → (kind, range)."""


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


def tune(
    cfg: TFTConfig,
    tc: TrainConfig,
    paths,
    workdir: Path,
    trials: int,
    seed: int = 0,
    progress: bool = False,
    log=print,
    dataset=None,
    journal: Path | None = None,
    tensorboard: bool = True,
) -> dict:
    """Run the search; the trials and the best settings (see the module docstring).
    ``dataset``: search on these windows (its test windows dropped) instead of reading
    ``paths`` (a walk-forward fold's own training and validation stretches).
    ``journal``: keep the study in this Optuna journal file, so that a search stopped part
    way goes on where it stopped when called again with the same file: ``trials`` is the
    total, completed and pruned trials count, a trial cut off mid-run is marked failed (and
    is run again), and the sampler is seeded with ``seed`` + the trials already in the study (so that it does not
    draw the first settings again)."""
    try:
        import optuna
    except ImportError:
        raise ConfigError(
            "python -m tftjax.tune needs optuna: pip install 'tftjax[tune]'"
        ) from None
    from tftjax.data import load_dataset
    from tftjax.training import train_and_evaluate

    if trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {trials}")
    import numpy as np

    # read once: every trial trains on the same windows
    ds = load_dataset(paths, cfg.data) if dataset is None else dataset
    # the test windows are not even evaluated: no trial's summary can show them
    ds = dataclasses.replace(
        ds,
        series=tuple(
            dataclasses.replace(s, splits=dataclasses.replace(s.splits, test=np.zeros(0, np.int32)))
            for s in ds.series
        ),
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage, before = None, 0
    if journal is not None:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        storage = JournalStorage(JournalFileBackend(str(journal)))
        before = stopped_trials(storage)
    study = optuna.create_study(
        direction="minimize",
        storage=storage,
        study_name="tftjax",
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=seed + before),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=1),
    )
    counted = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    finished = sum(t.state in counted for t in study.trials)  # a failed trial is run again
    if finished and finished >= trials:
        log(f"the study already has {finished} finished trials of {trials}")

    def objective(trial):
        (model, train), drawn = suggest(trial, cfg, tc)

        def report(epoch, state, metrics, is_final):
            if metrics.get("val_loss") is None:
                return
            trial.report(metrics["val_loss"], epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()

        run = workdir / f"trial_{trial.number:03d}"
        trial.set_user_attr("run", str(run))
        try:
            _, s = train_and_evaluate(
                model,
                train,
                run,
                data=ds,
                progress=progress,
                callback=report,
                log=lambda *a: None,
                plots=False,
                tensorboard=tensorboard,
            )
        finally:
            release_compiled()  # each trial's programs: compiled again if ever needed
        best = min(h["val_loss"] for h in s["history"] if h.get("val_loss") is not None)
        trial.set_user_attr("best_val_loss", best)
        trial.set_user_attr("weights_epoch", s["weights_epoch"])
        trial.set_user_attr("val_q_risk_90", s["model"]["val"]["q_risk_90"])
        log(
            f"trial {trial.number}: val loss {best:.4f} (epoch {s['weights_epoch']}) "
            + ", ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                for sec in drawn.values()
                for k, v in sec.items()
            )
        )
        return best

    study.optimize(objective, n_trials=max(trials - finished, 0), catch=())
    rows = [
        {
            "trial": t.number,
            **{k.split(".")[1]: v for k, v in t.params.items()},
            **t.user_attrs,
            "state": t.state.name.lower(),
        }
        for t in study.trials
    ]
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not done:
        raise ConfigError("every trial was pruned or failed: more --trials or epochs")
    best = study.best_trial
    settings = {"model": {}, "train": {}}
    for key, v in best.params.items():
        sec, name = key.split(".")
        settings[sec][name] = v
    return {
        "trials": rows,
        "best": {"trial": best.number, "val_loss": best.value, **settings},
        "settings": settings,
        "searched": list(SPACE),
        "covariates": ds.schema.to_json(),
    }


def stopped_trials(storage) -> int:
    """Mark the trials of a stored study that a stopped process left running as failed
    (nothing else runs them); the number of trials it holds (0 if none yet)."""
    import optuna

    try:
        sid = storage.get_study_id_from_name("tftjax")
    except KeyError:
        return 0
    held = storage.get_all_trials(sid, deepcopy=False)
    for t in held:
        if t.state == optuna.trial.TrialState.RUNNING:
            storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
    return len(held)


def format_trials(out: dict) -> str:
    keys = [k.split(".")[1] for k in out["searched"]]
    lines = [
        "| trial | " + " | ".join(keys) + " | state | best val loss | epoch |",
        "|---" * (len(keys) + 4) + "|",
    ]
    for r in out["trials"]:
        vals = [f"{r[k]:.3g}" if isinstance(r.get(k), float) else str(r.get(k)) for k in keys]
        loss = f"{r['best_val_loss']:.4f}" if "best_val_loss" in r else "–"
        lines.append(
            f"| {r['trial']} | " + " | ".join(vals) + f" | {r.get('state', '?')} | "
            f"{loss} | {r.get('weights_epoch', '–')} |"
        )
    b = out["best"]
    lines.append(
        f"best: trial {b['trial']}, validation loss {b['val_loss']:.4f}: "
        + json.dumps(out["settings"])
    )
    return "\n".join(lines)


def release_compiled() -> None:
    """Forget every compiled program this process keeps for reuse: the step, init and
    optimizer caches here and in :mod:`tftjax.training.state` and ``optimizer``, :mod:`tftjax.models.tft` and
    :mod:`tftjax.quant.ptq`, and JAX's own. A search that trains many configurations in
    one process (``tftjax.tune``, ``backtest --tune-trials``) calls it between trials;
    otherwise each trial's executables stay alive, and after a few dozen the process runs out
    of memory mappings (LLVM: "Cannot allocate memory")."""
    import jax

    from tftjax.models import tft
    from tftjax.quant import ptq
    from tftjax.training import optimizer, state
    from tftjax.training.steps import make_eval_step, make_train_step

    for fn in (
        make_train_step,
        make_eval_step,
        optimizer._optimizer,
        state._init_fn,
        ptq._record_step,
        tft.apply_fn,
        tft._init_fn,
    ):
        fn.cache_clear()
    jax.clear_caches()


def data_digest(paths) -> list[str]:
    """The bars a search reads, by content (sha256; a missing file by its name: reading it
    fails with one line later): a resume that would read other bars is refused, under any
    path spelling."""
    from tftjax.data import default_parquet
    from tftjax.data.identity import file_sha256

    files = (
        [default_parquet()]
        if paths is None
        else list(paths)
        if isinstance(paths, (list, tuple))
        else [paths]
    )
    return [file_sha256(p) if Path(p).is_file() else str(p) for p in files]


def start_search(workdir: Path, search: dict, resume: bool) -> Path:
    """The journal of the search ``search`` (its model and train settings, the bars' digest
    and the sampler's seed) in ``workdir``: a new search writes ``search.json`` into an empty
    folder; ``resume`` goes on with the one started there, refused where any setting differs.

    Raises:
      ConfigError: naming the settings that differ, or a folder that holds something else.
    """
    from tftjax.runner.resume import identity_diff

    search = json.loads(json.dumps(search, default=str))
    journal, started = workdir / "study.journal", workdir / "search.json"
    if resume:
        if not journal.is_file() or not started.is_file():
            raise ConfigError(
                f"--resume: {workdir} holds no search to go on with "
                f"(no study.journal and search.json)"
            )
        was = json.loads(started.read_text())
        was["model"] = TFTConfig.from_json(was["model"]).to_json()  # any schema
        changed = [
            path.split(":")[0].rsplit(".", 1)[-1]  # a field's name, as its flag
            for path in identity_diff(was, search)
        ]
        if changed:
            raise ConfigError(
                f"--resume: {', '.join(changed)} differ from the search started in "
                f"{workdir}; give the same settings, or a new --workdir"
            )
    elif workdir.exists() and any(p != started for p in workdir.iterdir()):
        raise ConfigError(
            f"--workdir {workdir} is not empty; choose a new folder, or "
            f"--resume to go on with its search"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    if not resume:
        started.write_text(json.dumps(search, indent=1))
    return journal
