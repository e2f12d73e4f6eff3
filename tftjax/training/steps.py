"""The jitted train and eval steps, with gradient accumulation and mesh shardings.

Steps are pure functions ``(state, data, batch_idx, key) -> (state, metrics)`` jitted
with the old state donated; a batch is a vector of window *start indices* (``-1`` pads
the last batch) and the windows are gathered on the device inside the step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.config import TFTConfig
from tftjax.data import DeviceData, gather
from tftjax.models.compute import compute_params, kernel_mode, quant_spec
from tftjax.models.kernels import multi_tensor
from tftjax.models.tft import apply_fn
from tftjax.quant import core as qt
from tftjax.stats import losses
from tftjax.training.state import TrainState, member_keys

Array = jax.Array


def _loss_fn(
    params,
    quant_stats,
    apply_fn,
    batch,
    mask,
    quantiles,
    dropout_key,
    denom=None,
    cfg: TFTConfig | None = None,
):
    # quant_batch is mutable: the forward records each observed tensor's range in this
    # (micro-)batch (once: a rematerialised block's recomputation only rebuilds residuals);
    # the step merges them and moves every observer once (tftjax.quant.core.update_observers).
    (pred, _), recorded = apply_fn(
        {"params": params, "quant_stats": quant_stats},
        batch.static,
        batch.historical,
        batch.known,
        False,
        batch.instrument,
        rngs={"dropout": dropout_key},
        mutable=["quant_batch"],
    )
    pred = forecast(pred, batch, cfg)
    target = batch.target
    if cfg is not None and cfg.head.anchor != "none" and cfg.head.anchor_loss == "vol":
        # pinball(y/σ, q/σ) = pinball(y, q)/σ: each window and step in units of the anchor
        target, pred = target / batch.anchor, pred / batch.anchor[..., None]
    return (
        losses.quantile_loss(target, pred, quantiles, mask, denom),
        recorded.get("quant_batch", {}),
    )


def at_matmul_precision(cfg: TFTConfig, fn: Callable) -> Callable:
    """``fn`` traced under ``cfg.execution.matmul_precision`` (``jax.default_matmul_precision``;
    ``default``: whatever the process has set). The whole step runs inside it, so that the
    backward pass's matmuls (traced after the forward's) get it too."""
    if cfg.execution.matmul_precision == "default":
        return fn

    @functools.wraps(fn)
    def traced(*args, **kw):
        with jax.default_matmul_precision(cfg.execution.matmul_precision):
            return fn(*args, **kw)

    return traced


def forecast(raw: Array, batch, cfg: TFTConfig | None) -> Array:
    """The quantile forecasts ``[B, D, Q]`` in target units from the network's outputs: as
    they are; (``vol_target``) times each window's EWMA volatility at its forecast time; or
    (``anchor``) :func:`anchored`."""
    if cfg is not None and cfg.head.anchor != "none":
        return anchored(raw, batch.anchor, batch.anchor_z, cfg)
    return raw * batch.scale[:, None, None] if cfg is not None and cfg.head.vol_target else raw


def anchored(raw: Array, sigma: Array, z: Array, cfg: TFTConfig) -> Array:
    """The anchored head: ``σ[B, D] · exp(s) · (z[B, Q] + Δ)`` with ``Δ = raw[..., :Q]`` and
    ``s = raw[..., Q]`` (``--anchor-median zero``: the median's level fixed at 0). Zero
    outputs (the zero-initialised head) give the anchor's own quantiles ``σ · z``."""
    q = len(cfg.head.quantiles)
    level = z[:, None, :] + raw[..., :q]
    if cfg.head.anchor_median == "zero":
        m = int(np.argmin(np.abs(np.asarray(cfg.head.quantiles) - 0.5)))
        level = level.at[..., m].set(0.0)
    return sigma[..., None] * jnp.exp(raw[..., q:]) * level


def rearranged(pred: Array) -> Array:
    """Monotone rearrangement (Chernozhukov, Fernández-Val & Galichon 2010): each window's
    and step's quantiles sorted, so that they never cross. Sorting the levels' values
    estimates the true quantile function at least as well as the crossing values (their
    Proposition 1) and leaves non-crossing forecasts as they are. Every forecast goes through
    the eval step (tables, backtest, predict, the API, exports' samples), so it applies to
    all of them, and to models saved before it."""
    return jnp.sort(pred, axis=-1)


def no_ranges(quant_stats):
    """An empty :func:`tftjax.quant.core.batch_range` for every observer (``[..., 2]`` of
    ``+inf, -inf``): the start of the micro-batches' merge."""

    def one(st):
        return jnp.stack([jnp.full(st.min.shape, jnp.inf), jnp.full(st.min.shape, -jnp.inf)], -1)

    return jax.tree.map(one, quant_stats, is_leaf=lambda x: isinstance(x, qt.MinMax))


def _gather_fn(cfg: TFTConfig, par):
    if par is not None and par.feature_rows_sharded:
        from tftjax.runner.mesh import gather_rows_sharded

        gather_fn = functools.partial(gather_rows_sharded, par)
    else:
        gather_fn = gather

    def take(data, idx):  # (--target cumulative: the device targets are the k-bar returns)
        return gather_fn(data, idx, cfg.data.encoder_steps, cfg.data.decoder_steps)

    return take


@functools.lru_cache(maxsize=None)
def make_train_step(
    cfg: TFTConfig,
    *,
    max_traces: int | None = None,
    par=None,
    accumulate: int = 1,
    ema: float = 0.0,
) -> Callable:
    """The jitted ``step(state, data, batch_idx, key) -> (state, metrics)``, state donated.

    ``par`` (a :class:`tftjax.runner.mesh.Parallel`): compiled for its mesh, the batch sharded
    over the devices and the state replicated (None: one default device, no shardings).
    ``accumulate`` K: the batch runs as K micro-batches (micro-batch k holds rows k, k+K,
    k+2K, … so that every device works on each) in a ``lax.scan``; their gradients are
    summed in float32 and the optimizer steps once, so the update is the full batch's
    (to round-off; with dropout, micro-batch k draws its masks from the step's key folded
    with k) and the peak memory is one micro-batch's. QAT observers are updated
    once per step, by the whole batch's range (the micro-batches' ranges merged in the scan),
    so accumulation changes memory, not what QAT trains.
    """
    step = _train_step_fn(cfg.override(ensemble=1), par, int(accumulate), ema)
    if cfg.model.ensemble > 1:
        step = ensemble_step(step, cfg.model.ensemble)
    step = at_matmul_precision(cfg, step)
    if max_traces is not None:
        import chex

        step = chex.assert_max_traces(step, n=max_traces)
    if par is None:
        return jax.jit(step, donate_argnums=(0,))
    return jax.jit(
        step,
        donate_argnums=(0,),
        in_shardings=(par.replicated, par.data_shardings(), par.batch_sharding, par.replicated),
        out_shardings=(par.replicated, par.replicated),
    )


def ensemble_step(step: Callable, n: int) -> Callable:
    """``--ensemble N``: one member's ``step`` vmapped over the members' stacked states and
    dropout keys (:func:`~tftjax.training.state.member_keys`), on the same batch: each member
    takes its own gradient and optimizer step, exactly as its own run would. Metrics: the
    members' mean loss and gradient norm."""

    def run(state, data, batch_idx, key):
        new, m = jax.vmap(step, in_axes=(0, None, None, 0))(
            state, data, batch_idx, member_keys(key, n)
        )
        return new, {
            "loss": m["loss"].mean(),
            "grad_norm": m["grad_norm"].mean(),
            "count": m["count"][0],
        }

    return run


def _train_step_fn(cfg: TFTConfig, par, k_acc: int, ema: float = 0.0) -> Callable:
    quantiles = np.asarray(cfg.head.quantiles, np.float32)
    take = _gather_fn(cfg, par)
    spec = quant_spec(cfg)
    # bf16: the step differentiates with respect to the parameters' bfloat16 copies (the
    # gradients come back in their dtype: what the cast's transpose would convert leaf by
    # leaf, the optimizer converts), cast in a few launches under the Pallas optimizer
    opt_k = kernel_mode(cfg, "optimizer")
    cast_leaves = (
        None
        if not opt_k.pallas
        else functools.partial(multi_tensor.cast, dtype=jnp.bfloat16, interpret=opt_k.interpret)
    )

    def grads_of(params, stats, apply_fn, data, idx, fill, dropout_key, denom):
        # a padded row (-1: the last batch of an epoch) is masked out of the loss and gathered
        # as the batch's first window, so that QAT's observers see only real windows
        batch = take(data, jnp.where(idx >= 0, idx, fill))
        return jax.value_and_grad(_loss_fn, has_aux=True)(
            params, stats, apply_fn, batch, idx >= 0, quantiles, dropout_key, denom, cfg
        )

    def step(state: TrainState, data: DeviceData, batch_idx: Array, key: Array):
        mask = batch_idx >= 0
        fill = jnp.maximum(batch_idx[0], 0)  # padding is at the end: row 0 is real
        dropout_key = jax.random.fold_in(key, state.step)
        params = compute_params(cfg, state.params, cast_leaves)
        if k_acc == 1:
            (loss, ranges), grads = grads_of(
                params, state.quant_stats, state.apply_fn, data, batch_idx, fill, dropout_key, None
            )
        else:
            denom = jnp.maximum(mask.sum(), 1).astype(jnp.float32)
            micro = batch_idx.reshape(-1, k_acc).T  # [K, B/K]
            if par is not None:
                micro = jax.lax.with_sharding_constraint(micro, par.micro_batch_sharding)

            def body(carry, xs):
                g_sum, l_sum, seen = carry
                idx, k = xs
                (loss_k, ranges), g = grads_of(
                    params,
                    state.quant_stats,
                    state.apply_fn,
                    data,
                    idx,
                    fill,
                    jax.random.fold_in(dropout_key, k),
                    denom,
                )
                g_sum = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_sum, g)
                return (g_sum, l_sum + loss_k, jax.tree.map(qt.merge_ranges, seen, ranges)), None

            zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
            (grads, loss, ranges), _ = jax.lax.scan(
                body,
                (zeros, jnp.zeros((), jnp.float32), no_ranges(state.quant_stats)),
                (micro, jnp.arange(k_acc)),
            )
        # every observer moves once, by the whole batch's range, whatever the micro-batches
        stats = (
            qt.update_observers(state.quant_stats, ranges, spec)
            if spec is not None
            else state.quant_stats
        )
        # the optimizer's fused step (optax's per leaf, a flat buffer or Pallas kernels)
        params, opt_state, grad_norm = state.tx.step(state.params, grads, state.opt_state)
        new_state = state.replace(
            step=state.step + 1, params=params, opt_state=opt_state, quant_stats=stats
        )
        if ema > 0:  # --ema: the average moves after the optimizer step
            new_state = new_state.replace(
                ema_params=jax.tree.map(
                    lambda e, p: ema * e + (1.0 - ema) * p, state.ema_params, new_state.params
                )
            )
        return new_state, {"loss": loss, "grad_norm": grad_norm, "count": mask.sum()}

    return step


