"""``python -m tftjax.train``: train a TFT on parquet OHLCV bars.

Examples:
  python -m tftjax.train --epochs 3
  python -m tftjax.train --preset tiny --epochs 1 --workdir runs/tiny
  python -m tftjax.train --remat=aggressive
  python -m tftjax.train --resume --workdir runs/tft --epochs 20
  python -m tftjax.train --qat --init-from runs/tft/run_001 --epochs 3   # QAT fine-tuning

The flags are the fields of :class:`~tftjax.config.TFTConfig` and
:class:`~tftjax.config.TrainConfig` (with the preset's values as defaults)
plus the run options below. With ``--resume`` the defaults are the
checkpoint's own settings and data file: a flag that contradicts them is
refused (only ``--epochs`` may grow).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from tftjax.cli import main as cli_main
from tftjax.cli import data_files, parse, peek, run_folder, with_config
from tftjax.config import ConfigError, TFTConfig, TrainConfig, preset, preset_training


@dataclasses.dataclass
class Args:
    """Train a Temporal Fusion Transformer on OHLCV bars (default: the bundled ES 1-minute bars)."""

    model: TFTConfig
    train: TrainConfig
    parquet_file: tuple[Path, ...] = ()
    """OHLCV bars (time column ts/timestamp/date, open, high, low, close, volume): one file, a
    long file of several instruments (a symbol column), or several files (one model over all
    their series); default: the bundled ES bars, or with --resume the run's own files."""
    dataset: str | None = None
    """Bundled sets instead of --parquet-file, comma-separated (spx,nasdaq): es (ES futures,
    1 min), spx, nasdaq (daily), btc (hourly); sources in tftjax/data/bundled/SOURCES.md;
    us-daily (12 US stocks and ETFs, daily, from a clone's data/ folder: data/SOURCES.md)."""
    preset: Literal["tft225", "small", "tiny", "compact"] = "tft225"
    """Model sizes: tft225 (the default), small (d=32: a few thousand training windows), compact
    (d=16, anchored, with --ema 0.9, 4 checks an epoch, --smooth 3, batch 32) or tiny; the flags
    below override single fields."""
    workdir: Path = Path("runs/tft/run_001")
    """Checkpoints, metrics.jsonl, summary.json and plots go here (default: a new
    runs/tft/run_NNN; with --resume, the newest of them)."""
    resume: bool = False
    """Continue the latest complete checkpoint in --workdir with its own settings and data."""
    config: Path | None = None
    """A settings file ({"model": {...}, "train": {...}}, e.g. python -m tftjax.tune's
    best.json) applied over the preset; flags still win."""
    remat: str = "full"
    """Rematerialisation tier: off, minimal, aggressive, full, offload, or auto -- see
    tftjax.remat. Default: the fastest on this platform (CPU: full, also the smallest);
    a resumed run keeps its own."""
    memory_budget: str | None = None
    """Device memory budget for --remat auto, e.g. 24GB or 16GiB (capped at 90% of the
    device's own limit where it reports one; needed where it does not, e.g. on CPU)."""
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
    no_progress: bool = False
    """Hide the per-epoch progress bar."""
    no_plots: bool = False
    """Skip the PNG plots (loss curves, quantile fans, variable importance): headless or
    scripted runs; the summary and checkpoints are the same. Per invocation (a --resume
    draws them unless given it again); a multi-process run gives it to every process."""
    no_tensorboard: bool = False
    """Write no TensorBoard log (RUN/tensorboard: each epoch's numbers, the config, the
    plots; tensorboard --logdir runs/ shows every run)."""


def defaults(argv: list[str] | None) -> Args:
    """The preset's settings, or on ``--resume`` the checkpoint's (a ``--preset`` given
    explicitly still sets the model, so that a different one is refused)."""
    from tftjax.runloop import latest_meta

    pre = peek(argv, preset=None, resume=False, workdir=None)
    workdir = run_folder(pre.workdir, "runs/tft", pre.resume)
    from tftjax.config import PRESETS

    name = pre.preset if pre.preset in PRESETS else "tft225"
    model, train = with_config(argv, preset(name), preset_training(name))
    if pre.resume:
        saved = latest_meta(workdir / "checkpoints", "tft")
        train = TrainConfig.from_json(saved["identity"]["train"])
        if pre.preset is None:
            model = TFTConfig.from_json(saved["identity"]["model"])
    from tftjax.remat import default_tier

    remat = model.remat if pre.resume else default_tier()
    return Args(model=model, train=train, preset=name, remat=remat, workdir=workdir)


