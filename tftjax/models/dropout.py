"""The TFT's dropout masks: a counter-based hash of each element's index and the site's key.

Every dropout site of the model (the GLUs' inputs, the attention weights, the stacked GRNs'
``η``) keeps element ``i`` when ``hash(key, i)`` falls below the keep threshold. The key is
the site's own (``make_rng("dropout")`` at the site's module path, as flax's
``nn.Dropout`` takes it); the hash is element-wise integer arithmetic: XLA fuses it into the
mask's consumer instead of drawing and storing random bits at each site (on a GPU, flax's
``nn.Dropout`` is three to four launches a site and a stored mask), and a layer and the
Pallas kernel that replaces it (tftjax.models.kernels.params) drop the same units because
both call :class:`Dropout` at the same path.

The hash: murmur3's 32-bit finaliser, twice, over ``i`` mixed with the key's two words (the
philox and threefry families are the rigorous counter-based generators; murmur3's
finaliser passes avalanche tests and is what hash-based dropout in GPU kernels commonly
uses). The keep probability is a multiple of 2⁻¹⁶ (16 bits of the hash are compared), and
kept values are divided by that exact probability, so the mask is unbiased. Tested: the
keep rate within binomial bounds, independence between neighbouring elements and between
keys.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jax.Array

KEEP_LEVELS = 1 << 16


def _fmix32(x: Array) -> Array:
    x = x ^ (x >> 16)
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def _words(key: Array) -> tuple[Array, Array]:
    """Two uint32 words of a typed or raw key (rbg keys have four: the first two)."""
    data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    data = data.reshape(-1).astype(jnp.uint32)
    return data[0], data[1]


def keep_mask(key: Array, rate: float, shape: tuple[int, ...]) -> Array:
    """Dropout keep-mask of ``shape``: ``True`` with probability ``keep_prob(rate)``,
    element ``i`` (row-major) kept when ``hash(key, i)``'s top 16 bits fall below the
    threshold."""
    k0, k1 = _words(key)
    idx = jnp.zeros(shape, jnp.uint32)
    for axis, n in enumerate(shape):  # the row-major flat index, element-wise (fusable)
        idx = idx * np.uint32(n) + lax.broadcasted_iota(jnp.uint32, shape, axis)
    h = _fmix32(_fmix32(idx * np.uint32(0x9E3779B9) + k0) ^ k1)
    return (h >> 16) < np.uint32(_keep_threshold(rate))


def _keep_threshold(rate: float) -> int:
    return round((1.0 - rate) * KEEP_LEVELS)


def keep_prob(rate: float) -> float:
    """The exact keep probability of :func:`keep_mask` (a multiple of 2⁻¹⁶, within 2⁻¹⁷ of
    ``1 - rate``); kept values are scaled by its inverse so that the mask is unbiased."""
    return _keep_threshold(rate) / KEEP_LEVELS


class Dropout(nn.Module):
    """``nn.Dropout`` (the same name at the same path, so the same key) with
    :func:`keep_mask`'s units: ``x`` with kept elements divided by :func:`keep_prob` and
    the rest 0; ``mask_only``: the keep mask of ``x``'s shape itself (None when nothing is
    dropped), for a Pallas kernel that applies it."""

    rate: float

    @nn.compact
    def __call__(self, x: Any, deterministic: bool, mask_only: bool = False) -> Any:
        if deterministic or self.rate == 0.0:
            return None if mask_only else x
        keep = keep_mask(self.make_rng("dropout"), self.rate, x.shape)
        if mask_only:
            return keep
        # divided in float32 (bf16 too): one rounding of the result, not of the probability
        return jnp.where(keep, x.astype(jnp.float32) / keep_prob(self.rate), 0).astype(x.dtype)
