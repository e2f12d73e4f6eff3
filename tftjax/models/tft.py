"""The Temporal Fusion Transformer (Lim et al. 2021), TFT-225 layout.

Shape glossary: B batch, T_e encoder steps, T_d decoder steps, T = T_e + T_d,
d hidden, Q quantiles; static ``[B, S]``, historical ``[B, T_e, F_h]``,
known ``[B, T, F_k]`` (known inputs at past and future steps).

Data flow (docs/tft-spec.md; which implementation runs each block: tftjax.models.blocks):
  static VSN → ζ → four static encoders → c_s, c_e, c_h, c_c
  encoder VSN over historical+known past (context c_s) → ξ_enc [B, T_e, d]
  decoder VSN over known future (context c_s)          → ξ_dec [B, T_d, d]
  LSTM encoder from (c_h, c_c), decoder from its final state → φ [B, T, d]
  φ̃ = GAN(ξ, φ); θ = GRN(φ̃, c_e); causal interpretable attention
  (queries at decoder steps) → δ = GAN(θ_dec, attn) → ψ = GRN(δ)
  → ψ̃ = GAN(φ̃_dec, ψ) → quantiles [B, T_d, Q]
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.core import Tracer

from tftjax.config import TFTConfig
from tftjax.models.blocks import Blocks
from tftjax.models.compute import COMPUTE_DTYPES, compute_params, quant_spec
from tftjax.models.layers import Dense

Array = jax.Array


class Interpretation(NamedTuple):
    static_weights: Array  # [B, S]
    historical_weights: Array  # [B, T_e, F_h + F_k]
    future_weights: Array  # [B, T_d, F_k]
    attention: Array  # [B, T_d, T], head-averaged


class Categorical(NamedTuple):
    """Where your own categorical columns sit in each variable selection's inputs:
    ``(position, table rows, column)`` each (tftjax.data.covariates lays them out)."""

    static: tuple[tuple[int, int, str], ...] = ()
    encoder: tuple[tuple[int, int, str], ...] = ()  # historical, then the known at past steps
    decoder: tuple[tuple[int, int, str], ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.static or self.encoder or self.decoder)


@functools.lru_cache(maxsize=None)
def covariate_layout(cfg: TFTConfig) -> Categorical:
    """Your own columns come after the built-in inputs of their group, in the order given:
    statics; each observed column's value and its missing flag; the known columns."""
    d, m = cfg.data, cfg.model
    rows = dict(zip(d.categorical, m.categories))
    if not rows:
        return Categorical()
    at = lambda names, base, stride=1: tuple(
        (base + stride * i, rows[c], c) for i, c in enumerate(names) if c in rows
    )
    hist_base = m.num_historical - 2 * len(d.observed)
    known_base = m.num_known - len(d.known)
    return Categorical(
        static=at(d.static, m.num_static - len(d.static)),
        encoder=at(d.observed, hist_base, 2) + at(d.known, m.num_historical + known_base),
        decoder=at(d.known, known_base),
    )


def indices(x: Array, where: tuple[tuple[int, int, str], ...]) -> Array | None:
    """The categorical columns' indices (exact integers in float32) as int32 ``[..., k]``."""
    if not where:
        return None
    return x[..., np.array([p for p, _, _ in where])].astype(jnp.int32)


def causal_mask(encoder_steps: int, decoder_steps: int) -> Array:
    """``[T_d, T]``: decoder step k (position T_e + k) sees positions ``<= T_e + k``."""
    q = encoder_steps + np.arange(decoder_steps)[:, None]  # numpy: a constant of the program
    return jnp.asarray(np.arange(encoder_steps + decoder_steps)[None, :] <= q)


