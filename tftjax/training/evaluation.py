"""Metrics of a trained TFT beside the baselines, on every split or one, and their table.

:func:`evaluate_model` scores a :class:`~tftjax.training.restore.SavedModel` (from a
checkpoint or an export: it reads the record, never the exporter); :func:`summarize`
is the end-of-run summary of the run loop's task.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from tftjax.config import ConfigError, TFTConfig
from tftjax.config.data import RETURNS
from tftjax.data import Dataset, find_data_files, load_dataset, to_device
from tftjax.data.sessions import DAILY
from tftjax.quant.ptq import calibrate
from tftjax.stats import losses
from tftjax.training.restore import SavedModel
from tftjax.training.trainer import Trainer


def saved_dataset(
    saved: SavedModel,
    parquet_file=None,
    *,
    unknown: str = "refuse",
    instrument: str | None = None,
    need_splits: bool = True,
    future=None,
) -> Dataset:
    """The data a saved model is evaluated or asked on: ``parquet_file`` (one or a list), or
    the files it was trained on (found relative to its run folder or at their recorded
    paths, refused when their content changed), featurised with the *training* statistics
    of each series (``unknown``, ``instrument``, ``future``: :func:`tftjax.data.load_dataset`)."""
    path = parquet_file if parquet_file is not None else find_data_files(saved.data, saved.run_dir)
    kw = saved.featurisation or {"stats": saved.feature_stats, "vocab": None}
    kw = {"anchor": saved.cfg.head.dataset_anchor, **kw}
    return load_dataset(
        path,
        saved.cfg.data,
        **kw,
        unknown=unknown,
        instrument=instrument,
        need_splits=need_splits,
        future=future,
    )


def evaluate_model(
    saved: SavedModel,
    parquet_file=None,
    split: str = "test",
    *,
    int8: bool = False,
    calibrate_batches: int = 0,
    unknown: str = "refuse",
    instrument: str | None = None,
    log: Callable = print,
    calibration: str = "minmax",
    quant_options: dict | None = None,
) -> dict:
    """Metrics of a saved TFT on one split, beside the baselines.

    The data is the file the model was trained on (found relative to its run folder or at
    its recorded path, and refused when its content hash changed), or ``parquet_file`` on
    purpose, featurised with the *training* statistics. ``int8``: also the int8 inference
    path (and the float weights without quantization) of a QAT checkpoint, or of a float
    one calibrated on ``calibrate_batches`` training batches (PTQ, under ``quant_options``:
    :func:`tftjax.quant.ptq.calibrate`). An int8 export is
    evaluated as int8 beside its float32 weights.

    Raises:
      DataError: the data is missing or changed.
      ConfigError: ``int8`` of a float model without calibration, and the like.
    """
    cfg, tc, variables = saved.cfg, saved.tc, saved.variables
    what = saved.what
    check_quantized_evaluation(saved, int8, calibrate_batches, quant_options)
    ds = saved_dataset(saved, parquet_file, unknown=unknown, instrument=instrument)
    same_data = ds.identity()["sha256"] == saved.data["sha256"]
    if same_data:
        source = f"{ds.describe()} (the training data)"
    else:
        source = (
            f"{ds.describe()} (another file than the training data, {saved.data['file']}; "
            "featurised with the training run's statistics)"
        )
    trainer = Trainer(cfg, tc, to_device(ds.features))
    if calibrate_batches:
        if not same_data:
            raise ConfigError(
                "--calibrate uses the training windows: evaluate on the training "
                "data (drop --parquet-file)"
            )
        cfg, qstats = calibrate(
            cfg,
            variables["params"],
            trainer.data,
            ds.splits.train,
            calibrate_batches,
            tc.batch_size,
            method=calibration,
            options=quant_options,
        )
        trainer = Trainer(cfg, tc, trainer.data)
        variables = {"params": variables["params"], "quant_stats": qstats}
        what += (
            f", int8 ranges calibrated on {calibrate_batches} training batches ({calibration}, PTQ)"
        )
    starts = getattr(ds.splits, split)
    summary = {
        "model": {},
        "baselines": {},
        "checkpoint": saved.given,
        "weights_epoch": saved.weights_epoch,
        "data": ds.identity(),
    }
    int8_export = saved.kind == "int8"
    # an int8 export: the int8 model, its series rows too, beside its float32 weights
    per_series = series_sums(trainer, variables, ds, split, "int8" if int8_export else None)
    summary["model"][split] = losses.finalize(functools.reduce(losses.add, per_series.values()))
    if int8_export:
        summary["variants"] = {
            "float": {split: trainer.evaluate(saved.float_variables, starts, "float")}
        }
    elif int8:
        summary["variants"] = {
            m: {split: trainer.evaluate(variables, starts, m)} for m in ("float", "int8")
        }
    summary["quantized"] = bool(cfg.quant.qat) and not int8_export
    if calibrate_batches:
        summary["ptq_batches"] = calibrate_batches
    for name, m in baselines(ds, cfg.head.quantiles, split).items():
        summary["baselines"][name] = {split: m}
    if len(ds.series) > 1:
        summary["series"] = by_series({split: per_series}, ds, cfg, [split])
    log(f"{what} on {source}, {split} split, {starts.size:,} windows")
    log(format_summary(summary, int8_model=int8_export, ptq=bool(calibrate_batches)))
    return summary


def check_quantized_evaluation(
    saved: SavedModel, int8: bool, calibrate_batches: int, quant_options: dict | None
) -> None:
    """Refuse an int8 evaluation the saved model cannot give (before any data is read).

    Raises:
      ConfigError: one line: an ensemble, a float model without calibration, an export to
        calibrate, a QAT model to calibrate again, PTQ options without a calibration.
    """
    cfg = saved.cfg
    if (int8 or calibrate_batches) and cfg.model.ensemble > 1:
        raise ConfigError(
            f"{saved.path} is an ensemble of {cfg.model.ensemble} members: int8 "
            "inference is of one model (train without --ensemble)"
        )
    if calibrate_batches and not int8:
        raise ConfigError("--calibrate needs --int8 (it calibrates the int8 activation ranges)")
    if quant_options and not calibrate_batches:
        raise ConfigError(
            f"--{'/--'.join(k.replace('_', '-') for k in quant_options)} "
            "choose how a PTQ --calibrate quantizes (a QAT model keeps its own)"
        )
    if saved.kind != "checkpoint":  # an export
        if int8 and saved.kind != "int8":
            raise ConfigError(
                f"{saved.path} holds float32 weights only: export a --qat run, "
                "or a float one with --calibrate N, to get an int8 model"
            )
        if calibrate_batches:
            raise ConfigError(
                f"{saved.path} is an export: calibrate when exporting "
                "(python -m tftjax.export --calibrate N)"
            )
        return
    if int8 and not cfg.quant.qat and not calibrate_batches:
        raise ConfigError(
            f"{saved.path} is a float model: add --calibrate N to calibrate its "
            "int8 activation ranges on N training batches (PTQ)"
        )
    if calibrate_batches and cfg.quant.qat:
        raise ConfigError(
            f"{saved.path} was trained with --qat: its activation ranges are "
            "already calibrated; drop --calibrate"
        )


def summarize(trainer: Trainer, variables, ds: Dataset, cfg: TFTConfig) -> dict:
    """Metrics on every split beside the baselines; a QAT model also with its float
    weights run without fake-quant and with the int8 inference path (``variants``)."""
    out: dict[str, Any] = {"model": {}, "baselines": {}}
    splits = [s for s in ("train", "val", "test") if getattr(ds.splits, s).size]
    # a panel's model runs once per window: each series' sums, pooled by adding them up
    per_series = {split: series_sums(trainer, variables, ds, split) for split in splits}
    for split in splits:
        out["model"][split] = losses.finalize(
            functools.reduce(losses.add, per_series[split].values())
        )
    if cfg.quant.qat:
        out["variants"] = {
            m: {
                split: trainer.evaluate(variables, getattr(ds.splits, split), m) for split in splits
            }
            for m in ("float", "int8")
        }
    for split in splits:
        for name, m in baselines(ds, cfg.head.quantiles, split).items():
            out["baselines"].setdefault(name, {})[split] = m
    if len(ds.series) > 1:
        out["series"] = by_series(per_series, ds, cfg, splits)
    return out


def series_sums(
    trainer: Trainer, variables, ds: Dataset, split: str, mode: str | None = None
) -> dict[int, Any]:
    """Series index → the model's metric sums over that series' windows of ``split`` (one
    entry, the whole split, for a single series); ``mode``: :meth:`Trainer.evaluate`'s."""
    starts = getattr(ds.splits, split)
    if len(ds.series) == 1:
        return {0: trainer.metric_sums(variables, starts, mode)}
    which = ds.series_of(starts)
    return {
        i: trainer.metric_sums(variables, starts[which == i], mode)
        for i in range(len(ds.series))
        if (which == i).any()
    }


