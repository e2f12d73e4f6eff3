"""Any saved TFT (a checkpoint, a run folder or an export folder) as one record.

The CLIs that read a trained model (evaluate, and predict) open it here: an export folder
through :mod:`tftjax.export`, anything else as an Orbax checkpoint
(:func:`tftjax.training.load_checkpoint`). Training and evaluation below never import the
exporter; they read the :class:`~tftjax.training.SavedModel` this returns.
"""

from __future__ import annotations

from pathlib import Path

from tftjax import export
from tftjax.training import SavedModel, load_checkpoint


def open_model(path: str | Path) -> SavedModel:
    """The model saved at ``path``.

    Raises:
      DataError: no such checkpoint, run folder or export, or an unreadable one.
    """
    return export.load_model(path) if export.is_export(path) else load_checkpoint(path)
