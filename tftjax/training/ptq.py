"""Post-training quantization: calibrate a float model's activation observers on training
batches, without training."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.config import TFTConfig
from tftjax.data import DeviceData, epoch_batches, gather
from tftjax.models.tft import TFT, init_variables

Array = jax.Array


@functools.lru_cache(maxsize=None)
def _calibrate_step(cfg: TFTConfig):
    model = TFT(cfg, "fake")

    @jax.jit
    def step(variables, data: DeviceData, batch_idx: Array):
        batch = gather(data, batch_idx, cfg.encoder_steps, cfg.decoder_steps)
        _, updated = model.apply(variables, batch.static, batch.historical, batch.known, True,
                                 mutable=["quant_stats"])
        return updated["quant_stats"]

    return step


def calibrate(cfg: TFTConfig, params, data: DeviceData, starts: np.ndarray, batches: int,
              batch_size: int, seed: int = 0) -> tuple[TFTConfig, dict]:
    """Post-training quantization: observers of a float model's layers (``cfg.qat_layers``)
    calibrated on ``batches`` shuffled full batches of the windows at ``starts`` (training
    windows; cycled if there are fewer), no training. Returns the quantized config and its
    ``quant_stats``."""
    qcfg = dataclasses.replace(cfg, qat=True)
    stats = init_variables(qcfg, jax.random.key(0))["quant_stats"]
    idx, mask = epoch_batches(starts, batch_size, seed=seed, epoch=1)
    full = [i for i, m in zip(idx, mask) if m.all()] or [np.resize(idx[0][mask[0]], batch_size)]
    step = _calibrate_step(qcfg)
    for b in range(batches):
        stats = step({"params": params, "quant_stats": stats}, data,
                     jnp.asarray(full[b % len(full)], jnp.int32))
    return qcfg, stats
