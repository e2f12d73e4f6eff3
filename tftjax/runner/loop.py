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
* **Preemption** (:mod:`tftjax.runner.preemption`): SIGTERM, SIGINT or SIGUSR1 ends the
  run at the next step boundary with a checkpoint of that step (a task whose epoch is one
  compiled call, the DQN's, at the end of the epoch in flight) and
  :class:`~tftjax.runner.preemption.Preempted`; ``saving`` adds checkpoints within an epoch.
  A resume from one continues the epoch's batch order at the next step, bit for bit.
  ``resume="auto"`` resumes where a checkpoint exists and starts afresh where the folder
  holds nothing but a run's own partial files (``run.json`` records the run's identity, so
  a changed setting is refused there too).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tftjax.errors import ConfigError, TrainingDiverged
from tftjax.runner.checkpoints import (
    EpochCheckpointer,
    checkpoint_name,
    epoch_checkpoints,
    list_checkpoints,
    read_history,
    supersede_finals,
)
from tftjax.runner.devices import memory_stats
from tftjax.runner.preemption import Preempted, SaveSchedule, Saving, SignalWatch
from tftjax.runner.provenance import provenance
from tftjax.runner.resume import (
    RUN_RECORD,
    check_fresh_folder,
    check_resume,
    identity_diff,
    latest_meta,
    resume_changes,
    wants_checkpoint,
)
from tftjax.runner.tensorboard import LOGDIR, Board


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
    # may raise TrainingDiverged; a task with ``steps_within`` takes ``within=`` (Within)
    def train_epoch(self, state, epoch: int) -> tuple[Any, dict]: ...
    def validate(self, state) -> dict: ...  # {score: None} when there is nothing to validate on
    def epoch_line(self, metrics: dict) -> str: ...
    def summarize(self, state, workdir: Path, history: list[dict]) -> tuple[dict, str]: ...


def _is_better(score: float, best: float | None, mode: str) -> bool:
    return best is None or (score < best if mode == "min" else score > best)


def run(
    make_task: Callable[[dict | None], Any],
    workdir: str | Path,
    *,
    kind: str,
    resume: bool | str = False,
    progress: bool = True,
    callback: Callable | None = None,
    log: Callable = print,
    tensorboard: bool = True,
    saving: Saving | None = None,
) -> tuple[Any, dict]:
    """Train a task epoch by epoch, with checkpoints, early stopping and a summary.

    Args:
      make_task: ``saved_meta -> Task``; ``saved_meta`` is the latest checkpoint's
        metadata on resume (the task reuses e.g. its feature statistics), else ``None``.
      workdir: the run folder.
      kind: the task's kind (``"tft"``, ``"dqn"``): a resume of another kind is refused.
      resume: continue the checkpoint furthest along in ``workdir`` (an epoch's, or one
        within the next epoch); ``"auto"``: that where one exists, else a fresh run.
      progress: show a progress bar.
      callback: ``(epoch, state, metrics, is_final)`` after each epoch's
        checkpoint (``state``: that epoch's; the final *checkpoint* holds the best).
      log: where lines go.
      tensorboard: write ``workdir/tensorboard`` (:mod:`tftjax.runner.tensorboard`): each
        epoch's numbers, the device's memory, the config, and at the end the plots.
      saving: checkpoints within an epoch (:class:`~tftjax.runner.preemption.Saving`).

    Returns:
      ``(the best epoch's state, the summary)`` (the summary is also
      ``workdir/summary.json``).

    Raises:
      ConfigError: another run in ``workdir``, or a resume that does not match.
      TrainingDiverged: a NaN/inf loss (the last good checkpoint is kept).
      Preempted: a signal, after the checkpoint it asked for (exit code 75 at the CLI).
    """
    workdir = Path(workdir)
    saving = saving or Saving()
    saving.check()
    saved = _saved_run(workdir, kind, resume)
    task = make_task(saved)
    if saved is not None:
        check_resume(saved, task, workdir / "checkpoints")
    elif resume == "auto":
        _check_run_record(workdir, task)
    # Nothing in the folder changes before this line.
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"run folder: {workdir}")
    with SignalWatch() as watch:
        book = _Book(task, workdir, saved, log, tensorboard, watch, saving)
        try:
            state = book.first_state(saved)
            log(task.describe(state))
            state = book.train(state, progress, callback)
            best_state, final = book.finish(state)
        except BaseException:
            book.board.close()
            raise
        finally:  # an interrupted run still completes (or cleanly abandons) the saves started
            with watch.saving():
                book.checkpointer.close()
        # a signal from here on lets the run end as it would have; then it is reported (a
        # walk-forward or a search must not start its next run)
        summary = book.summarize(best_state, final)
        if watch.received is not None and not watch.multi:
            raise Preempted(
                f"{watch.received}: the run ended and its summary is written ({workdir}); "
                "rerun the same command with --resume auto (backtest, tune: --resume) to go on"
            )
        return best_state, summary


