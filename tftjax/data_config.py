"""How bars become windows: :class:`DataConfig` and the TFT-225 layout (also importable
from :mod:`tftjax.config`)."""

from __future__ import annotations

import dataclasses

import tyro

from tftjax.errors import check
from tftjax.errors import finite as _finite

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
    target: str = "bar"
    """Decoder step k's target: ``bar``, the k-th bar's own 1-bar return, or ``cumulative``,
    the k-bar cumulative return from the origin (what risk and sizing read)."""
    features: str = "v1"
    """The 210 historical inputs: ``v1``, the 15 families of tftjax.data.features; ``v2``,
    the same with the volatility families in logs and the winners' inputs (the log
    Parkinson+gap variance, its 1-120-bar means, the EWMA and range-EWMA anchors' log
    volatility) in place of the mean log range."""
    normalise: str = "train"
    """How historical inputs are z-scored: ``train``, by the training rows' mean and std;
    ``expanding``, by those of every row up to each one; ``rolling``, of the last
    --normalise-window rows (both causal: a row's z-score reads no later row)."""
    normalise_window: int = 500
    """Rows of the rolling z-score (--normalise rolling)."""
    # From the model's config (TFTConfig.data): the --anchor whose arrays ride on every row.
    anchor: tyro.conf.Suppress[str] = "none"
    anchor_quantiles: tyro.conf.Suppress[tuple[float, ...]] = ()

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
            f"--target must be one of {', '.join(TARGETS)}, got {self.target!r}":
                self.target in TARGETS,
            f"--features must be one of {', '.join(FEATURE_SETS)}, got {self.features!r}":
                self.features in FEATURE_SETS,
            f"--normalise must be one of {', '.join(NORMALISATIONS)}, got {self.normalise!r}":
                self.normalise in NORMALISATIONS,
            f"--normalise-window must be >= 20 rows, got {self.normalise_window}":
                self.normalise_window >= 20,
        }, "DataConfig")  # fmt: skip
        if self.bar_interval is not None:
            from tftjax.data.calendar import parse_interval

            parse_interval(self.bar_interval)
        if self.timezone is not None:
            from tftjax.data.calendar import check_zone

            check_zone(self.timezone)



TARGETS = ("bar", "cumulative")
FEATURE_SETS = ("v1", "v2")
NORMALISATIONS = ("train", "expanding", "rolling")