@functools.lru_cache(maxsize=None)
def make_eval_step(cfg: TFTConfig, mode: str | None = None, par=None) -> Callable:
    """Jitted ``(variables, data, batch_idx) -> (MetricSums, predictions, interpretation)``;
    ``mode``: float, fake (-quant) or int8 arithmetic (default: the config's own); ``par``:
    the batch sharded over its devices like the train step's, outputs replicated."""
    quantiles = np.asarray(cfg.head.quantiles, np.float32)
    apply = apply_fn(cfg.override(ensemble=1), mode)
    take = _gather_fn(cfg, par)

    @functools.partial(at_matmul_precision, cfg)
    def step(variables, data: DeviceData, batch_idx: Array):
        mask = batch_idx >= 0
        batch = take(data, jnp.maximum(batch_idx, 0))

        def run(v):
            return apply(v, batch.static, batch.historical, batch.known, True, batch.instrument)

        if cfg.model.ensemble == 1:
            pred, interp = run(variables)
            pred = rearranged(forecast(pred, batch, cfg))
        else:  # every member's rearranged quantiles, averaged (sorted: a mean of sorted
            pred, interp = jax.vmap(run)(variables)  # rows), and its interpretation
            pred = rearranged(forecast(pred, batch, cfg)).mean(axis=0)
            interp = jax.tree.map(lambda x: x.mean(axis=0), interp)
        return losses.metric_sums(batch.target, pred, quantiles, mask), pred, interp

    if par is None:
        return jax.jit(step)
    return jax.jit(
        step,
        in_shardings=(par.replicated, par.data_shardings(), par.batch_sharding),
        out_shardings=par.replicated,
    )
