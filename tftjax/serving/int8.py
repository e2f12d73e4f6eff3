"""What the int8 export holds beside the int8 weights (:mod:`tftjax.export`): each activation
observer's scale and zero point, and sample windows with tftjax's int8 outputs for them, so
that another runtime can rebuild and check the int8 forward (``docs/int8_format.md``)."""

from __future__ import annotations

from typing import Any

import numpy as np

SAMPLES = 8
"""Sample windows in ``samples.safetensors``."""


def act_qparams(stats: Any, symmetric: bool) -> dict:
    """``{scale, zero_point}`` (float32, int32) of every observer in ``stats``, by
    :func:`tftjax.quant.core.activation_qparams` (what the int8 forward quantizes with)."""
    from tftjax.quant.core import MinMax, activation_qparams

    if isinstance(stats, MinMax):
        s, zp = activation_qparams(stats, symmetric)
        return {"scale": np.asarray(s, np.float32), "zero_point": np.asarray(zp, np.int32)}
    return {k: act_qparams(v, symmetric) for k, v in stats.items()}


def samples(cfg, variables: dict, ds=None, n: int = SAMPLES) -> tuple[dict[str, np.ndarray], str]:
    """The first ``n`` test windows of ``ds`` (``n`` standard normal inputs without one) and
    the int8 path's outputs for them, as ``samples.safetensors`` holds them."""
    import jax
    import jax.numpy as jnp

    from tftjax.data import gather, to_device
    from tftjax.models.tft import TFT

    starts = np.asarray(ds.splits.test)[:n] if ds is not None else np.zeros(0)
    if ds is not None and len(starts):
        b = gather(
            to_device(ds.features),
            jnp.asarray(starts, jnp.int32),
            cfg.data.encoder_steps,
            cfg.data.decoder_steps,
        )
        x, source = (
            (b.static, b.historical, b.known, b.instrument),
            f"the first test windows of {ds.describe()}",
        )
    else:
        k = jax.random.split(jax.random.key(0), 3)
        te, td = cfg.data.encoder_steps, cfg.data.decoder_steps
        x = (
            jax.random.normal(k[0], (n, cfg.model.num_static)),
            jax.random.normal(k[1], (n, te, cfg.model.num_historical)),
            jax.random.normal(k[2], (n, te + td, cfg.model.num_known)),
            jnp.zeros((n,), jnp.int32),
        )
        source = "standard normal inputs"
    # op by op (not jitted): XLA's fusions reorder float sums, and a value within round-off
    # of a rounding boundary lands one int8 step away in a jitted program and moves what
    # follows; op by op is the arithmetic docs/int8_format.md writes out
    out = TFT(cfg, "int8").apply(variables, *x[:3], True, x[3])[0]
    names = ("static", "historical", "known")
    return (
        {
            **{n: np.asarray(a, np.float32) for n, a in zip(names, x)},
            "instrument": np.asarray(x[3], np.int32),
            "int8_output": np.asarray(out, np.float32),
        },
        source,
    )
