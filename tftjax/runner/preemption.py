"""Training that survives preemption: signals, saves within an epoch, and the exit code that
says "saved, resume me".

A scheduler takes a machine back with a signal first: SIGTERM (spot and preemptible
instances, Kubernetes, ``scancel``), SIGUSR1 (SLURM's ``--signal=USR1@SECONDS``), or a user's
Ctrl-C (SIGINT). :class:`SignalWatch` turns each into a request that the run loop
(:mod:`tftjax.runner.loop`) honours at the next step boundary: the step in flight finishes,
a checkpoint of that step is written (with where the epoch's batch order stands), the
metrics so far are written, and the process ends with :data:`EXIT_SAVED`.

* A repeated SIGTERM or SIGUSR1 changes nothing (schedulers may send several); a second
  Ctrl-C before the save starts aborts at once (:class:`KeyboardInterrupt`: the previous
  checkpoint stays the one that resumes); a signal during a save never cuts it: a save the
  signal did not ask for (``--save-every-steps``) runs to its end and becomes the one the
  run stops with (a SIGKILL can cut a save: Orbax writes into a temporary folder renamed on
  commit, and the previous checkpoint stays the one that resumes).
* On several processes every process must save the same step: the decision is JAX's
  preemption sync point (:func:`jax.experimental.multihost_utils.reached_preemption_sync_point`,
  which MaxText and Orbax use), whose service catches SIGTERM itself; SIGUSR1 and SIGINT are
  passed on to it as SIGTERM.
* :class:`SaveSchedule`: checkpoints every ``--save-every-steps`` steps and every
  ``--save-every-minutes`` minutes, whatever signals come.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

EXIT_SAVED = 75
"""The exit code of a run that saved on a signal and wants to be resumed (``EX_TEMPFAIL``
of sysexits.h: a temporary failure, try again). A restart script reruns the same command
with ``--resume auto`` while the code is 75."""

SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")


class Preempted(Exception):
    """A run that saved on a signal: its message names the signal and the checkpoint."""


@dataclasses.dataclass(frozen=True)
class Saving:
    """When a run writes checkpoints within an epoch (beside every epoch's own).

    Attributes:
      every_steps: a checkpoint every N optimizer steps (None: not by steps).
      every_minutes: a checkpoint when M minutes have passed since the last (None: not by
        time).
      keep: the within-epoch checkpoints kept (the latest K; epoch checkpoints keep their own
        rule).
    """

    every_steps: int | None = None
    every_minutes: float | None = None
    keep: int = 2

    def check(self) -> None:
        """Raises ConfigError naming the flag of a value out of range."""
        from tftjax.errors import ConfigError

        if self.every_steps is not None and self.every_steps < 1:
            raise ConfigError(f"--save-every-steps must be at least 1, got {self.every_steps}")
        if self.every_minutes is not None and not self.every_minutes > 0:
            raise ConfigError(f"--save-every-minutes must be above 0, got {self.every_minutes}")
        if self.keep < 1:
            raise ConfigError(f"--keep must be at least 1, got {self.keep}")
        import jax

        if self.every_minutes is not None and jax.process_count() > 1:
            raise ConfigError(
                "--save-every-minutes reads each process's own clock: on several processes "
                "they would save at different steps; give --save-every-steps"
            )


class SaveSchedule:
    """Whether a within-epoch checkpoint is due at a step, by steps or by the clock."""

    def __init__(self, saving: Saving, clock=time.monotonic):
        self.saving, self.clock = saving, clock
        self.last_time = clock()

    def due(self, global_step: int) -> bool:
        s = self.saving
        by_steps = s.every_steps is not None and global_step % s.every_steps == 0
        by_time = (
            s.every_minutes is not None and self.clock() - self.last_time >= 60 * s.every_minutes
        )
        return by_steps or by_time

    def saved(self) -> None:
        self.last_time = self.clock()


class SignalWatch:
    """The signals of :data:`SIGNALS`, caught while the ``with`` block runs (in the main
    thread; elsewhere nothing is installed and no signal is seen), then the previous
    handlers back.

    ``received``: the first signal's name, or None. ``saving()``: a block no signal
    interrupts (one that comes is recorded, and honoured after it)."""

    def __init__(self, multi_process: bool | None = None):
        if multi_process is None:
            import jax

            multi_process = jax.process_count() > 1
        self.multi = multi_process
        self.received: str | None = None
        self._saving = False
        self._old: dict[int, object] = {}

    def __enter__(self) -> SignalWatch:
        if threading.current_thread() is not threading.main_thread():
            return self
        for name in SIGNALS:
            sig = getattr(signal, name, None)
            if sig is None or (self.multi and name == "SIGTERM"):  # JAX's service has it
                continue
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        self._old.clear()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is None:  # honoured at the next step boundary, or after a save
            self.received = name
            if self.multi:  # the preemption service decides the step every process saves
                os.kill(os.getpid(), signal.SIGTERM)
        elif name == "SIGINT" == self.received and not self._saving and not self.multi:
            raise KeyboardInterrupt  # a second Ctrl-C before the save: stop now (one process:
            # on several, the others would wait for it at the sync point)

    def should_stop(self, global_step: int) -> bool:
        """Whether to save and stop after ``global_step`` (every process at the same step)."""
        if self.multi:
            from jax.experimental import multihost_utils

            return multihost_utils.reached_preemption_sync_point(global_step)
        return self.received is not None

    def saving(self):
        """A context no signal interrupts (the save runs to its end)."""
        watch = self

        class _Saving:
            def __enter__(self):
                watch._saving = True

            def __exit__(self, *exc):
                watch._saving = False

        return _Saving()
