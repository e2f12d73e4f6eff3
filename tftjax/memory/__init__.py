"""Memory you can see: XLA's compiled memory analysis per remat tier and batch size.

The library behind ``python -m tftjax.memory`` (:mod:`tftjax.memory.__main__`)
and ``--remat auto``.

``python -m tftjax.memory --preset tft225 --tiers off,minimal,aggressive,full
--batch-sizes 1,8,64,256 --out DIR`` compiles the real jitted train step for
each tier and batch size and reports XLA's argument, output, temp and
generated-code bytes, the measured step time and its ratio to ``off``, the
largest batch that fits 4, 12, 24, 48, 80 and 141 GB (a linear fit of bytes
against batch size; ``--verify`` checks it by compiling, bisecting in both
directions from the fit's guess), and writes
a ``jax.profiler`` device memory profile (pprof ``.prof``) per tier. On a GPU
it also records ``device.memory_stats()`` peaks next to the prediction.

Compilation needs no arrays: the step is lowered against
``jax.ShapeDtypeStruct``s, so batch sizes far beyond this machine's memory
can be analysed (and planned for) without allocating them.
"""

from __future__ import annotations

from tftjax.memory.analysis import (
    GB,
    Compiled,
    abstract_inputs,
    analyse,
    analyse_eval,
    compile_eval_step,
    compile_step,
    for_target,
    min_bytes,
    release_executables,
)
from tftjax.memory.planning import (
    HEADROOM,
    fit_linear,
    largest_batch,
    parse_bytes,
    plan_auto,
    resolve_auto,
)
from tftjax.memory.report import BUDGETS_GB, report, time_step
from tftjax.runner.devices import device_limit

__all__ = [
    "BUDGETS_GB",
    "GB",
    "HEADROOM",
    "Compiled",
    "abstract_inputs",
    "analyse",
    "analyse_eval",
    "compile_eval_step",
    "compile_step",
    "device_limit",
    "fit_linear",
    "for_target",
    "largest_batch",
    "min_bytes",
    "parse_bytes",
    "plan_auto",
    "release_executables",
    "resolve_auto",
    "report",
    "time_step",
]
