"""A TFT's weights as safetensors (``python -m tftjax.export``), and exports read back.

:func:`export` writes into its ``out`` folder:

* ``model_float32.safetensors``: every parameter as float32, named by its path
  (``params/encoder_vsn/glu_k``, ``params/attention/query/kernel``, …), for any
  runtime that reads safetensors;
* ``model_int8.safetensors`` (a ``--qat`` checkpoint, or a float one with
  ``--calibrate N``): the quantized kernels as int8 with their per-output-channel
  float32 scales (``weight_scale/…``, ``w ≈ q · scale``), the other parameters
  (biases, LayerNorms) as float32, and the activation ranges
  (``quant_stats/…/{min,max,count}``) with the scale and zero point each implies
  (``act_qparams/…/{scale,zero_point}``, what an int8 runtime uses; the op-by-op
  semantics are in ``docs/int8_format.md``);
* ``samples.safetensors`` (with the int8 file): a few test windows of the training data
  (``static``, ``historical``, ``known``, as the model takes them) and tftjax's int8
  outputs for them (``int8_output``, run op by op), against which another implementation checks itself
  (``python experiments/int8_numpy_reference.py --export OUT`` rebuilds the int8 forward
  in plain numpy);
* ``config.json``: the model config, the feature statistics the inputs must be
  normalised with, what the outputs are (``output``: with ``model.vol_target`` the
  network's outputs are multiplied by the window's EWMA volatility), the training
  data's identity and where the weights came from.

``python -m tftjax.evaluate --checkpoint OUT`` evaluates an export (the int8
model beside the float32 one); :func:`load` reads one back, :func:`load_model` as the
:class:`~tftjax.training.SavedModel` record evaluation reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tftjax.errors import ConfigError, DataError
from tftjax.serving.int8 import SAMPLES, act_qparams, samples

FORMAT = "tftjax-export-1"
FLOAT_FILE, INT8_FILE, CONFIG_FILE = (
    "model_float32.safetensors",
    "model_int8.safetensors",
    "config.json",
)
SAMPLES_FILE = "samples.safetensors"


def flatten(tree: Any, prefix: str) -> dict[str, np.ndarray]:
    """``{"prefix/a/b": array}`` from nested dicts (``MinMax`` leaves as ``…/min|max|count``)."""
    out = {}

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}/{k}")
        elif hasattr(node, "_fields"):  # a NamedTuple (MinMax)
            for k in node._fields:
                walk(getattr(node, k), f"{path}/{k}")
        else:
            out[path] = np.ascontiguousarray(np.asarray(node))

    walk(tree, prefix)
    return out


def unflatten(flat: dict[str, np.ndarray]) -> dict:
    """Nested dicts by collection from :func:`flatten`'s names (observers back as ``MinMax``)."""
    from tftjax.quant.tree import as_minmax

    root: dict = {}
    for name, arr in flat.items():
        keys = name.split("/")
        node = root
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = arr

    return as_minmax(root)


def nbytes(flat: dict[str, np.ndarray], prefix: str | None = None) -> int:
    return sum(a.nbytes for k, a in flat.items() if prefix is None or k.startswith(prefix))