def run(argv: list[str] | None = None) -> int:
    # before anything touches a JAX backend: multi-host start-up
    from tftjax import parallel

    pre = peek(argv, coordinator=None, num_processes=None, process_id=None)
    try:
        n_proc = None if pre.num_processes is None else int(pre.num_processes)
        p_id = None if pre.process_id is None else int(pre.process_id)
    except ValueError:
        raise ConfigError("--num-processes and --process-id must be integers") from None
    parallel.initialize(pre.coordinator, n_proc, p_id)
    from tftjax.remat import AUTO, CHOICES

    args = parse(Args, argv, defaults(argv), "python -m tftjax.train", __doc__.split("\n\n")[0])
    if args.remat not in CHOICES:
        raise ConfigError(f"--remat {args.remat!r} is not a tier; choose one of: "
                          f"{', '.join(CHOICES)}")
    cfg, tc = args.model, args.train
    args.parquet_file = data_files(args.parquet_file, args.dataset)
    par = make_mesh(args, cfg, tc)
    if args.remat == AUTO:
        cfg, tc = plan_auto_tier(cfg, tc, args, par.size)
    else:
        cfg = dataclasses.replace(cfg, remat=args.remat)

    from tftjax.tensorboard import LOGDIR
    from tftjax.training import train_and_evaluate

    primary = parallel.is_primary()
    train_and_evaluate(cfg, tc, args.workdir, parquet_file=args.parquet_file, resume=args.resume,
                       progress=not args.no_progress and primary,
                       profile_dir=str(args.workdir / LOGDIR) if args.profile else None, par=par,
                       log=print if primary else (lambda *a, **k: None), plots=not args.no_plots,
                       tensorboard=not args.no_tensorboard)
    if args.profile and primary:
        print(f"profile trace written under {args.workdir / LOGDIR} (tensorboard --logdir "
              f"{args.workdir}: its profile tab, beside the scalars)")
    return 0


def make_mesh(args: Args, cfg: TFTConfig, tc: TrainConfig):
    """The mesh of ``--devices`` (feature layout decided from the data's size), checked
    against the batch before any data is read."""
    from tftjax import parallel

    par = parallel.make_parallel(args.devices, layout=args.feature_layout)
    parallel.check_divisible(tc.batch_size // tc.accumulate, par.size,
                             "--batch-size" if tc.accumulate == 1 else
                             f"--batch-size / --accumulate {tc.accumulate} =")
    return par  # an ``auto`` feature layout is decided once the data's size is known


def plan_auto_tier(cfg: TFTConfig, tc: TrainConfig, args: Args, devices: int = 1):
    """``--remat auto``: the fastest tier that fits the budget (a device's: each of
    ``devices`` runs ``1/devices`` of the batch), as accumulated micro-batches where the whole
    batch fits no tier, and (on a new run without accumulation) the largest batch that fits;
    a resumed run keeps its batch size."""
    from tftjax.data import default_parquet, find_data_files
    from tftjax.data.bars import read_series
    from tftjax.memory import parse_bytes, plan_auto

    budget = None
    if args.memory_budget:
        try:
            budget = parse_bytes(args.memory_budget)
        except ValueError:
            raise ConfigError(f"--memory-budget {args.memory_budget!r} is not a size like "
                              "24GB") from None
    path = args.parquet_file
    if path is None and args.resume:
        from tftjax.runloop import latest_meta

        saved = latest_meta(args.workdir / "checkpoints", "tft")
        path = find_data_files(saved["identity"]["data"], args.workdir)
    paths = path if isinstance(path, list) else [path or default_parquet()]
    rows = sum(len(b) for p in paths for b in read_series(p))
    tier, batch, k = plan_auto(dataclasses.replace(cfg, remat="off"), budget,
                               tc.batch_size // devices, rows, grow_batch=not args.resume,
                               eval_batch_size=-(-tc.eval_batch_size // devices),
                               accumulate=tc.accumulate)
    return (dataclasses.replace(cfg, remat=tier),
            dataclasses.replace(tc, batch_size=batch * devices, accumulate=k))


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit

    cli_exit(main())
