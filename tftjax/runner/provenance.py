"""How a result was made: command line, arguments, versions, device, CPU count, git revision.

Every experiment script stores this beside its results (:func:`write_result`)
and prints it (:func:`describe`), and every training run puts it in its
``summary.json``, so each figure in the README can be traced and rerun.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def _git_revision() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return rev.stdout.strip() + ("+uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(args: Any = None) -> dict:
    """The facts a result depends on; ``args``: an argparse namespace, dataclass or dict."""
    import jax

    if args is not None and not isinstance(args, dict):
        args = vars(args) if hasattr(args, "__dict__") else dict(args)
    dev = jax.devices()[0]
    return {
        "command": shlex.join([Path(sys.argv[0]).name if sys.argv[0] else "python", *sys.argv[1:]]),
        "arguments": {k: str(v) if isinstance(v, Path) else v for k, v in (args or {}).items()},
        "versions": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "jaxlib": _version("jaxlib"),
            "flax": _version("flax"),
            "optax": _version("optax"),
            "orbax-checkpoint": _version("orbax-checkpoint"),
            "tftjax": _version("tftjax"),
        },
        "device": f"{dev.platform}: {dev.device_kind}",
        "devices": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "git_revision": _git_revision(),
    }


def describe(p: dict) -> str:
    v = p["versions"]
    return (
        f"# {p['command']}\n# jax {v['jax']} / jaxlib {v['jaxlib']} / flax {v['flax']}, "
        f"{p['device']} x{p['devices']}, {p['cpu_count']} CPUs, git {p['git_revision']}"
    )


def write_result(path: str | Path, results: Any, args: Any = None) -> dict:
    """Write ``{"provenance": ..., "results": results}`` as JSON to ``path`` and print the
    provenance; returns it."""
    p = provenance(args)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"provenance": p, "results": results}, indent=2, default=str))
    print(describe(p))
    print(f"# wrote {path}")
    return p


def tree_sha256(tree: Any) -> str:
    """SHA-256 of a pytree of arrays: every leaf's path, dtype, shape and bytes, in path
    order (the identity of a model's weights, recorded in the files made from them)."""
    import hashlib

    import jax
    import numpy as np

    h = hashlib.sha256()
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()