def export(
    checkpoint: str | Path,
    out: str | Path,
    *,
    calibrate_batches: int = 0,
    log: Callable = print,
    calibration: str = "minmax",
    quant_options: dict | None = None,
    sample_windows: int = SAMPLES,
) -> dict:
    """Write the export of ``checkpoint`` into ``out``; returns what ``config.json`` holds.

    Raises:
      DataError: no such checkpoint; ConfigError: ``out`` not empty, or ``--calibrate``
      of a QAT checkpoint (its ranges are trained).
    """
    import jax
    from safetensors.numpy import save_file

    from tftjax.data import find_data_files, load_dataset, saved_featurisation, to_device
    from tftjax.models.compute import quant_spec
    from tftjax.training import calibrate, restore_checkpoint
    from tftjax.training.trainer import to_int8

    out = Path(out)
    ck = refuse_export(
        checkpoint, out, calibrate_batches, calibration, quant_options, sample_windows
    )
    cfg = ck.cfg
    state = restore_checkpoint(ck)
    params, stats = state.variables()["params"], state.quant_stats  # --ema: the average
    run_dir, ds = ck.path.resolve().parent.parent, None
    if calibrate_batches:
        ds = load_dataset(
            find_data_files(ck.meta["identity"]["data"], run_dir),
            cfg.data,
            **saved_featurisation(ck.meta),
        )
        cfg, stats = calibrate(
            cfg,
            params,
            to_device(ds.features),
            ds.splits.train,
            calibrate_batches,
            ck.tc.batch_size,
            method=calibration,
            options=quant_options,
        )
    quantized = bool(cfg.quant.qat)
    source = {
        "checkpoint": str(ck.path),
        "weights_epoch": ck.meta.get("weights_epoch"),
        "quantization": (
            "QAT"
            if ck.cfg.quant.qat
            else f"PTQ, {calibrate_batches} calibration batches ({calibration})"
            if quantized
            else None
        ),
    }
    files = {FLOAT_FILE: flatten(params, "params")}
    if quantized:
        q = jax.device_get(to_int8(params, quant_spec(cfg, "int8")))
        stats = jax.device_get(stats)
        files[INT8_FILE] = {
            **flatten(q["params"], "params"),
            **flatten(q["weight_scale"], "weight_scale"),
            **flatten(stats, "quant_stats"),
            **flatten(act_qparams(stats, cfg.quant.act_symmetric), "act_qparams"),
        }
        if ds is None:
            try:
                ds = load_dataset(
                    find_data_files(ck.meta["identity"]["data"], run_dir),
                    cfg.data,
                    **saved_featurisation(ck.meta),
                )
            except DataError as e:
                log(f"  samples: standard normal inputs ({e})")
        files[SAMPLES_FILE], sample_source = samples(
            cfg, {**q, "quant_stats": stats}, ds, sample_windows
        )
    sizes = {"float32_weight_bytes": nbytes(files[FLOAT_FILE])}
    if quantized:
        sizes["int8_weight_bytes"] = nbytes(files[INT8_FILE], "params") + nbytes(
            files[INT8_FILE], "weight_scale"
        )
        sizes["int8_activation_range_bytes"] = nbytes(files[INT8_FILE], "quant_stats")
        source["samples"] = sample_source
    config = {
        "format": FORMAT,
        "model": cfg.to_json(),
        "feature_stats": ck.meta["feature_stats"],
        **{k: ck.meta[k] for k in ("series", "vocab", "cuts", "covariates") if k in ck.meta},
        "data": ck.meta["identity"]["data"],
        "source": source,
        "files": sorted(files),
        "output": output_description(cfg),
        **sizes,
    }
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT}
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    mode = (out / CONFIG_FILE).stat().st_mode & 0o777  # a new file's mode under the umask
    for name, tensors in files.items():
        save_file(tensors, str(out / name), metadata=meta)
        # safetensors writes through a 0600 temporary file: readable by its owner only, so
        # another user or a serving process could not read a shared model
        os.chmod(out / name, mode)
    f32 = sizes["float32_weight_bytes"]
    log(f"exported {ck.path} (weights of epoch {source['weights_epoch']}) to {out}")
    log(
        f"  {FLOAT_FILE}: {f32:,} bytes of float32 weights "
        f"(file {(out / FLOAT_FILE).stat().st_size:,} bytes)"
    )
    if quantized:
        i8 = sizes["int8_weight_bytes"]
        log(
            f"  {INT8_FILE}: {i8:,} bytes of int8 weights and their scales, "
            f"{f32 / i8:.2f}x smaller (+ {sizes['int8_activation_range_bytes']:,} bytes of "
            f"activation ranges; file {(out / INT8_FILE).stat().st_size:,} bytes); "
            f"{source['quantization']}"
        )
    return config


