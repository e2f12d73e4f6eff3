"""What every entry point shares: errors at the edge, and flags from the config dataclasses.

Library code raises typed errors naming the file, field and value
(:class:`~tftjax.errors.DataError`, :class:`~tftjax.errors.ConfigError`);
:func:`main` turns them into one line on stderr and exit code 2, a diverged
run into exit code 1 and Ctrl-C into 130, so that no user meets a traceback
for a mistake of theirs; a run that saved on a signal (SIGTERM, SIGINT, SIGUSR1) ends
with 75, "saved, resume me" (:mod:`tftjax.runner.preemption`). The flags are the config dataclasses' own fields
(:mod:`tftjax.cli.flags`: ``--batch-size``, not ``--train.batch-size``), read in one parse
and laid over a preset, a settings file, or a checkpoint's own settings
(:func:`tft_configs`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path

from tftjax.cli.flags import CommandLine, Parsed

__all__ = [
    "first_paragraph",
    "CommandLine",
    "Parsed",
    "data_file",
    "data_files",
    "exit",
    "main",
    "quant_options",
    "run_folder",
    "tft_command_line",
    "tft_configs",
]


def main(run: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run an entry point's body with the project's errors mapped to exit codes."""
    from tftjax.errors import ConfigError, DataError, TrainingDiverged, command_line
    from tftjax.runner.preemption import EXIT_SAVED, Preempted

    enable_compilation_cache()
    try:
        with command_line():  # messages name flags, not the Python API's arguments
            return int(run(argv) or 0)
    except Preempted as e:  # saved on a signal: a restart script reruns with --resume auto
        print(f"stopped (exit {EXIT_SAVED}): {e}", file=sys.stderr)
        return EXIT_SAVED
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "interrupted: saves already started were completed; resume with --resume",
            file=sys.stderr,
        )
        return 130


def exit(code: int) -> None:
    """End a command-line process with ``code``. A failed command (``code != 0``) leaves
    through ``os._exit`` after flushing its output: an error exit has nothing left to save
    (checkpoints are closed before the error reaches :func:`main`), and C++ worker threads of
    the libraries (pyarrow, XLA) torn down by the interpreter's exit occasionally abort the
    process ("terminate called without an active exception", exit 134) instead of the 2 the
    user should see. A multi-process run first leaves ``jax.distributed`` cleanly."""
    if code == 0:
        sys.exit(0)
    sys.stdout.flush()
    sys.stderr.flush()
    if "jax" in sys.modules:
        try:
            import jax
            from jax._src import distributed

            if distributed.global_state.client is not None:
                jax.distributed.shutdown()
        except Exception:  # leaving anyway
            pass
    os._exit(code)


def first_paragraph(doc: str | None) -> str:
    """A module docstring's first paragraph: a command's description in its help."""
    return (doc or "").split("\n\n")[0]


def run_folder(given: str | Path | None, root: str | Path, resume: bool | str) -> Path:
    """The run folder: ``--workdir`` when given; else a new numbered folder under ``root``
    (``runs/tft/run_001``, ``run_002`` …) so that a second run never meets the first one's
    checkpoints, or with ``--resume`` the newest of them that holds checkpoints (with
    ``--resume auto`` the newest run folder, or a new one if there is none).

    Raises:
      ConfigError: ``--resume`` without ``--workdir`` and no run under ``root``.
    """
    import re

    from tftjax.errors import ConfigError
    from tftjax.runner.checkpoints import list_checkpoints

    if given is not None:
        return Path(given)
    root = Path(root)
    runs = sorted(
        (p for p in root.glob("run_*") if re.fullmatch(r"run_\d+", p.name)),
        key=lambda p: int(p.name[4:]),
    )
    if resume == "auto" and runs:
        return runs[-1]
    if resume and resume != "auto":
        done = [p for p in runs if list_checkpoints(p / "checkpoints")]
        if not done:
            raise ConfigError(
                f"--resume: no run with checkpoints under {root}; name one with --workdir"
            )
        return done[-1]
    return root / f"run_{int(runs[-1].name[4:]) + 1 if runs else 1:03d}"


def data_file(parquet_file: Path | None, dataset: str | None) -> Path | None:
    """``--parquet-file`` or the bundled ``--dataset`` (not both)."""
    if dataset is None:
        return parquet_file
    from tftjax.errors import ConfigError

    if parquet_file is not None:
        raise ConfigError("give --dataset or --parquet-file, not both")
    from tftjax.data.bundled import bundled_path

    return bundled_path(dataset)


def data_files(parquet_files, dataset: str | None):
    """``--parquet-file`` (one or several paths) or the bundled ``--dataset`` names (comma
    separated: ``spx,nasdaq``), not both: None, one path, or a list of them."""
    from tftjax.errors import ConfigError

    files = [Path(p) for p in (parquet_files or ())]
    if dataset is not None:
        if files:
            raise ConfigError("give --dataset or --parquet-file, not both")
        from tftjax.data.bundled import bundled_path

        names = [n.strip() for n in dataset.split(",")]
        if "" in names or len(set(names)) < len(names):
            raise ConfigError(
                f"--dataset {dataset!r}: give distinct bundled names separated by "
                "commas, e.g. spx,nasdaq"
            )
        files = [bundled_path(n) for n in names]
    return None if not files else files[0] if len(files) == 1 else files