def _saved_run(workdir: Path, kind: str, resume: bool | str) -> dict | None:
    """The latest checkpoint's metadata on ``resume``; None for a new run.

    Raises:
      ConfigError: ``workdir`` is a file, holds another run's checkpoints, or (resume) none.
    """
    ckpt_dir = workdir / "checkpoints"
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f"--workdir {workdir} is a file, not a folder")
    if wants_checkpoint(resume, ckpt_dir):
        return latest_meta(ckpt_dir, kind)
    if resume == "auto":
        check_fresh_folder(workdir)
        return None
    if list_checkpoints(ckpt_dir):
        raise ConfigError(
            f"{ckpt_dir} already holds checkpoints "
            f"({', '.join(list_checkpoints(ckpt_dir)[-3:])}); pass --resume to "
            "continue that run or choose another --workdir"
        )
    return None


def _check_run_record(workdir: Path, task: Task) -> None:
    """``--resume auto`` starting afresh where a run was killed before its first checkpoint:
    that run's settings (``run.json``) must be this one's, as a resume's must."""
    path = workdir / RUN_RECORD
    if not path.exists():
        return
    record = json.loads(path.read_text())
    identity = record.get("identity", {})
    normalize = getattr(task, "normalize_identity", None)
    if normalize is not None:
        identity = normalize(identity)
    diff = (
        [f"kind: {record.get('kind')!r}, now {task.kind!r}"]
        if record.get("kind") != task.kind
        else []
    )
    diff += identity_diff(identity, task.identity(), task.may_change)
    if diff:
        raise ConfigError(
            f"--resume auto: {workdir} holds a run started with other data or settings "
            f"(killed before its first checkpoint): {'; '.join(diff)}; give another --workdir"
        )


