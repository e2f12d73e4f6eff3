"""Frozen configuration dataclasses shared by the data pipeline, models and CLIs.

One config object travels through each layer ("global hyperparameters used to
minimize obnoxious kwarg plumbing", flax wmt); presets shrink runs for tests.
"""

from __future__ import annotations

import dataclasses

# TFT-225 layout (see ../shared/design/tft_spec.md).
NUM_STATIC = 5
NUM_HISTORICAL = 210
NUM_KNOWN = 10
ENCODER_STEPS = 50
DECODER_STEPS = 10


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """How bars become windows."""

    encoder_steps: int = ENCODER_STEPS
    """Past steps seen by the encoder (historical + known inputs)."""
    decoder_steps: int = DECODER_STEPS
    """Forecast horizon: future steps with known inputs and a target each."""
    train_fraction: float = 0.70
    """Share of the usable rows (after feature warm-up) given to training."""
    val_fraction: float = 0.15
    """Share given to validation; the rest (less embargoes) is test."""
    embargo: int | None = None
    """Rows left out between splits; ``None`` means one full window."""

    @property
    def window(self) -> int:
        return self.encoder_steps + self.decoder_steps

    @property
    def embargo_rows(self) -> int:
        return self.window if self.embargo is None else self.embargo

    def __post_init__(self) -> None:
        if self.encoder_steps < 1 or self.decoder_steps < 1:
            raise ValueError("encoder_steps and decoder_steps must be >= 1")
        if not (0 < self.train_fraction < 1 and 0 <= self.val_fraction < 1):
            raise ValueError("train_fraction must be in (0, 1), val_fraction in [0, 1)")
        if self.train_fraction + self.val_fraction >= 1:
            raise ValueError("train_fraction + val_fraction must be < 1 (test needs rows)")
        if self.embargo is not None and self.embargo < 0:
            raise ValueError("embargo must be >= 0")
