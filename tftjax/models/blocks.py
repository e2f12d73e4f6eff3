"""The TFT's blocks as its config builds them: which implementation runs each block (an XLA
layer, rematerialised or not; a Pallas kernel, compiled or interpreted; a quantized layer)
is decided here, in one factory per block, as MaxText's attention chooses its kernel. The
TFT (:mod:`tftjax.models.tft`) names blocks, never kernels.

Every factory is called inside the TFT's ``nn.compact`` ``__call__``: the layers and kernel
parameters it creates are the TFT's own submodules, at the paths the layers have always had
(``static_enrichment``, ``lstm_gate``, …), whichever implementation runs them, so that one
checkpoint serves every choice.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from tftjax.config import TFTConfig
from tftjax.models.compute import STATIC_CONTEXTS, grn_kernel, kernel_mode, quant_spec, static_stack
from tftjax.models.kernels import pallas_gated, pallas_grn
from tftjax.models.kernels.params import GateParams, GRNParams
from tftjax.models.layers import GRN, LSTM, GateAddNorm, InterpretableAttention
from tftjax.models.remat import RematPlan
from tftjax.models.remat import plan as remat_plan
from tftjax.models.vsn import VariableSelection
from tftjax.quant.core import QuantSpec

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Blocks:
    """The factories of one TFT: its config, remat plan and quantization."""

    cfg: TFTConfig
    plan: RematPlan
    quant: QuantSpec | None
    deterministic: bool

    @classmethod
    def of(
        cls, cfg: TFTConfig, mode: str | None, calibration: str | None, deterministic: bool
    ) -> Blocks:
        return cls(
            cfg,
            remat_plan(cfg.execution.remat, cfg.execution.platform),
            quant_spec(cfg, mode, calibration),
            deterministic,
        )

    @property
    def d(self) -> int:
        return self.cfg.model.hidden

    @property
    def rate(self) -> float:
        return self.cfg.model.dropout

    @property
    def rows_as_kernels(self) -> bool:
        """The GRNs and gates outside the VSNs as Pallas kernels (float models only)."""
        return grn_kernel(self.cfg) and self.quant is None

    def layer(self, cls, remat: bool) -> Callable:
        """``cls`` with the quantization, rematerialised under the plan's policy when
        ``remat`` (``deterministic`` is the last positional argument of every block)."""
        if not remat:
            return functools.partial(cls, quant=self.quant)
        n_args = {GRN: 3, GateAddNorm: 3, InterpretableAttention: 4}[cls]
        return functools.partial(
            nn.remat(cls, static_argnums=(n_args,), policy=self.plan.policy, prevent_cse=True),
            quant=self.quant,
        )

    # ---- variable selection
    def vsn(self, m: int, name: str, vocab: int = 0, categorical: tuple = ()) -> VariableSelection:
        """A variable selection network over ``m`` variables, chunked and recomputed as the
        plan says (chunks recomputed in the backward pass, or every residual kept; offload:
        the tagged intermediates to the host), through the fused CPU kernel or the Pallas
        kernels where they run. ``vocab``: variable 0 is an instrument of that many values;
        ``categorical``: further categorical variables (both: the stacked path, whole)."""
        cfg, plan = self.cfg, self.plan
        if vocab or categorical:
            return VariableSelection(
                m,
                cfg.model.d_v,
                self.d,
                self.rate,
                quant=self.quant,
                vocab=vocab,
                categorical=categorical,
                name=name,
            )
        chunked = plan.vsn or plan.vsn_scan
        offload = plan.name == "offload" and plan.note == ""
        policy = plan.policy if plan.vsn or offload else jax.checkpoint_policies.everything_saveable
        chunk = (cfg.execution.vsn_chunk or plan.vsn_chunk) if chunked else None
        return VariableSelection(
            m,
            cfg.model.d_v,
            self.d,
            self.rate,
            chunk=chunk,
            policy=policy,
            remat_weights=plan.vsn,
            quant=self.quant,
            fused=plan.vsn and plan.fused,
            kernel=kernel_mode(cfg, "vsn"),
            name=name,
        )

    # ---- the static contexts
    def static_contexts(self, zeta: Array) -> tuple[Array, Array, Array, Array]:
        """``c_s, c_e, c_h, c_c``: four GRNs of ``ζ`` (as two Pallas kernels, one stacked
        program each way, where the width fits them)."""
        d, p, det = self.d, self.rate, self.deterministic
        if not self.rows_as_kernels:
            grn = self.layer(GRN, self.plan.encoders)
            return tuple(
                grn(d, d, p, name=f"static_{n}")(zeta, None, det)  # type: ignore[return-value]
                for n in STATIC_CONTEXTS
            )
        interpret = kernel_mode(self.cfg, "grn").interpret
        got = [GRNParams(d, p, name=f"static_{n}")(zeta, det) for n in STATIC_CONTEXTS]
        if static_stack(self.cfg):  # all four in one kernel each way
            keeps = None if got[0][1] is None else [keep for _, keep in got if keep is not None]
            return tuple(
                pallas_grn.grn_stack(
                    [q for q, _ in got],
                    zeta,
                    keeps,
                    p,  # type: ignore[return-value]
                    interpret=interpret,
                )
            )
        return tuple(
            pallas_gated.gated_rows(
                q,
                zeta,
                None,
                keep,
                p,
                grn=True,  # type: ignore[return-value]
                interpret=interpret,
            )
            for q, keep in got
        )

    # ---- the row-wise GRNs and gates
    def grn(self, name: str, a: Array, context: Array | None) -> Array:
        """A GRN of ``a`` (with a per-window ``context`` [B, 1, d] or none)."""
        d, p, det = self.d, self.rate, self.deterministic
        if not self.rows_as_kernels:
            return self.layer(GRN, self.plan.encoders)(d, d, p, name=name)(a, context, det)
        prm, keep = GRNParams(d, p, context is not None, name=name)(a, det)
        ctx = None
        if context is not None:  # its projection per window, broadcast to the rows
            ctx_k: Any = prm["ctx_k"]
            ctx = jnp.broadcast_to(context @ ctx_k.astype(context.dtype), a.shape)
        return pallas_gated.gated_rows(
            prm, a, ctx, keep, p, grn=True, interpret=kernel_mode(self.cfg, "grn").interpret
        )

    def gate(self, name: str, a: Array, b: Array, rate: float, remat: bool) -> Array:
        """``LayerNorm(a + GLU(b))`` (gated add & norm), dropout ``rate`` on ``b``."""
        if not self.rows_as_kernels:
            return self.layer(GateAddNorm, remat)(self.d, rate, name=name)(a, b, self.deterministic)
        prm, keep = GateParams(self.d, rate, name=name)(b, self.deterministic)
        return pallas_gated.gated_rows(
            prm, a, b, keep, rate, grn=False, interpret=kernel_mode(self.cfg, "grn").interpret
        )

    # ---- the recurrence and the attention
    def lstm(self, name: str) -> LSTM:
        return LSTM(
            self.d,
            self.plan.lstm,
            self.plan.policy,
            self.quant,
            self.cfg.model.lstm_forget_bias,
            kernel_mode(self.cfg, "lstm"),
            name=name,
        )

    def attention(self, q: Array, kv: Array, mask: Array) -> tuple[Array, Array]:
        """The causal interpretable attention of the decoder steps ``q`` over ``kv``."""
        layer = self.layer(InterpretableAttention, self.plan.attention)
        return layer(
            self.cfg.model.heads,
            self.d,
            self.rate,
            kernel=kernel_mode(self.cfg, "attention"),
            name="attention",
        )(q, kv, mask, self.deterministic)
