"""How the TFT is optimised: :class:`TrainConfig`."""

from __future__ import annotations

import dataclasses
from typing import Literal

from tftjax.config.fields import choice_errors, from_json, to_json
from tftjax.errors import check
from tftjax.errors import finite as _finite


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How the TFT is optimised: everything here is checked on ``--resume`` (only ``epochs``
    may grow)."""

    epochs: int = 10
    """Maximum epochs (0, with --init-from: the weights scored and saved as they are)."""
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
    evals_per_epoch: int = 1
    """Validate this many times an epoch (4: every quarter epoch). Each check is a step of
    the run loop: checkpoints (tft_epoch_N counts checks), --patience and the best weights
    are per check."""
    ema: float = 0.0
    """Validate, keep and ship an exponential moving average of the weights, with this decay
    per optimizer step, started at the initial weights (0: off; e.g. 0.98). Training steps
    move the raw weights."""
    smooth: int = 1
    """Early-stop on the mean validation score of the last this-many checks (1: each check's
    own): a noisy validation stretch picks noise less often."""
    init_from: str | None = None
    """Start from the weights of this checkpoint or run folder (its final checkpoint): the
    same model (its settings are this run's defaults), on its data (e.g. a float run to
    fine-tune with --qat) or on data that extends it (new bars: docs/training.md)."""
    refit_stats: bool = False
    """With --init-from on new bars: fit the input statistics on this run's training rows
    instead of keeping the parent's (its vocabularies stay: they are the model's shapes)."""

    def __post_init__(self) -> None:
        check({
            f"epochs must be >= 0, got {self.epochs}": self.epochs >= 0,
            "--epochs 0 keeps the --init-from weights as they are: give --init-from":
                self.epochs != 0 or self.init_from is not None,
            "--refit-stats needs --init-from (new bars for a trained model)":
                not self.refit_stats or self.init_from is not None,
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
            f"--evals-per-epoch must be >= 1, got {self.evals_per_epoch}":
                self.evals_per_epoch >= 1,
            f"--ema must be in [0, 1) (0: off), got {self.ema}":
                _finite(self.ema) and 0 <= self.ema < 1,
            f"--smooth must be >= 1 check, got {self.smooth}": self.smooth >= 1,
            f"batch_size {self.batch_size} is not divisible by --accumulate {self.accumulate}":
                self.accumulate < 1 or self.batch_size % self.accumulate == 0,
            **choice_errors(self),
        }, "training config")  # fmt: skip

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, d: dict) -> TrainConfig:
        """A config from :meth:`to_json`'s dict (a saved run's, or a settings file's).

        Raises:
          ConfigError: unknown fields, or values it refuses.
        """
        return from_json(cls, d, "training config")
