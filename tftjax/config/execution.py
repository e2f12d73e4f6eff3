"""How a TFT runs: :class:`ExecutionConfig` (remat tier, precision, kernels, memory budget).

Execution settings change memory and speed, not the parameters or (beyond float round-off)
the results: a resumed run may change them, and models that differ only here share one
initialisation.

One switch chooses the kernels, ``--kernels xla|pallas``; ``--kernels-exclude`` keeps some
families in XLA to bisect a problem (``--kernels pallas --kernels-exclude attention,grn``).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Literal, get_args

from tftjax.config.fields import choice_errors, setting
from tftjax.errors import ConfigError, check

RematTier = Literal["off", "minimal", "aggressive", "full", "offload"]
RematChoice = Literal["off", "minimal", "aggressive", "full", "offload", "fastest", "auto"]
TIERS: tuple[str, ...] = get_args(RematTier)
"""The rematerialisation tiers (:mod:`tftjax.models.remat` holds their plans)."""
FASTEST, AUTO = "fastest", "auto"
"""Not tiers, but choices resolved to one before a model is built: ``fastest``, the tier of
least step time on the backend (CPU: ``full``); ``auto``, the fastest tier whose steps fit
the memory budget, at the largest batch that fits (:func:`tftjax.memory.plan_auto`)."""
Precision = Literal["f32", "bf16"]
MatmulPrecision = Literal["default", "high", "highest"]
KernelFamily = Literal["vsn", "lstm", "grn", "attention", "optimizer"]
KERNEL_FAMILIES: tuple[str, ...] = get_args(KernelFamily)
"""What ``--kernels pallas`` runs as Pallas kernels: the variable selection networks, the
LSTM recurrences, the GRNs and gates outside the VSNs, the attention, the optimizer step."""


class Kernels(str, enum.Enum):
    """``--kernels``: every block in XLA, or the Pallas/Triton kernels (NVIDIA GPUs, and
    ``--target`` compiles; on a CPU they run in Pallas' interpreter, for tests only)."""

    XLA = "xla"
    PALLAS = "pallas"


@dataclasses.dataclass(frozen=True)
class ExecutionConfig:
    """How the network runs: what is recomputed, in which precision, with which kernels."""

    remat: RematChoice = "off"
    """Rematerialisation tier: off, minimal, aggressive, full, offload (tftjax.models.remat);
    fastest: this platform's fastest (CPU: full, also the smallest); auto: the fastest whose
    steps fit --memory-budget, at the largest batch that fits."""
    memory_budget: str | None = None
    """Device memory budget for --remat auto, e.g. 24GB or 16GiB (capped at 90% of the
    device's own limit where it reports one; needed where it does not, e.g. on CPU)."""
    vsn_chunk: int | None = None
    """Variables per chunk where the variable selection networks run in chunks (CPU:
    aggressive/offload, and QAT under full; GPU: every tier but off); default: the tier's
    plan (20 on CPU, 10 on a GPU). Float full on CPU runs the fused kernel instead."""
    precision: Precision = "f32"
    """Compute precision: f32, or bf16 (parameters and the optimizer stay float32; matmuls and
    stored activations run in bfloat16; LayerNorm statistics, softmax, the LSTM cell state,
    the quantile head and the loss stay float32). Not with --qat."""
    matmul_precision: MatmulPrecision = "default"
    """Float32 matmul precision (jax.default_matmul_precision): default (the backend's: TF32
    on NVIDIA GPUs), high, or highest (full float32)."""
    kernels: Kernels = Kernels.XLA
    """xla, or pallas: the VSNs, LSTMs, GRNs and gates, attention and optimizer step as
    Pallas/Triton kernels (NVIDIA GPUs, or --target compiles; on CPU they run in Pallas'
    interpreter, for tests only). The float GRNs take widths whose weights fit a kernel."""
    kernels_exclude: tuple[KernelFamily, ...] = ()
    """With --kernels pallas: families kept in XLA (vsn, lstm, grn, attention, optimizer;
    comma-separated), e.g. to bisect a problem."""
    platform: str | None = setting(None, cli=False)
    """The backend the plans are for: None, the one running; set when compiling for another
    (python -m tftjax.memory --target)."""

    def __post_init__(self) -> None:
        check({
            f"--vsn-chunk must be >= 1, got {self.vsn_chunk}":
                self.vsn_chunk is None or self.vsn_chunk >= 1,
            f"--memory-budget {self.memory_budget!r} is not a size like 24GB":
                self.memory_budget is None or _is_size(self.memory_budget),
            **choice_errors(self),
        }, "execution config")  # fmt: skip

    def pallas(self, family: str) -> bool:
        """Whether ``family`` (one of :data:`KERNEL_FAMILIES`) runs as Pallas kernels."""
        if family not in KERNEL_FAMILIES:
            raise ValueError(f"unknown kernel family {family!r}")
        return self.kernels == Kernels.PALLAS and family not in self.kernels_exclude

    @property
    def pallas_families(self) -> tuple[str, ...]:
        return tuple(f for f in KERNEL_FAMILIES if self.pallas(f))

    def describe_kernels(self) -> str:
        """The kernels chosen as the flags that choose them ("" for XLA throughout)."""
        if not self.pallas_families:
            return ""
        out = "--kernels pallas"
        if self.kernels_exclude:
            out += f" --kernels-exclude {','.join(self.kernels_exclude)}"
        return out

    def with_pallas(self, families: tuple[str, ...] | list[str]) -> ExecutionConfig:
        """These settings with exactly ``families`` as Pallas kernels."""
        if not families:
            return dataclasses.replace(self, kernels=Kernels.XLA, kernels_exclude=())
        return dataclasses.replace(
            self,
            kernels=Kernels.PALLAS,
            kernels_exclude=tuple(f for f in KERNEL_FAMILIES if f not in families),
        )


LEGACY_KERNEL_FLAGS = {f"{f}_kernel": f for f in KERNEL_FAMILIES}
"""The five per-family switches before ``--kernels`` (``--vsn-kernel pallas`` …): still
accepted on the command line, in settings files and in saved configs."""


def legacy_kernels(
    execution: ExecutionConfig, old: dict[str, str], kernels_given: bool = False
) -> ExecutionConfig:
    """``execution`` with the old per-family switches (``{"vsn_kernel": "pallas", ...}``)
    applied: the families they name ``pallas`` run as Pallas kernels and, unless ``--kernels``
    was given too, every other family stays in XLA; those named ``xla`` are excluded.

    Raises:
      ConfigError: a value other than xla or pallas.
    """
    on, off = [], []
    for name, value in old.items():
        value = getattr(value, "value", value)
        if value not in ("xla", "pallas"):
            raise ConfigError(f"--{name.replace('_', '-')} must be xla or pallas, got {value!r}")
        (on if value == "pallas" else off).append(LEGACY_KERNEL_FLAGS[name])
    if on and not kernels_given:
        execution = execution.with_pallas(on)
    if execution.kernels == Kernels.XLA:  # nothing to exclude from
        return dataclasses.replace(execution, kernels_exclude=())
    excluded = {*execution.kernels_exclude, *off}
    return dataclasses.replace(
        execution, kernels_exclude=tuple(f for f in KERNEL_FAMILIES if f in excluded)
    )


_SIZE = re.compile(r"^\s*[0-9.]+(e[0-9]+)?\s*([KMGT]I?B|B)?\s*$", re.IGNORECASE)


def _is_size(text: str) -> bool:
    try:
        parse_bytes(text)
    except ValueError:
        return False
    return True


def parse_bytes(text: str) -> float:
    """'24GB', '512MiB', '1.5e9' → bytes.

    Raises:
      ValueError: not a size.
    """
    if not _SIZE.match(text):
        raise ValueError(f"not a size: {text!r}")
    t = text.strip().upper().replace(" ", "")
    units = {
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
        "TIB": 2**40,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "B": 1,
    }
    for u, mult in units.items():
        if t.endswith(u):
            return float(t[: -len(u)]) * mult
    return float(t)