def by_series(per_series: dict, ds: Dataset, cfg: TFTConfig, splits) -> dict:
    """Series name → ``{"model": {split: metrics}, "baselines": {name: {split: metrics}}}``:
    the model (its sums per split and series: :func:`series_sums`) and every baseline on
    each series' own windows (the pooled ones weigh every window alike, in each series' own
    target scale)."""
    out = {}
    for i, s in enumerate(ds.series):
        entry: dict[str, Any] = {"model": {}, "baselines": {}}
        for split in splits:
            starts = getattr(ds.splits, split)
            starts = starts[ds.series_of(starts) == i]
            if starts.size:
                entry["model"][split] = losses.finalize(per_series[split][i])
                for name, m in baselines(ds, cfg.head.quantiles, split, starts).items():
                    entry["baselines"].setdefault(name, {})[split] = m
        out[s.name] = entry
    return out


def window_targets(ds: Dataset, starts: np.ndarray) -> np.ndarray:
    """Targets ``[n, T_d]`` of the windows at ``starts`` (host numpy; NaN where the step's
    calendar slot has no bar: missing, not shifted)."""
    from tftjax.data.windows import window_decoder_targets

    e, d = ds.cfg.encoder_steps, ds.cfg.decoder_steps
    return window_decoder_targets(ds.features)[np.asarray(starts) + e - 1, :d]