class TFT(nn.Module):
    """The TFT; ``mode`` picks float, fake-quant (QAT) or int8 arithmetic for the layers
    that ``cfg.quant.qat_layers`` covers (default: float, or fake-quant when ``cfg.quant.qat``)."""

    cfg: TFTConfig
    mode: str | None = None
    calibration: str | None = None

    @nn.compact
    def __call__(
        self,
        static: Array,
        historical: Array,
        known: Array,
        deterministic: bool = True,
        instrument: Array | None = None,
    ) -> tuple[Array, Interpretation]:
        cfg, det = self.cfg, deterministic
        blocks = Blocks.of(cfg, self.mode, self.calibration, det)
        te = historical.shape[1]
        td = known.shape[1] - te
        lay = covariate_layout(cfg)
        past = jnp.concatenate([historical, known[:, :te]], axis=-1)  # [B, T_e, F_h + F_k]
        future = known[:, te:]
        cats = [indices(x, w) for x, w in zip((static, past, future), lay)]
        if lay.any and (dt := self.compute_dtype()) is not None:  # indices read in float32
            static, past, future = (a.astype(dt) for a in (static, past, future))

        # 1-2. Static covariates and their four contexts.
        zeta, static_w = self.static_selection(blocks, static, instrument, past.dtype, cats[0])
        c_s, c_e, c_h, c_c = blocks.static_contexts(zeta.astype(past.dtype))

        # 3. Variable selection at every step (context c_s).
        enc_vsn = blocks.vsn(past.shape[-1], "encoder_vsn", categorical=lay.encoder)
        xi_enc, hist_w = enc_vsn(past, c_s[:, None, :], det, categories=cats[1])
        dec_vsn = blocks.vsn(cfg.model.num_known, "decoder_vsn", categorical=lay.decoder)
        xi_dec, fut_w = dec_vsn(future, c_s[:, None, :], det, categories=cats[2])

        # 4. LSTM encoder seeded by the static context, decoder from its final state.
        carry, h_enc = blocks.lstm("lstm_encoder")((c_c, c_h), xi_enc)
        _, h_dec = blocks.lstm("lstm_decoder")(carry, xi_dec)
        phi = checkpoint_name(jnp.concatenate([h_enc, h_dec], axis=1), "lstm_out")  # [B, T, d]
        xi = jnp.concatenate([xi_enc, xi_dec], axis=1)

        # 5-6. Gated skip over the LSTM, static enrichment.
        phi_t = blocks.gate("lstm_gate", xi, phi, blocks.rate, blocks.plan.encoders)
        theta = blocks.grn("enrichment", phi_t, c_e[:, None, :])

        # 7. Causal interpretable attention, queries at the decoder steps.
        attn, attn_w = blocks.attention(theta[:, te:], theta, causal_mask(te, td))
        attn = checkpoint_name(attn, "attention_out")

        # 8-9. Gates, position-wise GRN, quantile head.
        delta = blocks.gate("attention_gate", theta[:, te:], attn, blocks.rate, False)
        psi = blocks.grn("positionwise", delta, None)
        psi_t = blocks.gate("output_gate", phi_t[:, te:], psi, 0.0, False)
        pred = self.head(blocks, psi_t)
        interp = Interpretation(static_w, hist_w, fut_w, attn_w)
        return pred, jax.tree.map(lambda a: a.astype(jnp.float32), interp)

    def compute_dtype(self):
        """The dtype :func:`apply_fn` would cast the inputs to (None: float32, as given)."""
        if self.cfg.execution.precision == "f32" or quant_spec(self.cfg, self.mode) is not None:
            return None
        return COMPUTE_DTYPES[self.cfg.execution.precision]

    def static_selection(
        self,
        blocks: Blocks,
        static: Array,
        instrument: Array | None,
        dtype,
        categories: Array | None = None,
    ) -> tuple[Array, Array]:
        """``(ζ, the static weights)``. Under a vocabulary, static input 0 is the instrument:
        ``instrument`` [B] int32 indexes a learned table (its last row: unknown, which
        ``--instrument-dropout`` trains; an index outside it is refused on the host,
        tftjax.training.trainer). ``categories``: your own static categories' indices."""
        cfg, det = self.cfg, blocks.deterministic
        own = covariate_layout(cfg).static
        if not cfg.model.instruments:
            vsn = blocks.vsn(cfg.model.num_static, "static_vsn", categorical=own)
            return vsn(static, None, det, categories=categories)
        if instrument is None:
            raise ValueError(
                "a TFT over an instrument vocabulary needs `instrument`, the "
                "windows' int32 vocabulary rows (Batch.instrument)"
            )
        idx = instrument.astype(jnp.int32)
        if not det and cfg.model.instrument_dropout > 0:
            drop = jax.random.bernoulli(
                self.make_rng("dropout"), cfg.model.instrument_dropout, idx.shape
            )
            idx = jnp.where(drop, cfg.model.instruments, idx)
        static = static.at[:, 0].set(0).astype(dtype)
        vsn = blocks.vsn(
            cfg.model.num_static, "static_vsn", vocab=cfg.model.instruments + 1, categorical=own
        )
        return vsn(static, None, det, idx, categories)

    def head(self, blocks: Blocks, psi_t: Array) -> Array:
        """The float32 quantile head (bf16: its parameters are not cast, see
        :func:`apply_fn`), ``[B, T_d, Q]``; anchored (``--anchor``): Δ ``[.., Q]`` and s
        ``[.., 1]`` from a zero-initialised layer, turned into quantiles around the anchor by
        :func:`tftjax.training.steps.anchored`."""
        head = self.cfg.head
        anchored = head.anchor != "none"
        pred = Dense(
            len(head.quantiles) + anchored, quant=blocks.quant, zero_init=anchored, name="quantiles"
        )(psi_t).astype(jnp.float32)
        if head.monotone_quantiles:
            pred = monotone(pred, head.median_index)
        return pred


