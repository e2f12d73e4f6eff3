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


@dataclasses.dataclass(frozen=True)
class DQNConfig:
    """The DQN trader (or CartPole agent) and its training loop."""

    env: str = "trading"
    """``trading`` (bars from a parquet file) or ``cartpole`` (gymnax CartPole-v1)."""
    # trading environment
    window: int = 16
    """Bars of features in one observation."""
    features: tuple[str, ...] = ("r1", "ret_5", "ret_20", "ret_60", "rvol_10", "rvol_60", "clv_20",
                                 "vz_20", "rsi_13", "sma_30", "tod_sin", "tod_cos")
    episode_len: int = 256
    """Decisions per training episode (a random contiguous segment of the training rows)."""
    cost_bps: float = 1.0
    """Transaction cost in basis points per unit of position change."""
    reward_scale: float = 1e4
    """Learning reward = env reward × this (trading: 1e4, log returns in basis points)."""
    # loop
    epochs: int = 100
    steps_per_epoch: int | None = None
    """Env steps per epoch; ``None``: the training split's length (trading), 10,000 (cartpole)."""
    num_envs: int = 8
    # agent
    hidden: tuple[int, ...] = (128, 128)
    learning_rate: float = 3e-4
    lr_end_fraction: float = 1.0
    """The learning rate falls linearly to this fraction of itself over the run (1: constant)."""
    max_grad_norm: float = 10.0
    huber_delta: float = 1.0
    """Huber loss: quadratic within ±delta of the target, linear outside."""
    gamma: float = 0.9
    batch_size: int = 64
    buffer_size: int = 50_000
    learning_starts: int = 1_000
    """Env steps collected before the first gradient update."""
    train_every: int = 1
    """Loop iterations (each ``num_envs`` env steps) per gradient update."""
    target_update_every: int = 250
    """Gradient updates between target-network updates."""
    tau: float = 1.0
    """Target update: 1 = hard copy, < 1 = Polyak averaging."""
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_decay_steps: int | None = None
    """Env steps over which ε falls linearly; ``None``: 30% of the run's env steps."""
    seed: int = 0

    def __post_init__(self) -> None:
        checks = {
            "env must be 'trading' or 'cartpole'": self.env in ("trading", "cartpole"),
            "window must be >= 1": self.window >= 1,
            "features must not be empty": len(self.features) > 0,
            "episode_len must be >= 1": self.episode_len >= 1,
            "cost_bps must be >= 0": self.cost_bps >= 0,
            "reward_scale must be > 0": self.reward_scale > 0,
            "epochs must be >= 1": self.epochs >= 1,
            "steps_per_epoch must be >= 1": self.steps_per_epoch is None or self.steps_per_epoch >= 1,
            "num_envs must be >= 1": self.num_envs >= 1,
            "hidden sizes must be >= 1": all(h >= 1 for h in self.hidden),
            "learning_rate must be > 0": self.learning_rate > 0,
            "lr_end_fraction must be in [0, 1]": 0 <= self.lr_end_fraction <= 1,
            "max_grad_norm must be > 0": self.max_grad_norm > 0,
            "gamma must be in [0, 1)": 0 <= self.gamma < 1,
            "huber_delta must be > 0": self.huber_delta > 0,
            "batch_size must be >= 1": self.batch_size >= 1,
            "buffer_size must be >= num_envs": self.buffer_size >= self.num_envs,
            "learning_starts must be >= batch_size": self.learning_starts >= self.batch_size,
            "train_every must be >= 1": self.train_every >= 1,
            "target_update_every must be >= 1": self.target_update_every >= 1,
            "tau must be in (0, 1]": 0 < self.tau <= 1,
            "eps_start and eps_end must be in [0, 1]": 0 <= self.eps_end <= 1 and 0 <= self.eps_start <= 1,
            "eps_decay_steps must be >= 1": self.eps_decay_steps is None or self.eps_decay_steps >= 1,
        }  # fmt: skip
        bad = [msg for msg, ok in checks.items() if not ok]
        if bad:
            raise ValueError("; ".join(bad))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "DQNConfig":
        d = dict(d)
        d["features"], d["hidden"] = tuple(d["features"]), tuple(d["hidden"])
        return cls(**d)


DQN_PRESETS = {
    "trading": DQNConfig(),
    # Verification on gymnax CartPole-v1. Rewards are scaled by 0.1 so that Q (<= 10) stays
    # mostly inside the Huber loss's quadratic zone; a 50k-transition buffer and a target copy
    # every 100 updates kept all seeds stable (10k and every-50 diverged: see the README).
    "cartpole": DQNConfig(env="cartpole", epochs=20, steps_per_epoch=10_000, num_envs=8,
                          hidden=(64, 64), learning_rate=1e-3, gamma=0.99, batch_size=64,
                          buffer_size=50_000, learning_starts=1_000, train_every=1,
                          target_update_every=100, eps_decay_steps=20_000, eps_end=0.02,
                          reward_scale=0.1, max_grad_norm=10.0),
}
