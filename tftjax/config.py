"""Frozen configuration dataclasses of the data pipeline, the TFT and its training (the
DQN's are in :mod:`tftjax.dqn.config`).

One config object travels through each layer ("global hyperparameters used to
minimize obnoxious kwarg plumbing", flax wmt); presets shrink runs for tests.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Literal

import tyro

from tftjax.errors import ConfigError

# TFT-225 layout (see ../shared/design/tft_spec.md).
NUM_STATIC = 5
NUM_HISTORICAL = 210
NUM_KNOWN = 10
ENCODER_STEPS = 50
DECODER_STEPS = 10
LOOKBACKS = (2, 3, 5, 8, 10, 13, 15, 20, 25, 30, 40, 60, 90, 120)
"""Look-back windows (bars) of the historical feature families (tftjax.data.features)."""
WARMUP = max(LOOKBACKS)
"""Rows before this index have incomplete look-backs: never an encoder row."""


def check(checks: dict[str, bool], where: str) -> None:
    """Raise one :class:`ConfigError` listing every message whose check is ``False``."""
    bad = [msg for msg, ok in checks.items() if not ok]
    if bad:
        raise ConfigError(f"{where}: " + "; ".join(bad))


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


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
    bar_interval: str | None = None
    """Nominal bar interval (1min, 5min, 1h, 1d ...); default: the median step of the training
    rows. Decoder step k's known inputs are those of the forecast time plus k intervals."""
    calendar: str | None = None
    """Exchange calendar for session inputs and the future slots: XCME (CME Globex), XNYS, XLON,
    24/7 ... (exchange_calendars names; the calendars extra). Default: none (clock only)."""
    timezone: str | None = None
    """Wall clock of the calendar features, e.g. America/Chicago; default: the data's own zone
    (tz-aware timestamps), else the calendar's, else the timestamps as stored."""
    winsorize: float = 0.001
    """The target scale is the std of training returns winsorised at this tail quantile (0: the
    plain std), so that one bad print cannot set it."""
    target_clip: float = 20.0
    """Targets (returns in target scales) are clipped to +-this for training and evaluation
    (0: no clip)."""

    @property
    def window(self) -> int:
        return self.encoder_steps + self.decoder_steps

    @property
    def embargo_rows(self) -> int:
        return self.window if self.embargo is None else self.embargo

    def __post_init__(self) -> None:
        check({
            f"encoder_steps and decoder_steps must be >= 1, got {self.encoder_steps}, "
            f"{self.decoder_steps}": self.encoder_steps >= 1 and self.decoder_steps >= 1,
            f"train_fraction must be in (0, 1), got {self.train_fraction}":
                0 < self.train_fraction < 1,
            f"val_fraction must be in [0, 1), got {self.val_fraction}": 0 <= self.val_fraction < 1,
            "train_fraction + val_fraction must be < 1 (test needs rows)":
                self.train_fraction + self.val_fraction < 1,
            f"embargo must be >= 0, got {self.embargo}": self.embargo is None or self.embargo >= 0,
            f"winsorize must be in [0, 0.5), got {self.winsorize}": 0 <= self.winsorize < 0.5,
            f"target_clip must be >= 0 (0: off), got {self.target_clip}":
                _finite(self.target_clip) and self.target_clip >= 0,
        }, "DataConfig")  # fmt: skip
        if self.bar_interval is not None:
            from tftjax.data.calendar import parse_interval

            parse_interval(self.bar_interval)
        if self.timezone is not None:
            from tftjax.data.calendar import check_zone

            check_zone(self.timezone)


DEFAULT_QUANTILES = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)


