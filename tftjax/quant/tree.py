"""The quantized model's trees: its int8 variables (kernels and their per-channel scales),
the names ``--qat-layers`` patterns match, and the observer statistics as checkpoints hold
them (:mod:`tftjax.quant` is the arithmetic)."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from tftjax.quant.core import (
    KERNEL_AXES,
    MinMax,
    QuantSpec,
    fake_quant_weight,
    layer_name,
    quantize_weight,
)

QUANT_FORMAT = 2
"""The layout of a QAT run's observers, kept in its identity (``quant_format``). 2: the
variable selections' weight GRNs observe their raw ``[N, m]`` inputs (the folded int8 path,
917d886). QAT checkpoints from before it hold the flat embeddings' ranges under the same
names, and are refused rather than misread."""


def fold_kernel(emb_k: jax.Array, kernel: jax.Array) -> jax.Array:
    """``A_j = k_j K_j``: ``[m, d_v]`` embeddings and a ``[m·d_v, out]`` kernel → ``[m, out]``
    (the selection GRN's folded input matmul, :mod:`tftjax.models.folded`)."""
    m, dv = emb_k.shape
    return jnp.einsum("mv,mvo->mo", emb_k, kernel.reshape(m, dv, -1))


def folded(params: dict, quant: QuantSpec, path: tuple = ()) -> dict:
    """``params`` with every covered folded selection-GRN input kernel (a VSN's
    ``weights/fc2`` and ``weights/skip``, when its embeddings are wider than 1 and it has no
    categorical table, the instrument's or a column's) replaced by the folded float ``[m, out]`` kernel, and the embedding
    biases' share added as ``fold_bias`` (what the int8 ``FoldedDense`` reads). The
    embeddings folded are those the model uses: fake-quantized where ``emb_k`` is covered."""
    out = {
        k: folded(dict(v), quant, path + (k,)) if isinstance(v, Mapping) else v
        for k, v in params.items()
    }  # (restored checkpoints may hold other mappings)
    if (
        "emb_k" in params
        and "weights" in params
        and not any(k.endswith("_table") for k in params)  # categories: the flat path
        and params["emb_k"].shape[1] != 1
    ):
        emb = params["emb_k"]
        if quant.covers(layer_name(path, "emb_k")):
            emb = fake_quant_weight(emb, quant.axes("emb_k"))
        for sub in ("fc2", "skip"):
            node = dict(params["weights"]).get(sub)
            if node is not None and quant.covers(layer_name(path + ("weights", sub), "kernel")):
                k = node["kernel"]
                out["weights"][sub] = {
                    **out["weights"][sub],
                    "kernel": fold_kernel(emb, k),
                    "fold_bias": params["emb_b"].reshape(-1) @ k,
                }
    return out


def int8_variables(params: dict, quant: QuantSpec) -> dict:
    """``{"params": ..., "weight_scale": ...}`` for ``mode="int8"``: every covered kernel
    becomes int8 with its scales (per output channel by default; the same grid as the
    fake-quant forward; the selection GRNs' input kernels folded first, :func:`folded`);
    everything else stays float."""
    scales: dict = {}

    def convert(path, leaf):
        keys = tuple(k.key for k in path)
        if keys[-1] in KERNEL_AXES and quant.covers(layer_name(keys[:-1], keys[-1])):
            q, s = quantize_weight(leaf, quant.axes(keys[-1]))
            node = scales
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            node[keys[-1]] = s
            return q
        return leaf

    qparams = jax.tree_util.tree_map_with_path(convert, folded(params, quant))
    return {"params": qparams, "weight_scale": scales}


def layer_names(params: dict) -> list[str]:
    """The names :class:`QuantSpec` patterns match, of every quantizable kernel in ``params``."""
    return [
        layer_name(tuple(k.key for k in path[:-1]), path[-1].key)
        for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
        if path[-1].key in KERNEL_AXES
    ]


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
