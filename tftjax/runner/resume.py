"""What a resume may and may not change, and the latest checkpoint's metadata it starts from
(:func:`tftjax.runner.loop.run`'s first reads)."""

from __future__ import annotations

from pathlib import Path

from tftjax.errors import ConfigError
from tftjax.runner.checkpoints import (
    checkpoint_name,
    epoch_checkpoints,
    list_checkpoints,
    read_meta,
    step_checkpoints,
    step_name,
)

KINDS = ("tft", "dqn")

RUN_RECORD = "run.json"
"""Written when a run starts (its kind and identity): ``--resume auto`` knows a folder a
run was killed in before its first checkpoint, and what that run was."""
RUN_FILES = frozenset({"checkpoints", "metrics.jsonl", "tensorboard", RUN_RECORD, "partial.json"})
"""What a run writes before its first checkpoint: a folder of nothing else (or nothing) is
one ``--resume auto`` may start afresh in."""


def wants_checkpoint(resume, ckpt_dir: str | Path) -> bool:
    """Whether a run continues a checkpoint: ``--resume`` (True) always, ``--resume auto``
    where ``ckpt_dir`` holds one (of any kind: another kind's is refused by name later)."""
    if resume == "auto":
        return bool(list_checkpoints(ckpt_dir))
    return bool(resume)


def check_fresh_folder(workdir: Path) -> None:
    """``--resume auto`` with no checkpoint: the folder must hold nothing but a run's own
    partial files (:data:`RUN_FILES`) or nothing at all.

    Raises:
      ConfigError: naming the files that are not a run's.
    """
    if not workdir.is_dir():
        return
    foreign = sorted(p.name for p in workdir.iterdir() if p.name not in RUN_FILES)
    if foreign:
        raise ConfigError(
            f"--resume auto: {workdir} holds no checkpoint and files that are not a run's "
            f"({', '.join(foreign[:4])}{', …' if len(foreign) > 4 else ''}); give a new or "
            "empty --workdir"
        )


def identity_diff(saved: dict, now: dict, may_change=(), prefix: str = "") -> list[str]:
    """Differences between two nested identity dicts, ``path: checkpoint X, now Y``."""
    out = []
    for key in sorted(set(saved) | set(now)):
        path = f"{prefix}{key}"
        if path in may_change:
            continue
        a, b = saved.get(key, "<missing>"), now.get(key, "<missing>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += identity_diff(a, b, may_change, path + ".")
        elif _norm(a) != _norm(b):
            out.append(f"{path}: {a!r} in the checkpoint, {b!r} now")
    return out


def resume_changes(saved: dict, task) -> list[str]:
    """The settings a resume may change (``task.may_change``: fields, or whole sections such
    as ``model.execution``) that it does change."""
    now = task.identity()
    old = saved["identity"]
    if hasattr(task, "normalize_identity"):
        old = task.normalize_identity(old)
    out = []
    for path in task.may_change:
        a, b = _at(old, path), _at(now, path)
        if a is _MISSING or b is _MISSING:  # an older run's identity lacks it
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += identity_diff(a, b, prefix=path + ".")
        elif _norm(a) != _norm(b):
            out.append(f"{path}: {a!r} in the checkpoint, {b!r} now")
    return out


_MISSING = object()


def _at(tree: dict, path: str):
    for key in path.split("."):
        if not isinstance(tree, dict) or key not in tree:
            return _MISSING
        tree = tree[key]
    return tree


def _norm(x):
    return tuple(_norm(v) for v in x) if isinstance(x, (list, tuple)) else x


def check_resume(saved: dict, task, ckpt_dir: Path) -> None:
    """Refuse a resume that would mix data, models or settings (one ConfigError)."""
    if saved.get("kind") != task.kind:
        raise ConfigError(
            f"--resume: {ckpt_dir} holds {saved.get('kind')!r} checkpoints, not {task.kind!r}"
        )
    s_data, n_data = saved["identity"].get("data", {}), task.identity().get("data", {})
    diff = []
    if (s_data.get("sha256"), s_data.get("rows")) != (n_data.get("sha256"), n_data.get("rows")):
        diff.append(f"data: trained on {_data(s_data)}, this run reads {_data(n_data)}")
    saved_identity = saved["identity"]
    if hasattr(task, "normalize_identity"):
        saved_identity = task.normalize_identity(saved_identity)
    diff += identity_diff(
        {k: v for k, v in saved_identity.items() if k != "data"},
        {k: v for k, v in task.identity().items() if k != "data"},
        task.may_change,
    )
    if diff:
        raise ConfigError(
            f"--resume: {ckpt_dir} was trained with other data or settings: "
            + "; ".join(diff)
            + ". Only --epochs may change on resume; train "
            "another --workdir for a new run"
        )
    done = saved["loop"]["epoch"]
    if task.epochs < done:
        raise ConfigError(
            f"--resume: --epochs {task.epochs} is below the {done} epochs already "
            f"trained in {ckpt_dir}; --epochs may only grow"
        )


def _data(d: dict) -> str:
    if "sha256" not in d:
        return str(d.get("env", d))
    return f"{d.get('file')} ({d.get('rows')} rows, sha256 {str(d.get('sha256'))[:12]}…)"


def latest_meta(ckpt_dir: str | Path, kind: str | None = None) -> dict:
    """The metadata of the checkpoint furthest along in ``ckpt_dir``: the latest complete
    epoch checkpoint, or a later step checkpoint within the next epoch (its meta's
    ``within`` says where the epoch stands, and ``path`` where it lies).

    Raises:
      ConfigError: there is none (``--resume`` into an empty or mistyped folder), it is
        another trainer's (``kind``), or it cannot be read as this version's checkpoint.
    """
    ckpt_dir = Path(ckpt_dir)
    epochs = {k: epoch_checkpoints(ckpt_dir, k) for k in KINDS}
    steps = {k: step_checkpoints(ckpt_dir, k) for k in KINDS}
    found = max(KINDS, key=lambda k: (bool(epochs[k] or steps[k]), epochs[k][-1:], steps[k][-1:]))
    if not (epochs[found] or steps[found]):
        raise ConfigError(
            f"--resume: no checkpoint to resume in {ckpt_dir}"
            + (" (no such folder)" if not ckpt_dir.exists() else "")
            + "; drop --resume to start a new run (--resume auto starts one where none is)"
        )
    if kind is not None and found != kind:
        raise ConfigError(f"--resume: {ckpt_dir} holds {found} checkpoints, not {kind}")
    meta = None
    if epochs[found]:
        meta = _meta(ckpt_dir / checkpoint_name(found, epochs[found][-1], False))
    if steps[found]:  # a step checkpoint of an epoch after the latest epoch checkpoint's
        within = _meta(ckpt_dir / step_name(found, steps[found][-1]))
        if meta is None or within["within"]["epoch"] > meta["loop"]["epoch"]:
            meta = within
    assert meta is not None
    return meta


def _meta(path: Path) -> dict:
    try:
        meta = read_meta(path)
    except Exception as e:  # Orbax raises several types for a damaged checkpoint
        raise ConfigError(f"--resume: {path} cannot be read ({type(e).__name__})") from None
    if not {"kind", "identity", "loop"} <= set(meta):
        raise ConfigError(
            f"--resume: {path} was written by an older tftjax (no data identity "
            "in its metadata); train another --workdir"
        )
    return {**meta, "path": str(path)}
