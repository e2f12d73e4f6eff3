"""The stacked per-variable parameters of a ``VariableSelection`` as the Pallas VSN kernels
(:mod:`tftjax.models.kernels.pallas_vsn`) see them: each variable's parameters read into registers
as zero-padded float32 tiles (masked loads: Triton wants power-of-two tiles), the embedding
folded in (:func:`tftjax.models.kernels.fused.fold`, per variable), and the folded parameters'
gradients unfolded and written back unpadded. So the kernels take the parameters as the
model holds them, and nothing else runs per step to fold, pad or cast them."""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl

from tftjax.models.kernels.fused import Folded
from tftjax.models.kernels.triton_util import dot_size, plt, start

PARAMS = (
    "emb_k",
    "emb_b",
    "fc2_k",
    "fc2_b",
    "fc1_k",
    "fc1_b",
    "glu_k",
    "glu_b",
    "skip_k",
    "skip_b",
    "ln_scale",
    "ln_bias",
)
"""The stacked parameters the kernels read (``VariableSelection``'s), in their order."""


class ParamTiles:
    """Variable ``j``'s stacked parameters read from their refs as zero-padded float32 tiles
    (masked loads: ``d_v`` to a power of two of at least 16, ``d`` to a power of two), and
    folded (:func:`tftjax.models.kernels.fused.fold`, here per variable in registers)."""

    def __init__(self, refs, j, dv: int, d: int):
        self.r, self.j, self.dv, self.d = dict(zip(PARAMS, refs)), j, dv, d
        self.dvp, self.dp = dot_size(dv), dot_size(d)
        v, h = jnp.arange(self.dvp) < dv, jnp.arange(self.dp) < d
        self.mv, self.mh = v, h
        self.ek, self.eb = self.vec("emb_k", v), self.vec("emb_b", v)
        self.f2 = self.mat("fc2_k", v[:, None] & v[None, :], self.dvp)
        self.sk2 = self.mat("skip_k", v[:, None] & h[None, :], self.dp)

    def vec(self, name, mask, first=0):
        ref = self.r[name]
        at = start(first)
        return (
            plt()
            .load(ref.at[self.j, pl.ds(at, mask.shape[0])], mask=mask, other=0)
            .astype(jnp.float32)
        )

    def mat(self, name, mask, cols, first=0):
        ref = self.r[name]
        at = start(first)
        return (
            plt()
            .load(ref.at[self.j, pl.ds(start(), self.dvp), pl.ds(at, cols)], mask=mask, other=0)
            .astype(jnp.float32)
        )

    def folded(self) -> Folded:
        st, v, h = self, self.mv, self.mh
        vh = v[:, None] & h[None, :]
        fold = lambda e, k: jnp.sum(e[:, None] * k, axis=0)
        return Folded(
            fk=fold(self.ek, self.f2),
            fb=fold(self.eb, self.f2) + self.vec("fc2_b", v),
            w1=self.mat("fc1_k", v[:, None] & v[None, :], st.dvp),
            b1=self.vec("fc1_b", v),
            vk=self.mat("glu_k", vh, st.dp),
            vb=self.vec("glu_b", h),
            gk=self.mat("glu_k", vh, st.dp, st.d),
            gb=self.vec("glu_b", h, st.d),
            sk=fold(self.ek, self.sk2),
            sb=fold(self.eb, self.sk2) + self.vec("skip_b", h),
            ln_g=self.vec("ln_scale", h),
            ln_b=self.vec("ln_bias", h),
        )

    def unfold(self, g: Folded) -> dict:
        """The stacked parameters' gradients from the folded ones' (the fold is linear in
        each factor)."""
        outer = lambda e, gv: e[:, None] * gv[None, :]
        back = lambda k, gv: jnp.sum(k * gv[None, :], axis=1)
        return {
            "emb_k": back(self.f2, g.fk) + back(self.sk2, g.sk),
            "emb_b": back(self.f2, g.fb) + back(self.sk2, g.sb),
            "fc2_k": outer(self.ek, g.fk) + outer(self.eb, g.fb),
            "fc2_b": g.fb,
            "fc1_k": g.w1,
            "fc1_b": g.b1,
            "glu_k": (g.vk, g.gk),
            "glu_b": (g.vb, g.gb),
            "skip_k": outer(self.ek, g.sk) + outer(self.eb, g.sb),
            "skip_b": g.sb,
            "ln_scale": g.ln_g,
            "ln_bias": g.ln_b,
        }

    def store_grads(self, g_refs, split, grads: dict) -> None:
        """One split's gradients (:meth:`unfold`) into the ``[splits, m, ...]`` refs, each
        masked to its real rows and columns."""
        v, h = self.mv, self.mh
        for name, ref in zip(PARAMS, g_refs):
            cols = h if name in ("skip_k", "skip_b", "glu_k", "glu_b", "ln_scale", "ln_bias") else v
            rows = v if name.endswith("_k") and name != "emb_k" else None
            for half, val in enumerate(grads[name] if name.startswith("glu") else [grads[name]]):
                at = start(half * self.d)
                if rows is None:
                    plt().store(
                        ref.at[split, self.j, pl.ds(at, val.shape[0])],
                        val.astype(ref.dtype),
                        mask=cols,
                    )
                else:
                    plt().store(
                        ref.at[
                            split, self.j, pl.ds(start(), val.shape[0]), pl.ds(at, val.shape[1])
                        ],
                        val.astype(ref.dtype),
                        mask=rows[:, None] & cols[None, :],
                    )
