"""Post-training quantization: a float model's int8 activation ranges calibrated on full
training batches, without training, by one of three methods (``--calibration``):

- ``minmax`` (default): the running min and max over the calibration batches, PyTorch's
  ``MinMaxObserver`` (not the training observers' moving average, in which the first batch
  keeps most of the weight);
- ``percentile:P`` (e.g. ``percentile:99.99``): each observed tensor's P-th and (100−P)-th
  percentiles, averaged over the batches (outliers no longer set the range);
- ``mse``: the range, among :data:`tftjax.quant.calib.MSE_SHRINK` fractions of the min/max range,
  that minimises the tensor's squared quantisation error summed over the batches.

Activations stay float during calibration (the observers only record), as in PyTorch's
prepared models; weights are fake-quantized as they will be.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.config import ConfigError, TFTConfig
from tftjax.data import DeviceData, epoch_batches, gather
from tftjax.models.tft import TFT, init_variables
from tftjax.quant.calib import MSE_SHRINK
from tftjax.quant.core import MinMax

Array = jax.Array


def check_calibration(method: str) -> str:
    """``minmax``, ``mse`` or ``percentile:P`` with 50 < P < 100, else one-line ConfigError."""
    if method in ("minmax", "mse"):
        return method
    if method.startswith("percentile:"):
        try:
            p = float(method.split(":", 1)[1])
        except ValueError:
            p = float("nan")
        if 50 < p < 100:
            return method
        raise ConfigError(
            f"--calibration {method}: the percentile must be in (50, 100), e.g. percentile:99.99"
        )
    raise ConfigError(f"--calibration must be minmax, percentile:P or mse, got {method!r}")


@functools.lru_cache(maxsize=None)
def _record_step(cfg: TFTConfig, method: str):
    model = TFT(cfg, "fake", calibration=method)

    @jax.jit
    def step(variables, data: DeviceData, batch_idx: Array):
        batch = gather(data, batch_idx, cfg.data.encoder_steps, cfg.data.decoder_steps)
        _, rec = model.apply(
            variables,
            batch.static,
            batch.historical,
            batch.known,
            True,
            batch.instrument,
            mutable=["quant_calib"],
        )
        return rec["quant_calib"]

    return step


def _paths(tree, leaf=None) -> dict:
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=leaf)[0]
    return {tuple(getattr(k, "key", getattr(k, "name", None)) for k in p): v for p, v in flat}


def _rebuild(like: dict, values: dict, prefix: tuple = ()) -> dict:
    out = {}
    for k, v in like.items():
        out[k] = (
            values[prefix + (k,)] if isinstance(v, MinMax) else _rebuild(v, values, prefix + (k,))
        )
    return out


def calibrate(
    cfg: TFTConfig,
    params,
    data: DeviceData,
    starts: np.ndarray,
    batches: int,
    batch_size: int,
    seed: int = 0,
    method: str = "minmax",
    options: dict | None = None,
) -> tuple[TFTConfig, dict]:
    """Post-training quantization: the activation ranges of a float model's layers
    (``cfg.quant.qat_layers``) from ``batches`` shuffled *full* batches of the windows at
    ``starts`` (training windows; cycled if there are fewer) by ``method``, under the
    quantization ``options`` (``act_symmetric``, ``weight_granularity``, ``stacked_scales``).
    Returns the quantized config and its ``quant_stats``.

    Raises:
      ConfigError: a bad method, ``batches`` < 1, or fewer windows than one batch.
    """
    method = check_calibration(method)
    if batches < 1:
        raise ConfigError(f"--calibrate must be >= 1 batch, got {batches}")
    qcfg = cfg.override(qat=True, **(options or {}))
    like = init_variables(qcfg, jax.random.key(0))["quant_stats"]
    idx, mask = epoch_batches(starts, batch_size, seed=seed, epoch=1)
    full = [i for i, m in zip(idx, mask) if m.all()]
    if not full:
        raise ConfigError(
            f"--calibrate needs full batches: {len(starts)} training windows are "
            f"fewer than one batch of {batch_size}"
        )
    picks = [jnp.asarray(full[b % len(full)], jnp.int32) for b in range(batches)]
    is_mm = lambda x: isinstance(x, MinMax)
    names = list(_paths(like, is_mm))

    def records(m, stats):
        step = _record_step(qcfg, m)
        return [
            _paths(jax.device_get(step({"params": params, "quant_stats": stats}, data, i)))
            for i in picks
        ]

    first = "minmax" if method == "mse" else method
    recs = records(first, like)
    lo = {n: np.array([r[n][..., 0] for r in recs]) for n in names}  # [batches, (m,)]
    hi = {n: np.array([r[n][..., 1] for r in recs]) for n in names}
    reduce_lo, reduce_hi = (np.min, np.max) if first == "minmax" else (np.mean, np.mean)
    ranges = {}
    for n in names:  # over the batches (axis 0); per variable where the observer is
        mn, mx = reduce_lo(lo[n], axis=0), reduce_hi(hi[n], axis=0)
        ranges[n] = MinMax(
            jnp.asarray(mn, jnp.float32),
            jnp.asarray(mx, jnp.float32),
            jnp.full(np.shape(mn), batches, jnp.int32),
        )
    if method == "mse":  # the candidate range of least squared error, over the same batches
        ref = _rebuild(like, ranges)
        errs = records("mse", ref)
        for n in names:
            a = np.asarray(MSE_SHRINK, np.float32)[
                np.argmin(np.sum([r[n] for r in errs], axis=0), axis=-1)
            ]
            ranges[n] = MinMax(ranges[n].min * a, ranges[n].max * a, ranges[n].count)
    return qcfg, _rebuild(like, ranges)
