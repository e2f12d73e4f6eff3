"""The books of one training epoch's steps (:meth:`tftjax.training.task.TFTTask.train_epoch`):
running sums on device, each step's loss checked on the host one step behind, the progress
bar, and the profiler's window of steps."""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.errors import TrainingDiverged


class RunningSums:
    """The epoch's loss and gradient-norm sums (float32, on device) and the step settled last.

    The host reads the running loss of step ``i-1`` right after dispatching step ``i``
    (:meth:`add`): the device is never idle waiting for the host, every step's loss is
    checked for NaN/inf, and the samples/s shown are of *completed* steps. A resumed epoch
    (``within.sums``) starts from the sums saved with its checkpoint: float32 values, which a
    JSON float holds exactly, so the sums that follow are the uninterrupted run's."""

    def __init__(self, epoch: int, idx: np.ndarray, bar, within=None):
        self.epoch, self.bar = epoch, bar
        self.valid = (idx >= 0).sum(axis=1)  # windows per step (the last batch is padded)
        self.loss_sum, self.grad_norm = jnp.zeros(()), jnp.zeros(())
        if within is not None and within.sums is not None:
            self.loss_sum = jnp.asarray(within.sums["loss_sum"], jnp.float32)
            self.grad_norm = jnp.asarray(within.sums["grad_norm"], jnp.float32)
        if bar is not None and within is not None and within.first:
            bar.update(within.first)
        self.pending: tuple[int, Any] | None = None
        self.done, self.t0 = 0, time.perf_counter()

    def add(self, i: int, m: dict) -> None:
        """Step ``i``'s metrics (dispatched); step ``i-1`` settled."""
        self.loss_sum = self.loss_sum + m["loss"] * m["count"]
        self.grad_norm = self.grad_norm + m["grad_norm"]
        if self.pending is not None:
            self._settle(*self.pending)
        self.pending = (i, self.loss_sum)

    def sums(self) -> dict:
        """The sums after the step dispatched last (waits for it): what a checkpoint within
        the epoch saves."""
        loss, grad_norm = float(self.loss_sum), float(self.grad_norm)
        if not (np.isfinite(loss) and np.isfinite(grad_norm)):  # never a diverged state saved
            raise TrainingDiverged(
                f"training loss became {loss} (gradient norm {grad_norm}) in epoch {self.epoch}"
            )
        return {"loss_sum": loss, "grad_norm": grad_norm}

    def settle_last(self) -> float:
        """The last step settled: the epoch's loss sum (a resumed epoch saved after its last
        step runs none: its restored sum)."""
        if self.pending is None:
            return float(self.loss_sum)
        return self._settle(*self.pending)

    def _settle(self, i: int, running_loss) -> float:
        loss = float(running_loss)  # waits for step i
        self.done += int(self.valid[i])
        if not np.isfinite(loss):
            raise TrainingDiverged(
                f"training loss became {loss} at step {i + 1} of epoch {self.epoch}"
            )
        if self.bar is not None:
            rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
            self.bar.update(1)
            self.bar.set_postfix(
                loss=f"{loss / max(self.valid[: i + 1].sum(), 1):.4f}", samples_s=f"{rate:.1f}"
            )
        return loss

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class StepTrace:
    """A ``jax.profiler`` trace of steps 2-6 (``--profile``) into ``directory`` (None: none)."""

    def __init__(self, directory: str | None, steps: int):
        self.directory, self.last = directory, min(5, steps - 1)
        self.on = False

    def before(self, i: int) -> None:
        if self.directory and i == 1:
            jax.profiler.start_trace(self.directory)
            self.on = True

    def after(self, i: int, state) -> None:
        if self.on and i == self.last:
            jax.block_until_ready(state)
            self.stop()

    def stop(self) -> None:
        if self.on:
            jax.profiler.stop_trace()
            self.on = False
