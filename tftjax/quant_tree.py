"""The quantized model's trees: its int8 variables (kernels and their per-channel scales),
the names ``--qat-layers`` patterns match, and the observer statistics as checkpoints hold
them (:mod:`tftjax.quant` is the arithmetic)."""

from __future__ import annotations

import fnmatch
from typing import Any

import jax
import jax.numpy as jnp

from tftjax.quant import KERNEL_AXES, MinMax, QuantSpec, layer_name, quantize_weight


def int8_variables(params: dict, quant: QuantSpec) -> dict:
    """``{"params": ..., "weight_scale": ...}`` for ``mode="int8"``: every covered kernel
    becomes int8 with its per-channel scale (the same grid as the fake-quant forward);
    everything else stays float."""
    scales: dict = {}

    def convert(path, leaf):
        keys = tuple(k.key for k in path)
        if keys[-1] in KERNEL_AXES and quant.covers(layer_name(keys[:-1], keys[-1])):
            q, s = quantize_weight(leaf, KERNEL_AXES[keys[-1]])
            node = scales
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            node[keys[-1]] = s
            return q
        return leaf

    qparams = jax.tree_util.tree_map_with_path(convert, params)
    return {"params": qparams, "weight_scale": scales}


def layer_names(params: dict) -> list[str]:
    """The names :class:`QuantSpec` patterns match, of every quantizable kernel in ``params``."""
    return [layer_name(tuple(k.key for k in path[:-1]), path[-1].key)
            for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
            if path[-1].key in KERNEL_AXES]


def unmatched(patterns, params: dict) -> list[str]:
    """Patterns that cover no quantizable kernel of ``params`` (a typo would train a float
    model under the name of QAT)."""
    names = layer_names(params)
    return [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]


def as_minmax(tree: Any) -> Any:
    """Observers restored as plain ``{min, max, count}`` dicts back as :class:`MinMax`."""
    if isinstance(tree, dict):
        if set(tree) == set(MinMax._fields):
            return MinMax(**{k: tree[k] for k in MinMax._fields})
        return {k: as_minmax(v) for k, v in tree.items()}
    return tree


def unobserved(quant_stats: dict) -> list[str]:
    """Paths of observers that never saw data (their range would quantize everything to 0)."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(quant_stats)[0]:
        if getattr(path[-1], "name", None) == "count" and int(jnp.min(leaf)) == 0:
            out.append("/".join(str(getattr(k, "key", "")) for k in path[:-1]))
    return out
