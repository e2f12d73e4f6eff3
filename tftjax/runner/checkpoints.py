"""Orbax checkpoints shared by the TFT and the DQN.

Names come from one function, :func:`checkpoint_name`: every epoch writes
``{prefix}_epoch_{N}``; the last epoch (normal end or early stop) also writes
``{prefix}_final_epoch{N}`` holding the *best* epoch's state (the run loop,
:mod:`tftjax.runner.loop`, decides which; the meta says ``weights_epoch``).

Within an epoch (``--save-every-steps``, ``--save-every-minutes``, or a signal:
:mod:`tftjax.runner.preemption`) a run writes ``{prefix}_step_{S}`` (S: the run's optimizer
steps so far), whose meta says where the epoch stands (``within``).

Retention (Orbax preservation policies): the latest 2 epoch checkpoints and
the best one, and the latest ``--keep`` step checkpoints; final checkpoints are never
deleted. Saves are atomic (written
as ``NAME.orbax-checkpoint-tmp-*``, renamed on commit), so an interrupted save
is never mistaken for a checkpoint. Each checkpoint holds the state pytree and
a JSON ``meta`` item (identity of data and configs, feature statistics,
metrics, loop counters).
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
    """Shape/dtype/sharding skeleton of a state pytree, for restoring into. Leaves without a
    sharding (``jax.eval_shape``'s) restore onto this process's first device, whatever mesh
    or number of processes wrote the checkpoint."""
    here = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def one(x):
        s = ocp.utils.to_shape_dtype_struct(x)
        if isinstance(s, jax.ShapeDtypeStruct) and s.sharding is None:
            s = jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=here)
        return s

    return jax.tree.map(one, tree)


class EpochCheckpointer:
    """Epoch and final checkpoints under ``directory``.

    Retention: the latest ``keep_latest`` epoch checkpoints and the best one.
    *Best* is the run loop's decision, passed as ``improved`` to :meth:`save`
    (so ties and an empty validation split cannot make Orbax keep another
    epoch than the one the loop reports): each save records the metric
    ``best_marker`` = its epoch if it improved on every earlier epoch, else -1,
    and Orbax keeps the highest marker, i.e. the latest improvement.

    Args:
      directory: folder of the checkpoints (created if missing).
      prefix: ``"tft"`` or ``"dqn"``.
      keep_latest: epoch checkpoints kept besides the best.
    """

    def __init__(self, directory: str | Path, prefix: str, *, keep_latest: int = 2):
        self.directory = Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        step_prefix = checkpoint_name(prefix, 0, False)[: -len("_0")]
        marker = lambda m: m.get(BEST_MARKER, -1)
        # BestN sorts ascending (reverse=False) and keeps the last n: the highest.
        best = cm.BestN(get_metric_fn=marker, reverse=False, n=1)
        options = ocp.CheckpointManagerOptions(
            step_prefix=step_prefix,
            # best_fn only makes Orbax write each step's metrics and read them back when a
            # run resumes; without it a resumed manager cannot rank (so never deletes) the
            # checkpoints of the earlier session. The preservation policy decides retention.
            best_fn=marker,
            best_mode="max",
            preservation_policy=cm.AnyPreservationPolicy([cm.LatestN(n=keep_latest), best]),
            enable_async_checkpointing=True,
            # Leftovers of an interrupted save are removed here, synchronously: Orbax's own
            # cleanup runs in a thread that races with an early exit (bad input).
            cleanup_tmp_directories=False,
        )
        for tmp in self.directory.glob("*.orbax-checkpoint-tmp*"):
            shutil.rmtree(tmp, ignore_errors=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self.within: ocp.CheckpointManager | None = None  # step checkpoints: made on first use

    def save(self, epoch: int, state: Any, metrics: dict, meta: dict, *, improved: bool) -> None:
        """``{prefix}_epoch_{epoch}`` (asynchronous; atomic on commit)."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        floats = dict(_floats(metrics), **{BEST_MARKER: float(epoch if improved else -1)})
        self.manager.save(epoch, args=args, metrics=floats, force=True)

    def save_final(self, epoch: int, state: Any, meta: dict) -> Path:
        """``{prefix}_final_epoch{epoch}``, written synchronously after pending saves."""
        self.manager.wait_until_finished()
        path = self.directory / checkpoint_name(self.prefix, epoch, True)
        final = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
        final.save(
            path,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )
        return path

    def restore(self, epoch: int, state_like: Any) -> Any:
        """The state of epoch checkpoint ``epoch`` (pending saves finish first)."""
        self.manager.wait_until_finished()
        target, fill = on_disk_fields(
            self.directory / checkpoint_name(self.prefix, epoch, False), state_like
        )
        restored: Any = self.manager.restore(
            epoch, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract(target)))
        )
        return fill(restored.state)

    def save_within(self, step: int, state: Any, meta: dict, *, keep: int, wait: bool) -> Path:
        """``{prefix}_step_{step}`` (asynchronous unless ``wait``; atomic on commit), the
        latest ``keep`` of them kept."""
        if self.within is None:
            options = ocp.CheckpointManagerOptions(
                step_prefix=f"{self.prefix}_step",
                max_to_keep=keep,
                enable_async_checkpointing=True,
                cleanup_tmp_directories=False,  # done synchronously in __init__
            )
            self.within = ocp.CheckpointManager(self.directory, options=options)
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self.within.save(step, args=args, force=True)
        if wait:
            self.within.wait_until_finished()
        return self.directory / step_name(self.prefix, step)

    def restore_within(self, step: int, state_like: Any) -> Any:
        """The state of step checkpoint ``step``."""
        return restore_state(self.directory / step_name(self.prefix, step), state_like)

    def wait(self) -> None:
        """Every save started (epoch and step checkpoints) committed."""
        for manager in (self.manager, self.within):
            if manager is not None:
                manager.wait_until_finished()

    def close(self) -> None:
        self.wait()
        for manager in (self.manager, self.within):
            if manager is not None:
                manager.close()


