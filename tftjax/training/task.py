"""The TFT's part of the shared run loop (:func:`tftjax.runner.loop.run`): an epoch of jitted
steps with a progress bar and a per-step NaN check, validation, the epoch line and the
end-of-run summary with plots."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.config import ConfigError, TFTConfig, TrainConfig
from tftjax.data import Dataset
from tftjax.data.calendar import format_interval
from tftjax.models.compute import grn_kernel
from tftjax.models.remat import is_gpu
from tftjax.models.remat import plan as remat_plan
from tftjax.models.tft import init_variables
from tftjax.quant.tree import QUANT_FORMAT, layer_names, unmatched
from tftjax.runner.mesh import is_primary, make_parallel
from tftjax.training.epoch import RunningSums, StepTrace
from tftjax.training.evaluation import format_summary, summarize
from tftjax.training.optimizer import learning_rate
from tftjax.training.restore import OLD_QAT, Initial, quant_format, restore_without_observers
from tftjax.training.state import TrainState, abstract_train_state, create_train_state
from tftjax.training.trainer import Trainer, epoch_indices, steps_per_epoch


class TFTTask:
    """The TFT for :func:`tftjax.runner.loop.run`: an epoch of jitted steps, validation, summary."""

    kind, score, mode, epoch_bar = "tft", "val_loss", "min", False
    steps_within = True  # checkpoints within an epoch; a resume continues its batch order
    may_change = ("train.epochs", "train.accumulate", "model.execution")

    def __init__(
        self,
        cfg: TFTConfig,
        tc: TrainConfig,
        ds: Dataset,
        workdir: Path,
        *,
        progress: bool = True,
        profile_dir: str | None = None,
        init: Initial | None = None,
        log: Callable = print,
        par=None,
        plots: bool = True,
        lineage: list[dict] | None = None,
    ):
        self.cfg, self.tc, self.ds, self.log, self.init = cfg, tc, ds, log, init
        self.lineage = lineage
        # the mesh: all local devices unless told (one on a plain CPU); the batch is sharded
        # over it, the state replicated
        f = ds.features
        self.par = (par if par is not None else make_parallel()).for_features(
            sum(a.nbytes for a in (f.historical, f.known, f.target, f.future)) + f.target.nbytes
        )
        kernels = cfg.execution.describe_kernels()
        if kernels and self.par.size > 1:
            raise ConfigError(
                f"{kernels} runs on one device: the Pallas kernels are not "
                f"sharded over a mesh, and this run has {self.par.size} devices "
                "(give --devices 1)"
            )
        if cfg.quant.qat:
            shapes = jax.eval_shape(lambda k: init_variables(cfg, k), jax.random.key(0))
            if bad := unmatched(cfg.quant.qat_layers, shapes["params"]):
                raise ConfigError(
                    f"--qat-layers {' '.join(bad)} matches no layer; layers are "
                    "named like "
                    + ", ".join(layer_names(shapes["params"])[:4])
                    + ", … (tftjax.quant.tree.layer_names)"
                )
        if tc.ema > 0 and cfg.quant.qat:
            raise ConfigError(
                "--ema and --qat do not go together (the observers follow the "
                "raw weights, not their average)"
            )
        # --evals-per-epoch k: the loop's "epochs" are the k checks of every data epoch
        self.checks = tc.evals_per_epoch
        self.epochs, self.patience = tc.epochs * self.checks, tc.patience
        if self.checks > steps_per_epoch(tc, ds.splits.train.size):
            raise ConfigError(
                f"--evals-per-epoch {self.checks} exceeds the "
                f"{steps_per_epoch(tc, ds.splits.train.size)} steps of an epoch"
            )
        # epoch 0 is the anchor, or the --init-from weights: early stopping may keep it (not
        # under QAT: its observers need a training step before fake-quant can run); anchored,
        # ranking epochs on the validation P90 the anchor was chosen on, so the weights kept
        # are never worse there than it
        start = cfg.head.anchor != "none" or init is not None
        self.score_at_start = start and not cfg.quant.qat
        if tc.epochs == 0 and not self.score_at_start:
            raise ConfigError(
                "--epochs 0 keeps the --init-from weights as they are, scored on this "
                "data: give --init-from (a float model's; QAT's observers need a step)"
            )
        if cfg.head.anchor != "none":
            self.score = "val_q_risk_90"
        self.total_steps = steps_per_epoch(tc, ds.splits.train.size) * tc.epochs
        if tc.lr_schedule == "cosine":  # the schedule spans the run's epochs: they are fixed
            self.may_change = tuple(f for f in self.may_change if f != "train.epochs")
        self.progress, self.profile_dir, self.plots = progress, profile_dir, plots
        self.trainer = Trainer(cfg, tc, self.par.put_data(ds.features), par=self.par)
        self._identity = {
            "data": ds.identity(workdir),
            "model": cfg.to_json(),
            "train": tc.to_json(),
            **({"quant_format": QUANT_FORMAT} if cfg.quant.qat else {}),
        }
        # Dropout masks from the RBG generator: same quality for dropout, and
        # XLA:CPU compiles it much faster than threefry (17 s → 11 s, tiny preset).
        self.dropout_key = self.par.replicate(jax.random.key(tc.seed, impl="rbg"))
        self.compiled = False

    def identity(self) -> dict:
        return self._identity

    def extra_meta(self) -> dict:
        from tftjax.training.finetune import lineage

        return {**self.ds.stats_meta(), "lineage": self.lineage or lineage(None, self.ds, None)}

    def init_state(self) -> TrainState:
        state = create_train_state(
            self.cfg, self.tc, jax.random.key(self.tc.seed), self.total_steps
        )
        if self.init is not None:
            self.log(self.init.note)
            place = lambda new, old: np.asarray(new, old.dtype)
            state = state.replace(
                params=jax.tree.map(place, self.init.params, state.params),
                quant_stats=(
                    jax.tree.map(place, self.init.quant_stats, state.quant_stats)
                    if self.init.quant_stats
                    else state.quant_stats
                ),
            )
            if state.ema_params:  # --ema: the average starts at the loaded weights
                state = state.replace(ema_params=jax.tree.map(jnp.copy, state.params))
        # replicated over the mesh, as the train step returns it: one compile
        return self.par.replicate(state)

    def abstract_state(self):
        """Shapes, dtypes and the replicated sharding of this mesh: a checkpoint written on
        any number of devices restores onto this run's."""
        shapes = abstract_train_state(self.cfg, self.tc, self.total_steps)
        rep = self.par.replicated
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), shapes)

    def restore(self, checkpointer, epoch: int) -> TrainState:
        """The state of epoch checkpoint ``epoch``; a float run's checkpoint written before
        ``quant_stats`` existed restores with an empty one."""
        like = self.abstract_state()
        try:
            return checkpointer.restore(epoch, like)
        except Exception:
            if like.quant_stats:
                raise
            return restore_without_observers(lambda s: checkpointer.restore(epoch, s), like)

    @staticmethod
    def normalize_identity(identity: dict) -> dict:
        """A saved identity with the fields added since (at their defaults) filled in."""
        out = dict(identity)
        model = out.get("model", {})
        if model.get("qat") or model.get("quant", {}).get("qat"):
            if quant_format(out) < 2:
                raise ConfigError(
                    f"--resume: {OLD_QAT}; train another --workdir (--init-from "
                    "keeps its weights, with fresh observers)"
                )
            out["quant_format"] = quant_format(out)
        try:
            out["model"] = TFTConfig.from_json(identity["model"]).to_json()
            out["train"] = TrainConfig.from_json(identity["train"]).to_json()
        except (KeyError, TypeError, ConfigError):
            pass  # reported field by field by the comparison
        return out

    def describe(self, state) -> str:
        ds, note = self.ds, remat_plan(self.cfg.execution.remat).note
        pallas = self.cfg.execution.describe_kernels()
        if self.cfg.execution.pallas("grn") and not grn_kernel(self.cfg):
            note = (note + "\n" if note else "") + (
                f"note: the GRN kernels do not take hidden size {self.cfg.model.hidden} at "
                f"--precision {self.cfg.execution.precision} (tftjax.models.kernels.pallas_gated."
                "supported: a power of two of at least 16 whose two d x d weights fit 128 KB), "
                "or a QAT model: the GRNs and gates run in XLA"
            )
        if pallas and not is_gpu():
            note = (note + "\n" if note else "") + (
                f"note: {pallas} runs in Pallas' interpreter on "
                f"{jax.default_backend()}: the same numbers, many times slower (the kernels "
                "are for NVIDIA GPUs)"
            )
        n = sum(x.size for x in jax.tree.leaves(state.params))
        warn = "".join(f"warning: {w}\n" for w in ds.warnings)
        clocks = {}  # each series' own clock (one line when they agree)
        for x in ds.series:
            c = x.features.stats.clock
            text = (
                f"bar {format_interval(c.interval)}, calendar {c.calendar or 'none'}"
                + (" (weekdays)" if c.weekdays else "")
                + f", clock {c.zone or 'as stored'}"
            )
            clocks.setdefault(text, []).append(x.name)
        cal = "; " + (
            "; ".join(f"{', '.join(n)}: {t}" for t, n in clocks.items())
            if len(clocks) > 1
            else next(iter(clocks))
        )
        return (
            warn
            + (note + "\n" if note else "")
            + f"TFT {n:,} parameters"
            + (f" ({self.cfg.model.ensemble} members)" if self.cfg.model.ensemble > 1 else "")
            + f"; {ds.describe()}; windows "
            f"train {ds.splits.train.size:,} / val {ds.splits.val.size:,} / test "
            f"{ds.splits.test.size:,}{cal}; remat={self.cfg.execution.remat}, batch "
            f"{self.tc.batch_size}"
            + (
                f" as {self.tc.accumulate} accumulated micro-batches of "
                f"{self.tc.batch_size // self.tc.accumulate}"
                if self.tc.accumulate > 1
                else ""
            )
            + f"; {self.par.describe()}"
            + (
                f"; QAT (int8 fake-quant of {', '.join(self.cfg.quant.qat_layers)}"
                + (
                    f", observers frozen after {self.cfg.quant.qat_freeze_after} steps)"
                    if self.cfg.quant.qat_freeze_after is not None
                    else ")"
                )
                if self.cfg.quant.qat
                else ""
            )
        )

    def train_epoch(self, state: TrainState, epoch: int, within=None):
        """One pass over the training windows.

        The host reads the running loss of step ``i-1`` right after dispatching
        step ``i``: the device is never idle waiting for the host, every step's
        loss is checked for NaN/inf (a diverged run stops within its epoch), and
        the samples/s shown are of *completed* steps. The first step of the
        process includes the compile, timed apart.

        ``within`` (:class:`tftjax.runner.loop.Within`): a resumed epoch starts after its
        ``first`` steps, from the running sums saved then (the batch order is a function of
        the seed and the epoch, the dropout masks of the step: the same steps follow), and
        ``within.after`` is called after every step (a save, a signal).
        """
        data_epoch, part = divmod(epoch - 1, self.checks)
        idx = np.array_split(
            epoch_indices(self.tc, self.ds.splits.train, data_epoch + 1), self.checks
        )[part]  # this check's share of the data epoch
        first = within.first if within is not None else 0
        books = RunningSums(epoch, idx, self._bar(len(idx), epoch), within)
        profile = StepTrace(self.profile_dir if epoch == 1 else None, len(idx))
        t0, compile_s = time.perf_counter(), None
        try:
            for i, b in enumerate(idx[first:], start=first):
                profile.before(i)
                state, m = self.trainer.train_step(state, b, self.dropout_key)
                if not self.compiled:  # the call returns once compiled and dispatched
                    compile_s, self.compiled = time.perf_counter() - t0, True
                    t0 = books.t0 = time.perf_counter()
                books.add(i, m)
                if within is not None:
                    within.after(state, i + 1, books.sums)
                profile.after(i, state)
            total = books.settle_last()
        finally:
            profile.stop()
            books.close()
        elapsed = time.perf_counter() - t0
        valid = books.valid
        out = {
            "train_loss": total / max(int(valid.sum()), 1),
            "data_epoch": epoch / self.checks,
            "samples_per_s": int(valid[first:].sum()) / elapsed,  # this process's steps
            "epoch_time_s": elapsed,
            "steps": int(len(idx)),
            "grad_norm": float(books.grad_norm) / max(len(idx), 1),
            "learning_rate": learning_rate(
                self.tc,
                self.total_steps,  # members share it
                int(np.ravel(jax.device_get(state.step))[0]),
            ),
        }
        if compile_s is not None:
            out["compile_s"] = compile_s
        return state, out

    def _bar(self, total: int, epoch: int):
        if not self.progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(
            total=total,
            desc=f"epoch {epoch}",
            unit="step",
            leave=False,
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def rank(self, history: list[dict]) -> float:
        """The score early stopping ranks a check by: the mean of the last ``--smooth``
        checks' scores (epoch 0's too)."""
        scores = [h[self.score] for h in history if h.get(self.score) is not None]
        return float(np.mean(scores[-self.tc.smooth :]))

    def validate(self, state: TrainState) -> dict:
        if self.ds.splits.val.size == 0:
            return {"val_loss": None}
        val = self.trainer.evaluate(state.variables(), self.ds.splits.val)
        return {
            "val_loss": val["loss"],
            "val_q_risk_50": val["q_risk_50"],
            "val_q_risk_90": val["q_risk_90"],
            "val_coverage_80": val["coverage_80"],
        }

    @staticmethod
    def epoch_line(m: dict) -> str:
        val = (
            "no validation windows"
            if m["val_loss"] is None
            else f"val loss {m['val_loss']:.4f}  q-risk P50 {m['val_q_risk_50']:.4f} "
            f"P90 {m['val_q_risk_90']:.4f}"
        )
        part = m.get("data_epoch", m["epoch"])
        part = f"[{part:.2f} data epochs] " if part != m["epoch"] else ""
        return (
            part + f"train loss {m['train_loss']:.4f}  {val}  {m['samples_per_s']:.1f} samples/s "
            f"({m['epoch_time_s']:.1f} s"
            + (f"; train step compiled in {m['compile_s']:.1f} s)" if "compile_s" in m else ")")
        )

    def summarize(self, state: TrainState, workdir: Path, history: list[dict]):
        summary = summarize(self.trainer, state.variables(), self.ds, self.cfg)
        summary["parameters"] = sum(x.size for x in jax.tree.leaves(state.params))
        if self.init is not None:
            summary["init_from"] = self.init.source
        try:
            from tftjax import plots

            if self.plots:
                plots.training_plots(
                    workdir,
                    history,
                    self.trainer,
                    state.variables(),
                    self.ds,
                    self.cfg,
                    write=is_primary(),
                )
        except Exception as e:  # plots must never lose a finished run
            self.log(f"warning: plots not written ({type(e).__name__}: {e})")
        return summary, format_summary(summary)
