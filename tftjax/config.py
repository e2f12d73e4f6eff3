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


DEFAULT_QUANTILES = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)


@dataclasses.dataclass(frozen=True)
class TFTConfig:
    """The Temporal Fusion Transformer's sizes (see tft_spec.md)."""

    num_static: int = NUM_STATIC
    num_historical: int = NUM_HISTORICAL
    num_known: int = NUM_KNOWN
    encoder_steps: int = ENCODER_STEPS
    decoder_steps: int = DECODER_STEPS
    hidden: int = 128
    """d: width of every hidden layer."""
    d_v: int = 8
    """Per-variable embedding size (pytorch-forecasting's hidden_continuous_size)."""
    heads: int = 4
    dropout: float = 0.1
    quantiles: tuple[float, ...] = DEFAULT_QUANTILES
    vsn_chunk: int = 20
    """Variables per checkpointed scan step in the VSNs (tiers that remat the VSNs)."""
    remat: str = "off"
    """Rematerialisation tier (tftjax.remat.TIERS)."""

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if not all(0 < q < 1 for q in self.quantiles) or list(self.quantiles) != sorted(self.quantiles):
            raise ValueError(f"quantiles must be increasing in (0, 1), got {self.quantiles}")
        if self.vsn_chunk < 1:
            raise ValueError("vsn_chunk must be >= 1")

    @property
    def data(self) -> DataConfig:
        return DataConfig(encoder_steps=self.encoder_steps, decoder_steps=self.decoder_steps)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "TFTConfig":
        d = dict(d)
        d["quantiles"] = tuple(d["quantiles"])
        return cls(**d)


PRESETS = {
    "tft225": TFTConfig(),
    "tiny": TFTConfig(encoder_steps=20, decoder_steps=5, hidden=16, d_v=4, heads=2,
                      quantiles=(0.1, 0.5, 0.9), vsn_chunk=64),
}


def preset(name: str, **overrides) -> TFTConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)
