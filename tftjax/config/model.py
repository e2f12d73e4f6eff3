"""The TFT's configuration: :class:`TFTConfig`, five typed parts, and the reading of saved
configs of any layout.

=============  =========================================================================
``model``      :class:`ModelConfig`: the network's sizes and its inputs' widths
``head``       :class:`HeadConfig`: the quantiles and how the head forms them (anchor)
``quant``      :class:`QuantConfig`: quantization-aware training and the int8 layout
``execution``  :class:`~tftjax.config.execution.ExecutionConfig`: remat, precision, kernels
``data``       :class:`~tftjax.config.data.DataConfig`: windows, splits, target, inputs
=============  =========================================================================

Each field lives in one part (no copies); every field name is unique across the parts, so
``cfg.override(hidden=32, remat="full")`` and the command line's flat flags find theirs.
One config object travels through each layer ("global hyperparameters used to minimize
obnoxious kwarg plumbing", flax wmt).

A saved model config (a checkpoint's metadata, an export's ``config.json``) says its layout in
``schema``. Schema 1 (no ``schema`` key: tftjax before 0.2.0) is the flat 44-field
``TFTConfig`` with five per-family kernel switches; it is read into the five parts field by
field.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from tftjax.config.data import NUM_HISTORICAL, NUM_KNOWN, NUM_STATIC, RETURNS, DataConfig
from tftjax.config.execution import LEGACY_KERNEL_FLAGS, ExecutionConfig, legacy_kernels
from tftjax.config.fields import (
    choice_errors,
    coerce,
    field_types,
    from_json,
    is_neutral,
    setting,
    to_json,
)
from tftjax.errors import ConfigError, check, finite

DEFAULT_QUANTILES = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)
Anchor = Literal["none", "auto", "ewma_empirical", "range_ewma", "har"]
CONFIG_SCHEMA = 2
"""The layout of a saved model config: 1, the flat 44 fields before 0.2.0
(:mod:`tftjax.config.schema` reads it); 2, the five parts."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The network: its width, attention heads, dropout and input widths."""

    # The input widths are fixed by the feature pipeline: not command-line flags.
    num_static: int = setting(NUM_STATIC, cli=False)
    num_historical: int = setting(NUM_HISTORICAL, cli=False)
    num_known: int = setting(NUM_KNOWN, cli=False)
    hidden: int = setting(128, flag="hidden-size", aliases=("--hidden",))
    """d: width of every hidden layer."""
    d_v: int = 8
    """Per-variable embedding size (pytorch-forecasting's hidden_continuous_size)."""
    heads: int = 4
    """Attention heads (the hidden size must be divisible by them)."""
    dropout: float = setting(0.1, neutral=True)
    lstm_forget_bias: float = 1.0
    """Initial bias of the LSTMs' forget gates (1.0, Jozefowicz et al.; chosen on validation:
    S&P's walk-forward fold 1, before every test target, P90 0.4715 against 0's 0.4809)."""
    instruments: int = setting(0, cli=False)
    """Instruments in the embedding vocabulary of static input 0 (set from the training data:
    one learned row each and one reserved row for an unknown instrument); 0: no embedding (a
    model from before vocabularies: static input 0 is then a real-valued code)."""
    categories: tuple[int, ...] = setting((), cli=False)
    """Rows of each --categorical column's embedding table, in --categorical's order (set
    from the training rows' vocabularies: one row a level and one for an unknown level)."""
    instrument_dropout: float = setting(0.1, neutral=True)
    """Share of training windows whose instrument is replaced by the vocabulary's unknown row,
    so that the row learns a pooled instrument (what --unknown-instrument embed serves)."""
    ensemble: int = 1
    """Members trained side by side in one vmapped program, each from its own seed (init and
    dropout; the same batches), each on its own loss and optimizer state: the forecast is
    their quantiles averaged (pinball loss is convex: never worse than the members' mean)."""

    def __post_init__(self) -> None:
        check({
            f"input widths must be >= 1, got {self.num_static}, {self.num_historical}, "
            f"{self.num_known}": min(self.num_static, self.num_historical, self.num_known) >= 1,
            f"--hidden-size must be >= 1, got {self.hidden}": self.hidden >= 1,
            f"--d-v must be >= 1, got {self.d_v}": self.d_v >= 1,
            f"--heads must be >= 1, got {self.heads}": self.heads >= 1,
            f"--hidden-size ({self.hidden}) must be divisible by --heads ({self.heads})":
                self.heads < 1 or self.hidden % self.heads == 0,
            f"--dropout must be in [0, 1), got {self.dropout}":
                finite(self.dropout) and 0 <= self.dropout < 1,
            f"instruments must be >= 0, got {self.instruments}": self.instruments >= 0,
            f"--instrument-dropout must be in [0, 1), got {self.instrument_dropout}":
                finite(self.instrument_dropout) and 0 <= self.instrument_dropout < 1,
            f"--ensemble must be >= 1 member, got {self.ensemble}": self.ensemble >= 1,
            f"categories must be >= 2 rows each, got {self.categories}":
                all(c >= 2 for c in self.categories),
        }, "model config")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    """The forecast's quantiles, and how the head turns the network's outputs into them."""

    quantiles: tuple[float, ...] = DEFAULT_QUANTILES
    """Forecast quantiles, increasing in (0, 1); must include 0.5 and 0.9 (q-risk)."""
    monotone_quantiles: bool = setting(False, neutral=True)
    """Non-crossing quantiles: the head predicts the median and softplus gaps to its
    neighbours, so that the forecast quantiles are increasing by construction."""
    vol_target: bool = setting(False, neutral=True)
    """Volatility-style target: the network forecasts each window's returns in units of the
    EWMA volatility (RiskMetrics, λ 0.94) at its forecast time and its quantiles are multiplied
    by that volatility (the loss stays in return units). Default: returns in the training
    scale only, so the network must learn the level of volatility itself."""
    anchor: Anchor = "none"
    """Anchor the quantile head on a volatility baseline: quantile q is its volatility forecast
    σ × exp(s) × (its standardised quantile z_q + Δ_q), s and Δ from a zero-initialised last
    layer (untrained: the anchor's own quantiles). none, auto (of ewma_empirical, range_ewma,
    and har on daily bars: the lowest P90 q-risk on validation), or one of those. A new run
    of python -m tftjax.train or backtest takes auto unless an anchor is named (none where
    --vol-target or --monotone-quantiles is given)."""
    anchor_median: Literal["learnt", "zero"] = setting("learnt", neutral=True)
    """With --anchor: the median's level learnt (z_0.5 + Δ_0.5), or zero (fixed at 0)."""
    anchor_loss: Literal["return", "vol"] = setting("return", neutral=True)
    """With --anchor: the pinball loss in return units, or vol (divided by the anchor's σ)."""

    def __post_init__(self) -> None:
        qs = tuple(self.quantiles)
        check({
            f"--quantiles must be increasing in (0, 1), got {qs}":
                len(qs) > 0 and all(0 < q < 1 for q in qs)
                and all(a < b for a, b in zip(qs, qs[1:])),
            f"--quantiles must include 0.5 and 0.9 (for q-risk), got {qs}":
                any(math.isclose(q, 0.5) for q in qs) and any(math.isclose(q, 0.9) for q in qs),
            "--anchor does not go with --vol-target or --monotone-quantiles (it sets the "
            "scale and the quantiles' order itself)": self.anchor == "none"
                or not (self.vol_target or self.monotone_quantiles),
            **choice_errors(self),
        }, "head config")  # fmt: skip

    @property
    def anchored(self) -> bool:
        return self.anchor != "none"

    @property
    def dataset_anchor(self) -> tuple[str, tuple[float, ...]] | None:
        """What the data must carry for this head (``load_dataset(anchor=...)``): the chosen
        anchor and the quantiles, or None (no anchor, or ``auto`` before its choice)."""
        if self.anchor in ("none", "auto"):
            return None
        return self.anchor, tuple(self.quantiles)

    @property
    def median_index(self) -> int:
        return min(range(len(self.quantiles)), key=lambda i: abs(self.quantiles[i] - 0.5))


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """Quantization-aware training, and the int8 layout of a quantized model."""

    qat: bool = False
    """Quantization-aware training: int8 fake-quant weights (per output channel) and
    activations (moving-average min/max observers) in the layers --qat-layers names."""
    qat_freeze_after: int | None = setting(None, neutral=True)
    """Freeze the activation observers after this many training steps (default: never)."""
    qat_layers: tuple[str, ...] = ("*",)
    """Layers to quantize, as fnmatch patterns over their paths: Dense modules
    (e.g. 'attention/*', 'quantiles', 'encoder_vsn/weights/*'), stacked and LSTM kernels
    ('*_vsn/glu_k', 'lstm_*/w_h'); default: every Dense and stacked/LSTM kernel."""
    act_symmetric: bool = setting(False, neutral=True)
    """Quantized: symmetric int8 activations (zero point 0, scale max|x|/127.5) for int8
    kernels without zero points; default: asymmetric (PyTorch's per_tensor_affine)."""
    weight_granularity: Literal["channel", "tensor"] = setting("channel", neutral=True)
    """Quantized Dense and LSTM kernels: one scale per output channel, or per tensor."""
    stacked_scales: Literal["channel", "variable"] = setting("channel", neutral=True)
    """Quantized stacked per-variable GRN kernels: one scale per (variable, output channel),
    or one per variable (fewer scale bytes)."""

    def __post_init__(self) -> None:
        check({
            f"--qat-freeze-after must be >= 1 (observers need one batch), got "
            f"{self.qat_freeze_after}": self.qat_freeze_after is None or self.qat_freeze_after >= 1,
            "--qat-freeze-after and --qat-layers need --qat":
                self.qat or (self.qat_freeze_after is None and tuple(self.qat_layers) == ("*",)),
            "--qat-layers must name at least one pattern": len(self.qat_layers) > 0,
            "--act-symmetric, --weight-granularity and --stacked-scales need --qat (or a PTQ "
            "--calibrate)": self.qat or self.layout_is_default,
            **choice_errors(self),
        }, "quantization config")  # fmt: skip

    @property
    def layout_is_default(self) -> bool:
        return (
            not self.act_symmetric
            and self.weight_granularity == "channel"
            and self.stacked_scales == "channel"
        )


