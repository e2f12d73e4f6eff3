"""Rematerialisation tiers: one table from a tier name to what is recomputed.

Tiers are ordered from fastest / most memory to slowest / least memory.
"""

from __future__ import annotations

import dataclasses

from jax import checkpoint_policies as cp


@dataclasses.dataclass(frozen=True)
class RematPlan:
    """Which blocks are rematerialised and with which ``jax.checkpoint`` policy."""

    name: str
    description: str
    lstm: bool = False  # per-step checkpoint inside the LSTM scans
    encoders: bool = False  # static encoders, enrichment and position-wise GRNs
    attention: bool = False
    vsn: bool = False  # per-variable GRNs in checkpointed scan chunks
    policy: object = None


TIERS: dict[str, RematPlan] = {
    "off": RematPlan("off", "nothing rematerialised (fastest, most memory)",
                     policy=cp.everything_saveable),
}


def plan(tier: str) -> RematPlan:
    """The plan of ``tier``; an unknown name raises ``ValueError`` listing the tiers."""
    try:
        return TIERS[tier]
    except KeyError:
        raise ValueError(f"unknown remat tier {tier!r}; choose one of: {', '.join(TIERS)}") from None
