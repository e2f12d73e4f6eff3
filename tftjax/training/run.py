"""``train_and_evaluate``: the whole TFT job, the task handed to the shared run loop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tftjax.config import NUM_HISTORICAL, NUM_KNOWN, NUM_STATIC, ConfigError, TFTConfig, TrainConfig
from tftjax.data import Dataset, find_data_files, load_dataset, saved_featurisation
from tftjax.runner import loop as runloop
from tftjax.runner.preemption import Saving
from tftjax.training.anchoring import resolve_anchor
from tftjax.training.finetune import lineage, on_new_bars
from tftjax.training.restore import initial_weights
from tftjax.training.task import TFTTask


def model_inputs(cfg: TFTConfig, ds: Dataset) -> TFTConfig:
    """``cfg`` with the input widths and category tables of ``ds``: the built-in inputs (the
    210 engineered ones, or with ``--inputs own`` the target itself) and your own columns
    (tftjax.data.covariates)."""
    if not ds.schema.columns and cfg.data.inputs == "builtin":
        return cfg
    w = ds.schema.widths
    builtin = NUM_HISTORICAL if cfg.data.inputs == "builtin" else 1  # own: the target itself
    return cfg.override(
        num_static=NUM_STATIC + w["static"],
        num_historical=builtin + w["historical"],
        num_known=NUM_KNOWN + w["known"],
        categories=ds.schema.categories(cfg.data.categorical),
    )


def train_and_evaluate(  # noqa: PLR0913 - the run's options, each a flag of train
    cfg: TFTConfig,
    tc: TrainConfig,
    workdir: str | Path,
    data: str | Path | list | Dataset | None = None,
    *,
    resume: bool | str = False,
    progress: bool = True,
    profile_dir: str | None = None,
    callback: Callable | None = None,
    log: Callable = print,
    par=None,
    plots: bool = True,
    tensorboard: bool = True,
    saving: Saving | None = None,
) -> tuple[Any, dict]:
    """Train, validate every epoch, checkpoint, and evaluate the best epoch on the test split.

    Args:
      cfg: model config; tc: training config.
      workdir: run folder (checkpoints/, metrics.jsonl, summary.json, plots).
      data: OHLCV bars (one parquet file, or a list: several series, or a long file of them;
        default: the bundled ES bars; on resume, the files the run was trained on, found
        again by their content hashes), or a prepared :class:`~tftjax.data.Dataset` (a
        walk-forward fold's, a search's).
      resume: continue the checkpoint furthest along in ``workdir`` (data, model and
        training config must match it; only ``tc.epochs`` may grow); ``"auto"``: that where
        one exists, else a fresh run (:func:`tftjax.runner.loop.run`).
      progress: a per-epoch progress bar; profile_dir: a ``jax.profiler``
        trace of steps 2-6 of epoch 1.
      callback: ``(epoch, state, metrics, is_final)`` after each epoch.
      plots: draw the loss curves, quantile fans and variable importance (off for the
        walk-forward's and the tuner's many runs).
      tensorboard: write ``workdir/tensorboard`` (:mod:`tftjax.runner.tensorboard`).
      saving: checkpoints within an epoch (:class:`tftjax.runner.preemption.Saving`); a
        signal saves and raises :class:`~tftjax.runner.preemption.Preempted` whatever it is.
      par: the device mesh (:func:`tftjax.runner.mesh.make_parallel`; default: every local
        device, features replicated).

    Returns:
      ``(state, summary)``: the best epoch's train state (the weights of the final
      checkpoint) and the summary dict (also written to ``workdir/summary.json``).

    Raises:
      DataError: bad input data.
      ConfigError: bad settings, or a resume that does not match.
      TrainingDiverged: a NaN/inf loss (the last good checkpoint is kept).
    """
    workdir = Path(workdir)
    cfg = concrete_remat(cfg)

    def make_task(saved: dict | None) -> TFTTask:
        ds = data if isinstance(data, Dataset) else None
        if ds is None:
            kw, path = {}, data
            if saved is not None:  # other data is refused by the identity check, by name
                kw = {**saved_featurisation(saved), "unknown": "embed"}
                if path is None:
                    path = find_data_files(saved["identity"]["data"], workdir)
            ds = load_dataset(path, cfg.data, **kw)
        model, parent = cfg, None
        if saved is None and tc.init_from and not isinstance(data, Dataset):
            model, ds, parent = on_new_bars(tc.init_from, cfg, ds, path, tc.refit_stats, log)
        # the model's instrument vocabulary is the data's (its unknown row included), and
        # its inputs the built-in ones and your own
        model = model if ds.vocab is None else model.override(instruments=len(ds.vocab))
        model = model_inputs(model, ds)
        model, ds, scores = resolve_anchor(model, ds)  # --anchor auto: chosen on validation
        if scores:
            log(
                f"--anchor auto: {model.head.anchor} (validation P90 q-risk "
                + ", ".join(f"{n} {v:.4f}" for n, v in scores.items())
                + ")"
            )
        init = None
        if saved is None and tc.init_from:  # on resume the run's own checkpoint has them
            init = initial_weights(tc.init_from, model, ds, new_bars=parent is not None)
        return TFTTask(
            model,
            tc,
            ds,
            workdir,
            progress=progress,
            profile_dir=profile_dir,
            init=init,
            log=log,
            par=par,
            plots=plots,
            # a resumed run keeps the lineage it recorded; a new one descends from its parent
            lineage=saved.get("lineage")
            if saved is not None
            else lineage(parent, ds, tc.init_from)
            if parent is not None
            else None,
        )

    return runloop.run(
        make_task,
        workdir,
        kind="tft",
        resume=resume,
        progress=progress,
        callback=callback,
        log=log,
        tensorboard=tensorboard,
        saving=saving,
    )


def concrete_remat(cfg: TFTConfig) -> TFTConfig:
    """``cfg`` with ``--remat fastest`` resolved to this platform's fastest tier, so that the
    run records the tier it ran.

    Raises:
      ConfigError: ``--remat auto``, which the memory planner resolves first
        (:func:`tftjax.memory.resolve_auto`: it compiles the steps).
    """
    from tftjax.config import AUTO, FASTEST
    from tftjax.models.remat import default_tier

    if cfg.execution.remat == AUTO:
        raise ConfigError(
            "--remat auto is resolved before training, by tftjax.memory."
            "resolve_auto (python -m tftjax.train does so)"
        )
    if cfg.execution.remat == FASTEST:
        return cfg.override(remat=default_tier(cfg.execution.platform))
    return cfg
