"""A model config bound to its device data and compiled steps: train, evaluate, predict.

:class:`Trainer` is what the run loop's task and the tests drive; :func:`train_epochs`
trains without checkpoints (to compare execution settings trained from one seed).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.config import ConfigError, TFTConfig, TrainConfig
from tftjax.data import Dataset, DeviceData, epoch_batches, to_device
from tftjax.models.compute import quant_spec
from tftjax.quant.tree import int8_variables, unobserved
from tftjax.stats import losses
from tftjax.training.state import TrainState, create_train_state
from tftjax.training.steps import make_eval_step, make_train_step

Array = jax.Array


class Trainer:
    """Binds a model config, its device data and compiled steps.

    ``train_step(state, batch_idx, key)`` and ``evaluate(params, starts)`` are
    what the loop uses; tests call them directly.
    """

    def __init__(
        self,
        cfg: TFTConfig,
        tc: TrainConfig,
        data: DeviceData,
        max_traces: int | None = None,
        par=None,
    ):
        self.cfg, self.tc, self.data, self.par = cfg, tc, data, par
        check_instruments(cfg, data)
        if par is not None:
            from tftjax.runner.mesh import check_divisible

            check_divisible(
                tc.batch_size // tc.accumulate,
                par.size,
                "--batch-size"
                if tc.accumulate == 1
                else f"--batch-size / --accumulate {tc.accumulate} =",
            )
        self._train = make_train_step(
            cfg, max_traces=max_traces, par=par, accumulate=tc.accumulate, ema=tc.ema
        )
        # an eval batch is padded anyway: round it up to a multiple of the devices
        n = par.size if par is not None else 1
        self.eval_batch_size = -(-tc.eval_batch_size // n) * n

    def _batch(self, idx) -> Array:
        idx = np.asarray(idx, np.int32)
        return self.par.batch(idx) if self.par is not None else jnp.asarray(idx)

    def train_step(self, state: TrainState, batch_idx, key):
        return self._train(state, self.data, self._batch(batch_idx), key)

    def evaluate(self, variables, starts: np.ndarray, mode: str | None = None) -> dict[str, float]:
        """Loss and q-risk over the windows at ``starts``; ``variables``: a Flax variables
        dict (or bare params), ``mode``: see :func:`model_variables`."""
        return losses.finalize(self.metric_sums(variables, starts, mode))

    def metric_sums(self, variables, starts: np.ndarray, mode: str | None = None):
        """The sums :meth:`evaluate` finalizes (on device): sums of disjoint sets of windows
        add up to those of their union, so a panel's pooled metrics need no second pass."""
        step = make_eval_step(self.cfg, mode, self.par)
        variables = model_variables(self.cfg, variables, mode)
        total = None
        for idx in _eval_batches(starts, self.eval_batch_size):
            sums, _, _ = step(variables, self.data, self._batch(idx))
            total = sums if total is None else losses.add(total, sums)
        if total is None:
            raise ValueError("no windows to evaluate")
        return total

    def predict(self, variables, starts: np.ndarray, mode: str | None = None):
        """Predictions ``[n, T_d, Q]`` and interpretation for windows at ``starts``."""
        return predict_windows(
            self.cfg, self.tc, self.data, variables, starts, mode, par=self.par, interpretation=True
        )