class _Book:
    """One run's books: the loop's counters (``loop``, saved in every checkpoint's metadata),
    the metrics history, the checkpointer, the TensorBoard log, and the signals watched."""

    def __init__(
        self,
        task: Task,
        workdir: Path,
        saved: dict | None,
        log: Callable,
        tensorboard: bool,
        watch: SignalWatch,
        saving: Saving,
    ):
        self.task, self.workdir, self.log = task, workdir, log
        self.watch, self.saving, self.schedule = watch, saving, SaveSchedule(saving)
        self.ckpt_dir = workdir / "checkpoints"
        self.loop = _start_loop(saved, task, log)
        self.start = self.loop["epoch"]
        # a resume within an epoch: where that epoch stands (its steps done, its sums)
        self.resume_within = saved.get("within") if saved is not None else None
        if self.resume_within is not None and self.resume_within["epoch"] > task.epochs:
            self.resume_within = None  # --epochs ends before it: its last epoch's weights
        self.metrics_path = workdir / "metrics.jsonl"
        self.history = read_history(self.metrics_path, upto=self.start) if saved is not None else []
        self.primary = _is_primary()  # the one process of a multi-host run that writes files
        self.identity = task.identity()
        if self.primary:
            self.metrics_path.write_text("".join(json.dumps(h) + "\n" for h in self.history))
            (workdir / "partial.json").unlink(missing_ok=True)
            if saved is None:  # what --resume auto compares before the first checkpoint
                record = {"kind": task.kind, "identity": self.identity}
                (workdir / RUN_RECORD).write_text(json.dumps(record, indent=1))
        self.checkpointer = EpochCheckpointer(self.ckpt_dir, task.kind)
        self.board = Board(workdir / LOGDIR if self.primary and tensorboard else None)
        self.board.config(self.identity)

    def meta(self, metrics: dict, is_final: bool, weights_epoch: int) -> dict:
        return {
            "kind": self.task.kind,
            "identity": self.identity,
            **self.task.extra_meta(),
            "loop": dict(self.loop),
            "metrics": metrics,
            "is_final": is_final,
            "weights_epoch": weights_epoch,
        }

    def record(self, metrics: dict, fresh: bool = False) -> None:
        """One check's metrics into the history, ``metrics.jsonl`` and TensorBoard."""
        self.history.append(metrics)
        if self.primary:
            with self.metrics_path.open("w" if fresh else "a") as f:
                f.write(json.dumps(metrics) + "\n")

    def first_state(self, saved: dict | None):
        """The resumed state, or a new one (an anchored task's epoch 0 validated and saved:
        its untrained model is the anchor, which early stopping may keep)."""
        task = self.task
        if saved is not None:
            restore = getattr(task, "restore", None)  # a task that restores its own way
            if self.resume_within is not None:
                within = self.resume_within
                state = self.checkpointer.restore_within(
                    within["global_step"], task.abstract_state()
                )
                self.log(
                    f"resuming from {saved['path']} (step {within['step']} of epoch "
                    f"{within['epoch']}; step {within['global_step']} of the run)"
                )
                return state
            state = (
                restore(self.checkpointer, self.start)
                if restore is not None
                else self.checkpointer.restore(self.start, task.abstract_state())
            )
            steps = f" (step {self.loop['steps']} of the run)" if "steps" in self.loop else ""
            self.log(
                "resuming from "
                f"{self.ckpt_dir / checkpoint_name(task.kind, self.start, False)}{steps}"
            )
            return state
        state = task.init_state()
        if getattr(task, "score_at_start", False):
            m0 = {"epoch": 0, "train_loss": None, **task.validate(state)}
            self.loop["best_score"] = m0.get(task.score)
            self.record(m0, fresh=True)
            self.checkpointer.save(0, state, m0, self.meta(m0, False, 0), improved=True)
            self.board.epoch(0, m0)
            self.log(f"epoch 0 (before training): {task.score} {m0.get(task.score)}")
        return state

    def train(self, state, progress: bool, callback: Callable | None):
        """Every epoch left, until the last or an early stop; the last epoch's state."""
        task = self.task
        bar = _epoch_bar(task, self.start) if progress and task.epoch_bar else None
        say = bar.write if bar is not None else self.log  # lines above the bar
        try:
            for epoch in range(self.start + 1, task.epochs + 1):
                if self.loop["stopped_early"]:
                    break
                state, stop = self.epoch(state, epoch, say)
                if callback is not None:
                    callback(epoch, state, self.history[-1], stop or epoch == task.epochs)
                if bar is not None:
                    bar.update(1)
                if epoch < task.epochs and not stop and self._stop_at_epoch_end(epoch):
                    with self.watch.saving():
                        self.checkpointer.wait()
                    self.preempted(
                        self.ckpt_dir / checkpoint_name(task.kind, epoch, False),
                        f"epoch {epoch}",
                    )
        finally:
            if bar is not None:
                bar.close()
        return state

    def _stop_at_epoch_end(self, epoch: int) -> bool:
        """A signal honoured at an epoch's end: its checkpoint is the save. On several
        processes, a task without steps within (the DQN) asks the sync point by epoch."""
        if self.watch.multi:
            return not getattr(self.task, "steps_within", False) and self.watch.should_stop(epoch)
        return self.watch.received is not None

    def global_step(self, steps_in_epoch: int) -> int:
        """The run's optimizer steps after ``steps_in_epoch`` steps of the epoch in flight."""
        return self.loop.get("steps", 0) + steps_in_epoch

    def after_step(self, state, epoch: int, steps: int, sums: Callable[[], dict]) -> None:
        """What a task calls after each step of an epoch (``steps``: the epoch's steps done,
        ``sums``: the epoch's running sums, read only for a save): a checkpoint when one is
        due or a signal asks for it, then for a signal :class:`Preempted`."""
        g = self.global_step(steps)
        stop = self.watch.should_stop(g)
        if not (stop or self.schedule.due(g)):
            return
        within = {"epoch": epoch, "step": steps, "global_step": g, **sums()}
        meta = {**self.meta({}, False, self.loop["best_epoch"]), "within": within}
        with self.watch.saving():
            path = self.checkpointer.save_within(g, state, meta, keep=self.saving.keep, wait=stop)
            if not stop and not self.watch.multi and self.watch.received is not None:
                # a signal during a scheduled save: that save is the one the run stops with
                self.checkpointer.wait()
                stop = True
        self.schedule.saved()
        if stop:
            self.preempted(path, f"step {steps} of epoch {epoch}", within)

    def preempted(self, path: Path, where: str, within: dict | None = None) -> None:
        """The metrics so far (``partial.json``: where the run stopped, and the epoch in
        flight's running loss), the TensorBoard log closed, then :class:`Preempted`."""
        import datetime

        signal_name = self.watch.received or "SIGTERM"
        if self.primary:
            record = {
                "signal": signal_name,
                "stopped_after": where,
                "checkpoint": str(path),
                "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "epochs_done": self.loop["epoch"] if within is None else within["epoch"] - 1,
            }
            if within is not None:
                record["epoch_in_flight"] = within
            (self.workdir / "partial.json").write_text(json.dumps(record, indent=1))
        self.board.close()
        raise Preempted(
            f"{signal_name}: saved after {where} in {path}; rerun the same command with "
            "--resume auto (backtest, tune: --resume)"
        )

    def epoch(self, state, epoch: int, say: Callable):
        """Train, validate, rank, record and checkpoint one epoch: ``(state, stop)``."""
        task, loop = self.task, self.loop
        kw = {}
        if getattr(task, "steps_within", False):
            resumed = self.resume_within if epoch == self.start + 1 else None
            kw["within"] = Within(self, epoch, resumed)
        try:
            state, train_m = task.train_epoch(state, epoch, **kw)
        except TrainingDiverged as e:
            raise TrainingDiverged(
                f"{e}; stopped without saving epoch {epoch} (last good "
                f"checkpoint: {_last(self.ckpt_dir, task.kind)})"
            ) from None
        val = task.validate(state)
        score = val.get(task.score)
        if score is not None and not math.isfinite(score):
            raise TrainingDiverged(
                f"{task.score} became {score} in epoch {epoch}; stopped "
                f"(last good checkpoint: {_last(self.ckpt_dir, task.kind)})"
            )
        metrics = {"epoch": epoch, **train_m, **val}
        rank = getattr(task, "rank", None)  # e.g. smoothed over epochs
        if score is not None and rank is not None:
            score = rank(self.history + [metrics])
        improved = score is None or _is_better(score, loop["best_score"], task.mode)
        if improved:
            loop.update(best_epoch=epoch, best_score=score, bad_epochs=0)
        else:
            loop["bad_epochs"] += 1
        stop = (
            task.patience > 0
            and score is not None
            and loop["bad_epochs"] >= task.patience
            and getattr(task, "may_stop", lambda e, m: True)(epoch, metrics)
        )
        loop.update(
            epoch=epoch, stopped_early=stop, steps=self.global_step(train_m.get("steps", 0))
        )
        self.record(metrics)
        self.board.epoch(epoch, metrics, memory_stats())
        say(
            f"epoch {epoch}/{task.epochs}: {task.epoch_line(metrics)}"
            + ("  *best" if improved and score is not None else "")
        )
        if score is None and epoch == self.start + 1:
            say(
                "no validation windows: early stopping is off and the last epoch counts as the best"
            )
        self.checkpointer.save(
            epoch, state, metrics, self.meta(metrics, False, epoch), improved=improved
        )
        return state, stop

    def finish(self, state):
        """The best epoch's state and the final checkpoint (written unless it exists)."""
        task, loop = self.task, self.loop
        last, best_epoch = loop["epoch"], loop["best_epoch"]
        if loop["stopped_early"]:
            self.log(
                f"early stop at epoch {last}: no better {task.score} for {task.patience} "
                f"epochs; restoring the best epoch, {best_epoch}"
            )
        best_state = (
            state
            if best_epoch == last
            else self.checkpointer.restore(best_epoch, task.abstract_state())
        )
        final = self.ckpt_dir / checkpoint_name(task.kind, last, True)
        if self.start == last:
            self.log(
                f"{self.ckpt_dir} already holds epoch {last}"
                + (" (stopped early)" if loop["stopped_early"] else f" of {task.epochs}")
                + ": nothing to train"
                + ("" if final.exists() else "; writing its missing final checkpoint")
            )
        if not final.exists():
            self.checkpointer.save_final(
                last,
                best_state,
                self.meta(self.history[-1] if self.history else {}, True, best_epoch),
            )
            for old in supersede_finals(self.ckpt_dir, task.kind, last):
                self.log(f"{old} is no longer final (superseded by {final.name})")
        return best_state, final

    def summarize(self, best_state, final: Path) -> dict:
        """The task's summary of the best state (its plots drawn), with the loop's record;
        written to ``summary.json``."""
        loop, task = self.loop, self.task
        try:
            summary, text = task.summarize(best_state, self.workdir, self.history)
            self.board.images(self.workdir, loop["epoch"])
        finally:
            self.board.close()
        summary.update(
            epochs_run=loop["epoch"],
            stopped_early=loop["stopped_early"],
            best_epoch=loop["best_epoch"],
            weights_epoch=loop["best_epoch"],
            best_score=loop["best_score"],
            score=task.score,
            final_checkpoint=str(final),
            identity=self.identity,
            provenance=provenance(),
            history=self.history,
        )
        if self.primary:
            (self.workdir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.log(f"weights of epoch {loop['best_epoch']} (best {task.score}) from {final}")
        self.log(text)
        return summary


class Within:
    """What a task with ``steps_within`` is given for one epoch: where a resumed epoch
    starts (``first``: the steps done before, ``sums``: its running sums then) and
    :meth:`after`, called after each step."""

    def __init__(self, book: _Book, epoch: int, resumed: dict | None):
        self.book, self.epoch = book, epoch
        self.first = resumed["step"] if resumed is not None else 0
        self.sums = (
            {k: v for k, v in resumed.items() if k not in ("epoch", "step", "global_step")}
            if resumed is not None
            else None
        )

    def after(self, state, steps: int, sums: Callable[[], dict]) -> None:
        self.book.after_step(state, self.epoch, steps, sums)


def _start_loop(saved: dict | None, task: Task, log: Callable) -> dict:
    """The loop's counters: fresh, or the saved run's (what a resume changes is logged, and
    an early-stopped run trains on only under another patience)."""
    loop = {
        "epoch": 0,
        "best_epoch": 0,
        "best_score": None,
        "bad_epochs": 0,
        "stopped_early": False,
    }
    if saved is not None:
        loop = dict(saved["loop"])
        for line in resume_changes(saved, task):
            log(f"--resume: {line}")
        if loop["stopped_early"] and task.epochs > loop["epoch"]:
            if loop.get("patience", task.patience) != task.patience:  # a new patience
                log(
                    f"--resume: the run stopped early at epoch {loop['epoch']}; training on to "
                    f"epoch {task.epochs} with patience {task.patience}"
                )
                loop.update(stopped_early=False, bad_epochs=0)
            else:
                log(
                    f"--resume: the run stopped early at epoch {loop['epoch']} (patience "
                    f"{task.patience}); to train on, pass --epochs N with another --patience "
                    "(0: no early stop)"
                )
    loop["patience"] = task.patience
    return loop


def _is_primary() -> bool:
    import jax

    return jax.process_index() == 0


def _last(ckpt_dir: Path, kind: str) -> str:
    epochs = epoch_checkpoints(ckpt_dir, kind)
    return str(ckpt_dir / checkpoint_name(kind, epochs[-1], False)) if epochs else "none"


def _epoch_bar(task: Task, start: int):
    import sys

    from tqdm.auto import tqdm

    return tqdm(
        total=task.epochs,
        initial=start,
        desc=task.kind,
        unit="epoch",
        leave=False,
        file=sys.stderr,
        dynamic_ncols=True,
    )
