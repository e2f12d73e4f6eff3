"""How one family of blocks runs: :class:`KernelMode` (XLA, or Pallas kernels compiled or
interpreted), what the layers are built with."""

from __future__ import annotations

import enum


class KernelMode(enum.Enum):
    """How one family of blocks runs: in XLA, as Pallas kernels compiled for an NVIDIA GPU
    (running on one, or compiling for one: ``--target``), or as the same kernels in Pallas'
    interpreter (any other backend; tests)."""

    XLA = "xla"
    COMPILED = "compiled"
    INTERPRETED = "interpreted"

    @property
    def pallas(self) -> bool:
        return self is not KernelMode.XLA

    @property
    def interpret(self) -> bool:
        return self is KernelMode.INTERPRETED
