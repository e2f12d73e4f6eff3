"""Frozen configuration dataclasses of the data pipeline, the TFT and its training (the
DQN's are in :mod:`tftjax.dqn.config`).

One config object travels through each layer ("global hyperparameters used to
minimize obnoxious kwarg plumbing", flax wmt); presets shrink runs for tests.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated

import tyro

from tftjax.errors import ConfigError, check
from tftjax.errors import finite as _finite
from tftjax.train_config import TrainConfig

from tftjax.data_config import (  # noqa: F401 - the layout's names, importable from here
    DECODER_STEPS, ENCODER_STEPS, FEATURE_SETS, LOOKBACKS, NORMALISATIONS, NUM_HISTORICAL,
    NUM_KNOWN, NUM_STATIC, TARGETS, WARMUP, DataConfig)


PRECISIONS = ("f32", "bf16")
MATMUL_PRECISIONS = ("default", "high", "highest")
DEFAULT_QUANTILES = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)
ANCHOR_CHOICES = ("none", "auto", "ewma_empirical", "range_ewma", "har")  # volatility.ANCHORS


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
    vsn_chunk: int | None = None
    """Variables per chunk where the variable selection networks run in chunks (CPU:
    ``aggressive``/``offload``, and QAT under ``full``; GPU: every tier but ``off``); default:
    the tier's plan (tftjax.remat: 20 on CPU, 10 on a GPU). Float ``full`` on CPU runs the
    fused kernel, one variable per step."""
    # The CLIs take --remat themselves (it also accepts `auto`).
    remat: tyro.conf.Suppress[str] = "off"
    """Rematerialisation tier (tftjax.remat.TIERS)."""
    lstm_forget_bias: float = 1.0
    """Initial bias of the LSTMs' forget gates (1.0, Jozefowicz et al.; chosen on validation:
    S&P's walk-forward fold 1, before every test target, P90 0.4715 against 0's 0.4809)."""
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
    target: str = "bar"
    """Decoder step k's target: bar (the k-th bar's 1-bar log return) or cumulative (the k-bar
    log return from the origin: quantiles of the price k bars ahead)."""
    features: str = "v1"
    """Historical inputs: v1 (15 families), or v2 (volatility families in logs; the log
    Parkinson+gap variance, its means and the anchors' log volatility replace the mean range)."""
    normalise: str = "train"
    """Z-scores of the historical inputs: train (the training rows' mean and std), expanding or
    rolling (of the rows up to each one; causal)."""
    normalise_window: int = 500
    """Rows of --normalise rolling."""
    precision: str = "f32"
    """Compute precision: f32, or bf16 (parameters and the optimizer stay float32; matmuls and
    stored activations run in bfloat16; LayerNorm statistics, softmax, the LSTM cell state,
    the quantile head and the loss stay float32). Not with --qat."""
    matmul_precision: str = "default"
    """Float32 matmul precision (jax.default_matmul_precision): default (the backend's: TF32
    on NVIDIA GPUs), high, or highest (full float32)."""
    vsn_kernel: str = "xla"
    """How the float VSNs' per-variable GRNs run: xla (the remat tier's plan), or pallas (two
    Pallas/Triton GPU kernels, forward and recomputing backward, in every tier: nothing
    [m, N, ·] reaches HBM, tftjax.models.pallas_vsn). pallas is for NVIDIA GPUs (and
    --target); on CPU it runs in Pallas' interpreter, for tests only."""
    lstm_kernel: str = "xla"
    """How the float LSTMs' recurrences run: xla (lax.scans, about seven kernel launches per
    step each way on a GPU), or pallas (one persistent Pallas/Triton kernel each way,
    tftjax.models.pallas_lstm). pallas is for NVIDIA GPUs (and --target); on CPU it runs in
    Pallas' interpreter, for tests only."""
    grn_kernel: str = "xla"
    """How the float GRNs and gates outside the VSNs run: xla (about 200 GPU launches), or
    pallas (Pallas/Triton kernels: tftjax.models.pallas_grn for the four static context
    GRNs, pallas_gated for the rest; widths as pallas_grn.supported)."""
    attention_kernel: str = "xla"
    """How the attention's softmax and mix run: xla (about 25 GPU launches), or pallas (one
    Pallas/Triton kernel each way, tftjax.models.pallas_attention). Every pallas kernel is
    for NVIDIA GPUs (and --target); on CPU it runs in Pallas' interpreter, for tests only."""
    optimizer_kernel: str = "xla"
    """How the optimizer step (global-norm clip, AdamW, the update) runs: xla (optax: one
    reduction and one update kernel per parameter leaf on a GPU), or pallas (one norm kernel
    and one update kernel per 48 leaves, tftjax.training.pallas_adamw; the same arithmetic and
    optimizer state). pallas is for NVIDIA GPUs (and --target); on CPU it runs in Pallas'
    interpreter, for tests only."""
    platform: tyro.conf.Suppress[str | None] = None
    """The backend the remat plan is for (tftjax.remat.plan): None, the one running; set
    when compiling for another (python -m tftjax.memory --target)."""
    instruments: tyro.conf.Suppress[int] = 0
    """Instruments in the embedding vocabulary of static input 0 (set from the training data:
    one learned row each and one reserved row for an unknown instrument); 0: no embedding (a
    model from before vocabularies: static input 0 is then a real-valued code)."""
    instrument_dropout: float = 0.1
    """Share of training windows whose instrument is replaced by the vocabulary's unknown row,
    so that the row learns a pooled instrument (what --unknown-instrument embed serves)."""
    qat_layers: tuple[str, ...] = ("*",)
    """Layers to quantize, as fnmatch patterns over their paths: Dense modules
    (e.g. 'attention/*', 'quantiles', 'encoder_vsn/weights/*'), stacked and LSTM kernels
    ('*_vsn/glu_k', 'lstm_*/w_h'); default: every Dense and stacked/LSTM kernel."""
    act_symmetric: bool = False
    """Quantized: symmetric int8 activations (zero point 0, scale max|x|/127.5) for int8
    kernels without zero points; default: asymmetric (PyTorch's per_tensor_affine)."""
    weight_granularity: str = "channel"
    """Quantized Dense and LSTM kernels: one scale per output channel, or per tensor."""
    stacked_scales: str = "channel"
    """Quantized stacked per-variable GRN kernels: one scale per (variable, output channel),
    or one per variable (fewer scale bytes)."""
    anchor: str = "none"
    """Anchor the quantile head on a volatility baseline: quantile q is its volatility forecast
    σ × exp(s) × (its standardised quantile z_q + Δ_q), s and Δ from a zero-initialised last
    layer (untrained: the anchor's own quantiles). none, auto (of ewma_empirical, range_ewma,
    and har on daily bars: the lowest P90 q-risk on validation), or one of those."""
    anchor_median: str = "learnt"
    """With --anchor: the median's level learnt (z_0.5 + Δ_0.5), or zero (fixed at 0)."""
    anchor_loss: str = "return"
    """With --anchor: the pinball loss in return units, or vol (divided by the anchor's σ)."""
    ensemble: int = 1
    """Members trained side by side in one vmapped program, each from its own seed (init and
    dropout; the same batches), each on its own loss and optimizer state: the forecast is
    their quantiles averaged (pinball loss is convex: never worse than the members' mean)."""

    # Execution settings: they change memory and speed, not the parameters or (beyond
    # float round-off) the results, so a resumed run may change them.
    KERNEL_FIELDS = ("vsn_kernel", "lstm_kernel", "grn_kernel", "attention_kernel",
                     "optimizer_kernel")
    """The settings that choose a Pallas kernel (xla or pallas)."""

    def pallas_flags(self) -> str:
        """The Pallas kernels chosen, as their flags ("--vsn-kernel pallas and …"; "" none)."""
        on = [f"--{f.replace('_', '-')} pallas" for f in self.KERNEL_FIELDS
              if getattr(self, f) == "pallas"]
        return " and ".join(on) if len(on) < 3 else ", ".join(on[:-1]) + " and " + on[-1]

    EXECUTION_FIELDS = ("remat", "vsn_chunk", "precision", "matmul_precision", "platform",
                        *KERNEL_FIELDS)
    # Settings that change neither the parameters' shapes nor their initial values (how the
    # network runs, what it is fed): models that differ only in these share one init.
    INIT_NEUTRAL_FIELDS = EXECUTION_FIELDS + (
        "dropout", "monotone_quantiles", "vol_target", "qat_freeze_after", "bar_interval",
        "calendar", "timezone", "winsorize", "target_clip", "instrument_dropout", "target",
        "act_symmetric", "weight_granularity", "stacked_scales", "anchor_median", "anchor_loss")

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
            f"instruments must be >= 0, got {self.instruments}": self.instruments >= 0,
            f"--instrument-dropout must be in [0, 1), got {self.instrument_dropout}":
                _finite(self.instrument_dropout) and 0 <= self.instrument_dropout < 1,
            f"vsn_chunk must be >= 1, got {self.vsn_chunk}":
                self.vsn_chunk is None or self.vsn_chunk >= 1,
            f"remat tier {self.remat!r} is not one of {', '.join(TIERS)}": self.remat in TIERS,
            f"--qat-freeze-after must be >= 1 (observers need one batch), got "
            f"{self.qat_freeze_after}": self.qat_freeze_after is None or self.qat_freeze_after >= 1,
            "--qat-freeze-after and --qat-layers need --qat":
                self.qat or (self.qat_freeze_after is None and tuple(self.qat_layers) == ("*",)),
            "--qat-layers must name at least one pattern": len(self.qat_layers) > 0,
            f"--weight-granularity must be channel or tensor, got {self.weight_granularity!r}":
                self.weight_granularity in ("channel", "tensor"),
            f"--stacked-scales must be channel or variable, got {self.stacked_scales!r}":
                self.stacked_scales in ("channel", "variable"),
            "--act-symmetric, --weight-granularity and --stacked-scales need --qat (or a PTQ "
            "--calibrate)": self.qat or (not self.act_symmetric and self.weight_granularity
                                         == "channel" and self.stacked_scales == "channel"),
            f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}":
                self.precision in PRECISIONS,
            f"--vsn-kernel must be xla or pallas, got {self.vsn_kernel!r}":
                self.vsn_kernel in ("xla", "pallas"),
            f"--lstm-kernel must be xla or pallas, got {self.lstm_kernel!r}":
                self.lstm_kernel in ("xla", "pallas"),
            f"--grn-kernel must be xla or pallas, got {self.grn_kernel!r}":
                self.grn_kernel in ("xla", "pallas"),
            f"--attention-kernel must be xla or pallas, got {self.attention_kernel!r}":
                self.attention_kernel in ("xla", "pallas"),
            f"--optimizer-kernel must be xla or pallas, got {self.optimizer_kernel!r}":
                self.optimizer_kernel in ("xla", "pallas"),
            f"--matmul-precision must be one of {', '.join(MATMUL_PRECISIONS)}, got "
            f"{self.matmul_precision!r}": self.matmul_precision in MATMUL_PRECISIONS,
            "--precision bf16 and --qat do not go together (QAT's observers and fake-quant "
            "are float32)": not (self.qat and self.precision == "bf16"),
            f"--anchor must be one of {', '.join(ANCHOR_CHOICES)}, got {self.anchor!r}":
                self.anchor in ANCHOR_CHOICES,
            f"--anchor-median must be learnt or zero, got {self.anchor_median!r}":
                self.anchor_median in ("learnt", "zero"),
            f"--anchor-loss must be return or vol, got {self.anchor_loss!r}":
                self.anchor_loss in ("return", "vol"),
            f"--ensemble must be >= 1 member, got {self.ensemble}": self.ensemble >= 1,
            "--ensemble and --qat do not go together (one int8 model is exported, not N)":
                self.ensemble == 1 or not self.qat,
            "--anchor does not go with --vol-target or --monotone-quantiles (it sets the "
            "scale and the quantiles' order itself)": self.anchor == "none"
                or not (self.vol_target or self.monotone_quantiles),
        }, "model config")  # fmt: skip
        self.data  # noqa: B018 - validates the data options

    @property
    def data(self) -> DataConfig:
        return DataConfig(encoder_steps=self.encoder_steps, decoder_steps=self.decoder_steps,
                          bar_interval=self.bar_interval, calendar=self.calendar,
                          timezone=self.timezone, winsorize=self.winsorize,
                          target_clip=self.target_clip, target=self.target,
                          features=self.features, normalise=self.normalise,
                          normalise_window=self.normalise_window, anchor=self.anchor if self.anchor != "auto" else "none",
                          anchor_quantiles=tuple(self.quantiles) if self.anchor not in
                          ("none", "auto") else ())

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
        return dataclasses.replace(self, qat=False, qat_freeze_after=None, qat_layers=("*",),
                                   act_symmetric=False, weight_granularity="channel",
                                   stacked_scales="channel")


PRESETS = {
    "tft225": TFTConfig(),
    # for a few thousand training windows (daily bars over decades, a few months of hours)
    "small": TFTConfig(hidden=32, d_v=4, heads=2, dropout=0.2),
    "tiny": TFTConfig(encoder_steps=20, decoder_steps=5, hidden=16, d_v=4, heads=2,
                      quantiles=(0.1, 0.5, 0.9), vsn_chunk=64),
    # a few thousand windows, estimated to the optimum: half small's width, more dropout, the
    # head anchored on the baseline chosen on validation (with its training settings below)
    "compact": TFTConfig(hidden=16, d_v=4, heads=2, dropout=0.3, anchor="auto"),
}
PRESET_TRAINING = {
    "compact": {"batch_size": 32, "evals_per_epoch": 4, "ema": 0.9, "smooth": 3,
                "patience": 8},
}
"""Training settings a preset comes with (the command's own defaults otherwise; flags and
--config still win)."""


def preset_training(name: str, **defaults):
    """The command's training defaults with the preset's own (:data:`PRESET_TRAINING`)."""
    return TrainConfig(**{**defaults, **PRESET_TRAINING.get(name, {})})


def preset(name: str, **overrides) -> TFTConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)
