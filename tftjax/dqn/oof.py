"""Out-of-fold forecasts: a TFT's forecast at every bar from a model that never saw that bar,
nor any bar of the walk-forward fold it is used in (issue 39).

Models are trained on growing heads of the series: model ``m`` on the bars before its
``start`` (its own train/validation split inside them), the starts being the validation
starts of the walk-forward folds and ``before`` evenly spaced points ahead of the first.
Fold ``k`` reads, at a bar ``t``, the forecast of the latest model whose start is at or
before both ``t`` and fold ``k``'s validation start: over its validation and test stretches
that is fold ``k``'s own model (trained on every bar before them), over its training rows
an earlier model, trained before those rows. So each fold's DQN trains, selects and
trades on forecasts that are out of sample where they are read, and no model it reads was
fitted on a bar of its validation or test stretch. Rows before the first model's start
have no forecast (0, and a 0 in the ``valid`` column).

:func:`build` takes the model as two functions (``fit`` and ``predict``) so that tests can
check this bookkeeping with a model that is not a TFT; :func:`tft_model` is the TFT's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np


@dataclasses.dataclass
class Block:
    """One model's forecasts at every bar of the series."""

    start: int  # ns: the model was fitted on bars strictly before this time
    first: np.ndarray  # [n, Q] first-step quantiles (target scales), 0 without a window
    cum: np.ndarray  # [n] median cumulative log return over the horizon
    valid: np.ndarray  # [n] bool: a complete window ends at this bar


def model_starts(ts: np.ndarray, folds: list[tuple[int, int, int]], before: int = 2) -> list[int]:
    """The models' start times: ``before`` evenly spaced bars ahead of the first fold's
    validation start, then every fold's validation start."""
    first = int(np.searchsorted(ts, folds[0][0]))
    pre = [int(ts[first * j // (before + 1)]) for j in range(1, before + 1)]
    return pre + [int(f[0]) for f in folds]


def build(
    bars,
    folds: list[tuple[int, int, int]],
    fit: Callable,
    predict: Callable,
    before: int = 2,
    log=print,
) -> list[Block]:
    """Fit one model per :func:`model_starts` time and forecast every bar with it.

    ``fit(head_bars, m) -> model`` sees only the bars before model ``m``'s start;
    ``predict(model) -> {"first", "cum", "valid"}`` forecasts every bar of the series, each
    from the window ending at it (causal)."""
    out = []
    for m, start in enumerate(model_starts(bars.ts, folds, before)):
        stop = int(np.searchsorted(bars.ts, start))
        log(
            f"out-of-fold model {m + 1}: fitted on the {stop:,} bars before "
            f"{np.datetime64(start, 'ns')} UTC"
        )
        f = predict(fit(bars.slice(0, stop), m))
        out.append(
            Block(
                start,
                np.asarray(f["first"], np.float32),
                np.asarray(f["cum"]),
                np.asarray(f["valid"], bool),
            )
        )
    return out


def for_fold(blocks: list[Block], ts: np.ndarray, val_start: int) -> dict:
    """The forecasts fold ``k`` (validation from ``val_start``) reads at every bar:
    ``columns [n, Q + 1]`` (the first-step quantiles, and 1 where a forecast exists: the
    DQN's extra observation columns), ``cum [n]``, ``valid [n]`` and ``model [n]`` (the block
    each bar's forecast came from; -1: none)."""
    usable = [b for b in blocks if b.start <= val_start]
    starts = np.array([b.start for b in usable], np.int64)
    model = np.searchsorted(starts, np.asarray(ts, np.int64), side="right") - 1
    n, q = len(ts), blocks[0].first.shape[1]
    first, cum, valid = np.zeros((n, q), np.float32), np.zeros(n), np.zeros(n, bool)
    for i, b in enumerate(usable):
        rows = model == i
        first[rows], cum[rows], valid[rows] = b.first[rows], b.cum[rows], b.valid[rows]
    first[~valid], cum[~valid] = 0.0, 0.0
    return {
        "columns": np.concatenate([first, valid[:, None].astype(np.float32)], axis=1),
        "cum": cum,
        "valid": valid,
        "model": np.where(valid, model, -1),
    }


def tft_model(
    workdir: Path,
    path,
    calendar: str | None,
    preset_name: str = "small",
    epochs: int = 20,
    patience: int = 3,
):
    """``(fit, predict)`` of a TFT for :func:`build`: ``fit`` trains the ``preset_name``
    preset on the head bars (written to ``workdir/model_M/head.parquet``; its own
    train/validation split inside them) and ``predict`` forecasts the whole series at
    ``path`` with that model's statistics (:func:`~tftjax.dqn.tft_inputs.tft_forecasts`)."""
    from tftjax.config import TrainConfig, preset
    from tftjax.data import load_dataset, write_bars
    from tftjax.dqn.tft_inputs import load_tft, tft_forecasts
    from tftjax.training import train_and_evaluate

    def fit(head, m):
        run_dir = Path(workdir) / f"model_{m + 1}"
        run_dir.mkdir(parents=True, exist_ok=True)
        write_bars(head, run_dir / "head.parquet")
        cfg = preset(preset_name, calendar=calendar)
        train_and_evaluate(
            cfg,
            TrainConfig(epochs=epochs, patience=patience),
            run_dir / "tft",
            data=load_dataset(run_dir / "head.parquet", cfg.data),
            progress=False,
            log=lambda *a: None,
            plots=False,
            tensorboard=False,
        )
        return run_dir / "tft"

    def predict(run_dir):
        return tft_forecasts(load_tft(run_dir), path)

    return fit, predict
