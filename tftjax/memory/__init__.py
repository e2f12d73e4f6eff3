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

import dataclasses
import gc
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tftjax import remat
from tftjax.config import ConfigError, TFTConfig, TrainConfig
from tftjax.data import DeviceData
from tftjax.train_lib import create_train_state, make_train_step

GB = 10**9
BUDGETS_GB = (4, 12, 24, 48, 80, 141)


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


def abstract_inputs(cfg: TFTConfig, batch_size: int, rows: int, tc: TrainConfig = TrainConfig()):
    """Shape-only (state, data, batch_idx, key) of the train step."""
    state = jax.eval_shape(lambda k: create_train_state(cfg, tc, k), jax.random.key(0))
    f32 = jnp.float32
    data = DeviceData(jax.ShapeDtypeStruct((rows, cfg.num_historical), f32),
                      jax.ShapeDtypeStruct((rows, cfg.num_known), f32),
                      jax.ShapeDtypeStruct((rows,), f32),
                      jax.ShapeDtypeStruct((cfg.num_static,), f32),
                      jax.ShapeDtypeStruct((rows, cfg.decoder_steps, cfg.num_known), f32),
                      jax.ShapeDtypeStruct((rows,), f32))
    idx = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
    key = jax.eval_shape(lambda: jax.random.key(0, impl="rbg"))
    return state, data, idx, key


def compile_step(cfg: TFTConfig, batch_size: int, rows: int, accumulate: int = 1):
    """The compiled train step of ``cfg`` at ``batch_size`` (no arrays allocated), as
    ``accumulate`` micro-batches of ``batch_size / accumulate``."""
    return make_train_step(cfg, accumulate=accumulate).lower(
        *abstract_inputs(cfg, batch_size, rows)).compile()


def release_executables() -> None:
    """Free compiled executables that JAX's caches keep alive.

    On XLA:CPU each TFT-225 executable holds about 2,000 memory mappings of
    JIT-compiled code until the caches are cleared; a sweep of a few dozen
    compiles would pass Linux's default 65,530 mappings and fail with "LLVM
    compilation error: Cannot allocate memory"."""
    gc.collect()
    jax.clear_caches()


def analyse(cfg: TFTConfig, batch_size: int, rows: int, compiled=None,
            accumulate: int = 1) -> Compiled:
    c = compiled if compiled is not None else compile_step(cfg, batch_size, rows, accumulate)
    m = c.memory_analysis()
    out = Compiled(cfg.remat, batch_size, int(m.argument_size_in_bytes),
                   int(m.output_size_in_bytes), int(m.alias_size_in_bytes),
                   int(m.temp_size_in_bytes), int(m.generated_code_size_in_bytes),
                   int(getattr(m, "host_temp_size_in_bytes", 0) or 0), accumulate)
    if compiled is None:
        del c
        release_executables()
    return out


