"""What every entry point shares: errors at the edge, and flags from the config dataclasses.

Library code raises typed errors naming the file, field and value
(:class:`~tftjax.errors.DataError`, :class:`~tftjax.errors.ConfigError`);
:func:`main` turns them into one line on stderr and exit code 2, a diverged
run into exit code 1 and Ctrl-C into 130, so that no user meets a traceback
for a mistake of theirs. :func:`parse` builds the command line with tyro from
the dataclasses themselves (a nested config's fields become top-level flags:
``--batch-size``, not ``--train.batch-size``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def main(run: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run an entry point's body with the project's errors mapped to exit codes."""
    from tftjax.errors import ConfigError, DataError, TrainingDiverged

    enable_compilation_cache()
    try:
        return int(run(argv) or 0)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: saves already started were completed; resume with --resume",
              file=sys.stderr)
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
        except Exception:  # noqa: BLE001 - leaving anyway
            pass
    os._exit(code)


def parse(cls: type[T], argv: list[str] | None, default: T, prog: str, description: str) -> T:
    """``tyro.cli`` over ``cls`` with ``default`` (e.g. a preset, or a checkpoint's settings
    on resume) and un-prefixed flags."""
    import tyro

    return tyro.cli(cls, args=argv, default=default, prog=prog, description=description,
                    config=(tyro.conf.OmitArgPrefixes,))


def run_folder(given: str | Path | None, root: str | Path, resume: bool) -> Path:
    """The run folder: ``--workdir`` when given; else a new numbered folder under ``root``
    (``runs/tft/run_001``, ``run_002`` …) so that a second run never meets the first one's
    checkpoints, or with ``--resume`` the newest of them that holds checkpoints.

    Raises:
      ConfigError: ``--resume`` without ``--workdir`` and no run under ``root``.
    """
    import re

    from tftjax.checkpoints import list_checkpoints
    from tftjax.errors import ConfigError

    if given is not None:
        return Path(given)
    root = Path(root)
    runs = sorted((p for p in root.glob("run_*") if re.fullmatch(r"run_\d+", p.name)),
                  key=lambda p: int(p.name[4:]))
    if resume:
        done = [p for p in runs if list_checkpoints(p / "checkpoints")]
        if not done:
            raise ConfigError(f"--resume: no run with checkpoints under {root}; name one with "
                              "--workdir")
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
            raise ConfigError(f"--dataset {dataset!r}: give distinct bundled names separated by "
                              "commas, e.g. spx,nasdaq")
        files = [bundled_path(n) for n in names]
    return None if not files else files[0] if len(files) == 1 else files


def apply_settings(model, train, settings: dict, source: str = "--config"):
    """``{"model": {...}, "train": {...}}`` (e.g. ``python -m tftjax.tune``'s best.json)
    applied to a model and a training config.

    Raises:
      ConfigError: unknown sections or fields, or values the configs refuse.
    """
    import dataclasses

    from tftjax.errors import ConfigError

    known = {"model": {f.name for f in dataclasses.fields(model)},
             "train": {f.name for f in dataclasses.fields(train)}}
    bad = [s for s in settings if s not in known] + [
        f"{sec}.{k}" for sec, kv in settings.items() if sec in known for k in kv
        if k not in known[sec]]
    if bad:
        raise ConfigError(f"{source}: unknown setting(s) {', '.join(bad)}")
    return (dataclasses.replace(model, **settings.get("model", {})),
            dataclasses.replace(train, **settings.get("train", {})))


def with_config(argv: list[str] | None, model, train):
    """The preset's configs with ``--config FILE`` (a JSON settings file) applied: the defaults
    the command-line flags then override.

    Raises:
      ConfigError: a missing or unreadable file, or settings the configs refuse.
    """
    import json

    from tftjax.errors import ConfigError

    given = peek(argv, config=None).config
    if given is None:
        return model, train
    try:
        data = json.loads(Path(given).read_text())
    except FileNotFoundError:
        raise ConfigError(f"--config {given}: no such file") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"--config {given}: not a JSON settings file ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {given}: expected an object with 'model' and 'train'")
    data.pop("tuned", None)  # how the settings were found: a record, not a setting
    return apply_settings(model, train, data, f"--config {given}")


def peek(argv: list[str] | None, **flags) -> argparse.Namespace:
    """Flags needed before the full parse (a preset, ``--resume``, ``--workdir``); the full
    parse validates them and everything else. ``flags``: name → default (bool: a switch)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name, default in flags.items():
        opt = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            p.add_argument(opt, action="store_true", default=default)
        else:
            p.add_argument(opt, default=default)
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:  # help reads no file and starts nothing: defaults
        return argparse.Namespace(**flags)
    ns, _ = p.parse_known_args(argv)
    return ns


def enable_compilation_cache() -> None:
    """Keep compiled XLA programs on disk (``$XDG_CACHE_HOME/tftjax/jax``, else
    ``~/.cache/tftjax/jax``) so that a second run of the same model skips its
    compiles (the TFT-225 train step takes 10-20 s to compile on a CPU). JAX's own
    ``JAX_COMPILATION_CACHE_DIR`` wins; ``TFTJAX_COMPILATION_CACHE=0`` turns it off."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or \
            os.environ.get("TFTJAX_COMPILATION_CACHE", "1") == "0":
        return
    import jax

    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    jax.config.update("jax_compilation_cache_dir", str(root / "tftjax" / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def quant_options(args) -> dict:
    """A PTQ's quantization options (``--act-symmetric``, ``--weight-granularity``,
    ``--stacked-scales`` of evaluate and export) that are set away from their defaults."""
    from tftjax.errors import ConfigError

    choices = {"weight_granularity": ("channel", "tensor"), "stacked_scales": ("channel", "variable")}
    for k, ok in choices.items():
        if getattr(args, k) not in ok:
            raise ConfigError(f"--{k.replace('_', '-')} must be {' or '.join(ok)}, got "
                              f"{getattr(args, k)!r}")
    default = {"act_symmetric": False, "weight_granularity": "channel",
               "stacked_scales": "channel"}
    return {k: getattr(args, k) for k, v in default.items() if getattr(args, k) != v}
