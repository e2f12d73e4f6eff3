"""Settings files: ``--config FILE`` and ``python -m tftjax.tune``'s ``best.json``.

A settings file names fields flat, as the flags do, and as tftjax wrote them before the typed
parts (the old per-family kernel switches included): ``{"model": {"hidden": 32, "remat":
"full"}, "train": {"learning_rate": 0.002}}``. Saved model configs of any layout are read by
:meth:`tftjax.config.TFTConfig.from_json`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tftjax.config.fields import coerce, field_types
from tftjax.config.model import TFTConfig, flat_settings
from tftjax.config.train import TrainConfig
from tftjax.errors import ConfigError


def apply_settings(
    cfg: TFTConfig, tc: TrainConfig, settings: dict, source: str = "--config"
) -> tuple[TFTConfig, TrainConfig]:
    """``{"model": {...}, "train": {...}}`` (flat field names) applied to a model and a
    training config.

    Raises:
      ConfigError: unknown sections or fields, or values the configs refuse.
    """
    if bad := sorted(set(settings) - {"model", "train"}):
        raise ConfigError(
            f"{source}: unknown section(s) {', '.join(bad)} (expected model and train)"
        )
    model, train = settings.get("model", {}), settings.get("train", {})
    if not isinstance(model, dict) or not isinstance(train, dict):
        raise ConfigError(f"{source}: 'model' and 'train' must map setting names to values")
    if bad := sorted(set(train) - {f.name for f in dataclasses.fields(TrainConfig)}):
        raise ConfigError(f"{source}: unknown setting(s) {', '.join('train.' + b for b in bad)}")
    train = {k: coerce(field_types(TrainConfig)[k], v) for k, v in train.items()}
    return (cfg.override(**flat_settings(model, source, cfg)), dataclasses.replace(tc, **train))


def read_settings(path: str | Path) -> dict:
    """A settings file's contents (a ``tuned`` record in it is dropped: how the settings
    were found, not a setting).

    Raises:
      ConfigError: a missing or unreadable file, or not an object.
    """
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"--config {path}: not a JSON settings file ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected an object with 'model' and 'train'")
    data.pop("tuned", None)
    return data