def predict_windows(
    cfg: TFTConfig,
    tc: TrainConfig,
    data: DeviceData,
    variables,
    starts: np.ndarray,
    mode: str | None = None,
    *,
    par=None,
    interpretation: bool = False,
):
    """Predictions ``[n, T_d, Q]`` (and with ``interpretation`` the attention and variable
    weights) of the windows at ``starts``, in batches of ``tc.eval_batch_size`` through one
    compiled eval step. Builds no train step: what forecasts use."""
    check_instruments(cfg, data)
    step = make_eval_step(cfg, mode, par)
    variables = model_variables(cfg, variables, mode)
    n = par.size if par is not None else 1
    size = -(-tc.eval_batch_size // n) * n
    preds, interps = [], []
    for idx in _eval_batches(starts, size):
        batch = (
            par.batch(np.asarray(idx, np.int32))
            if par is not None
            else jnp.asarray(np.asarray(idx, np.int32))
        )
        _, pred, interp = step(variables, data, batch)
        keep = np.asarray(idx) >= 0
        preds.append(np.asarray(pred)[keep])
        if interpretation:
            interps.append(jax.tree.map(lambda x, keep=keep: np.asarray(x)[keep], interp))
    pred = np.concatenate(preds)
    if not interpretation:
        return pred
    return pred, jax.tree.map(lambda *xs: np.concatenate(xs), *interps)


def inference_config(cfg: TFTConfig) -> TFTConfig:
    """The same model with the fastest forward pass for forecasts: on CPU the ``full`` tier's
    fused VSN kernel (one variable at a time, nothing ``[m, N, d]`` materialised), which runs
    TFT-225's forward about 6x faster than ``off`` on 2 cores (523 against 81 windows/s,
    experiments/forecast_speed.py); the same function to float32 rounding (the remat tiers
    share their weights). Elsewhere, and for quantized models (the fused kernel is float
    only), the model's own tier."""
    if cfg.quant.qat or jax.default_backend() != "cpu":
        return cfg

    return cfg.override(remat="full")


_min_max = jax.jit(lambda a: (a.min(), a.max()))


def check_instruments(cfg: TFTConfig, data: DeviceData) -> None:
    """Refuse instrument indices outside the model's table (rows ``0..instruments``, the last
    the unknown instrument): under ``jit`` a lookup would clip them to a wrong row silently.

    Raises:
      ConfigError: naming the index and the vocabulary's size.
    """
    if not cfg.model.instruments or data.instrument.size == 0:
        return
    lo, hi = (int(x) for x in _min_max(data.instrument))
    if lo < 0 or hi > cfg.model.instruments:
        raise ConfigError(
            f"instrument index {lo if lo < 0 else hi} is outside this model's "
            f"vocabulary (rows 0..{cfg.model.instruments}: {cfg.model.instruments} "
            "instruments and the unknown one)"
        )


def steps_per_epoch(tc: TrainConfig, train_windows: int) -> int:
    """Optimizer steps in one epoch over ``train_windows`` windows."""
    per_epoch = -(-train_windows // tc.batch_size)
    return min(per_epoch, tc.max_steps_per_epoch) if tc.max_steps_per_epoch else per_epoch


def epoch_indices(tc: TrainConfig, starts: np.ndarray, epoch: int) -> np.ndarray:
    """``[steps, B]`` window starts of one training epoch (``-1`` pads the last batch)."""
    idx, mask = epoch_batches(starts, tc.batch_size, seed=tc.seed, epoch=epoch)
    return np.where(mask, idx, -1).astype(np.int32)[: tc.max_steps_per_epoch]


def train_epochs(
    cfg: TFTConfig, tc: TrainConfig, ds: Dataset, epochs: int | None = None, par=None
) -> tuple[TrainState, list[float]]:
    """``epochs`` (default ``tc.epochs``) epochs of the run loop's training steps (the same
    batches, initial weights and dropout key from ``tc.seed``) without checkpoints or
    evaluation: the final state and each epoch's mean training loss. For comparisons of
    execution settings (remat tiers, meshes, accumulation) trained from one seed."""
    epochs = tc.epochs if epochs is None else epochs
    data = par.put_data(ds.features) if par is not None else to_device(ds.features)
    trainer = Trainer(cfg, tc, data, par=par)
    total_steps = steps_per_epoch(tc, ds.splits.train.size) * tc.epochs
    state = create_train_state(cfg, tc, jax.random.key(tc.seed), total_steps)
    key = jax.random.key(tc.seed, impl="rbg")
    if par is not None:
        state, key = par.replicate(state), par.replicate(key)
    history = []
    for epoch in range(1, epochs + 1):
        idx = epoch_indices(tc, ds.splits.train, epoch)
        total = 0.0
        for b in idx:
            state, m = trainer.train_step(state, b, key)
            total += float(m["loss"]) * int((b >= 0).sum())
        history.append(total / max(int((idx >= 0).sum()), 1))
    return state, history


def leaf_differences(params, reference) -> dict[str, float]:
    """Per parameter leaf: ``max |p - r| / max |r|`` (the largest difference relative to the
    leaf's scale), keyed by the leaf's path."""
    out = {}
    for (path, a), b in zip(
        jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(reference)
    ):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        out[jax.tree_util.keystr(path)] = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    return out


def model_variables(cfg: TFTConfig, variables: dict, mode: str | None = None) -> dict:
    """The variables a TFT of ``cfg`` runs with in ``mode`` (``None``: the config's own;
    ``float``; ``fake``: fake-quant; ``int8``: int8 kernels, converted here from float ones
    unless they already are). ``variables`` may be bare params (a float model).

    Raises:
      ConfigError: a quantized mode whose activation observers never saw data (train with
        --qat or calibrate first: their range would quantize everything to zero).
    """
    if "params" not in variables:
        variables = {"params": variables}
    spec = quant_spec(cfg, mode)
    if spec is None:
        return {"params": variables["params"]}
    stats = variables.get("quant_stats")
    if stats is None or unobserved(stats):
        raise ConfigError(
            f"{spec.mode} inference needs observed activation ranges: train with "
            "--qat, or calibrate a float model (--calibrate N)"
        )
    if spec.mode == "int8" and "weight_scale" not in variables:
        variables = {**to_int8(variables["params"], spec), "quant_stats": stats}
    return variables


@functools.partial(jax.jit, static_argnums=1)
def to_int8(params, spec):
    """:func:`tftjax.quant.tree.int8_variables`, jitted (one compile instead of one per eager op
    of every kernel)."""
    return int8_variables(params, spec)


def _eval_batches(starts: np.ndarray, batch_size: int):
    # One batch shape for every call: one compiled eval step.
    idx, mask = epoch_batches(starts, batch_size, seed=0, epoch=0, shuffle=False)
    for i, m in zip(idx, mask):
        yield np.where(m, i, -1).astype(np.int32)
