"""Saved TFTs back into memory: open and restore a checkpoint, and ``--init-from``.

:class:`SavedModel` is the neutral record evaluation and prediction read: a model
config, its variables, the feature statistics and the training data's identity,
whatever the model was saved as. :func:`load_checkpoint` makes one from an Orbax
checkpoint; :mod:`tftjax.export` makes one from an export folder, and
:func:`tftjax.serving.saved.open_model` dispatches between them (training never imports the
exporter).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from tftjax.config import ConfigError, TFTConfig, TrainConfig
from tftjax.data import DataError, Dataset, FeatureStats, saved_featurisation
from tftjax.quant.tree import as_minmax
from tftjax.runner.checkpoints import list_checkpoints, read_meta, restore_state
from tftjax.runner.resume import identity_diff
from tftjax.training.state import TrainState, abstract_train_state

OLD_QAT = (
    "a QAT checkpoint from before quantization format 2 (917d886: the variable "
    "selections' observers now watch their raw inputs), whose observer ranges would be "
    "misread"
)


class Checkpoint(NamedTuple):
    path: Path
    meta: dict
    cfg: TFTConfig
    tc: TrainConfig


class SavedModel(NamedTuple):
    """A trained TFT as evaluation and prediction see it."""

    cfg: TFTConfig
    tc: TrainConfig
    variables: dict
    """What the model runs with: float (and observers), or an export's int8 variables."""
    feature_stats: FeatureStats
    data: dict
    """The training data's identity (:func:`tftjax.data.data_identity`)."""
    path: Path
    """The checkpoint directory or export folder."""
    given: str
    """The path as the user named it (a run folder names its final checkpoint)."""
    run_dir: Path
    """Where a recorded relative data path is resolved from."""
    weights_epoch: int | None
    what: str
    """How output names the model, e.g. ``DIR (weights of epoch 3)``."""
    kind: str = "checkpoint"
    """``checkpoint``, or an export's ``float32`` / ``int8``."""
    float_variables: dict | None = None
    """An int8 export's float32 weights (evaluated beside the int8 model)."""
    featurisation: dict | None = None
    """:func:`tftjax.data.load_dataset`'s keywords that featurise data as training did
    (:func:`tftjax.data.saved_featurisation`)."""


def open_checkpoint(path: str | Path, flag: str = "--checkpoint") -> Checkpoint:
    """A TFT checkpoint's metadata and configs: ``path`` is a checkpoint directory or a run
    folder (its newest final checkpoint: the best epoch's weights).

    Raises:
      DataError: missing, unreadable, not a TFT checkpoint, or from an older tftjax.
    """
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"{flag} {path}: no such checkpoint or run folder")
    if (path / "checkpoints").is_dir():
        finals = [n for n in list_checkpoints(path / "checkpoints") if "_final_epoch" in n]
        if not finals:
            raise DataError(
                f"{flag} {path}: the run has no final checkpoint yet (name one of "
                f"its epoch checkpoints under {path / 'checkpoints'})"
            )
        path = path / "checkpoints" / finals[-1]
    elif any(re.search(r"_(final_)?epoch_?\d+$", n) for n in list_checkpoints(path)):
        raise DataError(
            f"{flag} {path}: is a run's folder of checkpoints; give the run folder "
            f"{path.parent} (its final checkpoint) or one checkpoint in it"
        )
    try:
        meta = read_meta(path)
    except Exception as e:  # orbax raises several types for a folder that is not a checkpoint
        raise DataError(
            f"{flag} {path}: not a readable tftjax checkpoint ({type(e).__name__})"
        ) from None
    if meta.get("kind") != "tft":
        what = "a DQN trader's" if meta.get("kind") == "dqn" else f"kind {meta.get('kind')!r}"
        raise DataError(
            f"{flag} {path}: not a TFT checkpoint ({what}); forecasts need a TFT "
            "from python -m tftjax.train"
        )
    try:
        cfg = TFTConfig.from_json(meta["identity"]["model"])
        tc = TrainConfig.from_json(meta["identity"]["train"])
        if "sha256" not in meta["identity"]["data"] or "feature_stats" not in meta:
            raise KeyError("sha256")
    except (KeyError, TypeError, ConfigError):
        raise DataError(
            f"{flag} {path}: written by an older tftjax (no data identity in its metadata)"
        ) from None
    return Checkpoint(path, meta, cfg, tc)


def restore_checkpoint(ck: Checkpoint, *, old_observers: bool = False) -> TrainState:
    """The checkpoint's train state (a float checkpoint written before ``quant_stats``
    existed gets an empty one).

    Raises:
      DataError: the state cannot be restored (damaged, or not this model's shapes), or it is
      a QAT state from before :data:`~tftjax.quant.tree.QUANT_FORMAT` (unless
      ``old_observers``: the caller drops its observers).
    """
    if is_old_qat(ck) and not old_observers:
        raise DataError(
            f"{ck.path}: {OLD_QAT}; re-run its QAT (train --qat --init-from "
            "it keeps the weights, with fresh observers)"
        )
    like = abstract_train_state(ck.cfg, ck.tc)
    try:
        return restore_state(ck.path, like)
    except Exception as e:  # orbax raises several types
        if not like.quant_stats:
            try:
                return restore_without_observers(lambda s: restore_state(ck.path, s), like)
            except Exception:
                pass
        raise DataError(
            f"{ck.path}: the weights cannot be restored ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200]})"
        ) from None