SECTIONS = {
    "model": ModelConfig,
    "head": HeadConfig,
    "quant": QuantConfig,
    "execution": ExecutionConfig,
    "data": DataConfig,
}
"""The parts of a :class:`TFTConfig`, by attribute name."""


@dataclasses.dataclass(frozen=True)
class TFTConfig:
    """The Temporal Fusion Transformer (docs/tft-spec.md): five typed parts."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    head: HeadConfig = dataclasses.field(default_factory=HeadConfig)
    quant: QuantConfig = dataclasses.field(default_factory=QuantConfig)
    execution: ExecutionConfig = dataclasses.field(default_factory=ExecutionConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)

    def __post_init__(self) -> None:
        check({
            "--precision bf16 and --qat do not go together (QAT's observers and fake-quant "
            "are float32)": not (self.quant.qat and self.execution.precision == "bf16"),
            "--ensemble and --qat do not go together (one int8 model is exported, not N)":
                self.model.ensemble == 1 or not self.quant.qat,
            f"categories ({len(self.model.categories)}) must give one table size for each "
            f"--categorical column ({len(self.data.categorical)})":
                not self.model.categories
                or len(self.model.categories) == len(self.data.categorical),
            "--anchor reads the bars' volatility: it needs their log returns as the target "
            "(--target-column close --target-transform log_return)":
                self.head.anchor == "none" or self.data.returns_target,
            "--vol-target scales changes: it needs --target-transform log_return or diff":
                not self.head.vol_target or self.data.target_transform in RETURNS,
        }, "model config")  # fmt: skip

    # ---- building and changing
    def override(self, **settings: Any) -> TFTConfig:
        """This config with fields of any part replaced by name (``hidden=32``,
        ``remat="full"``), or whole parts (``execution=ExecutionConfig(...)``). The old
        per-family kernel switches (``vsn_kernel="pallas"``) are still understood.

        Raises:
          ConfigError: a name no part has, or a value a part refuses.
        """
        old = {k: settings.pop(k) for k in list(settings) if k in LEGACY_KERNEL_FLAGS}
        parts: dict[str, dict[str, Any]] = {}
        whole = {}
        for name, value in settings.items():
            if name in SECTIONS:
                whole[name] = value
            else:
                parts.setdefault(section_of(name), {})[name] = value
        out = dataclasses.replace(
            self,
            **whole,
            **{
                s: dataclasses.replace(whole.get(s, getattr(self, s)), **kv)
                for s, kv in parts.items()
            },
        )
        if old:  # the five per-family switches before --kernels
            out = dataclasses.replace(
                out, execution=legacy_kernels(out.execution, old, "kernels" in settings)
            )
        return out

    def init_key(self) -> TFTConfig:
        """This config with every setting that changes neither the parameters' shapes nor
        their initial values at its default (the execution part whole): models with equal
        keys initialise to equal values (tested), so they share one compiled init."""
        return TFTConfig(
            **{name: _neutral_reset(getattr(self, name), name == "execution") for name in SECTIONS}
        )

    def float_twin(self) -> TFTConfig:
        """The same model without quantization (what ``--init-from`` compares)."""
        return dataclasses.replace(self, quant=QuantConfig())

    # ---- saved form
    def to_json(self) -> dict:
        return {**to_json(self), "schema": CONFIG_SCHEMA}

    @classmethod
    def from_json(cls, d: dict) -> TFTConfig:
        """A config from :meth:`to_json`'s dict, or from a saved schema-1 (flat) one.

        Raises:
          ConfigError: unknown fields, or values a part refuses.
        """
        return model_from_saved(d)


def section_of(name: str) -> str:
    """The part of :class:`TFTConfig` that holds field ``name``.

    Raises:
      ConfigError: no part has it.
    """
    for section, cls in SECTIONS.items():
        if name in {f.name for f in dataclasses.fields(cls)}:
            return section
    raise ConfigError(f"unknown model setting {name!r}")


def _neutral_reset(part: Any, whole: bool) -> Any:
    defaults = type(part)()
    return (
        defaults
        if whole
        else dataclasses.replace(
            part,
            **{
                f.name: getattr(defaults, f.name) for f in dataclasses.fields(part) if is_neutral(f)
            },
        )
    )


def from_parts(d: dict) -> TFTConfig:
    """A :class:`TFTConfig` from a schema-2 dict (``{"model": {...}, "head": {...}, ...}``)."""
    d = {k: v for k, v in d.items() if k != "schema"}
    return from_json(TFTConfig, d, "model config")


# ---- saved configs of any schema
def model_from_saved(d: dict) -> TFTConfig:
    """A saved model config of any schema.

    Raises:
      ConfigError: unknown fields, an unknown schema, or values today's config refuses.
    """
    schema = d.get("schema", 2 if any(isinstance(d.get(s), dict) for s in SECTIONS) else 1)
    if schema == 2:
        return from_parts(d)
    if schema != 1:
        raise ConfigError(f"model config schema {schema!r}: written by a newer tftjax")
    return TFTConfig().override(**flat_settings(d, "a saved model config"))


def flat_settings(d: dict, where: str, base: TFTConfig | None = None) -> dict[str, Any]:
    """Flat model settings (``{"hidden": 32, "vsn_kernel": "pallas"}``) as
    :meth:`TFTConfig.override` takes them: values typed as the fields are (tuples, enums),
    the old kernel switches applied to ``base``'s execution settings (default: the
    defaults') and given as a whole ``execution``.

    Raises:
      ConfigError: a name no part of the config has.
    """
    old = {k: v for k, v in d.items() if k in LEGACY_KERNEL_FLAGS}
    out: dict[str, Any] = {}
    for name, value in d.items():
        if name in old:
            continue
        try:
            section = section_of(name)
        except ConfigError:
            raise ConfigError(f"{where}: unknown model setting {name!r}") from None
        out[name] = coerce(field_types(SECTIONS[section])[name], value)
    if old:
        execution = (
            (base or TFTConfig())
            .override(**{k: v for k, v in out.items() if section_of(k) == "execution"})
            .execution
        )
        out = {k: v for k, v in out.items() if section_of(k) != "execution"}
        out["execution"] = legacy_kernels(execution, old, "kernels" in d)
    return out
