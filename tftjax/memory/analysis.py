"""XLA's compiled memory analysis of the TFT's train and eval steps.

Compilation needs no arrays: the steps are lowered against ``jax.ShapeDtypeStruct``s, so
batch sizes far beyond this machine's memory can be analysed without allocating them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc

import jax
import jax.numpy as jnp

from tftjax.config import TFTConfig, TrainConfig
from tftjax.data import DeviceData
from tftjax.training import make_eval_step, make_train_step
from tftjax.training.state import abstract_train_state

GB = 10**9


@dataclasses.dataclass(frozen=True)
class Compiled:
    tier: str
    batch_size: int
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int
    host_temp_bytes: int = 0
    """Temporaries XLA placed in host memory (the ``offload`` tier's residuals on GPU/TPU)."""
    accumulate: int = 1
    """Micro-batches per step (``--accumulate``): the batch runs as K of ``batch / K``."""

    @property
    def total_bytes(self) -> int:
        """Device bytes the step needs: arguments + temporaries + outputs not aliased
        onto donated arguments."""
        return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes


_TARGET: list = [None]  # (name, compile-only device) while compiling for a GPU target


@contextlib.contextmanager
def for_target(name: str | None):
    """Inside this block the steps are compiled (for their memory analysis only) for GPU
    ``name`` (tftjax.memory.targets: no GPU needed, the CUDA plugin is), or for this
    process's default device when ``name`` is None."""
    if name is None:
        yield
        return
    from tftjax.memory.targets import compile_only_device

    was, _TARGET[0] = _TARGET[0], (name, compile_only_device(name))
    # a compile-only device's executables cannot be written to or read from the persistent
    # compilation cache (JAX warns at each step and compiles anyway): off inside the block
    cache = flag("jax_enable_compilation_cache")
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        _TARGET[0] = was
        jax.config.update("jax_enable_compilation_cache", cache)


def flag(name: str):
    """A JAX flag's current value. ``jax.config.read`` refuses flags that have a context
    manager (``jax_enable_compilation_cache``: AttributeError in jax 0.10), and attribute
    access misses those without one (``jax_disable_most_optimizations``); ``values`` holds
    both."""
    return jax.config.values[name]


def targeting() -> bool:
    """Whether the steps are compiled for a GPU target now (inside :func:`for_target`)."""
    return _TARGET[0] is not None


def target_name() -> str:
    """What the steps are compiled for now: a GPU target's name, or the default backend."""
    return _TARGET[0][0] if _TARGET[0] is not None else jax.default_backend()


def _targeted(cfg: TFTConfig) -> TFTConfig:
    """``cfg`` with the remat plan of the target's platform (a GPU's differs, tftjax.models.remat)."""
    return cfg if _TARGET[0] is None else cfg.override(platform="gpu")


def _placed(tree):
    """``tree``'s ShapeDtypeStructs on the target device (unchanged without a target)."""
    if _TARGET[0] is None:
        return tree
    s = jax.sharding.SingleDeviceSharding(_TARGET[0][1])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree)


def abstract_inputs(cfg: TFTConfig, batch_size: int, rows: int, tc: TrainConfig = TrainConfig()):
    """Shape-only (state, data, batch_idx, key) of the train step (on the GPU target inside
    :func:`for_target`)."""
    state = abstract_train_state(cfg, tc)
    f32 = jnp.float32
    data = DeviceData._make(
        (  # a pytree of shapes
            jax.ShapeDtypeStruct((rows, cfg.model.num_historical), f32),
            jax.ShapeDtypeStruct((rows, cfg.model.num_known), f32),
            jax.ShapeDtypeStruct((rows, cfg.data.decoder_steps), f32),
            jax.ShapeDtypeStruct((rows, cfg.model.num_static), f32),
            jax.ShapeDtypeStruct((rows, cfg.data.decoder_steps, cfg.model.num_known), f32),
            jax.ShapeDtypeStruct((rows,), f32),
            *(
                (
                    jax.ShapeDtypeStruct((rows, cfg.data.decoder_steps), f32),
                    jax.ShapeDtypeStruct((rows, len(cfg.head.quantiles)), f32),
                )
                if cfg.head.anchor != "none"
                else (jax.ShapeDtypeStruct((rows, 0), f32),) * 2
            ),
            jax.ShapeDtypeStruct((rows,), jnp.int32),
        )
    )
    idx = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
    key = jax.eval_shape(lambda: jax.random.key(0, impl="rbg"))
    return _placed((state, data, idx, key))