def quant_format(identity: dict) -> int:
    """The observers' layout of a saved run (:data:`~tftjax.quant.tree.QUANT_FORMAT`): as
    recorded, else 2 for a run written by 917d886 or later (its model settings name
    ``stacked_scales``, added with the folded layout), else 1."""
    if "quant_format" in identity:
        return int(identity["quant_format"])
    model = identity.get("model", {})
    return 2 if "stacked_scales" in model or "quant" in model else 1


def is_old_qat(ck: Checkpoint) -> bool:
    return bool(ck.cfg.quant.qat) and quant_format(ck.meta["identity"]) < 2


def restore_without_observers(restore, like: TrainState) -> TrainState:
    """A float state written before ``quant_stats`` existed: ``restore`` the other fields
    into ``like``'s structure and give it ``like``'s empty observers."""
    r = restore({"step": like.step, "params": like.params, "opt_state": like.opt_state})
    return like.replace(step=r["step"], params=r["params"], opt_state=r["opt_state"])


def load_checkpoint(path: str | Path) -> SavedModel:
    """The :class:`SavedModel` of a checkpoint directory or run folder."""
    ck = open_checkpoint(path)
    epoch = ck.meta.get("weights_epoch")
    return SavedModel(
        ck.cfg,
        ck.tc,
        restore_checkpoint(ck).variables(),
        FeatureStats.from_json(ck.meta["feature_stats"]),
        ck.meta["identity"]["data"],
        ck.path,
        str(path),
        ck.path.resolve().parent.parent,  # RUN/checkpoints/NAME
        epoch,
        f"{ck.path} (weights of epoch {epoch})",
        featurisation=saved_featurisation(ck.meta),
    )


class Initial(NamedTuple):
    """Weights a run starts from (``--init-from``)."""

    params: Any
    quant_stats: Any  # the source's observers when it is a QAT run of the same layers, else None
    source: dict
    note: str


def initial_weights(
    init_from: str | Path, cfg: TFTConfig, ds: Dataset, *, new_bars: bool = False
) -> Initial:
    """The weights of ``--init-from`` (a float or QAT checkpoint / run folder) for a run of
    ``cfg`` on ``ds``: the same model (quantization and execution settings aside) trained on
    the same data (or, ``new_bars``, on data :func:`tftjax.training.finetune.on_new_bars`
    checked to extend it), else ConfigError naming what differs."""
    try:
        ck = open_checkpoint(init_from, "--init-from")
    except DataError as e:
        raise ConfigError(str(e)) from None
    # shapes and data must match; how the model runs and its dropout rate may differ
    skip = ("execution", "model.dropout")
    diff = identity_diff(ck.cfg.float_twin().to_json(), cfg.float_twin().to_json(), skip)
    if diff:
        raise ConfigError(
            f"--init-from {ck.path}: another model than this run's: "
            + "; ".join(diff).replace("in the checkpoint", "there")
        )
    src, now = ck.meta["identity"]["data"], ds.identity()
    if src.get("sha256") != now["sha256"] and not new_bars:
        raise ConfigError(
            f"--init-from {ck.path}: trained on {src.get('file')} (sha256 "
            f"{str(src.get('sha256'))[:12]}…), this run reads {now['file']} (sha256 "
            f"{now['sha256'][:12]}…): fine-tune on the data the weights were "
            "trained on"
        )
    state = restore_checkpoint(ck, old_observers=True)
    same_quant = (
        ck.cfg.quant.qat
        and cfg.quant.qat
        and tuple(ck.cfg.quant.qat_layers) == tuple(cfg.quant.qat_layers)
        and not is_old_qat(ck)
    )  # an old layout's ranges are not kept
    source = {
        "checkpoint": str(ck.path),
        "weights_epoch": ck.meta.get("weights_epoch"),
        "qat": ck.cfg.quant.qat,
    }
    kind = "QAT" if ck.cfg.quant.qat else "float"
    note = (
        f"initialised from the {kind} weights of {ck.path} (epoch "
        f"{ck.meta.get('weights_epoch')})"
        + ("" if same_quant or not cfg.quant.qat else "; activation observers start empty")
    )
    stats = None
    if same_quant:  # keep the ranges; count this run's steps (for --qat-freeze-after)
        stats = jax.tree.map(
            lambda m: m._replace(count=jnp.minimum(m.count, 1)),
            as_minmax(state.quant_stats),
            is_leaf=lambda t: hasattr(t, "_fields"),
        )
    return Initial(state.variables()["params"], stats, source, note)  # what it shipped
