"""What the Pallas/Triton kernels share: Triton's sizes, the compiler parameters, matmuls
with float32 sums, the FLOPs a kernel states for the census, masked tiles and the backward
passes' row splits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array
MIN_DOT = 16
"""Triton's smallest dot dimension: padded sizes are powers of two of at least this."""


def dot_size(n: int) -> int:
    """The power of two ≥ ``n`` and ≥ :data:`MIN_DOT`: a size Triton's loads and dots take."""
    return max(MIN_DOT, 1 << max(0, n - 1).bit_length())


def triton_params(interpret: bool, num_warps: int = 4):
    """Triton's compiler parameters (None in the interpreter)."""
    if interpret:
        return None
    from jax.experimental.pallas import triton as plt

    return plt.CompilerParams(num_warps=num_warps, num_stages=1)


def dot(a: Array, b: Array, ca: int, cb: int, cd) -> Array:
    """``a`` contracted on axis ``ca`` with ``b`` on ``cb``: operands in ``cd``, float32 sum."""
    return lax.dot_general(
        a.astype(cd), b.astype(cd), (((ca,), (cb,)), ((), ())), preferred_element_type=jnp.float32
    )


def meta(flops: int) -> dict:
    """A kernel's matmul FLOPs, serialised into the compiled HLO (tftjax.memory.hlo_cost
    reads them: XLA does not look inside a Triton call)."""
    return {"matmul_flops": str(int(flops))}


def plt():
    """Pallas' Triton module (masked loads and stores)."""
    from jax.experimental.pallas import triton as plt

    return plt


def start(at: int = 0):
    """A tile's first index, traced: a tile may run past its axis's end (masked), which a
    static start would be refused for."""
    return jnp.int32(at)


def row_splits(tiles: int, most: int) -> int:
    """Row splits for a backward grid: at most ``most``, the largest that divides the tiles
    if it is at least half of that (no padded rows: padding and slicing back are launches of
    their own), else ``most`` (the rows padded)."""
    if tiles <= most:
        return tiles
    best = max(s for s in range(1, most + 1) if tiles % s == 0)
    return best if 2 * best >= most else most
