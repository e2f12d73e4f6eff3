"""The project's error types, importable without JAX, Orbax or pyarrow (the CLIs' edge uses
them, and every layer raises them: nothing below needs to import a layer above for its
error type)."""

import contextlib
import contextvars


class ConfigError(Exception):
    """Settings that cannot work: a bad value, or a resume that would mix runs.

    The message names the field and the value; every CLI prints it as one line
    and exits with code 2 (:mod:`tftjax.cli`). Not a ``ValueError`` on purpose:
    a parser would otherwise report it as its own usage error.
    """


class DataError(ValueError):
    """Bad input data: the message names the file, column and row (exit code 2)."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept (exit code 1)."""


_COMMAND_LINE = contextvars.ContextVar("tftjax_command_line", default=False)


@contextlib.contextmanager
def command_line():
    """Inside: a command-line entry point is running (:func:`tftjax.cli.main`), so messages
    keep the flags' names; the Python API names its own arguments elsewhere."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def on_command_line() -> bool:
    return _COMMAND_LINE.get()


def check(checks: dict[str, bool], where: str) -> None:
    """Raise one :class:`ConfigError` listing every message whose check is ``False``."""
    bad = [msg for msg, ok in checks.items() if not ok]
    if bad:
        raise ConfigError(f"{where}: " + "; ".join(bad))


def finite(x) -> bool:
    """A real, finite number (what a config's float fields must be)."""
    import math

    return isinstance(x, (int, float)) and math.isfinite(x)
