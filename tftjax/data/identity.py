"""What a run records of its data, and how it finds the same data again.

A data file is identified by the SHA-256 of its bytes and its row count: a moved
file is the same data, an edited one is not. Resume, evaluate, export and
predict find the file a run was trained on from what :func:`data_identity`
recorded (:func:`find_data_file`), and refuse it when its content changed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath

import numpy as np

from tftjax.data.bars import VALUE_COLUMNS, Bars
from tftjax.data.bundled import DATASETS, bundled_path
from tftjax.errors import DataError

BUNDLED = "<bundled>/"


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes (the identity of a data file recorded with every run)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def content_hash(bars: Bars) -> str:
    """The file's SHA-256, or for bars built in memory a hash of the columns' bytes."""
    if bars.sha256:
        return bars.sha256
    h = hashlib.sha256()
    for name in ("ts",) + VALUE_COLUMNS:
        h.update(np.ascontiguousarray(getattr(bars, name)).tobytes())
    return "arrays:" + h.hexdigest()


def data_identity(bars: Bars, run_dir: str | os.PathLike | None = None) -> dict:
    """``{"file", "file_from_run", "sha256", "rows"}`` of a bar table.

    ``file`` (absolute, or ``<bundled>/NAME`` for the bundled bars) and ``file_from_run``
    (relative to ``run_dir``) say where to find it again (:func:`find_data_file`)."""
    out = {
        "file": str(bars.path),
        "file_from_run": None,
        "sha256": content_hash(bars),
        "rows": len(bars),
    }
    if bars.sha256:  # read from a file
        p = Path(bars.path).resolve()
        mine = {bundled_path(n).resolve(): bundled_path(n).name for n in DATASETS}
        out["file"] = BUNDLED + mine[p] if p in mine else str(p)
        if run_dir is not None and not out["file"].startswith(BUNDLED):
            out["file_from_run"] = os.path.relpath(p, Path(run_dir).resolve())
    return out


def combined_identity(series: list[tuple[str, Bars]], run_dir=None) -> dict:
    """The identity of several series: each one's (with its name), and a hash of theirs."""
    parts = [{"name": name, **data_identity(b, run_dir)} for name, b in series]
    h = hashlib.sha256("".join(f"{p['name']}:{p['sha256']};" for p in parts).encode())
    return {
        "file": " + ".join(dict.fromkeys(p["file"] for p in parts)),
        "file_from_run": None,
        "sha256": "series:" + h.hexdigest(),
        "rows": sum(p["rows"] for p in parts),
        "series": parts,
    }


def find_data_files(identity: dict, run_dir: str | os.PathLike) -> str | list[str]:
    """:func:`find_data_file` of a run's data: one file, or the files of several series."""
    if "series" not in identity:
        return find_data_file(identity, run_dir)
    return list(dict.fromkeys(find_data_file(p, run_dir) for p in identity["series"]))


def the_file(path: str) -> str:
    """The file of a recorded series path: a long file's series reads ``FILE[SYMBOL]``."""
    if path.endswith("]") and "[" in path and not Path(path).exists():
        return path[: path.rindex("[")]
    return path


def find_data_file(identity: dict, run_dir: str | os.PathLike) -> str:
    """The recorded data file, checked against its hash.

    Looks for it relative to ``run_dir`` first (a run folder moved together
    with its data), then at its absolute path; the bundled bars are found in
    this installation.

    Raises:
      DataError: when no candidate exists or the file's content changed.
    """
    f = the_file(identity["file"])
    if f.startswith(BUNDLED):
        name = PurePosixPath(f).name
        candidates = [bundled_path(k) for k, v in DATASETS.items() if v == name] or [Path(f)]
    else:
        rel = identity.get("file_from_run")
        candidates = [(Path(run_dir) / the_file(rel)).resolve()] if rel else []
        candidates.append(Path(f))
    found = [c for c in candidates if c.is_file()]
    if not found:
        raise DataError(
            f"{f}: the data file this run was trained on is not found (looked at "
            f"{', '.join(str(c) for c in candidates)}); pass --parquet-file to use "
            "another file on purpose"
        )
    for c in found:
        if file_sha256(c) == identity["sha256"]:
            return str(c)
    raise DataError(
        f"{found[0]}: content changed since training (sha256 "
        f"{file_sha256(found[0])[:12]}…, recorded {identity['sha256'][:12]}…); pass "
        "--parquet-file to use another file on purpose"
    )
