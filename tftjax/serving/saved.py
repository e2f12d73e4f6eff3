"""Any saved TFT (a checkpoint, a run folder or an export folder) as one record, and its
evaluation.

Whatever reads a trained model (evaluate, predict, the Python API, the DQN's
``--tft-checkpoint``) opens it here: an export folder through :mod:`tftjax.serving.export`,
anything else as an Orbax checkpoint (:func:`tftjax.training.load_checkpoint`). Training
and evaluation below never import the exporter; they read the
:class:`~tftjax.training.SavedModel` this returns.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tftjax.errors import ConfigError
from tftjax.serving import export
from tftjax.training import SavedModel, load_checkpoint, open_checkpoint


def open_model(path: str | Path, flag: str = "--checkpoint") -> SavedModel:
    """The model saved at ``path``; ``flag`` names it in a refusal.

    Raises:
      DataError: no such checkpoint, run folder or export, or an unreadable one.
    """
    if export.is_export(path):
        return export.load_model(path)
    open_checkpoint(path, flag)  # missing, unreadable, not a TFT: one line naming the flag
    return load_checkpoint(path)


def evaluate_checkpoint(
    checkpoint: str | Path,
    parquet_file=None,
    split: str = "test",
    *,
    int8: bool = False,
    calibrate_batches: int = 0,
    unknown: str = "refuse",
    instrument: str | None = None,
    log: Callable = print,
    calibration: str = "minmax",
    quant_options: dict | None = None,
) -> dict:
    """Metrics of a saved TFT (checkpoint, run folder or export) on one split beside the
    baselines: :func:`tftjax.training.evaluate_model` of :func:`tftjax.serving.saved.open_model`.

    Raises:
      DataError: no checkpoint, not a TFT checkpoint, or the data is missing or changed.
      ConfigError: ``int8`` of a float checkpoint without calibration, and the like.
    """
    from tftjax.training import evaluate_model

    if calibrate_batches and not int8:  # before anything is read, as the model's own checks
        raise ConfigError("--calibrate needs --int8 (it calibrates the int8 activation ranges)")
    from tftjax.quant.ptq import check_calibration

    check_calibration(calibration)
    return evaluate_model(
        open_model(checkpoint),
        parquet_file,
        split,
        int8=int8,
        calibrate_batches=calibrate_batches,
        unknown=unknown,
        instrument=instrument,
        log=log,
        calibration=calibration,
        quant_options=quant_options,
    )
