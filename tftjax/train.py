"""``python -m tftjax.train``: train a TFT on parquet OHLCV bars.

Examples:
  python -m tftjax.train --epochs 3
  python -m tftjax.train --preset tiny --epochs 1 --workdir runs/tiny
  python -m tftjax.train --remat=aggressive
  python -m tftjax.train --preset tft225-gpu --memory-budget 24GB   # bf16, Pallas, remat auto
  python -m tftjax.train --resume --workdir runs/tft --epochs 20
  python -m tftjax.train --resume auto --workdir runs/tft --save-every-steps 200   # requeues
  python -m tftjax.train --qat --init-from runs/tft/run_001 --epochs 3   # QAT fine-tuning
  python -m tftjax.train --init-from runs/tft/run_001 --parquet-file new.parquet --epochs 2

The flags are the fields of :class:`~tftjax.config.TFTConfig`'s parts and of
:class:`~tftjax.config.TrainConfig` (the preset's values as defaults) plus the run options
below. With ``--resume`` the defaults are the checkpoint's own settings and data file: a
flag that contradicts them is refused (only ``--epochs`` and how the model runs may change);
with ``--init-from`` (and no ``--preset``) they are the parent run's."""

from __future__ import annotations

import dataclasses

from tftjax.cli import (
    Parsed,
    data_files,
    first_paragraph,
    run_folder,
    tft_command_line,
    tft_configs,
)
from tftjax.cli import main as cli_main
from tftjax.cli.options import TrainOptions, resume_mode
from tftjax.config import AUTO, TFTConfig, TrainConfig

COMMAND_LINE = tft_command_line(
    "python -m tftjax.train", first_paragraph(__doc__), TrainOptions, "tft225"
)


def configs(parsed: Parsed) -> tuple[TFTConfig, TrainConfig, TrainOptions]:
    """The run's model and training configs and its options, from the parsed command line:
    the preset's (or on ``--resume`` the checkpoint's) settings, the ``--config`` file, then
    the flags. A ``--preset`` given with ``--resume`` sets the model, so that a different
    one is refused."""
    from tftjax.training.finetune import run_settings

    opts = parsed.options(TrainOptions)
    workdir = run_folder(opts.workdir, "runs/tft", resume_mode(opts.resume))
    saved = run_settings(parsed, opts, workdir)
    cfg, tc = tft_configs(parsed, opts.preset, settings=opts.config, saved=saved, anchor_auto=True)
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
    from tftjax.runner.preemption import Saving
    from tftjax.runner.resume import wants_checkpoint

    mode = resume_mode(opts.resume)
    saving = Saving(opts.save_every_steps, opts.save_every_minutes, opts.keep)
    saving.check()
    if cfg.execution.remat == AUTO:  # the fastest tier that fits, at the largest batch
        from tftjax.memory import resolve_auto

        continues = wants_checkpoint(mode, opts.workdir / "checkpoints")
        cfg, tc = resolve_auto(cfg, tc, paths, par.size, continues, opts.workdir)

    from tftjax.runner.tensorboard import LOGDIR
    from tftjax.training import train_and_evaluate

    primary = parallel.is_primary()
    train_and_evaluate(
        cfg,
        tc,
        opts.workdir,
        data=paths,
        resume=mode,
        saving=saving,
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
