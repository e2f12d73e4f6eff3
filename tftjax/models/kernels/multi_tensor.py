"""Element-wise work over many arrays at once as one Pallas kernel (GPU, Triton): apex's
multi-tensor apply, in JAX.

On a GPU, XLA runs an element-wise operation on each of many small arrays (parameter
leaves, per-leaf partial sums) as a launch of its own wherever it cannot fuse it into the
consumer: a Pallas call is such a consumer. Here the arrays' blocks of :data:`BLOCK`
elements are laid end to end over one grid; each program finds its array by a static branch
on its program index and works on its block (masked loads and stores for the last one).

* :func:`cast`: the bf16 step's copies of the parameters;
* :func:`sum_splits`: a kernel's per-split partial gradients ``[S, ...]``, summed over the
  splits (the Pallas VSN's backward pass);
* the optimizer step (:mod:`tftjax.models.kernels.pallas_adamw`) lays its leaves out the same way.

A CUDA kernel's parameters are limited to 4 KB: a kernel takes at most a few dozen arrays,
so the arrays are cut into groups of :data:`GROUP` (or the caller's group size), one launch
each. On CPU the kernels run in Pallas' interpreter (the tests compare them with numpy).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tftjax.models.kernels.triton_util import triton_params

Array = jax.Array
BLOCK = 1024
"""Elements of one array per program (float32: 4 KB per operand)."""
GROUP = 96
"""Arrays per kernel when each takes two pointers (an input and an output)."""


@dataclasses.dataclass(frozen=True)
class Leaf:
    size: int
    start: int  # its first program in the kernel's grid
    blocks: int
    decay: bool = False  # the optimizer's: decayed or not


def layout(sizes: list[int], decays: list[bool] | None = None) -> tuple[tuple[Leaf, ...], int]:
    """Arrays of ``sizes`` elements laid end to end in blocks: their :class:`Leaf` and the
    grid's programs in all."""
    leaves, start = [], 0
    for i, n in enumerate(sizes):
        b = -(-n // BLOCK)
        leaves.append(Leaf(n, start, b, bool(decays[i]) if decays is not None else False))
        start += b
    return tuple(leaves), start


def block(i, leaf: Leaf):
    """Program ``i``'s block of ``leaf``: (its slice, the mask of real elements)."""
    k = i - leaf.start
    offs = k * BLOCK + jnp.arange(BLOCK)
    return pl.ds(k * BLOCK, BLOCK), offs < leaf.size


def mine(i, leaf: Leaf):
    return (i >= leaf.start) & (i < leaf.start + leaf.blocks)


def load(ref, sl, mask):
    """A masked load: the elements past the array's end read as 0 (the last block's tail)."""
    from jax.experimental.pallas import triton as plt

    return plt.load(ref.at[sl], mask=mask, other=0.0)


def store(ref, sl, val, mask):
    from jax.experimental.pallas import triton as plt

    plt.store(ref.at[sl], val, mask=mask)


def _cast_kernel(*refs, leaves: tuple[Leaf, ...]):
    n = len(leaves)
    pid = pl.program_id(0)  # read here: the interpreter cannot read it inside a branch
    for leaf, x_ref, o_ref in zip(leaves, refs[:n], refs[n:]):

        @pl.when(mine(pid, leaf))
        def _(leaf=leaf, x_ref=x_ref, o_ref=o_ref):
            sl, mask = block(pid, leaf)
            store(o_ref, sl, load(x_ref, sl, mask).astype(o_ref.dtype), mask)


def _sum_kernel(*refs, leaves: tuple[Leaf, ...], splits: tuple[int, ...]):
    n = len(leaves)
    pid = pl.program_id(0)
    for leaf, s, x_ref, o_ref in zip(leaves, splits, refs[:n], refs[n:]):

        @pl.when(mine(pid, leaf))
        def _(leaf=leaf, s=s, x_ref=x_ref, o_ref=o_ref):
            sl, mask = block(pid, leaf)

            def add(j, acc):  # split j's block: offset j * size in the flattened [S, size]
                part = pl.ds(j * leaf.size + sl.start, BLOCK)
                return acc + load(x_ref, part, mask).astype(jnp.float32)

            total = lax.fori_loop(0, s, add, jnp.zeros((BLOCK,), jnp.float32))
            store(o_ref, sl, total.astype(o_ref.dtype), mask)


def _grouped(
    name: str,
    kernel,
    xs: list[Array],
    outs: list[jax.ShapeDtypeStruct],
    sizes: list[int],
    interpret: bool,
    **kw,
) -> list[Array]:
    res = []
    for lo in range(0, len(xs), GROUP):
        flat = [a.reshape(-1) for a in xs[lo : lo + GROUP]]
        shapes = outs[lo : lo + GROUP]
        leaves, total = layout(sizes[lo : lo + GROUP])
        part = {k: v[lo : lo + GROUP] for k, v in kw.items()}
        got = pl.pallas_call(
            functools.partial(kernel, leaves=leaves, **part),
            out_shape=[jax.ShapeDtypeStruct((math.prod(o.shape),), o.dtype) for o in shapes],
            grid=(total,),
            in_specs=[pl.no_block_spec] * len(flat),
            out_specs=[pl.no_block_spec] * len(flat),
            interpret=interpret,
            compiler_params=triton_params(interpret),
            name=name,
        )(*flat)
        res.extend(g.reshape(o.shape) for g, o in zip(got, shapes))
    return res


def cast(xs: list[Array], dtype, *, interpret: bool) -> list[Array]:
    """``[x.astype(dtype) for x in xs]`` in one launch per :data:`GROUP` arrays."""
    outs = [jax.ShapeDtypeStruct(x.shape, dtype) for x in xs]
    return _grouped("cast_params", _cast_kernel, xs, outs, [x.size for x in xs], interpret)


def sum_splits(parts: list[Array], dtypes: list, *, interpret: bool) -> list[Array]:
    """``[p.sum(axis=0).astype(dt) for p, dt in zip(parts, dtypes)]`` (each ``p`` ``[S,
    ...]``, summed in float32 in the order of its splits) in one launch per :data:`GROUP`
    arrays."""
    outs = [jax.ShapeDtypeStruct(p.shape[1:], dt) for p, dt in zip(parts, dtypes)]
    return _grouped(
        "sum_splits",
        _sum_kernel,
        parts,
        outs,
        [math.prod(o.shape) for o in outs],
        interpret,
        splits=tuple(p.shape[0] for p in parts),
    )
