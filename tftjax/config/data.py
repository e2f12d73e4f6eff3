"""How bars become windows: :class:`DataConfig`, and the TFT-225 layout (``docs/tft-spec.md``)."""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from tftjax.config.fields import choice_errors, setting
from tftjax.errors import ConfigError, check, finite

# TFT-225 layout (docs/tft-spec.md).
NUM_STATIC = 5
NUM_HISTORICAL = 210
NUM_KNOWN = 10
ENCODER_STEPS = 50
DECODER_STEPS = 10
LOOKBACKS = (2, 3, 5, 8, 10, 13, 15, 20, 25, 30, 40, 60, 90, 120)
"""Look-back windows (bars) of the historical feature families (tftjax.data.features)."""
WARMUP = max(LOOKBACKS)
"""Rows before this index have incomplete look-backs: never an encoder row."""

Target = Literal["bar", "cumulative"]
TargetTransform = Literal["log_return", "diff", "level", "log"]
Inputs = Literal["builtin", "own"]
RETURNS = ("log_return", "diff")
"""Transforms forecast as changes: their decoder targets sum over a gap, and may be
cumulative; ``level`` and ``log`` forecast the value at each step's slot."""
FeatureSet = Literal["v1", "v2"]
Normalisation = Literal["train", "expanding", "rolling"]
ROLES = ("static", "observed", "known")
"""The roles a column of your own takes (tftjax.data.covariates)."""
TARGETS: tuple[str, ...] = get_args(Target)
FEATURE_SETS: tuple[str, ...] = get_args(FeatureSet)
NORMALISATIONS: tuple[str, ...] = get_args(Normalisation)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """How bars become windows: their length, the splits, the calendar, the target and the
    historical inputs."""

    encoder_steps: int = ENCODER_STEPS
    """Past steps the encoder sees (historical + known inputs)."""
    decoder_steps: int = DECODER_STEPS
    """Forecast horizon in bars: future steps with known inputs and a target each."""
    train_fraction: float = 0.70
    """Share of the usable rows (after feature warm-up) given to training."""
    val_fraction: float = 0.15
    """Share given to validation; the rest (less embargoes) is test."""
    embargo: int | None = None
    """Rows left out between splits (default: one full window)."""
    bar_interval: str | None = setting(None, neutral=True)
    """Nominal bar interval (1min, 5min, 1h, 1d ...); default: the median step of the training
    rows. Decoder step k's known inputs are those of the forecast time plus k intervals."""
    calendar: str | None = setting(None, neutral=True)
    """Exchange calendar: its sessions, breaks, early closes and holidays become known inputs
    and place the decoder steps (XCME, XNYS, XLON, 24/7 ...; the calendars extra). Default:
    none (clock and weekday only)."""
    timezone: str | None = setting(None, neutral=True)
    """Wall clock of the calendar features, e.g. America/Chicago; default: the data's own zone
    (tz-aware timestamps), else the calendar's, else the timestamps as stored."""
    winsorize: float = setting(0.001, neutral=True)
    """Target scale: std of the training returns winsorised at this tail quantile and at least
    the 5 most extreme values of each tail (0: the plain std), so that one bad print cannot
    set it."""
    target_clip: float = setting(20.0, neutral=True)
    """Clip targets to +-this many target scales, in training and evaluation (0: off)."""
    target: Target = setting("bar", neutral=True)
    """Decoder step k's target: bar (the k-th bar's 1-bar log return) or cumulative (the k-bar
    log return from the origin: quantiles of the price k bars ahead)."""
    features: FeatureSet = "v1"
    """Historical inputs: v1 (15 families), or v2 (volatility families in logs; the log
    Parkinson+gap variance, its means and the anchors' log volatility replace the mean range)."""
    normalise: Normalisation = "train"
    """Z-scores of the historical inputs: train (the training rows' mean and std), expanding or
    rolling (of the rows up to each one; causal: a row's z-score reads no later row)."""
    normalise_window: int = 500
    """Rows of --normalise rolling."""
    observed: tuple[str, ...] = ()
    """Your own columns of the bars file known up to each bar (historical inputs, e.g. a
    funding rate): each is an input of the encoder beside a flag that says it was missing."""
    known: tuple[str, ...] = ()
    """Your own columns known in advance for every decoder step (e.g. a scheduled event):
    taken as scheduled, read at each decoder slot's own time (docs/covariates.md)."""
    static: tuple[str, ...] = ()
    """Your own columns with one value per series (e.g. a sector), from the bars file or
    --static-file."""
    categorical: tuple[str, ...] = ()
    """Which of the --observed, --known and --static columns are categories (embedded, a
    vocabulary from the training rows and an unknown bucket); the rest are reals."""
    static_file: str | None = setting(None, neutral=True)
    """A parquet or CSV table of the --static columns keyed by a symbol column (instead of
    reading them from the bars file)."""
    max_ffill: int | None = setting(None, neutral=True)
    """Bars an observed value missing from the file is carried forward (default: one
    window); past that, every window whose encoder holds it is left out, like a missing bar."""
    max_categories: int = setting(1000, neutral=True)
    """The most levels a --categorical column may have in the training rows."""
    target_column: str = "close"
    """The column to forecast (with --inputs own, any numeric column of the file)."""
    target_transform: TargetTransform = "log_return"
    """How the target column is forecast: log_return (log x_t - log x_{t-1}), diff
    (x_t - x_{t-1}), level (x_t) or log (log x_t); reported in the column's own units too."""
    inputs: Inputs = "builtin"
    """builtin: the 210 engineered features of OHLCV bars, the calendar and the statics (and
    your columns); own: your columns, the calendar and the target itself only, for a file
    that is not OHLCV bars (its price columns are then not needed)."""
    season: int | None = setting(None, neutral=True)
    """Bars in a season (e.g. 48 half-hours a day): adds the seasonal naive baseline of a
    target that is not a return."""

    @property
    def covariates(self) -> tuple[tuple[str, str], ...]:
        """``(column, role)`` of every column of your own, in input order: static, observed,
        known (each in the order given)."""
        return tuple((c, role) for role in ROLES for c in getattr(self, role))

    @property
    def returns_target(self) -> bool:
        """The bars' log returns (the default target): what the volatility baselines and
        the anchors forecast."""
        return (
            self.target_column == "close"
            and self.target_transform == "log_return"
            and self.inputs == "builtin"
        )

    @property
    def ffill_rows(self) -> int:
        return self.window if self.max_ffill is None else self.max_ffill

    def _check_roles(self) -> None:
        seen: dict[str, str] = {}
        for column, role in self.covariates:
            if column in seen:
                raise ConfigError(
                    f"column {column!r} is named in two roles (--{seen[column]} and --{role}): "
                    "give each column one role"
                )
            seen[column] = role
        if self.target_column in self.known + self.static:
            role = "known" if self.target_column in self.known else "static"
            raise ConfigError(
                f"--{role} {self.target_column}: the target column cannot be an input known "
                "ahead or fixed per series (its future values would reach the decoder)"
            )
        if bad := [c for c in seen if "/" in c or c == "instrument"]:
            raise ConfigError(
                f"column {bad[0]!r}: rename it (a name with '/' or 'instrument' would clash "
                "with the model's own parameter names)"
            )
        if bad := [c for c in self.categorical if c not in seen]:
            raise ConfigError(
                f"--categorical {','.join(bad)}: not named by --observed, --known or --static"
            )
        if self.static_file is not None and not self.static:
            raise ConfigError("--static-file: name its columns with --static")

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
            f"--train-fraction must be in (0, 1), got {self.train_fraction}":
                0 < self.train_fraction < 1,
            f"--val-fraction must be in [0, 1), got {self.val_fraction}":
                0 <= self.val_fraction < 1,
            "--train-fraction + --val-fraction must be < 1 (test needs rows)":
                self.train_fraction + self.val_fraction < 1,
            f"--embargo must be >= 0, got {self.embargo}": self.embargo is None or self.embargo >= 0,
            f"--winsorize must be in [0, 0.5), got {self.winsorize}":
                finite(self.winsorize) and 0 <= self.winsorize < 0.5,
            f"--target-clip must be >= 0 (0: off), got {self.target_clip}":
                finite(self.target_clip) and self.target_clip >= 0,
            f"--normalise-window must be >= 20 rows, got {self.normalise_window}":
                self.normalise_window >= 20,
            f"--max-ffill must be >= 0 bars, got {self.max_ffill}":
                self.max_ffill is None or self.max_ffill >= 0,
            f"--max-categories must be >= 1, got {self.max_categories}": self.max_categories >= 1,
            f"--season must be >= 1 bar, got {self.season}": self.season is None or self.season >= 1,
            "--target cumulative sums changes: a --target-transform log_return or diff":
                self.target == "bar" or self.target_transform in RETURNS,
            "--features v2 reads OHLCV bars: it needs --inputs builtin":
                self.features == "v1" or self.inputs == "builtin",
            **choice_errors(self),
        }, "data config")  # fmt: skip
        self._check_roles()
        if self.bar_interval is not None:
            from tftjax.data.calendar import parse_interval

            parse_interval(self.bar_interval)
        if self.timezone is not None:
            from tftjax.data.calendar import check_zone

            check_zone(self.timezone)