def enable_compilation_cache() -> None:
    """Keep compiled XLA programs on disk (``$XDG_CACHE_HOME/tftjax/jax``, else
    ``~/.cache/tftjax/jax``) so that a second run of the same model skips its
    compiles (the TFT-225 train step takes 10-20 s to compile on a CPU). JAX's own
    ``JAX_COMPILATION_CACHE_DIR`` wins; ``TFTJAX_COMPILATION_CACHE=0`` turns it off."""
    if (
        os.environ.get("JAX_COMPILATION_CACHE_DIR")
        or os.environ.get("TFTJAX_COMPILATION_CACHE", "1") == "0"
    ):
        return
    import jax

    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    jax.config.update("jax_compilation_cache_dir", str(root / "tftjax" / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def quant_options(act_symmetric: bool, weight_granularity: str, stacked_scales: str) -> dict:
    """A PTQ's quantization options (``--act-symmetric``, ``--weight-granularity``,
    ``--stacked-scales`` of evaluate and export) that are set away from their defaults."""
    given = {
        "act_symmetric": act_symmetric,
        "weight_granularity": weight_granularity,
        "stacked_scales": stacked_scales,
    }
    default = {"act_symmetric": False, "weight_granularity": "channel", "stacked_scales": "channel"}
    return {k: v for k, v in given.items() if v != default[k]}


MODEL_PARTS = ("model", "head", "quant", "execution", "data")


def tft_command_line(
    prog: str, description: str, options: type, preset_name: str, train_defaults: dict | None = None
) -> CommandLine:
    """The command line of a command that trains TFTs (train, tune, backtest): every field
    of the model's five parts and of the training config, the command's ``options``, and
    the old per-family kernel switches (hidden). The help shows ``preset_name``'s values."""
    from tftjax.config import SECTIONS, TrainConfig, get_preset

    p = get_preset(preset_name)
    display = {
        **{name: getattr(p.model, name) for name in MODEL_PARTS},
        "train": p.train_for(**(train_defaults or {})),
        "options": options(),
    }
    parts = {
        **{name: SECTIONS[name] for name in MODEL_PARTS},
        "train": TrainConfig,
        "options": options,
    }
    return CommandLine(prog, description, parts, display, legacy_kernel_flags=True)


def default_anchor(cfg):
    """``cfg`` anchored on the baseline chosen on validation (``--anchor auto``), or as it
    is where its head sets the scale or the order itself (said in one line)."""
    head = cfg.head
    if not cfg.data.returns_target:
        print(
            "--anchor auto (the default) resolves to none: the anchors forecast the bars' "
            "log returns, and the target is another"
        )
        return cfg
    if head.vol_target or head.monotone_quantiles:
        flag = "--vol-target" if head.vol_target else "--monotone-quantiles"
        print(f"--anchor auto (the default) resolves to none: {flag} sets the head itself")
        return cfg
    return cfg.override(anchor="auto")


def tft_configs(
    parsed: Parsed,
    preset_name: str,
    *,
    train_defaults: dict | None = None,
    settings: str | Path | None = None,
    saved=None,
    anchor_auto: bool = False,
):
    """``(TFTConfig, TrainConfig)`` of a command line: the preset's (training: the
    command's ``train_defaults`` under the preset's own), or ``saved`` (a resumed run's
    pair); then the ``settings`` file (``--config``); then the flags given.

    ``anchor_auto``: a new run's head is anchored (``--anchor auto``, the validated recipe
    of ``train`` and ``backtest``) unless the preset, the settings file or a flag names its
    anchor, or the preset keeps the plain head (``tiny``); with ``--vol-target`` or ``--monotone-quantiles``, which set the scale and the
    quantiles' order themselves, it stays ``none`` and a line says so.

    Raises:
      ConfigError: a bad settings file, or values the configs refuse.
    """
    from tftjax.config import apply_settings, get_preset, read_settings
    from tftjax.config.execution import legacy_kernels

    if saved is not None:
        cfg, tc = saved
    else:
        p = get_preset(preset_name)
        cfg, tc = p.model, p.train_for(**(train_defaults or {}))
        anchor_auto = anchor_auto and p.anchored_by_default
    named = saved is not None or parsed.given_flag("head", "anchor") or cfg.head.anchored
    if settings is not None:
        read = read_settings(settings)
        model = read.get("model", {})  # flat, or in its parts
        named = named or "anchor" in model or "anchor" in model.get("head", {})
        cfg, tc = apply_settings(cfg, tc, read, f"--config {settings}")
    cfg = cfg.override(**parsed.model_settings(MODEL_PARTS))
    if anchor_auto and not named:
        cfg = default_anchor(cfg)
    if parsed.legacy_kernels:
        cfg = cfg.override(
            execution=legacy_kernels(
                cfg.execution, parsed.legacy_kernels, parsed.given_flag("execution", "kernels")
            )
        )
    return cfg, dataclasses.replace(tc, **parsed.part("train"))
