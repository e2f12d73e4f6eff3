"""Fine-tuning on new bars (daily retraining): ``--init-from RUN`` on data that extends the
run's (docs/training.md, "Fine-tuning on new bars").

A run records the time range of the data it saw (:func:`data_range`): each series' first
and last bar and the end of its training and validation rows, and the lineage of the runs
it descends from. A fine-tune on other data than its parent's must extend it:

* the same bar interval, the same columns of your own (the model config's comparison
  refuses another schema as another model);
* every series the parent knew begins no later than the parent's last training bar (the
  history, continued) and ends no earlier than the parent's data did; new series are
  served by the vocabulary's unknown row;
* the parent's input statistics, instrument vocabulary and category levels are kept, so
  that inputs mean what they meant (``--refit-stats``: the statistics are fitted again on
  the fine-tune's own training rows; the vocabularies stay, as the model's shapes do).

Its splits are its own data's, by the same fractions (or global cut times) as any run's. A
fine-tune whose validation rows begin before its parent's training rows ended says so, with
the count of bars its validation shares with the parent's training.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from tftjax.config import ConfigError, TFTConfig, TrainConfig
from tftjax.data import DataError, Dataset, load_dataset, saved_featurisation
from tftjax.data.calendar import format_interval
from tftjax.data.covariates import time_text


def data_range(ds: Dataset) -> dict[str, dict[str, int]]:
    """Each series' first and last bar, and the last bar of its training and validation
    rows (ns; instants for bars with a zone, the wall clock as stored otherwise)."""
    out = {}
    for s in ds.series:
        ts, sp = s.bars.ts, s.splits
        out[s.name] = {
            "first": int(ts[0]),
            "last": int(ts[-1]),
            "train_until": last_bar(ts, sp.train_rows),
            "val_until": last_bar(ts, sp.val_rows),
            "interval": int(s.features.stats.clock.interval),
        }
    return out


def last_bar(ts: np.ndarray, rows: tuple[int, int]) -> int | None:
    return int(ts[rows[1] - 1]) if rows[1] > rows[0] else None


def lineage(parent_meta: dict | None, ds: Dataset, parent: str | None) -> list[dict]:
    """The runs this one descends from (each with its data range), then this run."""
    before = list((parent_meta or {}).get("lineage", []))
    here = {"init_from": parent, "data": data_range(ds)}
    return [*before, here]


def on_new_bars(
    init_from: str, cfg: TFTConfig, ds: Dataset, path, refit: bool, log: Callable = print
) -> tuple[TFTConfig, Dataset, dict | None]:
    """``(cfg, ds, the parent's metadata)`` of a run started ``--init-from`` a parent: on
    the parent's own data unchanged; on other data, checked to extend the parent's and
    featurised as the parent was (module docstring).

    Raises:
      DataError: data of another bar interval, or that ends before the parent's.
      ConfigError: a parent that recorded no data range (a run from before fine-tuning).
    """
    from tftjax.training.restore import open_checkpoint

    try:
        ck = open_checkpoint(init_from, "--init-from")
    except DataError as e:
        raise ConfigError(str(e)) from None
    if ck.meta["identity"]["data"].get("sha256") == ds.identity()["sha256"]:
        return cfg, ds, ck.meta
    if "lineage" not in ck.meta:
        raise ConfigError(
            f"--init-from {ck.path}: trained on other data, and written before runs recorded "
            "the time range of their data: fine-tune from a run of this version, or on the "
            "data the weights were trained on"
        )
    parent = ck.meta["lineage"][-1]["data"]
    kw = saved_featurisation(ck.meta)
    if refit:
        kw["stats"] = None
    kw["cuts"] = None  # the fine-tune's own splits, on its own data
    if cfg.head.anchor == "auto":  # the parent's anchor: its head was trained around it
        cfg = cfg.override(anchor=ck.cfg.head.anchor)
    # one series of a file without a symbol column is the one series its parent knew
    vocab = [str(v) for v in kw.get("vocab") or ()]
    one = len(vocab) == 1 and len(ds.series) == 1 and ds.series[0].bars.symbol is None
    if one and ds.names[0] != vocab[0]:
        log(f"{ds.series[0].bars.path}: read as {vocab[0]}, the one series its parent knew")
    ds = load_dataset(path, cfg.data, **kw, unknown="embed", instrument=vocab[0] if one else None)
    check_extends(parent, ds, str(ck.path))
    say_overlap(parent, ds, log)
    return cfg, ds, ck.meta


def check_extends(parent: dict, ds: Dataset, where: str) -> None:
    """Refuse data that does not extend the parent's: no series the parent knew, another
    bar interval, or a series that begins after the parent's training or ends before the
    parent's data did."""
    if not any(s.name in parent for s in ds.series):
        raise DataError(
            f"{', '.join(ds.names)}: none of these series is one --init-from {where} was "
            f"trained on ({', '.join(parent)}): a fine-tune continues its parent's data"
        )
    interval = next(iter(parent.values()))["interval"]
    for s in ds.series:
        was = parent.get(s.name, {"interval": interval, "last": -1})
        now = int(np.median(np.diff(s.bars.ts)))  # the bars' own (the clock is the parent's)
        if now != was["interval"]:
            raise DataError(
                f"{s.bars.path}: bars of {format_interval(now)}, and --init-from {where} was "
                f"trained on bars of {format_interval(was['interval'])}: fine-tune on the "
                "same interval"
            )
        until = was.get("train_until")
        if until is not None and int(s.bars.ts[0]) > until:
            raise DataError(
                f"{s.bars.path}: its first bar ({time_text(s.bars.ts[0], s.bars.tz)}) is after "
                f"the last bar --init-from {where} trained on ({time_text(until, s.bars.tz)}): "
                "a fine-tune's data continues its parent's (give the history with the new bars)"
            )
        if int(s.bars.ts[-1]) < was["last"]:
            raise DataError(
                f"{s.bars.path}: its last bar ({time_text(s.bars.ts[-1], s.bars.tz)}) is "
                f"before the last bar --init-from {where} saw "
                f"({time_text(was['last'], s.bars.tz)}): fine-tune on data that extends it"
            )


def say_overlap(parent: dict, ds: Dataset, log: Callable) -> None:
    """A line for each series whose validation rows begin before its parent's training
    rows ended (those bars are not new to the weights)."""
    for s in ds.series:
        was = parent.get(s.name)
        until = None if was is None else was.get("train_until")
        a, b = s.splits.val_rows
        if until is None or b <= a or int(s.bars.ts[a]) > until:
            continue
        shared = int(np.sum(s.bars.ts[a:b] <= until))
        log(
            f"note: {s.name}'s validation begins {time_text(s.bars.ts[a], s.bars.tz)}, "
            f"and {shared} of its bars are ones its --init-from parent trained on (until "
            f"{time_text(until, s.bars.tz)}): its validation scores are not all out of sample"
        )


def run_settings(parsed, opts, workdir) -> tuple[TFTConfig, TrainConfig] | None:
    """The settings ``python -m tftjax.train`` starts from before its flags: on ``--resume``
    (``--resume auto`` where a checkpoint is) the checkpoint's (a ``--preset`` given sets the model, so that a different one is
    refused); with ``--init-from`` and no ``--preset``, the parent's; else None (the
    preset's).

    Raises:
      ConfigError: no such parent, or not a TFT's.
    """
    from tftjax.cli.options import resume_mode
    from tftjax.config import get_preset
    from tftjax.runner.resume import latest_meta, wants_checkpoint
    from tftjax.training.restore import open_checkpoint

    preset = parsed.given_flag("options", "preset")
    if wants_checkpoint(resume_mode(opts.resume), workdir / "checkpoints"):
        meta = latest_meta(workdir / "checkpoints", "tft")
        model = TFTConfig.from_json(meta["identity"]["model"])
        model = get_preset(opts.preset).model if preset else model
        return model, TrainConfig.from_json(meta["identity"]["train"])
    init_from = parsed.part("train").get("init_from")
    if not init_from or preset:
        return None
    try:
        ck = open_checkpoint(init_from, "--init-from")
    except DataError as e:
        raise ConfigError(str(e)) from None
    return ck.cfg, dataclasses.replace(ck.tc, init_from=init_from, refit_stats=False)
