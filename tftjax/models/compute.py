"""What a TFT of a config computes with: the compute dtypes and the float32 islands of
``--precision bf16``, the quantization of its layers, which blocks run as Pallas kernels,
and the parameters a step computes with (cast once, outside the model, by the train step)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from tftjax.config import TFTConfig
from tftjax.models.kernels import pallas_gated, pallas_grn
from tftjax.models.kernels.mode import KernelMode
from tftjax.quant.core import MODES, QuantSpec


def quant_spec(
    cfg: TFTConfig, mode: str | None = None, calibration: str | None = None
) -> QuantSpec | None:
    """How a TFT of ``cfg`` quantizes in ``mode`` (``None``: fake-quant for a QAT config,
    float otherwise); ``None`` means float. ``calibration``: a PTQ calibration pass
    (:attr:`tftjax.quant.core.QuantSpec.calibrate`)."""
    mode = mode or ("fake" if cfg.quant.qat else "float")
    if mode not in MODES:
        raise ValueError(f"unknown quantization mode {mode!r}; choose one of {MODES}")
    if mode == "float":
        return None
    return QuantSpec(
        mode,
        tuple(cfg.quant.qat_layers),
        cfg.quant.qat_freeze_after,
        calibrate=calibration,
        act_symmetric=cfg.quant.act_symmetric,
        weight_granularity=cfg.quant.weight_granularity,
        stacked_scales=cfg.quant.stacked_scales,
    )


def kernel_mode(cfg: TFTConfig, family: str) -> KernelMode:
    """How ``family`` (tftjax.config.KERNEL_FAMILIES) runs for ``cfg`` on its platform."""
    from tftjax.models.remat import is_gpu

    if not cfg.execution.pallas(family):
        return KernelMode.XLA
    return KernelMode.COMPILED if is_gpu(cfg.execution.platform) else KernelMode.INTERPRETED


COMPUTE_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
FLOAT32_MODULES = ("quantiles",)
"""Top-level modules whose parameters bf16 compute keeps in float32 (the quantile head)."""
FLOAT32_PARAMS = ("w_h",)
"""Parameters bf16 compute passes in float32 and casts where they are used: the LSTMs'
recurrent kernels, cast inside each step, so that the kernel's gradient is summed over the
steps in float32 (cast once outside the scan, it would accumulate in bfloat16)."""
STATIC_CONTEXTS = ("selection", "enrichment", "state_h", "state_c")
"""The four static context GRNs (``static_<name>``)."""
ROW_BLOCKS = ("lstm_gate", "enrichment", "attention_gate", "positionwise", "output_gate")
"""The row-wise GRNs and gates that ``--grn-kernel pallas`` runs as Pallas kernels too."""


def grn_kernel(cfg: TFTConfig) -> bool:
    """Whether the GRNs and gates outside the VSNs run as Pallas kernels (the static context
    GRNs, tftjax.models.kernels.pallas_grn; the row-wise blocks, tftjax.models.kernels.pallas_gated):
    ``--grn-kernel pallas`` where the kernels take the width in the compute dtype
    (tftjax.models.kernels.pallas_gated.supported; the quantized layers always run in XLA)."""
    return (
        cfg.execution.pallas("grn")
        and not cfg.quant.qat
        and pallas_gated.supported(cfg.model.hidden, COMPUTE_DTYPES[cfg.execution.precision])
    )


def static_stack(cfg: TFTConfig) -> bool:
    """Under :func:`grn_kernel`: whether the four static context GRNs run as one stacked
    kernel each way (tftjax.models.kernels.pallas_grn, where the width fits it), else each through
    the row kernels (tftjax.models.kernels.pallas_gated)."""
    return grn_kernel(cfg) and pallas_grn.supported(
        cfg.model.hidden, COMPUTE_DTYPES[cfg.execution.precision]
    )


def kernel_cast(cfg: TFTConfig) -> tuple[str, ...]:
    """Top-level modules whose parameters bf16 compute passes in float32 because a Pallas
    kernel reads them and casts them itself: the GRNs and gates under ``--grn-kernel
    pallas`` (cast outside, each cast would be a launch of its own, and so would each
    gradient's conversion back)."""
    if grn_kernel(cfg):
        return tuple(f"static_{n}" for n in STATIC_CONTEXTS) + ROW_BLOCKS
    return ()


def compute_params(cfg: TFTConfig, params: Any, cast_leaves=None, mode: str | None = None) -> Any:
    """The parameters as a step at ``cfg.execution.precision`` computes with them: under bf16 a
    bfloat16 copy of every float leaf except the float32 ones (the quantile head, the LSTMs'
    recurrent kernels, the modules a Pallas kernel casts itself: :func:`kernel_cast`);
    float32 and quantized models: ``params`` as they are. ``cast_leaves``: casts a list of
    float32 leaves to bfloat16 (default: each on its own, ``astype``); the train step passes
    one that casts them all in a few launches (tftjax.models.kernels.pallas_adamw.cast). Casting
    cast parameters again changes nothing, so :func:`apply_fn` takes either."""
    if cfg.execution.precision == "f32" or quant_spec(cfg, mode) is not None:  # quantized: float32
        return params
    dt = COMPUTE_DTYPES[cfg.execution.precision]
    keep_f32 = FLOAT32_MODULES + kernel_cast(cfg)

    def cast(path, a):  # the LSTMs' recurrent kernels are cast inside each step
        return (
            jnp.issubdtype(a.dtype, jnp.floating)
            and a.dtype != dt
            and path[0].key not in keep_f32
            and getattr(path[-1], "key", None) not in FLOAT32_PARAMS
        )

    paths, tree = jax.tree_util.tree_flatten_with_path(params)
    which = [i for i, (path, a) in enumerate(paths) if cast(path, a)]
    leaves = [a for _, a in paths]
    cast_leaves = cast_leaves or (lambda xs: [x.astype(dt) for x in xs])
    for i, a in zip(which, cast_leaves([leaves[i] for i in which])):
        leaves[i] = a
    return jax.tree.unflatten(tree, leaves)
