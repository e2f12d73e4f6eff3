"""The project's error types, importable without JAX or Orbax (the CLIs' edge uses them)."""


class ConfigError(Exception):
    """Settings that cannot work: a bad value, or a resume that would mix runs.

    The message names the field and the value; every CLI prints it as one line
    and exits with code 2 (:mod:`tftjax.cli`). Not a ``ValueError`` on purpose:
    tyro would otherwise wrap it in its own multi-line box.
    """


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept (exit code 1)."""
