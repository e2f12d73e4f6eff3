"""Rematerialisation tiers: one table from a tier name to what is recomputed.

Ordered like MaxText's ``remat_policy``: a trade-off between speed and memory,
from ``off`` (nothing recomputed) to ``full`` (everything but the quantile
head). Every tier computes the same function and the same gradients (tested
leaf by leaf against ``off``): remat is ``jax.checkpoint``, never
``stop_gradient``.

Where the recompute sits matters on XLA:CPU (architecture.md): a checkpoint
around a whole block is often scheduled early and saves little, so the two
blocks that hold most activations are rematerialised *inside their scans*:
the LSTMs per time step, and the variable selection networks per chunk of
``vsn_chunk`` variables (``lax.scan`` over chunks with a checkpointed body
that only carries the ``[N, d]`` weighted sum).

=============  ===============================================================
``off``        nothing rematerialised (most memory)
``minimal``    LSTM encoder/decoder, per step inside the scan
``aggressive`` the seed's plan: static encoders, gated skip, static
               enrichment and position-wise GRNs ("encoder GRNs"), LSTMs,
               temporal attention; VSNs and quantile head kept (nothing in
               them is recomputed, but their per-variable GRNs run as a scan
               over chunks so that the backward pass frees its transients
               chunk by chunk: measured, the peak of the step sits inside
               the VSN backward, after every other residual is freed, so
               rematerialising the other blocks alone lowers nothing)
``full``       ``aggressive`` plus the VSNs: float per-variable GRNs through
               the fused kernel (tftjax.models.kernels.fused: a ``custom_vjp`` whose
               backward recomputes each variable from the saved inputs), QAT
               ones in checkpointed scan chunks with their selection-weight
               GRNs rematerialised. The default on CPU: fastest and smallest
``offload``    ``aggressive``, but the tagged intermediates (:data:`OFFLOAD_NAMES`:
               inside the VSN chunks and the rematerialised blocks) are moved
               to pinned host memory and the rest recomputed (GPU/TPU), so it
               can go below ``aggressive`` on the device; on
               CPU there is no separate host memory space and it *is*
               ``aggressive`` (the CLI says so)
``auto``       not a plan: ``python -m tftjax.train --remat auto
               [--memory-budget 24GB]`` picks, among the tiers whose train and
               eval steps fit the budget (and the device's own limit), the one
               of least :data:`STEP_TIME`, and the largest batch that fits it
               (tftjax.memory.plan_auto)
=============  ===============================================================

That table is the CPU's. On a GPU (:data:`GPU_PLANS`) ``minimal``, ``aggressive`` and
``full`` run the VSNs as checkpointed chunks of batched matmuls: ``minimal`` keeping their
GLU outputs, ``aggressive`` the same VSNs and the seed's plan for the other blocks,
``full`` nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax import checkpoint_policies as cp

from tftjax.config.execution import AUTO, FASTEST
from tftjax.config.execution import TIERS as TIER_NAMES

# checkpoint_name tags used in the model (tftjax/models/*.py): the per-variable GRN's GLU
# output and pre-norm sum inside each VSN chunk (most of the step's residuals), the GRN
# hidden layers, LSTM gates and attention weights.
OFFLOAD_NAMES = ("vsn_glu", "vsn_y", "grn_hidden", "lstm_gates", "attention_weights")


@dataclasses.dataclass(frozen=True)
class RematPlan:
    """Which blocks are rematerialised and with which ``jax.checkpoint`` policy."""

    name: str
    description: str
    lstm: bool = False  # per-step checkpoint inside the LSTM scans
    encoders: bool = False  # static encoders, gated skip, enrichment, position-wise GRNs
    attention: bool = False
    vsn: bool = False  # per-variable GRNs recomputed (fused kernel; QAT: checkpointed chunks)
    vsn_scan: bool = False  # per-variable GRNs as a scan over chunks, residuals all kept
    fused: bool = True  # recomputed VSNs through the fused kernel (CPU), else checkpointed chunks
    vsn_chunk: int = 20  # variables per VSN chunk unless TFTConfig.vsn_chunk says otherwise
    policy: Any = None  # a jax.checkpoint policy
    note: str = ""


_AGGRESSIVE: dict[str, Any] = dict(
    lstm=True, encoders=True, attention=True, vsn_scan=True, policy=cp.nothing_saveable
)

TIERS: dict[str, RematPlan] = {
    "off": RematPlan("off", "nothing rematerialised (most memory)"),
    "minimal": RematPlan(
        "minimal",
        "LSTM encoder/decoder, per step inside the scan",
        lstm=True,
        policy=cp.nothing_saveable,
    ),
    "aggressive": RematPlan(
        "aggressive", "encoder GRNs, LSTMs, attention; VSNs and head kept", **_AGGRESSIVE
    ),
    "full": RematPlan(
        "full",
        "everything but the quantile head, VSNs in checkpointed chunks",
        vsn=True,
        **_AGGRESSIVE,
    ),
    "offload": RematPlan(
        "offload",
        "aggressive, with tagged intermediates offloaded to pinned host memory",
        lstm=True,
        encoders=True,
        attention=True,
        vsn_scan=True,
        policy=cp.save_and_offload_only_these_names(
            names_which_can_be_saved=[],
            names_which_can_be_offloaded=list(OFFLOAD_NAMES),
            offload_src="device",
            offload_dst="pinned_host",
        ),
    ),
}
ORDER = ("off", "minimal", "aggressive", "full")
"""Tiers from most to least memory (``offload`` aside)."""

STEP_TIME: dict[str, dict[str, float]] = {
    # Measured: TFT-225 step time relative to `off` at batch 64 on XLA:CPU (2 cores),
    # experiments/throughput.py --remat off,minimal,aggressive,full. `full` is *fastest*
    # there: its VSNs run the fused recomputing kernel (tftjax.models.kernels.fused).
    "cpu": {"off": 1.0, "minimal": 1.0, "aggressive": 1.0, "full": 0.25},
    # GPU plans (GPU_PLANS): modelled, not measured yet (experiments/gpu_check.py measures
    # them). Measured on an H200 before they changed (TFT-225 b256): the CPU's `aggressive`
    # 1.51 and the fused `full` 6.4. Now `full` recomputes the VSNs' forward (~90% of the
    # forward) once, as `default` models; `minimal` and `aggressive` recompute all of it but
    # the kept GLU outputs, less than `full`.
    "gpu": {"off": 1.0, "minimal": 1.1, "aggressive": 1.15, "full": 1.333},
    # Modelled elsewhere (not measured in this project): a step is ~3 forward passes and
    # rematerialising a block adds one more of its forward; the VSNs are ~90% of the
    # forward, the LSTMs ~5%, everything else ~5%.
    "default": {"off": 1.0, "minimal": 1.017, "aggressive": 1.033, "full": 1.333},
}
"""Relative step time per tier and platform, the cost ``--remat auto`` minimises."""


def step_time(tier: str, backend: str | None = None) -> float:
    backend = "gpu" if is_gpu(backend) else (backend or jax.default_backend())
    table = STEP_TIME.get(backend, STEP_TIME["default"])
    return table["aggressive" if tier == "offload" else tier]


def default_tier(backend: str | None = None) -> str:
    """The tier ``--remat`` defaults to: the fastest on ``backend`` (:data:`STEP_TIME`);
    on CPU ``full``, which is also the smallest."""
    return min(ORDER, key=lambda t: (step_time(t, backend), ORDER.index(t)))


CHOICES = tuple(TIERS) + (FASTEST, AUTO)
assert tuple(TIERS) == TIER_NAMES


def is_gpu(backend: str | None = None) -> bool:
    return (backend or jax.default_backend()) in ("gpu", "cuda", "rocm")


GPU_PLANS = {
    # XLA:GPU schedules a scan over VSN chunks with every residual kept (the CPU's
    # `aggressive`) so that the scan's stacked residuals outgrow what the chunking frees
    # (an H200, TFT-225 b256: 1.64x `off`'s temp bytes), and the LSTMs' per-step remat
    # alone saves nothing (their activations are ~4% of the step's). The VSNs hold ~96%: on a
    # GPU the tiers are a ladder of how much of the VSN chunks' residuals is kept (tagged
    # names, tftjax.models.remat.OFFLOAD_NAMES), each chunk's rest recomputed in the backward pass.
    # `minimal` keeps the GLU outputs only: keeping the pre-norm sums too held more than
    # `off` in bf16 (TFT-225 b256 on the H100 spec: 3,090 against 2,990 MiB; tiny b1024:
    # 827 against 799), and without them 587 (f32: 1,143 against off's 1,865).
    "minimal": dict(
        lstm=False,
        vsn=True,
        fused=False,
        vsn_chunk=10,
        policy=cp.save_only_these_names("vsn_glu"),
        description="VSNs in checkpointed chunks that keep their GLU outputs (GPU)",
    ),
    "aggressive": dict(
        vsn_scan=False,
        vsn=True,
        fused=False,
        vsn_chunk=10,
        policy=cp.save_only_these_names("vsn_glu"),
        description="encoder GRNs, LSTMs, attention; VSNs in checkpointed "
        "chunks that keep their GLU outputs (GPU)",
    ),
    # The fused kernel scans the variables one at a time: hundreds of tiny sequential
    # kernels on a GPU (6.4x `off`'s step on an H200). There the VSNs run as checkpointed
    # chunks of `vsn_chunk` variables, each a few batched matmuls, recomputed per chunk.
    # Chunks of 10: compiled for the H100 spec, TFT-225 b256 `full` holds 836 MiB of temp
    # bytes with chunks of 20 (0.12x `off`'s), 541 MiB with 10 (0.076x), 385 with 5.
    "full": dict(
        fused=False,
        vsn_chunk=10,
        description="everything but the quantile head, VSNs in "
        "checkpointed chunks of batched matmuls (GPU)",
    ),
}
"""What a tier means on a GPU where it differs from the CPU's plan."""


def offload_supported(backend: str | None = None) -> bool:
    return (backend or jax.default_backend()) in ("gpu", "cuda", "rocm", "tpu")


def plan(tier: str, backend: str | None = None) -> RematPlan:
    """The plan of ``tier``; an unknown name raises ``ValueError`` listing the tiers.

    ``offload`` on a backend without a host memory space (CPU) returns the
    ``aggressive`` plan under the name ``offload`` with a note saying so.
    """
    if tier == AUTO:
        raise ValueError(
            "'auto' is resolved to a tier before the model is built (tftjax.memory.resolve_auto)"
        )
    if tier == FASTEST:
        tier = default_tier(backend)
    try:
        p = TIERS[tier]
    except KeyError:
        raise ValueError(
            f"unknown remat tier {tier!r}; choose one of: {', '.join(CHOICES)}"
        ) from None
    if is_gpu(backend) and tier in GPU_PLANS:
        return dataclasses.replace(p, **GPU_PLANS[tier])
    if tier == "offload" and not offload_supported(backend):
        return dataclasses.replace(
            TIERS["aggressive"],
            name="offload",
            note=f"offload: the {backend or jax.default_backend()} backend has no separate host "
            "memory space, so this tier behaves exactly like 'aggressive'",
        )
    return p