def refuse_export(
    checkpoint,
    out: Path,
    calibrate_batches: int,
    calibration: str,
    quant_options: dict | None,
    sample_windows: int,
):
    """The checkpoint to export, once every refusal is behind (nothing written yet).

    Raises:
      DataError: no such checkpoint; ConfigError: ``out`` not empty, a bad count or
      calibration, PTQ options without ``--calibrate``, or ``--calibrate`` of a QAT
      checkpoint or an ensemble.
    """
    from tftjax.quant.ptq import check_calibration
    from tftjax.training import open_checkpoint

    if sample_windows < 1:
        raise ConfigError(f"--samples must be >= 1 window, got {sample_windows}")
    if calibrate_batches < 0:
        raise ConfigError(f"--calibrate must be >= 1 batch, got {calibrate_batches}")
    check_calibration(calibration)
    if quant_options and not calibrate_batches:
        raise ConfigError(
            f"--{'/--'.join(k.replace('_', '-') for k in quant_options)} "
            "choose how a PTQ --calibrate quantizes (a QAT model keeps its own)"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty folder; choose a new one")
    ck = open_checkpoint(checkpoint)
    if calibrate_batches and ck.cfg.quant.qat:
        raise ConfigError(
            f"{ck.path} was trained with --qat: its activation ranges are "
            "already calibrated; drop --calibrate"
        )
    if calibrate_batches and ck.cfg.model.ensemble > 1:
        raise ConfigError(
            f"{ck.path} is an ensemble of {ck.cfg.model.ensemble} members: int8 "
            "export is of one model (drop --calibrate for the float32 members, "
            "or train without --ensemble)"
        )
    return ck


def output_description(cfg) -> str:
    """What the exported network's outputs are, in words (``config.json``'s ``output``)."""
    out = (
        "quantiles of the next decoder_steps one-bar log returns in target scales "
        "(feature_stats.target_scale)"
    )
    if cfg.head.vol_target:
        out += (
            ", after multiplying the network's outputs by the window's EWMA volatility at "
            "its forecast time (model.vol_target: tftjax.stats.baselines.ewma_scale of the "
            "targets, row T; the EWMA starts from 1 at the series' first row)"
        )
    if cfg.head.anchor != "none":
        out += (
            f"; anchored (model.anchor {cfg.head.anchor}): the network's outputs are "
            "[.., Q] Δ and [.., 1] s, and the quantiles σ · exp(s) · (z + Δ) with the "
            "anchor's σ and z (tftjax.stats.volatility.anchor, fitted on the series' "
            "training rows)"
        )
    return out


class Export(NamedTuple):
    cfg: Any  # TFTConfig
    variables: dict  # int8 variables (params, weight_scale, quant_stats) if exported, else float
    float_variables: dict
    feature_stats: Any
    data: dict
    source: dict
    kind: str  # "int8" or "float32"
    featurisation: dict | None = None  # load_dataset's keywords (tftjax.data.saved_featurisation)


def is_export(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file() and (Path(path) / FLOAT_FILE).is_file()


def load(path: str | Path) -> Export:
    """Read an export back (the same arrays and config it was written from)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    from tftjax.config import TFTConfig
    from tftjax.data import DataError, FeatureStats, saved_featurisation

    path = Path(path)
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
        if config.get("format") != FORMAT:
            raise DataError(f"{path / CONFIG_FILE}: not a {FORMAT} export")
        cfg = TFTConfig.from_json(config["model"])
        f32 = unflatten(load_file(str(path / FLOAT_FILE)))
        variables = {"params": f32["params"]}
        kind = "float32"
        if (path / INT8_FILE).is_file():
            variables, kind = unflatten(load_file(str(path / INT8_FILE))), "int8"
            if "act_qparams" not in variables:  # before the folded selection GRN's int8 layout
                raise DataError(
                    f"{path}: an int8 export from before its format changed "
                    "(issue 27: folded selection GRN, act_qparams); export it again"
                )
            variables.setdefault("quant_stats", {})  # weight-only layers have no observers
            variables.pop("act_qparams", None)  # derived from quant_stats (for other runtimes)
        return Export(
            cfg,
            variables,
            {"params": f32["params"]},
            FeatureStats.from_json(config["feature_stats"]),
            config["data"],
            config["source"],
            kind,
            saved_featurisation(config),
        )
    except DataError:
        raise
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as e:
        raise DataError(f"{path}: not a readable tftjax export ({type(e).__name__}: {e})") from None


def load_model(path: str | Path):
    """An export as a :class:`~tftjax.training.SavedModel` (what evaluation and prediction
    read; the training config is the default one: an export keeps the model, not how it was
    trained)."""
    from tftjax.config import TrainConfig
    from tftjax.training import SavedModel

    exp, path = load(path), Path(path)
    epoch = exp.source.get("weights_epoch")
    return SavedModel(
        exp.cfg,
        TrainConfig(),
        exp.variables,
        exp.feature_stats,
        exp.data,
        path,
        str(path),
        path,
        epoch,
        f"{path} (export of {exp.source.get('checkpoint')}, epoch {epoch})",
        exp.kind,
        exp.float_variables,
        exp.featurisation,
    )