@functools.lru_cache(maxsize=None)
def apply_fn(cfg: TFTConfig, mode: str | None = None):
    """``TFT(cfg, mode).apply`` at ``cfg.execution.precision``. bf16: the float32 parameters are cast to
    bfloat16 copies for the step (:func:`compute_params`; their gradients come back float32
    through the cast, or bfloat16 when the caller passes the copies) and so are the inputs,
    so that matmuls and stored activations are bfloat16; the layers keep their LayerNorm
    statistics, softmaxes and LSTM cell state in float32, and the quantile head and the
    outputs are float32. Quantized arithmetic (fake-quant, int8) is float32."""
    model = TFT(cfg, mode)
    if cfg.execution.precision == "f32" or quant_spec(cfg, mode) is not None:  # quantized: float32
        return model.apply
    dt = COMPUTE_DTYPES[cfg.execution.precision]

    own_categories = covariate_layout(cfg).any  # their indices are read in float32: TFT casts

    def cast(a):
        floating = jnp.issubdtype(a.dtype, jnp.floating)
        return a.astype(dt) if floating and not own_categories else a

    def apply(variables, static, historical, known, *args, **kw):
        params = compute_params(cfg, variables["params"], mode=mode)
        # the statics too (the instrument rides as an int32 index, not in static): their
        # contexts feed every later block, and a float32 context promotes it to float32
        return model.apply(
            {**variables, "params": params},
            cast(static),
            cast(historical),
            cast(known),
            *args,
            **kw,
        )

    return apply


def monotone(raw: Array, m: int) -> Array:
    """Non-crossing quantiles from raw head outputs ``[..., Q]``: ``raw[m]`` is the median,
    the others sit softplus gaps above or below their inner neighbour."""
    base = raw[..., m : m + 1]
    up = base + jnp.cumsum(jax.nn.softplus(raw[..., m + 1 :]), axis=-1)
    down = base - jnp.cumsum(jax.nn.softplus(raw[..., :m][..., ::-1]), axis=-1)[..., ::-1]
    return jnp.concatenate([down, base, up], axis=-1)


def init_params(cfg: TFTConfig, key: Array, batch_size: int = 2) -> dict:
    """Parameters of a TFT for ``cfg`` (shapes from a dummy batch)."""
    return init_variables(cfg, key, batch_size)["params"]


def init_variables(cfg: TFTConfig, key: Array, batch_size: int = 2) -> dict:
    """``params`` and, for a QAT config, the unobserved ``quant_stats``.

    Models that differ only in :attr:`TFTConfig.INIT_NEUTRAL_FIELDS` (the remat tier, the
    dropout rate, ...) initialise to the same values (tested), so they share one compiled
    init."""
    neutral = cfg.init_key()
    # XLA options belong to a top-level jit only: traced (inside a jit or eval_shape), plain
    return _init_fn(neutral, batch_size, not isinstance(key, Tracer))(key)


@functools.lru_cache(maxsize=None)
def _init_fn(cfg: TFTConfig, batch_size: int, top_level: bool = True):
    # Jitted: an eager Flax init compiles every small op on its own (hundreds
    # of XLA:CPU compiles, ~25 s even for the tiny preset). Cached: one compile
    # per model in a process (the init traces the whole forward pass). Compiled with little
    # optimisation: it runs once, and XLA:CPU's -O2 compiles it 2x as long (tiny preset and
    # TFT-225: ~4 s against ~8.5 s) for values that differ at most in the last bit of a float.
    return jax.jit(
        lambda k: TFT(cfg).init(
            {"params": k}, *dummy_inputs(cfg, batch_size), True, jnp.zeros((batch_size,), jnp.int32)
        ),
        compiler_options=RUN_ONCE if top_level else None,
    )


# XLA options for programs that run once (inits): their compile, not their speed, is the cost.
RUN_ONCE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def dummy_inputs(cfg: TFTConfig, batch_size: int) -> tuple[Array, Array, Array]:
    t = cfg.data.encoder_steps + cfg.data.decoder_steps
    return (
        jnp.zeros((batch_size, cfg.model.num_static)),
        jnp.zeros((batch_size, cfg.data.encoder_steps, cfg.model.num_historical)),
        jnp.zeros((batch_size, t, cfg.model.num_known)),
    )