@dataclasses.dataclass(frozen=True)
class TFTConfig:
    """The Temporal Fusion Transformer's sizes (see tft_spec.md)."""

    # The input widths are fixed by the feature pipeline: not command-line flags.
    num_static: tyro.conf.Suppress[int] = NUM_STATIC
    num_historical: tyro.conf.Suppress[int] = NUM_HISTORICAL
    num_known: tyro.conf.Suppress[int] = NUM_KNOWN
    encoder_steps: int = ENCODER_STEPS
    """Past steps the encoder sees."""
    decoder_steps: int = DECODER_STEPS
    """Forecast horizon in bars."""
    hidden: Annotated[int, tyro.conf.arg(name="hidden-size", aliases=("--hidden",))] = 128
    """d: width of every hidden layer."""
    d_v: int = 8
    """Per-variable embedding size (pytorch-forecasting's hidden_continuous_size)."""
    heads: int = 4
    """Attention heads (hidden must be divisible by heads)."""
    dropout: float = 0.1
    quantiles: tuple[float, ...] = DEFAULT_QUANTILES
    """Forecast quantiles, increasing in (0, 1); must include 0.5 and 0.9 (q-risk)."""
    vsn_chunk: int = 20
    """Variables per scan step in the variable selection networks where they run in chunks
    (``aggressive``/``offload``, and QAT under ``full``; float ``full`` runs the fused kernel,
    one variable per step)."""
    # The CLIs take --remat themselves (it also accepts `auto`).
    remat: tyro.conf.Suppress[str] = "off"
    """Rematerialisation tier (tftjax.remat.TIERS)."""
    lstm_forget_bias: float = 1.0
    """Initial bias of the LSTMs' forget gates (1.0, Jozefowicz et al.: remember by default;
    it lowered the P90 q-risk on S&P daily and BTC hourly in experiments/forecast_skill.py)."""
    monotone_quantiles: bool = False
    """Non-crossing quantiles: the head predicts the median and softplus gaps to its
    neighbours, so that the forecast quantiles are increasing by construction."""
    vol_target: bool = False
    """Volatility-style target: the network forecasts each window's returns in units of the
    EWMA volatility (RiskMetrics, λ 0.94) at its forecast time and its quantiles are multiplied
    by that volatility (the loss stays in return units). Default: returns in the training
    scale only, so the network must learn the level of volatility itself."""
    qat: bool = False
    """Quantization-aware training: int8 fake-quant weights (per output channel) and
    activations (moving-average min/max observers) in the layers --qat-layers names."""
    qat_freeze_after: int | None = None
    """Freeze the activation observers after this many training steps (default: never)."""
    bar_interval: str | None = None
    """Nominal bar interval (1min, 5min, 1h, 1d ...); default: the median step of the training
    rows. Decoder step k's known inputs are those of the forecast time plus k intervals."""
    calendar: str | None = None
    """Exchange calendar: its sessions, breaks, early closes and holidays become known inputs
    and place the decoder steps (XCME, XNYS, XLON, 24/7 ...; the calendars extra). Default:
    none (clock and weekday only)."""
    timezone: str | None = None
    """Wall clock of the calendar features, e.g. America/Chicago; default: the data's own zone
    (tz-aware timestamps), else the calendar's, else the timestamps as stored."""
    winsorize: float = 0.001
    """Target scale: std of the training returns winsorised at this tail quantile and at least
    the 5 most extreme values of each tail (0: the plain std)."""
    target_clip: float = 20.0
    """Clip targets to +-this many target scales, in training and evaluation (0: off)."""
    qat_layers: tuple[str, ...] = ("*",)
    """Layers to quantize, as fnmatch patterns over their paths: Dense modules
    (e.g. 'attention/*', 'quantiles', 'encoder_vsn/weights/*'), stacked and LSTM kernels
    ('*_vsn/glu_k', 'lstm_*/w_h'); default: every Dense and stacked/LSTM kernel."""

    # Execution settings: they change memory and speed, not the parameters or (beyond
    # float round-off) the results, so a resumed run may change them.
    EXECUTION_FIELDS = ("remat", "vsn_chunk")
    # Settings that change neither the parameters' shapes nor their initial values (how the
    # network runs, what it is fed): models that differ only in these share one init.
    INIT_NEUTRAL_FIELDS = EXECUTION_FIELDS + (
        "dropout", "monotone_quantiles", "vol_target", "qat_freeze_after", "bar_interval",
        "calendar", "timezone", "winsorize", "target_clip")

    def __post_init__(self) -> None:
        from tftjax.remat import TIERS

        qs = tuple(self.quantiles)
        check({
            f"num_static, num_historical and num_known must be >= 1, got {self.num_static}, "
            f"{self.num_historical}, {self.num_known}":
                min(self.num_static, self.num_historical, self.num_known) >= 1,
            f"encoder_steps and decoder_steps must be >= 1, got {self.encoder_steps}, "
            f"{self.decoder_steps}": self.encoder_steps >= 1 and self.decoder_steps >= 1,
            f"hidden size must be >= 1, got {self.hidden}": self.hidden >= 1,
            f"d_v must be >= 1, got {self.d_v}": self.d_v >= 1,
            f"heads must be >= 1, got {self.heads}": self.heads >= 1,
            f"hidden size ({self.hidden}) must be divisible by heads ({self.heads})":
                self.heads < 1 or self.hidden % self.heads == 0,
            f"dropout must be in [0, 1), got {self.dropout}":
                _finite(self.dropout) and 0 <= self.dropout < 1,
            f"quantiles must be increasing in (0, 1), got {qs}":
                len(qs) > 0 and all(0 < q < 1 for q in qs)
                and all(a < b for a, b in zip(qs, qs[1:])),
            f"quantiles must include 0.5 and 0.9 (for q-risk), got {qs}":
                any(math.isclose(q, 0.5) for q in qs) and any(math.isclose(q, 0.9) for q in qs),
            f"vsn_chunk must be >= 1, got {self.vsn_chunk}": self.vsn_chunk >= 1,
            f"remat tier {self.remat!r} is not one of {', '.join(TIERS)}": self.remat in TIERS,
            f"--qat-freeze-after must be >= 1 (observers need one batch), got "
            f"{self.qat_freeze_after}": self.qat_freeze_after is None or self.qat_freeze_after >= 1,
            "--qat-freeze-after and --qat-layers need --qat":
                self.qat or (self.qat_freeze_after is None and tuple(self.qat_layers) == ("*",)),
            "--qat-layers must name at least one pattern": len(self.qat_layers) > 0,
        }, "model config")  # fmt: skip
        self.data  # noqa: B018 - validates the data options

    @property
    def data(self) -> DataConfig:
        return DataConfig(encoder_steps=self.encoder_steps, decoder_steps=self.decoder_steps,
                          bar_interval=self.bar_interval, calendar=self.calendar,
                          timezone=self.timezone, winsorize=self.winsorize,
                          target_clip=self.target_clip)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "TFTConfig":
        d = dict(d)
        d["quantiles"] = tuple(d["quantiles"])
        if "qat_layers" in d:
            d["qat_layers"] = tuple(d["qat_layers"])
        return cls(**d)

    def float_twin(self) -> "TFTConfig":
        """The same model without quantization (what ``--init-from`` compares)."""
        return dataclasses.replace(self, qat=False, qat_freeze_after=None, qat_layers=("*",))


