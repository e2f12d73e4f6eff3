"""The one host loop every trainer uses (TFT and DQN), given a :class:`Task` (its state, one
epoch of training, validation, the summary of the weights it is given):

* **Run folder**: ``checkpoints`` (Orbax), ``metrics.jsonl``, ``summary.json``; a folder
  with another run's checkpoints is never written to unless ``resume`` is asked for.
* **Resume**: the latest complete epoch checkpoint's metadata is read *first*; its data
  identity (content hash, rows) and configs must equal this run's, field by field (except
  the task's ``may_change``, e.g. ``epochs``), else :class:`~tftjax.config.ConfigError`
  before anything in the folder changes.
* **Early stopping** on the validation ``score`` (or ``task.rank(history)``, e.g. smoothed)
  with ``patience``, never while ``task.may_stop(epoch, metrics)`` says no (a resume with
  another patience trains on). The final checkpoint ``{kind}_final_epoch{N}`` (N: the last
  epoch run), the summary, the plots and the test metrics come from the *best* epoch's state
  (``weights_epoch``); an empty validation split turns early stopping off.
* **Epoch 0**: a task with ``score_at_start`` (an anchored TFT: its untrained model is the
  anchor) is validated and saved before training, so early stopping can keep it.
* **NaN stop**: :class:`TrainingDiverged` within the epoch, nothing of it saved; the manager
  is closed in a ``finally`` (an interrupted async save commits or is ignored).
* **Several processes**: all run the loop and the checkpoints; process 0 writes the files;
  the final checkpoint is written on resume when the last run ended before writing it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Protocol

from tftjax.runner.checkpoints import (EpochCheckpointer, checkpoint_name, epoch_checkpoints,
                                supersede_finals,
                                list_checkpoints, read_history)
from tftjax.errors import ConfigError, TrainingDiverged
from tftjax.runner.devices import memory_stats
from tftjax.runner.provenance import provenance
from tftjax.runner.tensorboard import LOGDIR, Board
from tftjax.runner.resume import (KINDS, check_resume, identity_diff, latest_meta,  # noqa: F401
                           resume_changes)


class Task(Protocol):
    """What a trainer gives the loop."""

    kind: str  # checkpoint prefix and meta "kind": "tft" or "dqn"
    score: str  # key of validate()'s dict that ranks epochs, e.g. "val_loss"
    mode: str  # "min" or "max": which end of the score is better
    epochs: int
    patience: int
    may_change: tuple[str, ...]  # identity paths a resume may change, e.g. "train.epochs"
    epoch_bar: bool  # True: the loop shows a bar over epochs (the task has no bar of its own)

    def identity(self) -> dict: ...  # data, model and training config: compared on resume
    def extra_meta(self) -> dict: ...  # saved beside (e.g. feature statistics), not compared
    def init_state(self) -> Any: ...
    def abstract_state(self) -> Any: ...  # shapes to restore into
    def describe(self, state) -> str: ...  # one line: parameters, data, sizes
    def train_epoch(self, state, epoch: int) -> tuple[Any, dict]: ...  # may raise TrainingDiverged
    def validate(self, state) -> dict: ...  # {score: None} when there is nothing to validate on
    def epoch_line(self, metrics: dict) -> str: ...
    def summarize(self, state, workdir: Path, history: list[dict]) -> tuple[dict, str]: ...


def _is_better(score: float, best: float | None, mode: str) -> bool:
    return best is None or (score < best if mode == "min" else score > best)


def run(make_task: Callable[[dict | None], Task], workdir: str | Path, *, kind: str,
        resume: bool = False, progress: bool = True, callback: Callable | None = None,
        log: Callable = print, tensorboard: bool = True) -> dict:
    """Train a task epoch by epoch, with checkpoints, early stopping and a summary.

    Args:
      make_task: ``saved_meta -> Task``; ``saved_meta`` is the latest checkpoint's
        metadata on resume (the task reuses e.g. its feature statistics), else ``None``.
      workdir: the run folder.
      kind: the task's kind (``"tft"``, ``"dqn"``): a resume of another kind is refused.
      resume: continue the latest complete epoch checkpoint in ``workdir``.
      progress: show a progress bar.
      callback: ``(epoch, state, metrics, is_final)`` after each epoch's
        checkpoint (``state``: that epoch's; the final *checkpoint* holds the best).
      log: where lines go.
      tensorboard: write ``workdir/tensorboard`` (:mod:`tftjax.runner.tensorboard`): each epoch's
        numbers, the device's memory, the config, and at the end the plots.

    Returns:
      The summary (also ``workdir/summary.json``).

    Raises:
      ConfigError: another run in ``workdir``, or a resume that does not match.
      TrainingDiverged: a NaN/inf loss (the last good checkpoint is kept).
    """
    workdir = Path(workdir)
    ckpt_dir = workdir / "checkpoints"
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f"--workdir {workdir} is a file, not a folder")
    saved = None
    if resume:
        saved = latest_meta(ckpt_dir, kind)
    elif list_checkpoints(ckpt_dir):
        raise ConfigError(f"{ckpt_dir} already holds checkpoints "
                          f"({', '.join(list_checkpoints(ckpt_dir)[-3:])}); pass --resume to "
                          "continue that run or choose another --workdir")
    task = make_task(saved)
    if saved is not None:
        check_resume(saved, task, ckpt_dir)

    # Nothing in the folder changes before this line.
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"run folder: {workdir}")
    loop = {"epoch": 0, "best_epoch": 0, "best_score": None, "bad_epochs": 0,
            "stopped_early": False}
    if saved is not None:
        loop = dict(saved["loop"])
        for line in resume_changes(saved, task):
            log(f"--resume: {line}")
        if loop["stopped_early"] and task.epochs > loop["epoch"]:
            if loop.get("patience", task.patience) != task.patience:  # an explicit new patience
                log(f"--resume: the run stopped early at epoch {loop['epoch']}; training on to "
                    f"epoch {task.epochs} with patience {task.patience}")
                loop.update(stopped_early=False, bad_epochs=0)
            else:
                log(f"--resume: the run stopped early at epoch {loop['epoch']} (patience "
                    f"{task.patience}); to train on, pass --epochs N with another --patience "
                    "(0: no early stop)")
    loop["patience"] = task.patience
    start = loop["epoch"]
    metrics_path = workdir / "metrics.jsonl"
    history = read_history(metrics_path, upto=start) if saved is not None else []
    primary = _is_primary()  # the one process of a multi-host run that writes files
    if primary:
        metrics_path.write_text("".join(json.dumps(h) + "\n" for h in history))
    identity = task.identity()

    def meta(metrics: dict, is_final: bool, weights_epoch: int) -> dict:
        return {"kind": task.kind, "identity": identity, **task.extra_meta(), "loop": dict(loop),
                "metrics": metrics, "is_final": is_final, "weights_epoch": weights_epoch}

    checkpointer, bar = EpochCheckpointer(ckpt_dir, task.kind), None
    board = Board(workdir / LOGDIR if primary and tensorboard else None)
    board.config(identity)
    try:
        if saved is not None:
            state = (task.restore(checkpointer, start) if hasattr(task, "restore")
                     else checkpointer.restore(start, task.abstract_state()))
            log(f"resuming from {ckpt_dir / checkpoint_name(task.kind, start, False)}")
        else:
            state = task.init_state()
            if getattr(task, "score_at_start", False):  # epoch 0: the untrained model's score
                m0 = {"epoch": 0, "train_loss": None, **task.validate(state)}
                loop["best_score"] = m0.get(task.score)
                history.append(m0)
                if primary:
                    metrics_path.write_text(json.dumps(m0) + "\n")
                checkpointer.save(0, state, m0, meta(m0, False, 0), improved=True)
                board.epoch(0, m0)
                log(f"epoch 0 (before training): {task.score} {m0.get(task.score)}")
        log(task.describe(state))
        bar = _epoch_bar(task, start) if progress and task.epoch_bar else None
        say = bar.write if bar is not None else log  # lines above the bar
        for epoch in range(start + 1, task.epochs + 1):
            if loop["stopped_early"]:
                break
            try:
                state, train_m = task.train_epoch(state, epoch)
            except TrainingDiverged as e:
                raise TrainingDiverged(f"{e}; stopped without saving epoch {epoch} (last good "
                                       f"checkpoint: {_last(ckpt_dir, task.kind)})") from None
            val = task.validate(state)
            score = val.get(task.score)
            if score is not None and not math.isfinite(score):
                raise TrainingDiverged(f"{task.score} became {score} in epoch {epoch}; stopped "
                                       f"(last good checkpoint: {_last(ckpt_dir, task.kind)})")
            metrics = {"epoch": epoch, **train_m, **val}
            if score is not None and hasattr(task, "rank"):  # e.g. smoothed over epochs
                score = task.rank(history + [metrics])
            improved = score is None or _is_better(score, loop["best_score"], task.mode)
            if improved:
                loop.update(best_epoch=epoch, best_score=score, bad_epochs=0)
            else:
                loop["bad_epochs"] += 1
            stop = (task.patience > 0 and score is not None and loop["bad_epochs"] >= task.patience
                    and (not hasattr(task, "may_stop") or task.may_stop(epoch, metrics)))
            loop.update(epoch=epoch, stopped_early=stop)
            history.append(metrics)
            if primary:
                with metrics_path.open("a") as f:
                    f.write(json.dumps(metrics) + "\n")
            board.epoch(epoch, metrics, memory_stats())
            say(f"epoch {epoch}/{task.epochs}: {task.epoch_line(metrics)}"
                + ("  *best" if improved and score is not None else ""))
            if score is None and epoch == start + 1:
                say("no validation windows: early stopping is off and the last epoch counts "
                    "as the best")
            checkpointer.save(epoch, state, metrics, meta(metrics, False, epoch), improved=improved)
            if callback is not None:
                callback(epoch, state, metrics, stop or epoch == task.epochs)
            if bar is not None:
                bar.update(1)
        last, best_epoch = loop["epoch"], loop["best_epoch"]
        if loop["stopped_early"]:
            log(f"early stop at epoch {last}: no better {task.score} for {task.patience} epochs; "
                f"restoring the best epoch, {best_epoch}")
        best_state = state if best_epoch == last else checkpointer.restore(
            best_epoch, task.abstract_state())
        final = ckpt_dir / checkpoint_name(task.kind, last, True)
        if start == last:
            log(f"{ckpt_dir} already holds epoch {last}"
                + (" (stopped early)" if loop["stopped_early"] else f" of {task.epochs}")
                + ": nothing to train" + ("" if final.exists() else
                                          "; writing its missing final checkpoint"))
        if not final.exists():
            checkpointer.save_final(last, best_state,
                                    meta(history[-1] if history else {}, True, best_epoch))
            for old in supersede_finals(ckpt_dir, task.kind, last):
                log(f"{old} is no longer final (superseded by {final.name})")
    except BaseException:
        board.close()
        raise
    finally:  # an interrupted run still completes (or cleanly abandons) the saves started
        if bar is not None:
            bar.close()
        checkpointer.close()

    try:
        summary, text = task.summarize(best_state, workdir, history)  # draws the plots
        board.images(workdir, last)
    finally:
        board.close()
    summary.update(epochs_run=last, stopped_early=loop["stopped_early"], best_epoch=best_epoch,
                   weights_epoch=best_epoch, best_score=loop["best_score"], score=task.score,
                   final_checkpoint=str(final), identity=identity, provenance=provenance(),
                   history=history)
    if primary:
        (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    log(f"weights of epoch {best_epoch} (best {task.score}) from {final}")
    log(text)
    return summary


def _is_primary() -> bool:
    import jax

    return jax.process_index() == 0


def _last(ckpt_dir: Path, kind: str) -> str:
    epochs = epoch_checkpoints(ckpt_dir, kind)
    return str(ckpt_dir / checkpoint_name(kind, epochs[-1], False)) if epochs else "none"


def _epoch_bar(task: Task, start: int):
    import sys

    from tqdm.auto import tqdm

    return tqdm(total=task.epochs, initial=start, desc=task.kind, unit="epoch", leave=False,
                file=sys.stderr, dynamic_ncols=True)
