"""Typed, frozen configs of the TFT and its training, the named presets, and the reading of
saved and settings-file configs (the DQN's config is :mod:`tftjax.dqn.config`).

Nothing here imports JAX or a command-line library: the configs import anywhere (a GPU
image without the CLIs' extras, a notebook)."""

from tftjax.config.data import (
    DECODER_STEPS,
    ENCODER_STEPS,
    FEATURE_SETS,
    LOOKBACKS,
    NORMALISATIONS,
    NUM_HISTORICAL,
    NUM_KNOWN,
    NUM_STATIC,
    TARGETS,
    WARMUP,
    DataConfig,
)
from tftjax.config.execution import (
    AUTO,
    FASTEST,
    KERNEL_FAMILIES,
    TIERS,
    ExecutionConfig,
    Kernels,
    parse_bytes,
)
from tftjax.config.model import (
    CONFIG_SCHEMA,
    DEFAULT_QUANTILES,
    SECTIONS,
    HeadConfig,
    ModelConfig,
    QuantConfig,
    TFTConfig,
)
from tftjax.config.presets import PRESET_NAMES, PRESETS, Preset, get_preset, preset
from tftjax.config.schema import apply_settings, read_settings
from tftjax.config.train import TrainConfig
from tftjax.errors import ConfigError, check

__all__ = [
    "AUTO",
    "CONFIG_SCHEMA",
    "ConfigError",
    "DECODER_STEPS",
    "DEFAULT_QUANTILES",
    "DataConfig",
    "ENCODER_STEPS",
    "ExecutionConfig",
    "FASTEST",
    "FEATURE_SETS",
    "HeadConfig",
    "KERNEL_FAMILIES",
    "Kernels",
    "LOOKBACKS",
    "ModelConfig",
    "NORMALISATIONS",
    "NUM_HISTORICAL",
    "NUM_KNOWN",
    "NUM_STATIC",
    "PRESETS",
    "PRESET_NAMES",
    "Preset",
    "QuantConfig",
    "SECTIONS",
    "TARGETS",
    "TFTConfig",
    "TIERS",
    "TrainConfig",
    "WARMUP",
    "apply_settings",
    "check",
    "get_preset",
    "parse_bytes",
    "preset",
    "read_settings",
]