def window_origins(ds: Dataset, starts: np.ndarray) -> np.ndarray:
    """Each window's forecast origin (its last encoder bar's time, int64 ns): the date a
    walk-forward's inference groups windows by (:class:`tftjax.stats.verdict.Fold`)."""
    return ds.ts[np.asarray(starts) + ds.cfg.encoder_steps - 1].astype(np.int64)


def window_ends(ds: Dataset, starts: np.ndarray) -> np.ndarray:
    """Each window's last target time, at the latest (int64 ns): the time of the
    ``decoder_steps``-th bar after its origin (the bar of the last calendar slot is at most
    that many bars on), or its series' last bar. A choice made before a time reads only
    windows that end before it (:func:`tftjax.stats.verdict.record`)."""
    origin = np.asarray(starts) + ds.cfg.encoder_steps - 1
    last = np.array([o + len(s.bars) - 1 for s, o in zip(ds.series, ds.offsets)])
    end = np.minimum(origin + ds.cfg.decoder_steps, last[ds.series_of(origin)])
    return ds.ts[end].astype(np.int64)


def baselines(
    ds: Dataset, quantiles, split: str, starts: np.ndarray | None = None
) -> dict[str, dict]:
    """Metrics of every baseline (:mod:`tftjax.stats.baselines`) on the windows of ``split`` (or
    those of them at ``starts``), each series' fitted on its own training rows."""
    starts = getattr(ds.splits, split) if starts is None else np.asarray(starts)
    assert starts is not None
    y = window_targets(ds, starts)
    return {
        name: losses.numpy_metrics(y, p, quantiles)
        for name, p in baselines_forecasts(ds, quantiles, starts).items()
    }


def baselines_forecasts(ds: Dataset, quantiles, starts: np.ndarray) -> dict[str, np.ndarray]:
    """Every baseline's quantiles ``[n, D, Q]`` for the windows at ``starts``: each series'
    from its own returns and ranges, fitted on its own training rows (range baselines from
    the bars' high, low and opening gap; HAR for daily and coarser bars)."""
    from tftjax.data.windows import window_decoder_targets
    from tftjax.stats import baselines as bl

    starts = np.asarray(starts)
    if ds.cfg.target_transform not in RETURNS:  # a level: the last value, the seasonal naive
        return level_baselines(ds, quantiles, starts)
    which = ds.series_of(starts)
    preds: dict[str, np.ndarray] = {}
    inputs = [anchor_inputs(s, ds.cfg.returns_target) for s in ds.series]
    # a panel's late starters (too few training rows of their own) read every series' pool
    late = [len(inputs) > 1 and b - a < bl.LATE_ROWS for a, b in (i["train_rows"] for i in inputs)]
    pools = bl.pooled_residuals(inputs) if any(late) else None
    for i, s in enumerate(ds.series):
        sel = which == i
        if not sel.any():
            continue
        local = starts[sel] - ds.offsets[i]
        hours = intraday_hours(s.features, ds.cfg.decoder_steps)
        for name, p in bl.forecasts(
            inputs[i]["target"],
            local + ds.cfg.encoder_steps - 1,
            ds.cfg.decoder_steps,
            quantiles,
            inputs[i]["train_rows"],
            ranges=inputs[i]["ranges"],
            daily=inputs[i]["daily"],
            cumulative=ds.cfg.target == "cumulative",
            features=s.features.historical,
            decoder_target=window_decoder_targets(s.features),
            hours=hours,
            pools=pools if late[i] else None,
        ).items():
            preds.setdefault(name, np.empty((starts.size,) + p.shape[1:], p.dtype))[sel] = p
    return preds