@contextlib.contextmanager
def analysis_only():
    """Compile inside this block for the memory analysis only, with XLA's
    ``jax_disable_most_optimizations`` (LLVM at -O0, no expensive passes). The buffer
    assignment is made on the HLO, before the back end's LLVM work, so the analysis is the
    optimised program's (checked: tests/memory/test_memory.py compares the two) and the compile
    takes about half the time. (A JAX flag read at each compile: not for threads compiling
    programs to run meanwhile.)"""
    if _TARGET[0] is not None:  # checked on XLA:CPU only: a GPU target compiles as it would run
        yield
        return
    was = flag("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", was)


def compile_step(
    cfg: TFTConfig, batch_size: int, rows: int, accumulate: int = 1, *, to_run: bool = True
):
    """The compiled train step of ``cfg`` at ``batch_size`` (no arrays allocated), as
    ``accumulate`` micro-batches of ``batch_size / accumulate``; ``to_run=False``: compiled
    for its memory analysis only (:func:`analysis_only`)."""
    cfg = _targeted(cfg)
    lowered = make_train_step(cfg, accumulate=accumulate).lower(
        *abstract_inputs(cfg, batch_size, rows)
    )
    with contextlib.nullcontext() if to_run else analysis_only():
        return lowered.compile()


def release_executables() -> None:
    """Free compiled executables that JAX's caches keep alive.

    On XLA:CPU each TFT-225 executable holds about 2,000 memory mappings of
    JIT-compiled code until the caches are cleared; a sweep of a few dozen
    compiles would pass Linux's default 65,530 mappings and fail with "LLVM
    compilation error: Cannot allocate memory"."""
    gc.collect()
    jax.clear_caches()


_ANALYSED: dict[tuple, Compiled] = {}


def analyse(
    cfg: TFTConfig, batch_size: int, rows: int, compiled=None, accumulate: int = 1
) -> Compiled:
    """XLA's memory analysis of the train step of ``cfg`` at ``batch_size`` (of ``compiled``
    when given). Compiled plans are deterministic: each point is compiled once per process
    (the planner and the report ask again for points they have seen)."""
    key = (cfg, batch_size, rows, accumulate, target_name())
    if compiled is None and key in _ANALYSED:
        return _ANALYSED[key]
    c = (
        compiled
        if compiled is not None
        else compile_step(cfg, batch_size, rows, accumulate, to_run=False)
    )
    m = c.memory_analysis()
    out = Compiled(
        cfg.execution.remat,
        batch_size,
        int(m.argument_size_in_bytes),
        int(m.output_size_in_bytes),
        int(m.alias_size_in_bytes),
        int(m.temp_size_in_bytes),
        int(m.generated_code_size_in_bytes),
        int(getattr(m, "host_temp_size_in_bytes", 0) or 0),
        accumulate,
    )
    if compiled is None:
        del c
        release_executables()
    _ANALYSED[key] = out
    return out


def compile_eval_step(cfg: TFTConfig, batch_size: int, rows: int, *, to_run: bool = True):
    cfg = _targeted(cfg)
    state, data, _, _ = abstract_inputs(cfg, batch_size, rows)
    idx = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
    # the variables the trainer evaluates with (observers too for a QAT model)
    variables = {
        "params": state.params,
        **({"quant_stats": state.quant_stats} if state.quant_stats else {}),
    }
    lowered = make_eval_step(cfg).lower(variables, data, _placed(idx))
    with contextlib.nullcontext() if to_run else analysis_only():
        return lowered.compile()


def analyse_eval(cfg: TFTConfig, batch_size: int, rows: int) -> Compiled:
    return analyse(
        cfg, batch_size, rows, compiled=compile_eval_step(cfg, batch_size, rows, to_run=False)
    )


def min_bytes(cfg: TFTConfig, batch_size: int, rows: int) -> int:
    """Bytes of the step's arguments (state, data, indices): a floor no tier can go under."""
    state, data, idx, _ = abstract_inputs(cfg, batch_size, rows)
    if not cfg.head.vol_target:  # jit drops the unused window-scale argument
        data = data._replace(scale=None)
    if not cfg.model.instruments:  # and the instrument indices of a model without a vocabulary
        data = data._replace(instrument=None)
    leaves = jax.tree.leaves((state, data, idx))
    return int(sum(x.size * x.dtype.itemsize for x in leaves))
