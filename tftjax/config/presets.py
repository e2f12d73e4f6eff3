"""Named presets: a (model, train, execution) triple each, chosen with ``--preset NAME``.

=================  ===========================================================================
``tft225``         TFT-225 as specified (d 128, 4 heads), this platform's fastest remat tier
``tft225-gpu``     TFT-225 for an NVIDIA GPU: bf16, every Pallas kernel, ``--remat auto``
``small``          d 32, 2 heads, dropout 0.2: a few thousand training windows
``compact``        d 16, dropout 0.3, the head anchored on the baseline chosen on validation;
                   trained with ``--ema 0.9``, 4 checks an epoch, ``--smooth 3``, batch 32,
                   patience 8
``tiny``           20 encoder and 5 decoder steps, d 16, 3 quantiles, no remat, the plain
                   head: tests and smoke runs
=================  ===========================================================================

A command's flags and a ``--config`` file override single fields of a preset. The execution
settings ride in the model config (``preset.execution`` is ``preset.model.execution``): a
model carries how it ran.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

from tftjax.config.data import DataConfig
from tftjax.config.execution import FASTEST, ExecutionConfig, Kernels
from tftjax.config.model import HeadConfig, ModelConfig, TFTConfig
from tftjax.config.train import TrainConfig
from tftjax.errors import ConfigError

PresetName = Literal["tft225", "tft225-gpu", "small", "compact", "tiny"]
PRESET_NAMES: tuple[str, ...] = get_args(PresetName)


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named starting point: the model (with how it runs) and how it is trained."""

    name: str
    description: str
    model: TFTConfig
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    anchored_by_default: bool = True
    """A new ``train`` or ``backtest`` run of it takes ``--anchor auto`` unless an anchor is
    named (:func:`tftjax.cli.tft_configs`); ``tiny``, the tests' and smoke runs' preset,
    keeps the plain head."""

    @property
    def execution(self) -> ExecutionConfig:
        return self.model.execution

    def train_for(self, **command_defaults: Any) -> TrainConfig:
        """The training settings of a command whose own defaults are ``command_defaults``
        (backtest: 30 epochs, patience 3): those, with every setting the preset changes
        from :class:`TrainConfig`'s defaults on top."""
        own = {
            f.name: getattr(self.train, f.name)
            for f in dataclasses.fields(TrainConfig)
            if getattr(self.train, f.name) != getattr(TrainConfig(), f.name)
        }
        return TrainConfig(**{**command_defaults, **own})


_FASTEST = ExecutionConfig(remat=FASTEST)
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "tft225",
            "TFT-225 as specified, this platform's fastest remat tier",
            TFTConfig(execution=_FASTEST),
        ),
        Preset(
            "tft225-gpu",
            "TFT-225 on an NVIDIA GPU: bf16, the Pallas kernels, --remat auto",
            TFTConfig(
                execution=ExecutionConfig(remat="auto", precision="bf16", kernels=Kernels.PALLAS)
            ),
        ),
        Preset(
            "small",
            "d 32: a few thousand training windows (daily bars over decades)",
            TFTConfig(
                model=ModelConfig(hidden=32, d_v=4, heads=2, dropout=0.2), execution=_FASTEST
            ),
        ),
        # a few thousand windows, estimated to the optimum: half small's width, more dropout,
        # the head anchored on the baseline chosen on validation, and its training settings
        Preset(
            "compact",
            "d 16, anchored, with --ema 0.9, 4 checks an epoch, --smooth 3",
            TFTConfig(
                model=ModelConfig(hidden=16, d_v=4, heads=2, dropout=0.3),
                head=HeadConfig(anchor="auto"),
                execution=_FASTEST,
            ),
            TrainConfig(batch_size=32, evals_per_epoch=4, ema=0.9, smooth=3, patience=8),
        ),
        Preset(
            "tiny",
            "20 + 5 steps, d 16, three quantiles, no remat: tests and smoke runs",
            TFTConfig(
                model=ModelConfig(hidden=16, d_v=4, heads=2),
                head=HeadConfig(quantiles=(0.1, 0.5, 0.9)),
                execution=ExecutionConfig(remat="off", vsn_chunk=64),
                data=DataConfig(encoder_steps=20, decoder_steps=5),
            ),
            anchored_by_default=False,
        ),
    )
}
assert tuple(PRESETS) == PRESET_NAMES


def get_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
      ConfigError: no such preset.
    """
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def preset(name: str, **overrides: Any) -> TFTConfig:
    """The model config of preset ``name`` with single fields overridden by name
    (:meth:`TFTConfig.override`): ``preset("tiny", remat="off", hidden=8)``."""
    return get_preset(name).model.override(**overrides)
