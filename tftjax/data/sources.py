"""Where bars come from: a parquet file, or a table in memory for the Python API.

A file is identified by the SHA-256 of its bytes; a table in memory has no file, so its
bars carry no file hash and are identified by their columns' content
(:func:`tftjax.data.identity.content_hash`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tftjax.errors import DataError

TABLE = "<table>"
"""How messages name a table given in memory."""


def is_table(source: Any) -> bool:
    """A pyarrow Table or a pandas DataFrame (not a path)."""
    return isinstance(source, pa.Table) or (
        hasattr(source, "columns") and hasattr(source, "to_numpy")
    )


def as_arrow(frame: Any) -> pa.Table:
    """A pyarrow Table from a pyarrow or pandas table; a pandas time index becomes a ``ts``
    column (its zone kept)."""
    if isinstance(frame, pa.Table):
        return frame
    index = getattr(frame, "index", None)
    if index is not None and str(getattr(index, "dtype", "")).startswith("datetime64"):
        frame = frame.reset_index(names=index.name or "ts")
    try:
        return pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError) as e:
        raise DataError(f"{TABLE}: not a table of bars ({type(e).__name__}: {e})") from None


def read_table(source: Any) -> tuple[pa.Table, str | None, str]:
    """``(table, sha256 of the file's bytes or None, the name messages use)``.

    Raises:
      DataError: a missing, unreadable or non-parquet file.
    """
    if is_table(source):
        return as_arrow(source), None, TABLE
    p, path_s = Path(source), str(source)
    if not p.exists():
        raise DataError(f"{path_s}: file not found")
    if p.is_dir():
        raise DataError(f"{path_s}: is a directory, expected a parquet file")
    try:
        raw = p.read_bytes()
        return pq.read_table(pa.BufferReader(raw)), hashlib.sha256(raw).hexdigest(), path_s
    except (pa.ArrowException, OSError, ValueError) as e:
        raise DataError(
            f"{path_s}: not a readable parquet file ({type(e).__name__}: {e})"
        ) from None


def source_name(source: Any) -> str:
    return TABLE if is_table(source) else os.fspath(source)
