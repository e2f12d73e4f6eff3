"""``python -m tftjax.train``: train a TFT on parquet OHLCV bars.

Examples:
  python -m tftjax.train --epochs 3
  python -m tftjax.train --preset tiny --epochs 1 --workdir runs/tiny
  python -m tftjax.train --remat=aggressive
  python -m tftjax.train --preset tft225-gpu --memory-budget 24GB   # bf16, Pallas, remat auto
  python -m tftjax.train --resume --workdir runs/tft --epochs 20
  python -m tftjax.train --qat --init-from runs/tft/run_001 --epochs 3   # QAT fine-tuning

The flags are the fields of :class:`~tftjax.config.TFTConfig`'s parts and of
:class:`~tftjax.config.TrainConfig` (the preset's values as defaults) plus the run options
below. With ``--resume`` the defaults are the checkpoint's own settings and data file: a
flag that contradicts them is refused (only ``--epochs`` and how the model runs may change).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from tftjax.cli import (
    Parsed,
    data_files,
    first_paragraph,
    run_folder,
    tft_command_line,
    tft_configs,
)
from tftjax.cli import main as cli_main
from tftjax.config import AUTO, TFTConfig, TrainConfig
from tftjax.config.presets import PresetName


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
    resume: bool = False
    """Continue the latest complete checkpoint in --workdir with its own settings and data."""
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


COMMAND_LINE = tft_command_line(
    "python -m tftjax.train", first_paragraph(__doc__), TrainOptions, "tft225"
)


def configs(parsed: Parsed) -> tuple[TFTConfig, TrainConfig, TrainOptions]:
    """The run's model and training configs and its options, from the parsed command line:
    the preset's (or on ``--resume`` the checkpoint's) settings, the ``--config`` file, then
    the flags. A ``--preset`` given with ``--resume`` sets the model, so that a different
    one is refused."""
    from tftjax.runner.resume import latest_meta

    opts = parsed.options(TrainOptions)
    workdir = run_folder(opts.workdir, "runs/tft", opts.resume)
    saved = None
    if opts.resume:
        meta = latest_meta(workdir / "checkpoints", "tft")
        model = TFTConfig.from_json(meta["identity"]["model"])
        if parsed.given_flag("options", "preset"):
            from tftjax.config import get_preset

            model = get_preset(opts.preset).model
        saved = (model, TrainConfig.from_json(meta["identity"]["train"]))
    cfg, tc = tft_configs(parsed, opts.preset, settings=opts.config, saved=saved)
    return cfg, tc, dataclasses.replace(opts, workdir=workdir)


def run(argv: list[str] | None = None) -> int:
    # before anything touches a JAX backend: multi-host start-up
    from tftjax.runner import mesh as parallel

    parsed = COMMAND_LINE.parse(argv)
    opts = parsed.options(TrainOptions)
    parallel.initialize(opts.coordinator, opts.num_processes, opts.process_id)
    cfg, tc, opts = configs(parsed)
    assert opts.workdir is not None
    paths = data_files(opts.parquet_file, opts.dataset)
    par = parallel.make_parallel(opts.devices, layout=opts.feature_layout)
    parallel.check_divisible(
        tc.batch_size // tc.accumulate,
        par.size,
        "--batch-size" if tc.accumulate == 1 else f"--batch-size / --accumulate {tc.accumulate} =",
    )
    if cfg.execution.remat == AUTO:  # the fastest tier that fits, at the largest batch
        from tftjax.memory import resolve_auto

        cfg, tc = resolve_auto(cfg, tc, paths, par.size, opts.resume, opts.workdir)

    from tftjax.runner.tensorboard import LOGDIR
    from tftjax.training import train_and_evaluate

    primary = parallel.is_primary()
    train_and_evaluate(
        cfg,
        tc,
        opts.workdir,
        data=paths,
        resume=opts.resume,
        progress=opts.progress and primary,
        profile_dir=str(opts.workdir / LOGDIR) if opts.profile else None,
        par=par,
        log=print if primary else (lambda *a, **k: None),
        plots=opts.plots,
        tensorboard=opts.tensorboard,
    )
    if opts.profile and primary:
        print(
            f"profile trace written under {opts.workdir / LOGDIR} (tensorboard --logdir "
            f"{opts.workdir}: its profile tab, beside the scalars)"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


def main_exit() -> None:
    """The console script: :func:`main`, and the process ends with its exit code."""
    from tftjax.cli import exit as cli_exit

    cli_exit(main())


if __name__ == "__main__":
    main_exit()