BEST_MARKER = "best_marker"


def epoch_checkpoints(directory: str | Path, prefix: str) -> list[int]:
    """Epochs of the complete ``{prefix}_epoch_{N}`` checkpoints in ``directory``, sorted."""
    pat = re.compile(re.escape(prefix) + r"_epoch_(\d+)$")
    return sorted(int(m.group(1)) for n in list_checkpoints(directory) if (m := pat.match(n)))


def step_name(prefix: str, step: int) -> str:
    """The directory name of a checkpoint within an epoch, after ``step`` optimizer steps."""
    return f"{prefix}_step_{step}"


def step_checkpoints(directory: str | Path, prefix: str) -> list[int]:
    """Steps of the complete ``{prefix}_step_{S}`` checkpoints in ``directory``, sorted."""
    pat = re.compile(re.escape(prefix) + r"_step_(\d+)$")
    return sorted(int(m.group(1)) for n in list_checkpoints(directory) if (m := pat.match(n)))


def read_meta(path: str | Path) -> dict:
    """The JSON ``meta`` item of a checkpoint directory (epoch or final)."""
    ckpt = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    return dict(
        ckpt.restore(
            Path(path).absolute(), args=ocp.args.Composite(meta=ocp.args.JsonRestore())
        ).meta
    )


def restore_state(path: str | Path, state_like: Any) -> Any:
    """Restore the state pytree of a checkpoint directory into ``state_like``'s structure."""
    ckpt = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    target, fill = on_disk_fields(path, state_like)
    return fill(
        ckpt.restore(
            Path(path).absolute(),
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract(target))),
        ).state
    )


def on_disk_fields(path: str | Path, state_like: Any):
    """``(target, fill)``: for a dataclass state (a flax ``struct``) whose checkpoint was
    written before one of its fields existed (``ema_params``), the fields on disk as a dict
    to restore into, and ``fill`` putting the restored ones back into ``state_like`` with its
    own value of each missing field, which must be an empty pytree (a field a run actually
    uses is never missing from its own checkpoints: resume and restore compare the
    configs first). Anything else: ``state_like`` itself, unchanged."""
    import dataclasses

    try:
        handler: Any = ocp.PyTreeCheckpointHandler()
        saved = set(handler.metadata(Path(path).absolute() / "state").tree)
    except Exception:  # no readable metadata: restore as asked, orbax reports the rest
        return state_like, lambda r: r
    if not dataclasses.is_dataclass(state_like) or isinstance(state_like, type):
        return state_like, lambda r: r
    names = [f.name for f in dataclasses.fields(state_like) if f.metadata.get("pytree_node", True)]
    missing = [n for n in names if n not in saved]
    if not missing or any(jax.tree.leaves(getattr(state_like, n)) for n in missing):
        return state_like, lambda r: r
    target = {n: getattr(state_like, n) for n in names if n in saved}
    return target, lambda r: dataclasses.replace(state_like, **r)


def list_checkpoints(directory: str | Path) -> list[str]:
    """Names of the complete checkpoints in ``directory`` (no temporary ones), sorted."""
    d = Path(directory)
    if not d.exists():
        return []
    names = [p.name for p in d.iterdir() if p.is_dir() and "orbax-checkpoint-tmp" not in p.name]
    key = lambda n: (int(re.findall(r"\d+", n)[-1]) if re.findall(r"\d+", n) else -1, n)
    return sorted(names, key=key)


def supersede_finals(directory: str | Path, prefix: str, epoch: int) -> list[str]:
    """Mark every ``{prefix}_final_epoch{M}`` other than ``epoch``'s as no longer final
    (``is_final`` false, ``superseded_by`` the new one) in its meta, which is rewritten
    atomically; the weights stay. An early-stopped run that trains on writes a new final:
    only that one is final. Returns the names changed."""
    new = checkpoint_name(prefix, epoch, True)
    pat = re.compile(re.escape(prefix) + r"_final_epoch(\d+)$")
    changed = []
    for name in list_checkpoints(directory):
        meta_file = Path(directory) / name / "meta" / "metadata"
        if name == new or not pat.match(name) or not meta_file.exists():
            continue
        meta = json.loads(meta_file.read_text())
        if meta.get("is_final"):
            meta.update(is_final=False, superseded_by=new)
            tmp = meta_file.with_name("metadata.tmp")
            tmp.write_text(json.dumps(meta))
            tmp.replace(meta_file)
            changed.append(name)
    return changed


def read_history(path: str | Path, upto: int) -> list[dict]:
    """The ``metrics.jsonl`` lines of epochs ``<= upto`` (what a resumed run keeps)."""
    path = Path(path)
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("epoch", 0) <= upto]


def _floats(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