def anchor_inputs(series, bars_target: bool = True) -> dict:
    """A series' volatility models' inputs (:func:`tftjax.stats.volatility.anchor`): its
    targets, training rows, range variance in target units² (None where the target is not
    the bars' close: their ranges are another series') and whether it is daily."""
    from tftjax.stats import baselines as bl

    b, stats = series.bars, series.features.stats
    return {
        "target": series.features.target,
        "train_rows": series.splits.train_rows,
        "ranges": bl.range_variance(b.open, b.high, b.low, b.close) / stats.target_scale**2
        if bars_target
        else None,
        "daily": stats.clock.interval >= DAILY[0],
    }


def level_baselines(ds, quantiles, starts: np.ndarray) -> dict[str, np.ndarray]:
    """A level target's baselines (:mod:`tftjax.stats.levels`), each series' fitted on its
    own training rows, ``[n, D, Q]`` for the windows at ``starts``."""
    from tftjax.data.windows import window_decoder_targets
    from tftjax.stats import levels

    which = ds.series_of(starts)
    preds: dict[str, np.ndarray] = {}
    for i, s in enumerate(ds.series):
        sel = which == i
        if not sel.any():
            continue
        origins = starts[sel] - ds.offsets[i] + ds.cfg.encoder_steps - 1
        f = s.features
        for name, p in levels.forecasts(
            f.target,
            window_decoder_targets(f),
            origins,
            quantiles,
            s.splits.train_rows,
            ds.cfg.season,
        ).items():
            preds.setdefault(name, np.empty((starts.size,) + p.shape[1:], p.dtype))[sel] = p
    return preds


def intraday_hours(features, decoder_steps: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Intraday bars' hour of the week ``[n]`` and that of the ``k``-th calendar slot after
    each bar ``[n, D]``, on the wall clock of the series' calendar zone (None: daily or
    coarser bars, or features without a timeline)."""
    from tftjax.stats.seasonal import hour_of_week

    tl = features.timeline
    if tl is None or features.stats.clock.interval >= DAILY[0]:
        return None
    return hour_of_week(tl.wall), hour_of_week(tl.future(decoder_steps)[1])


VARIANT_NAMES = {"float": "TFT: float, no quant", "int8": "TFT: int8 inference"}


def format_summary(
    summary: dict, qat: bool | None = None, int8_model: bool = False, ptq: bool = False
) -> str:
    """The metrics table: the model, its quantization variants, the baselines."""
    from tftjax.stats.baselines import NAMES

    qat = summary.get("quantized", bool(summary.get("variants"))) if qat is None else qat
    name = (
        "TFT int8 (export)"
        if int8_model
        else "TFT: fake-quant (PTQ)"
        if ptq
        else "TFT: fake-quant (QAT)"
        if qat
        else "TFT"
    )
    rows = [(name, summary["model"])]
    rows += [(VARIANT_NAMES[k], v) for k, v in summary.get("variants", {}).items()]
    rows += [(NAMES.get(k, k), v) for k, v in summary["baselines"].items()]
    head = (
        f"{'':{label_width()}s} {'split':6s} {'loss':>9s} {'q-risk P50':>11s} {'q-risk P90':>11s} "
        f"{'cover 10-90':>11s}"
    )
    lines = [head, "-" * len(head)] + _rows(rows, ("train", "val", "test"))
    if any("train" in v for _, v in rows[1:]):
        lines.append(
            "(train rows: in-sample for the baselines too, whose statistics are fitted on them)"
        )
    series = summary.get("series", {})
    if series:
        last = next(s for s in ("test", "val", "train") if s in summary["model"])
        lines += ["", f"by series ({last} split; above: all series pooled):"]
        for sname, entry in series.items():
            lines += [f"{sname}"] + _rows(
                [(f"  {name}", entry["model"])]
                + [(f"  {NAMES.get(k, k)}", v) for k, v in entry["baselines"].items()],
                (last,),
            )
    return "\n".join(lines)


def label_width() -> int:
    """The table's first column: the longest baseline's name, indented as a series' row."""
    from tftjax.stats.baselines import NAMES

    return max(28, 2 + max(len(n) for n in NAMES.values()))


def _rows(rows, splits) -> list[str]:
    lines = []
    for split in splits:
        for name, by_split in rows:
            if split in by_split:
                m = by_split[split]
                cov = m.get("coverage_80", float("nan"))
                lines.append(
                    f"{name:{label_width()}s} {split:6s} {m['loss']:9.4f} {m['q_risk_50']:11.4f} "
                    f"{m['q_risk_90']:11.4f} {cov:11.3f}"
                )
    return lines
