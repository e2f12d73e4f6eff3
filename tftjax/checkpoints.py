"""Orbax checkpoints shared by the TFT and the DQN.

Names come from one function, :func:`checkpoint_name`: every epoch writes
``{prefix}_epoch_{N}``; the last epoch (normal end or early stop) also writes
``{prefix}_final_epoch{N}``. The training loops call
``callback(epoch, state, metrics, is_final)``; :class:`EpochCheckpointer` is
that callback.

Retention (Orbax preservation policies): the latest 2 epoch checkpoints and
the best one by a validation metric; final checkpoints are never deleted.
Saves are atomic (written as ``NAME.orbax-checkpoint-tmp-*``, renamed on
commit), so an interrupted save is ignored by :meth:`restore_latest`.
Each checkpoint holds the state pytree and a JSON ``meta`` item (config,
feature statistics, metrics, loop counters).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm


def checkpoint_name(prefix: str, epoch: int, is_final: bool) -> str:
    """The directory name of a checkpoint: the single place names are decided."""
    return f"{prefix}_final_epoch{epoch}" if is_final else f"{prefix}_epoch_{epoch}"


def abstract(tree: Any) -> Any:
    """Shape/dtype skeleton of a state pytree, for restoring into."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class EpochCheckpointer:
    """Epoch and final checkpoints under ``directory``.

    Args:
      directory: folder of the checkpoints (created if missing).
      prefix: ``"tft"`` or ``"dqn"``.
      best_metric: key of the metrics dict ranking checkpoints.
      mode: ``"min"`` or ``"max"``: which end of ``best_metric`` is best.
      keep_latest: epoch checkpoints kept besides the best.
    """

    def __init__(self, directory: str | Path, prefix: str, *, best_metric: str, mode: str = "min",
                 keep_latest: int = 2):
        if mode not in ("min", "max"):
            raise ValueError("mode must be 'min' or 'max'")
        self.directory = Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        step_prefix = checkpoint_name(prefix, 0, False)[: -len("_0")]
        # BestN sorts ascending (reverse=False) and keeps the last n: the highest.
        best = cm.BestN(get_metric_fn=lambda m: m[best_metric], reverse=(mode == "min"), n=1)
        options = ocp.CheckpointManagerOptions(
            step_prefix=step_prefix,
            # best_fn only makes Orbax write each step's metrics and read them back when a
            # run resumes; without it a resumed manager cannot rank (so never deletes) the
            # checkpoints of the earlier session. The preservation policy decides retention.
            best_fn=lambda m: m[best_metric], best_mode=mode,
            preservation_policy=cm.AnyPreservationPolicy([cm.LatestN(n=keep_latest), best]),
            enable_async_checkpointing=True,
            # Leftovers of an interrupted save are removed here, synchronously: Orbax's own
            # cleanup runs in a thread that races with an early exit (bad input).
            cleanup_tmp_directories=False,
        )
        for tmp in self.directory.glob("*.orbax-checkpoint-tmp*"):
            shutil.rmtree(tmp, ignore_errors=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def __call__(self, epoch: int, state: Any, metrics: dict, is_final: bool,
                 meta: dict | None = None) -> None:
        meta = dict(meta or {}, epoch=epoch, metrics=metrics, is_final=is_final)
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self.manager.save(epoch, args=args, metrics=_floats(metrics), force=True)
        if is_final:
            self.manager.wait_until_finished()
            final = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
            path = self.directory / checkpoint_name(self.prefix, epoch, True)
            final.save(path, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     meta=ocp.args.JsonSave(meta)), force=True)

    def latest_epoch(self) -> int | None:
        return self.manager.latest_step()

    def restore_latest(self, state_like: Any) -> tuple[int, Any, dict] | None:
        """``(epoch, state, meta)`` of the latest complete epoch checkpoint, or ``None``."""
        epoch = self.manager.latest_step()
        if epoch is None:
            return None
        out = self.manager.restore(epoch, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract(state_like)), meta=ocp.args.JsonRestore()))
        return epoch, out.state, dict(out.meta)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def read_meta(path: str | Path) -> dict:
    """The JSON ``meta`` item of a checkpoint directory (epoch or final)."""
    ckpt = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    return dict(ckpt.restore(Path(path).absolute(),
                             args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)


def restore_state(path: str | Path, state_like: Any) -> Any:
    """Restore the state pytree of a checkpoint directory into ``state_like``'s structure."""
    ckpt = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    return ckpt.restore(Path(path).absolute(), args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract(state_like)))).state


def list_checkpoints(directory: str | Path) -> list[str]:
    """Names of the complete checkpoints in ``directory`` (no temporary ones), sorted."""
    d = Path(directory)
    if not d.exists():
        return []
    names = [p.name for p in d.iterdir() if p.is_dir() and "orbax-checkpoint-tmp" not in p.name]
    key = lambda n: (int(re.findall(r"\d+", n)[-1]) if re.findall(r"\d+", n) else -1, n)  # noqa: E731
    return sorted(names, key=key)


def last_checkpoint(directory: str | Path) -> str:
    """Path of the newest complete checkpoint in ``directory`` (for messages), or ``"none"``."""
    names = list_checkpoints(directory)
    return str(Path(directory) / names[-1]) if names else "none"


def read_history(path: str | Path, upto: int) -> list[dict]:
    """The ``metrics.jsonl`` lines of epochs ``<= upto`` (what a resumed run keeps)."""
    path = Path(path)
    if not path.exists() or upto == 0:
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("epoch", 0) <= upto]


def _floats(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