PRESETS = {
    "tft225": TFTConfig(),
    # for a few thousand training windows (daily bars over decades, a few months of hours)
    "small": TFTConfig(hidden=32, d_v=4, heads=2, dropout=0.2),
    "tiny": TFTConfig(encoder_steps=20, decoder_steps=5, hidden=16, d_v=4, heads=2,
                      quantiles=(0.1, 0.5, 0.9), vsn_chunk=64),
}


def preset(name: str, **overrides) -> TFTConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How the TFT is optimised: everything here is checked on ``--resume`` (only ``epochs``
    may grow)."""

    epochs: int = 10
    """Maximum epochs."""
    batch_size: int = 64
    """Windows per step."""
    learning_rate: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    decay_all: bool = True
    """Weight decay on every parameter; --no-decay-all keeps it off LayerNorms, biases and the
    per-variable input embeddings (decay on weight matrices only)."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """Learning rate over the run: constant, or cosine decay to 0 over all steps of --epochs."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up from 0 over this many steps."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    seed: int = 0
    """Initialisation, shuffling and dropout."""
    patience: int = 5
    """Early stop after this many epochs without a better validation loss (0: off); the
    final checkpoint, summary and plots then hold the best epoch's weights."""
    max_steps_per_epoch: int | None = None
    """Cap the steps of an epoch (default: every training window once)."""
    eval_batch_size: int = 256
    """Windows per evaluation batch."""
    accumulate: int = 1
    """Gradient accumulation: run each batch as this many micro-batches of batch/K windows
    inside the jitted step (gradients summed in float32, one optimizer update): the update of
    the whole batch at the peak memory of one micro-batch."""
    init_from: str | None = None
    """Start from the weights of this checkpoint or run folder (its final checkpoint): the
    same model and data, e.g. a float run to fine-tune with --qat."""

    def __post_init__(self) -> None:
        check({
            f"epochs must be >= 1, got {self.epochs}": self.epochs >= 1,
            f"batch_size must be >= 1, got {self.batch_size}": self.batch_size >= 1,
            f"learning_rate must be a finite number >= 0, got {self.learning_rate}":
                _finite(self.learning_rate) and self.learning_rate >= 0,
            f"weight_decay must be a finite number >= 0, got {self.weight_decay}":
                _finite(self.weight_decay) and self.weight_decay >= 0,
            f"grad_clip must be > 0, got {self.grad_clip}":
                _finite(self.grad_clip) and self.grad_clip > 0,
            f"seed must be in [0, 2**32), got {self.seed}": 0 <= self.seed < 2**32,
            f"patience must be >= 0, got {self.patience}": self.patience >= 0,
            f"max_steps_per_epoch must be >= 1, got {self.max_steps_per_epoch}":
                self.max_steps_per_epoch is None or self.max_steps_per_epoch >= 1,
            f"eval_batch_size must be >= 1, got {self.eval_batch_size}": self.eval_batch_size >= 1,
            f"warmup_steps must be >= 0, got {self.warmup_steps}": self.warmup_steps >= 0,
            f"accumulate must be >= 1, got {self.accumulate}": self.accumulate >= 1,
            f"batch_size {self.batch_size} is not divisible by --accumulate {self.accumulate}":
                self.accumulate < 1 or self.batch_size % self.accumulate == 0,
        }, "training config")  # fmt: skip

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "TrainConfig":
        return cls(**d)
