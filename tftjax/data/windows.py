"""Time-ordered splits, shuffled start-index batches and an on-device window gather.

A window starting at row ``s`` covers rows ``s .. s+E+D-1``: encoder rows
``s .. s+E-1`` (historical and known inputs), decoder rows ``s+E .. s+E+D-1``
(known inputs and targets). Batches are *start indices* only; the feature
matrix goes to the device once and :func:`gather` (jittable) cuts the
windows there, so no host copy of windows is ever made (250k bars as
``[n, 60, 225]`` float32 windows would be 13 GB).

Splits are contiguous row ranges in time order: train, val, test, with an
embargo of one full window (by default) of unused rows between them, so that
no window of one split shares rows with, or directly abuts, a window of
another. Statistics are fitted on the train rows only.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.config import WARMUP, DataConfig
from tftjax.data.feature_stats import decoder_targets
from tftjax.data.features import FeatureSet
from tftjax.errors import DataError
from tftjax.stats.baselines import ewma_scale


@dataclasses.dataclass(frozen=True)
class Splits:
    """Row ranges ``[start, stop)`` and valid window starts of each split."""

    train_rows: tuple[int, int]
    val_rows: tuple[int, int]
    test_rows: tuple[int, int]
    train: np.ndarray  # [n_train] int32 window starts
    val: np.ndarray  # [n_val] int32
    test: np.ndarray  # [n_test] int32

    def rows(self, name: str) -> tuple[int, int]:
        return getattr(self, f"{name}_rows")


def _starts(rows: tuple[int, int], window: int) -> np.ndarray:
    a, b = rows
    return np.arange(a, max(b - window + 1, a), dtype=np.int32)


def make_splits(
    n_rows: int, cfg: DataConfig = DataConfig(), *, warmup: int = WARMUP, source: str = "data"
) -> Splits:
    """Split rows ``[warmup, n_rows)`` into train/val/test with embargoes.

    Raises:
      DataError: when a split would hold no complete window (names ``source``).
    """
    W, E = cfg.window, cfg.embargo_rows
    usable = n_rows - warmup - 2 * E
    n_train = int(usable * cfg.train_fraction)
    n_val = int(usable * cfg.val_fraction)
    train = (warmup, warmup + n_train)
    val = (train[1] + E, train[1] + E + n_val)
    test = (val[1] + E, n_rows)
    splits = Splits(train, val, test, _starts(train, W), _starts(val, W), _starts(test, W))
    for name in ("train", "val", "test"):
        if getattr(splits, name).size == 0 and (name != "val" or cfg.val_fraction > 0):
            a, b = splits.rows(name)
            need = (
                warmup
                + 2 * E
                + int(
                    np.ceil(
                        W
                        / min(
                            cfg.train_fraction,
                            cfg.val_fraction or 1,
                            1 - cfg.train_fraction - cfg.val_fraction,
                        )
                    )
                )
            )
            raise DataError(
                f"{source}: {n_rows} rows leave the {name} split {b - a} rows, fewer than one "
                f"{W}-row window (need about {need} rows: {warmup} warm-up, two {E}-row embargoes "
                f"and the split fractions {cfg.train_fraction}/{cfg.val_fraction})"
            )
    return splits


def global_cuts(
    timestamps: list[np.ndarray], cfg: DataConfig = DataConfig(), *, warmup: int = WARMUP
) -> tuple[int, int]:
    """Global split times ``(train_end, val_end)`` (ns) of several series: the split fractions
    of the union of their timestamps after each one's warm-up, so that every series' test
    period is the same stretch of calendar time. For one series :func:`splits_at` at these
    cuts gives exactly :func:`make_splits`."""
    union = np.unique(np.concatenate([np.asarray(t[warmup:], np.int64) for t in timestamps]))
    E = cfg.embargo_rows
    usable = union.size - 2 * E
    n_train = int(usable * cfg.train_fraction)
    n_val = int(usable * cfg.val_fraction)
    a, b = n_train, n_train + E + n_val
    if usable < 1 or b >= union.size:
        raise DataError(f"{union.size} distinct bar times leave no test period")
    return int(union[a]), int(union[b])


def splits_at(
    ts: np.ndarray,
    cuts: tuple[int, int],
    cfg: DataConfig = DataConfig(),
    *,
    warmup: int = WARMUP,
    source: str = "data",
) -> Splits:
    """A series' splits at global cut times: train rows end before ``cuts[0]``, val rows
    start one embargo (of this series' rows) later and end before ``cuts[1]``, test rows
    start one embargo after that.

    Raises:
      DataError: a split of this series would hold no complete window (names ``source``).
    """
    W, E = cfg.window, cfg.embargo_rows
    n = len(ts)
    t_end = max(int(np.searchsorted(ts, cuts[0])), warmup)
    v_end = max(int(np.searchsorted(ts, cuts[1])), t_end + E)
    train, val, test = (warmup, t_end), (t_end + E, v_end), (min(v_end + E, n), n)
    splits = Splits(train, val, test, _starts(train, W), _starts(val, W), _starts(test, W))
    for name in ("train", "val", "test"):
        if getattr(splits, name).size == 0 and (name != "val" or cfg.val_fraction > 0):
            a, b = splits.rows(name)
            t = lambda ns: str(np.datetime64(int(ns), "ns").astype("datetime64[s]"))
            raise DataError(
                f"{source}: its {name} split at the global cut times ({t(cuts[0])}, "
                f"{t(cuts[1])}) holds {max(b - a, 0)} rows, fewer than one {W}-row window (its "
                f"bars run {t(ts[0])} to {t(ts[-1])}): give series that cover the same period"
            )
    return splits


def walk_forward_times(
    timestamps: list[np.ndarray],
    cfg: DataConfig,
    folds: int,
    test_fraction: float,
    *,
    warmup: int = WARMUP,
) -> list[tuple[int, int, int]]:
    """``(val_start, test_start, test_end)`` times (ns) of each walk-forward fold.

    On the union of the series' bar times after warm-up, the last ``test_fraction`` is cut
    into ``folds`` consecutive test stretches; each fold validates on the stretch of the same
    length that ends one embargo before its test stretch, and trains on every row before
    that, one more embargo earlier (an expanding window). The last fold's ``test_end`` is
    the end of the data.

    Raises:
      DataError: a fold too short for one window, or too little left to train on.
    """
    union = np.unique(np.concatenate([np.asarray(t[warmup:], np.int64) for t in timestamps]))
    n, E, W = union.size, cfg.embargo_rows, cfg.window
    s0 = n - int(n * test_fraction)
    L = (n - s0) // folds
    if L < W:
        raise DataError(
            f"{folds} folds over the last {test_fraction:g} of {n:,} bar times "
            f"leave {L} bars a fold, fewer than one {W}-bar window: fewer folds, a "
            "larger --test-fraction or more data"
        )
    first_train_end = s0 - 2 * E - L
    if first_train_end < 2 * W:
        raise DataError(
            f"the first fold would train on {max(first_train_end, 0)} bar times, "
            f"fewer than two {W}-bar windows: a smaller --test-fraction"
        )
    out = []
    for k in range(folds):
        b = s0 + k * L
        end = np.iinfo(np.int64).max if k == folds - 1 else int(union[b + L])
        out.append((int(union[b - E - L]), int(union[b]), end))
    return out


def fold_splits(
    ts: np.ndarray,
    times: tuple[int, int, int],
    cfg: DataConfig,
    *,
    warmup: int = WARMUP,
    source: str = "data",
    partial: bool = False,
) -> Splits:
    """A series' splits in one walk-forward fold (:func:`walk_forward_times`): train windows
    end one embargo before the validation stretch, validation windows end one embargo
    before the test stretch, and the test windows are those whose forecast targets all lie in
    the test stretch (their encoders may reach back before it: the past is known), so that
    consecutive folds' test targets tile the test region without overlap. ``partial``: return
    empty splits instead of refusing (a panel's series that joins the fold only in part,
    :mod:`tftjax.data.panel`)."""
    W, E, enc = cfg.window, cfg.embargo_rows, cfg.encoder_steps
    r = lambda t: int(np.searchsorted(ts, t))
    v0, t0, t1 = r(times[0]), r(times[1]), r(times[2])
    train, val = (warmup, max(v0 - E, warmup)), (v0, max(t0 - E, v0))
    test = np.arange(max(t0 - enc, warmup), t1 - W + 1, dtype=np.int32)  # targets in [t0, t1)
    splits = Splits(train, val, (t0, t1), _starts(train, W), _starts(val, W), test)
    for name in () if partial else ("train", "val", "test"):
        if getattr(splits, name).size == 0:
            raise DataError(
                f"{source}: its {name} stretch of a walk-forward fold holds no "
                f"complete {W}-bar window: fewer folds or more data"
            )
    return splits


def epoch_batches(
    starts: np.ndarray, batch_size: int, *, seed: int, epoch: int, shuffle: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """One epoch of batches covering every window exactly once.

    Returns:
      ``(idx, mask)``, both ``[n_batches, batch_size]``: window starts and a
      validity mask. The last batch is padded (mask ``False``) so that every
      batch has the same shape and the jitted step compiles once.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    order = starts
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(starts)
    n = order.shape[0]
    n_batches = max(-(-n // batch_size), 1)
    pad = n_batches * batch_size - n
    fill = order[:1] if n else np.zeros(1, dtype=np.int32)
    idx = np.concatenate([order, np.repeat(fill, pad)]).astype(np.int32)
    mask = np.concatenate([np.ones(n, bool), np.zeros(pad, bool)])
    return idx.reshape(n_batches, batch_size), mask.reshape(n_batches, batch_size)


class DeviceData(NamedTuple):
    """The feature arrays of one series or of several one after another, on device once."""

    historical: jax.Array  # [n, 210] float32
    known: jax.Array  # [n, 10] float32, at each bar's own time
    target: jax.Array  # [n, D] float32, each row's decoder targets (NaN: no bar in the slot)
    static: jax.Array  # [n, 5] float32, each row's series' statics
    future: jax.Array  # [n, D, 10] float32, at the D calendar slots after each bar
    scale: jax.Array  # [n] float32, EWMA volatility forecast made at each row (target units)
    anchor: jax.Array  # [n, D] float32, the --anchor's σ per step made at each row ([n, 0]: none)
    anchor_z: jax.Array  # [n, Q] float32, its series' standardised quantiles ([n, 0]: none)
    instrument: jax.Array  # [n] int32, each row's series' row of the instrument vocabulary


class Batch(NamedTuple):
    """Model inputs for B windows."""

    static: jax.Array  # [B, 5]
    historical: jax.Array  # [B, E, 210]
    known: jax.Array  # [B, E+D, 10]
    target: jax.Array  # [B, D], NaN where the step's calendar slot has no bar (masked)
    scale: jax.Array  # [B], the EWMA volatility at the forecast time (``--vol-target``)
    anchor: jax.Array  # [B, D], the anchor's σ per step at the forecast time (``--anchor``)
    anchor_z: jax.Array  # [B, Q], its standardised quantiles
    instrument: jax.Array  # [B] int32, the window's instrument (its vocabulary row)


def device_arrays(features: FeatureSet) -> list[np.ndarray]:
    """The host arrays of :class:`DeviceData`, in its field order (a series' statics on
    every row of it; the EWMA scale of each series on its own returns)."""
    n = len(features)
    static = np.broadcast_to(
        np.asarray(features.static, np.float32), (n, features.static.shape[-1])
    )
    scale = features.scale if features.scale is not None else ewma_scale(features.target)
    none = np.zeros((n, 0), np.float32)
    anchor = none if features.anchor is None else features.anchor
    anchor_z = none if features.anchor_z is None else features.anchor_z
    instrument = (
        np.zeros(n, np.int32)
        if features.instrument is None
        else np.asarray(features.instrument, np.int32)
    )
    return [
        np.ascontiguousarray(a)
        for a in (
            features.historical,
            features.known,
            window_decoder_targets(features),
            static,
            features.future,
            scale,
            anchor,
            anchor_z,
            instrument,
        )
    ]


def window_decoder_targets(features: FeatureSet) -> np.ndarray:
    """``[n, D]``: every row's decoder targets (:attr:`FeatureSet.decoder_target`, or, for a
    feature set built without a timeline, the next ``D`` rows' per-bar targets)."""
    if features.decoder_target is not None:
        return features.decoder_target
    return decoder_targets(features.target, None, features.future.shape[1])


def to_device(features: FeatureSet, device=None) -> DeviceData:
    """Copy the feature arrays to the device (once per run)."""
    return DeviceData(*[jax.device_put(a, device) for a in device_arrays(features)])


def gather(data: DeviceData, starts: jax.Array, encoder_steps: int, decoder_steps: int) -> Batch:
    """Cut windows at ``starts`` ``[B]`` out of the device arrays (jittable).

    Encoder rows take the known inputs of their own bars; the decoder steps take those of
    the calendar slots after the last encoder bar (``future[s + E - 1]``), so no input of a
    window depends on a bar after its forecast time. ``encoder_steps`` and
    ``decoder_steps`` must be static under ``jit`` (``decoder_steps`` at most the ``D`` the
    future inputs were built for).
    """
    steps = encoder_steps + decoder_steps
    rows = starts[:, None] + jnp.arange(steps, dtype=starts.dtype)  # [B, E+D]
    last = starts + (encoder_steps - 1)
    return Batch(
        static=jnp.take(data.static, last, axis=0, mode="clip"),
        historical=jnp.take(data.historical, rows[:, :encoder_steps], axis=0, mode="clip"),
        known=jnp.concatenate(
            [
                jnp.take(data.known, rows[:, :encoder_steps], axis=0, mode="clip"),
                jnp.take(data.future, last, axis=0, mode="clip")[:, :decoder_steps],
            ],
            axis=1,
        ),
        target=jnp.take(data.target, last, axis=0, mode="clip")[:, :decoder_steps],
        scale=jnp.take(data.scale, last, axis=0, mode="clip"),
        anchor=jnp.take(data.anchor, last, axis=0, mode="clip")[:, :decoder_steps],
        anchor_z=jnp.take(data.anchor_z, last, axis=0, mode="clip"),
        instrument=jnp.take(data.instrument, last, axis=0, mode="clip"),
    )
