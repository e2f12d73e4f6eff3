"""What each command line takes beyond the configs' fields: the options of
``python -m tftjax.train``, ``evaluate``, ``predict``, ``backtest``, ``tune`` and ``export``
(each field a flag; its docstring the flag's help, read by :func:`tftjax.cli.flags.field_docs`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from tftjax.config.presets import PresetName

ResumeFlag = Literal["no", "yes", "auto"]
"""``--resume`` (yes), ``--resume auto``, or neither (no): :func:`resume_mode` reads it."""


def resume_mode(flag: ResumeFlag) -> bool | Literal["auto"]:
    """What the run loop takes (:func:`tftjax.runner.loop.run`'s ``resume``)."""
    return {"no": False, "yes": True, "auto": "auto"}[flag]


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """Where the bars come from, where the run goes, and how it is run."""

    parquet_file: tuple[Path, ...] = ()
    """OHLCV bars (time column ts/timestamp/date, open, high, low, close, volume): one file, a
    long file of several instruments (a symbol column), or several files (one model over all
    their series); default: the bundled ES bars, or with --resume the run's own files."""
    dataset: str | None = None
    """Bundled sets instead of --parquet-file, comma-separated (spx,nasdaq): es (ES futures,
    1 min), spx, nasdaq (daily), btc (hourly); sources in tftjax/data/bundled/SOURCES.md;
    us-daily (12 US stocks and ETFs, daily, from a clone's data/ folder: data/SOURCES.md)."""
    preset: PresetName = "tft225"
    """The model, how it runs and how it trains (tftjax.config.presets): tft225, tft225-gpu
    (bf16, the Pallas kernels, --remat auto), small, compact or tiny; flags override single
    fields."""
    workdir: Path | None = None
    """Checkpoints, metrics.jsonl, summary.json and plots go here (default: a new
    runs/tft/run_NNN; with --resume, the newest of them)."""
    resume: ResumeFlag = dataclasses.field(default="no", metadata={"bare": "yes"})
    """--resume: continue the checkpoint furthest along in --workdir (an epoch's or one within
    an epoch) with its own settings and data; refused where there is none. --resume auto: the
    same where one exists, else a fresh run (a folder holding only a run's partial files, of
    the same settings); for restart scripts."""
    save_every_steps: int | None = None
    """Also write a checkpoint every N optimizer steps within an epoch (tft_step_S; a resume
    continues the epoch's batch order from it)."""
    save_every_minutes: float | None = None
    """Also write a checkpoint within an epoch when M minutes have passed since the last."""
    keep: int = 2
    """The checkpoints within an epoch kept (the latest K; epoch checkpoints keep the latest
    2 and the best)."""
    config: Path | None = None
    """A settings file ({"model": {...}, "train": {...}}, e.g. python -m tftjax.tune's
    best.json) applied over the preset; flags still win."""
    devices: int | None = None
    """Data parallelism over this many local devices (default: all of them; one on a plain
    CPU): the batch is sharded over them, parameters replicated. --batch-size (divided by
    --accumulate) must be a multiple of the devices of the mesh."""
    feature_layout: Literal["auto", "replicated", "rows"] = "auto"
    """The feature arrays on a mesh: replicated on every device, or sharded by rows (windows
    gathered with one reduce-scatter); auto: rows when a replica would take over 25% of a
    device's memory limit (never on CPU)."""
    coordinator: str | None = None
    """Multi-host: HOST:PORT of process 0's coordinator (jax.distributed); or set
    JAX_COORDINATOR_ADDRESS. Under SLURM or Open MPI JAX reads all three itself."""
    num_processes: int | None = None
    """Multi-host: the number of processes (or JAX_NUM_PROCESSES)."""
    process_id: int | None = None
    """Multi-host: this process's index, 0..num_processes-1 (or JAX_PROCESS_ID); process 0
    writes the logs, metrics, summary and plots; all write their part of the checkpoints."""
    profile: bool = False
    """Write a jax.profiler trace of steps 2-6 into WORKDIR/tensorboard, beside the run's
    scalars: one TensorBoard (its profile tab, or XProf) shows both."""
    progress: bool = True
    """Show the per-epoch progress bar (--no-progress hides it)."""
    plots: bool = True
    """Draw the PNG plots (loss curves, quantile fans, variable importance); --no-plots for
    headless or scripted runs (the summary and checkpoints are the same). Per invocation (a
    --resume draws them unless given it again); a multi-process run gives it to every
    process."""
    tensorboard: bool = True
    """Write a TensorBoard log (RUN/tensorboard: each epoch's numbers, the config, the plots;
    tensorboard --logdir runs/ shows every run)."""


@dataclasses.dataclass(frozen=True)
class EvaluateOptions:
    """Evaluate a TFT checkpoint on the test split."""

    checkpoint: Path
    """A checkpoint directory (runs/tft/run_001/checkpoints/tft_final_epoch10), a run folder
    (its final checkpoint) or an export folder."""
    parquet_file: tuple[Path, ...] = ()
    """Evaluate on these files instead of the training data (with each series' training
    statistics)."""
    dataset: str | None = None
    """Bundled sets instead of --parquet-file, comma-separated (spx,nasdaq): es (ES futures,
    1 min), spx, nasdaq (daily), btc (hourly); sources in tftjax/data/bundled/SOURCES.md;
    us-daily (12 US stocks and ETFs, daily, from a clone's data/ folder: data/SOURCES.md)."""
    instrument: str | None = None
    """The instrument of a one-series file without a symbol column (default: its file name's
    stem, a bundled set's name)."""
    unknown_instrument: Literal["refuse", "embed"] = "refuse"
    """An instrument the model was not trained on: refuse it, or embed it with the model's
    reserved unknown row (its statistics fitted on its own training rows)."""
    split: Literal["train", "val", "test"] = "test"
    int8: bool = False
    """Also run the int8 inference path (a --qat checkpoint, or a float one with --calibrate)."""
    calibrate: int | None = None
    """Post-training quantization of a float checkpoint: calibrate the int8 activation ranges
    on this many full training batches (with --int8)."""
    calibration: str = "minmax"
    """How --calibrate sets the ranges: minmax (running min/max), percentile:P (e.g.
    percentile:99.99) or mse (least squared quantisation error)."""
    act_symmetric: bool = False
    """With --calibrate: symmetric int8 activations (zero point 0)."""
    weight_granularity: Literal["channel", "tensor"] = "channel"
    """With --calibrate: Dense and LSTM weight scales per output channel, or per tensor."""
    stacked_scales: Literal["channel", "variable"] = "channel"
    """With --calibrate: stacked GRN weight scales per (variable, channel), or per variable."""


@dataclasses.dataclass(frozen=True)
class PredictOptions:
    """Forecast the next bars' quantiles with a saved TFT."""

    checkpoint: Path
    """A checkpoint, a run folder (its final checkpoint) or an export folder."""
    parquet_file: tuple[Path, ...] = ()
    """The bars to forecast from: one or several files, or a long file (default: the files
    the model was trained on)."""
    dataset: str | None = None
    """Bundled sets instead of --parquet-file, comma-separated (spx,nasdaq): es (ES futures,
    1 min), spx, nasdaq (daily), btc (hourly); sources in tftjax/data/bundled/SOURCES.md;
    us-daily (12 US stocks and ETFs, daily, from a clone's data/ folder: data/SOURCES.md)."""
    instrument: str | None = None
    """The instrument of a one-series file without a symbol column (default: its file name's
    stem, a bundled set's name)."""
    unknown_instrument: Literal["refuse", "embed"] = "refuse"
    """An instrument the model was not trained on: refuse it, or embed it with the model's
    reserved unknown row (its statistics fitted on its own training rows, or for a new
    listing with none the trained series' pooled statistics; the stats_from column says)."""
    as_of: str | None = None
    """The origin: each series' last bar at or before this time (default: its last bar). No
    UTC offset: the data's own clock (its zone's wall clock for zone-aware bars)."""
    origins: str = "last"
    """last, all, or N: forecast from the last N eligible bars up to the origin (with
    --start/--end/--split: default every origin in the range)."""
    start: str | None = None
    """The first origin time of a range (historical forecasts)."""
    end: str | None = None
    """The last origin time of a range."""
    split: Literal["train", "val", "test"] | None = None
    """Origins of the model's own windows of this split (scored like evaluate's)."""
    series: str | None = None
    """Only these series (comma-separated names)."""
    stale_after: int = 1
    """Warn when more than this many calendar slots after a series' origin, up to --as-of,
    have no bar."""
    future: Path | None = None
    """A model with --known columns of your own: their values after the bars, a parquet
    file of a time column, those columns and (several series) a symbol column."""
    out: Path = Path("forecast.parquet")
    """The forecast file: .parquet (metadata in its schema) or .csv (metadata in FILE.json)."""
    int8: bool = False
    """The int8 inference path (a --qat checkpoint or an int8 export)."""
    plot: Path | None = None
    """Also draw each printed series' last quantile fan to this PNG (log-return units)."""


@dataclasses.dataclass(frozen=True)
class BacktestOptions:
    """The walk-forward: its data, folds, tuning and outputs."""

    parquet_file: tuple[Path, ...] = ()
    """OHLCV bars (one file, several, or a long file); default: the bundled ES bars."""
    dataset: str | None = None
    """Bundled sets instead of --parquet-file, comma-separated (spx, nasdaq, btc, es; the
    us-daily panel from a clone's data/ folder)."""
    preset: PresetName = "small"
    """The model, how it runs and trains (tftjax.config.presets): small (d=32), compact (d=16,
    anchored, with --ema 0.9, 4 checks an epoch, --smooth 3, batch 32), tft225, tiny; the
    flags override single fields."""
    config: Path | None = None
    """A settings file (python -m tftjax.tune's best.json) applied over the preset; flags
    still win. The table then says the settings were tuned (once, not inside each fold)."""
    tune_trials: int = 0
    """Tune inside each fold: that many Optuna trials (python -m tftjax.tune's search) on the
    fold's own training and validation stretches before its training (0: no tuning)."""
    tune_epochs: int = 8
    """Epochs of each tuning trial (patience 2, median pruning)."""
    folds: int = 5
    """Walk-forward folds (at least 2)."""
    test_fraction: float = 0.4
    """Share of the bar times (after warm-up) cut into the folds' test stretches."""
    baseline_pairs: str = "all"
    """The pair control: the pairs of baselines combined on each fold's validation
    (a+b,c+d of zero, train_quantiles, rolling, ewma_gauss, ewma_empirical, range_ewma, har,
    qr), or all."""
    preregistered: Path | None = None
    """A recipe committed before the run (experiments/preregistered/*.json): the run is
    refused unless its settings are the recipe's, and backtest.json records the file's
    SHA-256, its one test and its Holm family."""
    workdir: Path | None = None
    """Each fold's run (fold_1 …) and backtest.json go here (default: a new
    runs/backtest/run_NNN)."""
    resume: bool = False
    """Continue the walk-forward in --workdir where it stopped: folds trained to their end
    are scored again, a fold stopped midway continues from its latest checkpoint (the
    settings and data must be the walk-forward's own: walkforward.json)."""
    bootstrap: int = 2000
    """Circular block bootstrap resamples of the intervals (at least 1)."""
    plot: bool = False
    """Also draw the stitched forecasts' PIT histogram (WORKDIR/pit.png)."""
    progress: bool = True
    """Show the progress bars (--no-progress hides them)."""
    tensorboard: bool = True
    """Write a TensorBoard log per fold (RUN/tensorboard)."""


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    """The search: its data, where it starts from, how many trials."""

    parquet_file: tuple[Path, ...] = ()
    """OHLCV bars (one file, several, or a long file); default: the bundled ES bars."""
    dataset: str | None = None
    """Bundled sets instead of --parquet-file, comma-separated (es, spx, nasdaq, btc; the
    us-daily panel from a clone's data/ folder)."""
    preset: PresetName = "small"
    """The model the search starts from (the searched fields are drawn, the rest kept)."""
    config: Path | None = None
    """A settings file (e.g. an earlier best.json) applied before the flags."""
    trials: int = 20
    """Trials to run (at least 1)."""
    sampler_seed: int = 0
    """The TPE sampler's seed (the drawn settings are reproducible from it; --seed is each
    trial's training seed)."""
    workdir: Path | None = None
    """Trials' runs (trial_000 …), trials.json and best.json (default: a new
    runs/tune/run_NNN)."""
    resume: bool = False
    """Go on with the search stopped in --workdir (its study.journal): run the trials left
    of --trials, with the settings it was started with."""
    progress: bool = True
    """Show the progress bars (--no-progress hides them)."""
    tensorboard: bool = True
    """Write a TensorBoard log per trial (RUN/tensorboard)."""


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """Export a TFT checkpoint's weights (float32 and int8) as safetensors plus its config."""

    checkpoint: Path
    """A checkpoint directory or a run folder (its final checkpoint)."""
    out: Path
    """Folder to write (must not exist or be empty)."""
    calibrate: int | None = None
    """For a float checkpoint: calibrate the int8 activation ranges on this many full training
    batches (post-training quantization) and export int8 too; default: float32 only."""
    calibration: str = "minmax"
    """How --calibrate sets the ranges: minmax, percentile:P or mse."""
    act_symmetric: bool = False
    """With --calibrate: symmetric int8 activations (zero point 0)."""
    weight_granularity: Literal["channel", "tensor"] = "channel"
    """With --calibrate: Dense and LSTM weight scales per output channel, or per tensor."""
    stacked_scales: Literal["channel", "variable"] = "channel"
    """With --calibrate: stacked GRN weight scales per (variable, channel), or per variable."""
    samples: int = 8
    """int8 exports: how many test windows samples.safetensors holds, with tftjax's int8
    outputs for them (what another runtime checks its rebuild against)."""