def fit_linear(points: list[Compiled]) -> tuple[float, float]:
    """``total_bytes ≈ a + b · batch`` by least squares over the measured batch sizes."""
    x = np.array([p.batch_size for p in points], float)
    y = np.array([p.total_bytes for p in points], float)
    if len(points) == 1:
        return 0.0, float(y[0] / x[0])
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def largest_batch(cfg: TFTConfig, budget_bytes: float, fit: tuple[float, float], rows: int,
                  verify: bool = True, max_batch: int = 1 << 16, rel_tol: float = 0.02,
                  log=None) -> tuple[int, Compiled | None]:
    """Largest batch whose compiled step fits ``budget_bytes``.

    From the linear fit alone (``verify=False``: no compile), or checked by compiling:
    from the fit's guess, step up or down by 25% until the fit boundary is bracketed,
    then bisect to within ``rel_tol`` (a few compiles instead of a walk).
    """
    a, b = fit
    guess = int(min(max((budget_bytes - a) // max(b, 1.0), 0), max_batch))
    if not verify:
        return guess, None
    tried: dict[int, Compiled] = {}

    def fits(n: int) -> bool:
        if n not in tried:
            tried[n] = analyse(cfg, n, rows)
            if log:
                log(f"  {cfg.remat} batch {n}: {tried[n].total_bytes / GB:.2f} GB")
        return tried[n].total_bytes <= budget_bytes

    lo, hi = 0, max_batch + 1  # lo fits (0: nothing), hi does not
    n = max(guess, 1)
    if fits(n):
        lo = n
        while lo < max_batch:
            n = min(max(lo + 1, int(lo * 1.25)), max_batch)
            if not fits(n):
                hi = n
                break
            lo = n
    else:
        hi = n
        while hi > 1:
            n = max(int(hi / 1.25), 1) if hi > 4 else hi - 1
            if fits(n):
                lo = n
                break
            hi = n
    while hi - lo > max(1, int(lo * rel_tol)) and hi <= max_batch:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried.get(lo)


HEADROOM = 0.9
"""Share of the device's ``bytes_limit`` that ``--remat auto`` plans for."""


def device_limit(device=None) -> int | None:
    """The bytes JAX may allocate on ``device`` (``memory_stats()["bytes_limit"]``: the
    preallocated fraction on a GPU), or None where the backend does not say (CPU)."""
    device = device or jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without the API
        return None
    return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


def compile_eval_step(cfg: TFTConfig, batch_size: int, rows: int):
    from tftjax.train_lib import make_eval_step

    state, data, _, _ = abstract_inputs(cfg, batch_size, rows)
    idx = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
    # the variables the trainer evaluates with (observers too for a QAT model)
    variables = {"params": state.params, **({"quant_stats": state.quant_stats}
                                            if state.quant_stats else {})}
    return make_eval_step(cfg).lower(variables, data, idx).compile()


def analyse_eval(cfg: TFTConfig, batch_size: int, rows: int) -> Compiled:
    return analyse(cfg, batch_size, rows, compiled=compile_eval_step(cfg, batch_size, rows))


def plan_auto(cfg: TFTConfig, budget_bytes: float | None, batch_size: int, rows: int,
              log=print, grow_batch: bool = True, eval_batch_size: int | None = None,
              backend: str | None = None, accumulate: int = 1,
              max_accumulate: int = 64, rel_tol: float = 0.02) -> tuple[str, int, int]:
    """``--remat auto``: three knobs, the remat tier, gradient accumulation and the batch.

    The batch first runs whole (``accumulate`` micro-batches), the tiers tried fastest first
    by modelled step time (:data:`tftjax.remat.STEP_TIME`; ties: the smaller tier); where
    none fits, as 2×, 4×, … as many micro-batches (up to ``max_accumulate``): accumulation
    keeps the update of the whole batch at the memory of one micro-batch, but small
    micro-batches use an accelerator poorly, so a rematerialising tier comes first. The first
    fit is the choice (a slower tier is never compiled: it cannot help). With ``grow_batch`` and no accumulation needed,
    the batch then grows to the largest that fits, checked by compiling. The budget is
    ``budget_bytes`` capped at :data:`HEADROOM` of the device's real limit (or that limit when
    ``budget_bytes`` is None). The eval step at ``eval_batch_size`` must fit too.
    ``rel_tol``: how close the grown batch is bisected to the largest that fits.

    Returns:
      ``(tier, batch_size, accumulate)``.

    Raises:
      ConfigError: no budget known, or nothing fits at ``batch_size``.
    """
    limit = device_limit()
    if limit is not None and (budget_bytes is None or HEADROOM * limit < budget_bytes):
        log(f"auto: planning for {HEADROOM:.0%} of the device's limit of {limit / GB:.2f} GB"
            + (f" (below --memory-budget {budget_bytes / GB:.2f} GB)" if budget_bytes else ""))
        budget_bytes = HEADROOM * limit
    if budget_bytes is None:
        raise ConfigError("--remat auto needs --memory-budget on a device that does not report "
                          "its memory limit (e.g. --memory-budget 24GB)")
    floor = min_bytes(cfg, batch_size, rows)
    if budget_bytes < floor:
        raise ConfigError(f"no remat tier fits {budget_bytes / GB:.2f} GB: parameters, optimizer "
                         f"state and data alone take {floor / GB:.2f} GB")
    choice, k = None, accumulate
    tiers = sorted(remat.ORDER, key=lambda t: (remat.step_time(t, backend),
                                               -remat.ORDER.index(t)))
    while choice is None and k <= max_accumulate and batch_size % k == 0:
        for t in tiers:
            at = analyse(dataclasses.replace(cfg, remat=t), batch_size, rows, accumulate=k)
            fits = at.total_bytes <= budget_bytes
            log(f"auto: {t:10s} batch {batch_size}"
                + (f" as {k} micro-batches of {batch_size // k}" if k > 1 else "")
                + f": {at.total_bytes / GB:7.2f} GB, modelled time "
                f"{remat.step_time(t, backend):.2f}× off: {'fits' if fits else 'does not fit'} "
                f"{budget_bytes / GB:.2f} GB")
            if fits:
                choice = (t, k, at)
                break
        k *= 2
    if choice is None:
        raise ConfigError(f"no remat tier fits {budget_bytes / GB:.2f} GB at batch {batch_size}, "
                          f"even as {max(k // 2, accumulate)} accumulated micro-batches; lower "
                          "--batch-size or raise --memory-budget")
    tier, k, at = choice
    c = dataclasses.replace(cfg, remat=tier)
    if eval_batch_size:
        ev = analyse_eval(c, eval_batch_size, rows)
        if ev.total_bytes > budget_bytes:
            raise ConfigError(f"the eval step at --eval-batch-size {eval_batch_size} needs "
                              f"{ev.total_bytes / GB:.2f} GB, over {budget_bytes / GB:.2f} GB; "
                              "lower --eval-batch-size")
        log(f"auto: the eval step at batch {eval_batch_size} needs {ev.total_bytes / GB:.2f} GB: fits")
    acc = f" as {k} accumulated micro-batches of {batch_size // k}" if k > 1 else ""
    if not grow_batch or k > 1:
        log(f"auto: chose remat={tier} (least modelled step time among the tiers that fit) "
            f"at batch {batch_size}{acc}")
        return tier, batch_size, k
    small = analyse(c, max(1, batch_size // 2), rows)
    best, _ = largest_batch(c, budget_bytes, fit_linear([small, at]), rows,
                            max_batch=max(batch_size, rows), rel_tol=rel_tol)
    best = max(best, batch_size)
    log(f"auto: chose remat={tier} (least modelled step time among the tiers that fit) and "
        f"batch {best} (the largest that fits, checked by compiling it)")
    return tier, best, 1


def min_bytes(cfg: TFTConfig, batch_size: int, rows: int) -> int:
    """Bytes of the step's arguments (state, data, indices): a floor no tier can go under."""
    state, data, idx, _ = abstract_inputs(cfg, batch_size, rows)
    if not cfg.vol_target:  # jit drops the unused window-scale argument
        data = data._replace(scale=None)
    leaves = jax.tree.leaves((state, data, idx))
    return int(sum(x.size * x.dtype.itemsize for x in leaves))


def parse_bytes(text: str) -> float:
    """'24GB', '512MiB', '1.5e9' → bytes."""
    t = text.strip().upper().replace(" ", "")
    units = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
             "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "B": 1}
    for u, mult in units.items():
        if t.endswith(u):
            return float(t[: -len(u)]) * mult
    return float(t)


def time_step(cfg: TFTConfig, batch_size: int, data, starts: np.ndarray, steps: int = 3,
              compiled=None, accumulate: int = 1):
    """Median measured step time (real arrays) and the compiled executable.

    ``compiled`` may be the executable from :func:`compile_step` (same shapes):
    the analysed program is exactly the one timed, compiled once.
    """
    tc = TrainConfig(batch_size=batch_size, accumulate=accumulate)
    state = create_train_state(cfg, tc, jax.random.key(0))
    key = jax.random.key(1, impl="rbg")
    rng = np.random.default_rng(0)
    idx = [jnp.asarray(rng.choice(starts, batch_size)) for _ in range(steps + 1)]
    if compiled is None:
        compiled = make_train_step(cfg, accumulate=accumulate).lower(state, data, idx[0],
                                                                     key).compile()
    state, m = compiled(state, data, idx[0], key)
    jax.block_until_ready(m)
    times = []
    for b in idx[1:]:
        t0 = time.perf_counter()
        state, m = compiled(state, data, b, key)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), compiled, state


def report(cfg: TFTConfig, tiers: list[str], batch_sizes: list[int], out: Path,
           budgets_gb=BUDGETS_GB, steps: int = 3, time_limit_bytes: float | None = None,
           verify: bool = False, log=print, parquet_file=None,
           isolate: bool | None = None, accumulate=(1,)) -> list[dict]:
    """Measure, print and write ``memory.json``, ``memory.png`` and ``.prof`` files.

    The data arrays have the rows of ``parquet_file`` (default: the bundled ES bars).
    ``steps=0`` compiles and analyses without running steps. ``isolate`` (default: on a
    device that reports memory statistics, i.e. not on CPU) times every point in its own
    process, so that each point's ``peak_bytes_in_use`` is its own: JAX has no way to
    reset a device's peak, and in one process every later point would report the
    largest peak so far. ``accumulate``: each batch size also as K micro-batches for each K
    given that divides it (``--accumulate 1,4``); the batch plan fits the first K's points."""
    from tftjax.data import load_dataset, to_device

    out.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(parquet_file, cfg.data)
    data = to_device(ds.features)
    rows = len(ds.features)
    dev = jax.devices()[0]
    budget_for_timing = time_limit_bytes or _host_budget()
    if isolate is None:
        isolate = device_limit(dev) is not None
    records, fits = [], {}
    for tier in tiers:
        c = dataclasses.replace(cfg, remat=tier)
        note = remat.plan(tier).note
        if note:
            log(note)
        points = []
        for b, k in [(b, k) for b in batch_sizes for k in accumulate if b % k == 0]:
            compiled = compile_step(c, b, rows, k)
            a = analyse(c, b, rows, compiled=compiled, accumulate=k)
            if k == accumulate[0]:
                points.append(a)
            rec = {"tier": tier, **{k: v for k, v in dataclasses.asdict(a).items() if k != "tier"},
                   "total_bytes": a.total_bytes, "step_time_s": None, "device": dev.device_kind}
            if steps > 0 and isolate:
                del compiled
                rec.update(_point_in_subprocess(c, b, steps, out, parquet_file, k))
                release_executables()
                records.append(rec)
                continue
            if steps > 0 and a.total_bytes <= budget_for_timing:
                t, compiled, state = time_step(c, b, data, ds.splits.train, steps, compiled, k)
                rec["step_time_s"] = t
                stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
                if stats:
                    rec["peak_bytes_in_use"] = int(stats.get("peak_bytes_in_use", 0))
                # Live device buffers right after a step (pprof; `pprof -http` or XProf).
                jax.profiler.save_device_memory_profile(
                    str(out / f"memory_{tier}_b{b}{f'_k{k}' if k > 1 else ''}.prof"))
                del state
            del compiled
            release_executables()
            records.append(rec)
        fits[tier] = fit_linear(points) if points else (0.0, 0.0)
    off_time = {(r["batch_size"], r["accumulate"]): r["step_time_s"] for r in records
                if r["tier"] == tiers[0]}
    for r in records:
        base = off_time.get((r["batch_size"], r["accumulate"]))
        r["time_ratio_to_" + tiers[0]] = (r["step_time_s"] / base
                                         if r["step_time_s"] and base else None)
    plan_rows = []
    for tier in tiers:
        c = dataclasses.replace(cfg, remat=tier)
        for g in budgets_gb:
            bmax, checked = largest_batch(c, g * GB, fits[tier], rows, verify=verify,
                                          max_batch=1 << 20)
            plan_rows.append({"tier": tier, "budget_gb": g, "max_batch": bmax,
                              "checked_total_bytes": checked.total_bytes if checked else None})
    (out / "memory.json").write_text(json.dumps(records, indent=2))
    (out / "batch_plan.json").write_text(json.dumps({"fits": fits, "plan": plan_rows}, indent=2))
    log(format_table(records, tiers[0]))
    log(format_plan(plan_rows, tiers, budgets_gb))
    plot(records, fits, out / "memory.png", tiers)
    return records


def _point_in_subprocess(cfg: TFTConfig, batch_size: int, steps: int, out: Path,
                         parquet_file, accumulate: int = 1) -> dict:
    """Step time and device peak of one point, measured by a fresh process."""
    import subprocess
    import sys

    where = out / f"point_{cfg.remat}_b{batch_size}_k{accumulate}"
    where.mkdir(parents=True, exist_ok=True)
    (where / "config.json").write_text(json.dumps(cfg.to_json()))
    cmd = [sys.executable, "-m", "tftjax.memory", "--point-config", str(where / "config.json"),
           "--tiers", cfg.remat, "--batch-sizes", str(batch_size), "--steps", str(steps),
           "--budgets", "", "--no-isolate", "--accumulate", str(accumulate), "--out", str(where)]
    if parquet_file is not None:
        cmd += ["--parquet-file", str(parquet_file)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"step_time_s": None, "isolated_error": (p.stderr or p.stdout)[-400:]}
    rec = json.loads((where / "memory.json").read_text())[0]
    for prof in where.glob("*.prof"):
        prof.replace(out / prof.name)
    return {k: rec[k] for k in ("step_time_s", "peak_bytes_in_use") if k in rec} | {
        "isolated": True}


def _host_budget() -> float:
    try:
        import os

        return 0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * GB


def format_table(records: list[dict], base: str) -> str:
    lines = [f"| tier | batch | micro-batches | argument | output | temp | host temp | code | "
             f"step time | vs {base} |", "|---|---|---|---|---|---|---|---|---|---|"]
    mib = lambda x: f"{x / 2**20:,.0f} MiB"  # noqa: E731
    for r in records:
        t = f"{r['step_time_s']:.2f} s" if r["step_time_s"] else "not run"
        ratio = r.get(f"time_ratio_to_{base}")
        k = r.get("accumulate", 1)
        micro = f"{k} × {r['batch_size'] // k}" if k > 1 else "1"
        lines.append(f"| {r['tier']} | {r['batch_size']} | {micro} | "
                     f"{mib(r['argument_bytes'])} | "
                     f"{mib(r['output_bytes'])} | {mib(r['temp_bytes'])} | "
                     f"{mib(r.get('host_temp_bytes', 0))} | "
                     f"{r['generated_code_bytes'] / 2**10:,.0f} KiB | {t} | "
                     f"{f'{ratio:.2f}×' if ratio else '–'} |")
    return "\n".join(lines)


def format_plan(rows: list[dict], tiers, budgets) -> str:
    if not rows:
        return "largest batch per budget: needs two or more --batch-sizes to fit bytes against batch"
    lines = ["| tier | " + " | ".join(f"{g} GB" for g in budgets) + " |",
             "|---|" + "---|" * len(budgets)]
    for tier in tiers:
        cells = [str(r["max_batch"]) for r in rows if r["tier"] == tier]
        lines.append(f"| {tier} | " + " | ".join(cells) + " |")
    checked = any(r["checked_total_bytes"] is not None for r in rows)
    how = ("linear fit, checked by compiling (bisection)" if checked else
           "linear fit of compiled bytes against batch; --verify checks it by compiling")
    return f"largest batch that fits ({how}):\n" + "\n".join(lines)


def plot(records: list[dict], fits: dict, path: Path, tiers: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for tier in tiers:
        rs = [r for r in records if r["tier"] == tier]
        bs = [r["batch_size"] for r in rs]
        a1.plot(bs, [r["temp_bytes"] / 2**30 for r in rs], "o-", label=tier)
        ts = [(r["batch_size"], r["step_time_s"]) for r in rs if r["step_time_s"]]
        if ts:
            a2.plot(*zip(*ts), "o-", label=tier)
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        if ax.get_legend_handles_labels()[0]:  # no timed points with --steps 0
            ax.legend()
    a1.set_yscale("log")
    a1.set_ylabel("XLA temp memory (GiB)")
    a1.set_title("compiled train step: temp bytes")
    a2.set_ylabel("step time (s)")
    a2.set_title("measured step time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
