"""``python -m tftjax.memory``'s report: compiled bytes and measured step time per tier and
batch size, the batch plan per budget, ``jax.profiler`` memory profiles, a plot."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.config import TFTConfig, TrainConfig
from tftjax.memory.analysis import (
    GB,
    Compiled,
    analyse,
    compile_step,
    for_target,
    release_executables,
    target_name,
)
from tftjax.memory.planning import fit_linear, largest_batch
from tftjax.memory.targets import spec
from tftjax.models import remat
from tftjax.runner.devices import device_limit
from tftjax.training import create_train_state, make_train_step

BUDGETS_GB = (4, 12, 24, 48, 80, 141)


def time_step(
    cfg: TFTConfig,
    batch_size: int,
    data,
    starts: np.ndarray,
    steps: int = 3,
    compiled=None,
    accumulate: int = 1,
):
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
        compiled = (
            make_train_step(cfg, accumulate=accumulate).lower(state, data, idx[0], key).compile()
        )
    times, state, _ = timed_steps(compiled, state, data, idx, key)
    return float(np.median(times)), compiled, state


def timed_steps(compiled, state, data, batches, key) -> tuple[list[float], object, dict]:
    """Run ``compiled`` on each batch (the first one a warm-up): the wall times of the others,
    each to the step's results being ready, the last state and the last step's metrics."""
    state, m = compiled(state, data, batches[0], key)
    jax.block_until_ready(m)
    times = []
    for b in batches[1:]:
        t0 = time.perf_counter()
        state, m = compiled(state, data, b, key)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t0)
    return times, state, m


def report(
    cfg: TFTConfig,
    tiers: list[str],
    batch_sizes: list[int],
    out: Path,
    budgets_gb=BUDGETS_GB,
    steps: int = 3,
    verify: bool = False,
    log=print,
    parquet_file=None,
    isolate: bool | None = None,
    accumulate=(1,),
    target: str | None = None,
) -> list[dict]:
    """Measure, print and write ``memory.json``, ``memory.png`` and ``.prof`` files.

    The data arrays have the rows of ``parquet_file`` (default: the bundled ES bars).
    ``steps=0`` compiles and analyses without running steps. ``isolate`` (default: on a
    device that reports memory statistics, i.e. not on CPU) times every point in its own
    process, so that each point's ``peak_bytes_in_use`` is its own: JAX has no way to
    reset a device's peak, and in one process every later point would report the
    largest peak so far. ``accumulate``: each batch size also as K micro-batches for each K
    given that divides it (``--accumulate 1,4``); the batch plan fits the first K's points.
    ``target``: compiled for that GPU (tftjax.memory.targets) on this machine, nothing run."""
    with for_target(target):
        return _report(
            cfg,
            tiers,
            batch_sizes,
            out,
            budgets_gb,
            0 if target else steps,
            verify,
            log,
            parquet_file,
            isolate,
            accumulate,
        )


def _report(
    cfg,
    tiers,
    batch_sizes,
    out,
    budgets_gb,
    steps,
    verify,
    log,
    parquet_file,
    isolate,
    accumulate,
) -> list[dict]:
    from tftjax.data import load_dataset, to_device

    out.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(parquet_file, cfg.data)
    data = to_device(ds.features)
    rows = len(ds.features)
    dev = jax.devices()[0]
    budget_for_timing = _host_budget()  # points larger than 80% of the host are not timed
    if isolate is None:
        isolate = device_limit(dev) is not None
    records, fits = [], {}
    for tier in tiers:
        c = cfg.override(remat=tier)
        note = remat.plan(tier).note
        if note:
            log(note)
        points = []
        for b, k in [(b, k) for b in batch_sizes for k in accumulate if b % k == 0]:
            if steps > 0 and isolate:  # compiled, analysed and timed by the child alone
                rec = _point_in_subprocess(c, b, steps, out, parquet_file, k)
                if "temp_bytes" not in rec:  # the child failed: the plan from here
                    rec.update(_record(tier, analyse(c, b, rows, accumulate=k), dev))
                if k == accumulate[0]:
                    points.append(
                        Compiled(
                            **{
                                f.name: rec[f.name] if f.name != "tier" else tier
                                for f in dataclasses.fields(Compiled)
                            }
                        )
                    )
                records.append(rec)
                continue
            compiled = compile_step(c, b, rows, k, to_run=steps > 0)
            a = analyse(c, b, rows, compiled=compiled, accumulate=k)
            if k == accumulate[0]:
                points.append(a)
            rec = _record(tier, a, dev)
            if steps > 0 and a.total_bytes <= budget_for_timing:
                t, compiled, state = time_step(c, b, data, ds.splits.train, steps, compiled, k)
                rec["step_time_s"] = t
                stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
                if stats:
                    rec["peak_bytes_in_use"] = int(stats.get("peak_bytes_in_use", 0))
                else:
                    rec["peak_note"] = f"{dev.platform} reports no memory statistics"
                # Live device buffers right after a step (pprof; `pprof -http` or XProf).
                jax.profiler.save_device_memory_profile(
                    str(out / f"memory_{tier}_b{b}{f'_k{k}' if k > 1 else ''}.prof")
                )
                del state
            del compiled
            release_executables()
            records.append(rec)
        fits[tier] = fit_linear(points) if points else (0.0, 0.0)
    off_time = {
        (r["batch_size"], r["accumulate"]): r["step_time_s"]
        for r in records
        if r["tier"] == tiers[0]
    }
    for r in records:
        base = off_time.get((r["batch_size"], r["accumulate"]))
        r["time_ratio_to_" + tiers[0]] = (
            r["step_time_s"] / base if r["step_time_s"] and base else None
        )
    plan_rows = []
    for tier in tiers:
        c = cfg.override(remat=tier)
        for g in budgets_gb:
            bmax, checked = largest_batch(
                c, g * GB, fits[tier], rows, verify=verify, max_batch=1 << 20
            )
            plan_rows.append(
                {
                    "tier": tier,
                    "budget_gb": g,
                    "max_batch": bmax,
                    "checked_total_bytes": checked.total_bytes if checked else None,
                }
            )
    (out / "memory.json").write_text(json.dumps(records, indent=2))
    (out / "batch_plan.json").write_text(json.dumps({"fits": fits, "plan": plan_rows}, indent=2))
    log(format_table(records, tiers[0]))
    log(format_plan(plan_rows, tiers, budgets_gb))
    plot(records, fits, out / "memory.png", tiers)
    return records


def _record(tier: str, a: Compiled, dev) -> dict:
    name = target_name()
    device = (
        dev.device_kind
        if name == jax.default_backend()
        else (f"{spec(name).description} (compile-only target)")
    )
    return {
        "tier": tier,
        **{k: v for k, v in dataclasses.asdict(a).items() if k != "tier"},
        "total_bytes": a.total_bytes,
        "step_time_s": None,
        "device": device,
    }


def _point_in_subprocess(
    cfg: TFTConfig, batch_size: int, steps: int, out: Path, parquet_file, accumulate: int = 1
) -> dict:
    """Step time and device peak of one point, measured by a fresh process."""
    import subprocess
    import sys

    where = out / f"point_{cfg.execution.remat}_b{batch_size}_k{accumulate}"
    where.mkdir(parents=True, exist_ok=True)
    (where / "config.json").write_text(json.dumps(cfg.to_json()))
    cmd = [
        sys.executable,
        "-m",
        "tftjax.memory",
        "--point-config",
        str(where / "config.json"),
        "--tiers",
        cfg.execution.remat,
        "--batch-sizes",
        str(batch_size),
        "--steps",
        str(steps),
        "--budgets",
        "",
        "--no-isolate",
        "--accumulate",
        str(accumulate),
        "--out",
        str(where),
    ]
    if parquet_file is not None:
        cmd += ["--parquet-file", str(parquet_file)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"step_time_s": None, "isolated_error": (p.stderr or p.stdout)[-400:]}
    rec = json.loads((where / "memory.json").read_text())[0]
    for prof in where.glob("*.prof"):
        prof.replace(out / prof.name)
    return {k: v for k, v in rec.items() if not k.startswith("time_ratio_to_")} | {"isolated": True}


def _host_budget() -> float:
    try:
        import os

        return 0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * GB


def format_table(records: list[dict], base: str) -> str:
    lines = [
        f"| tier | batch | micro-batches | argument | output | temp | host temp | code | "
        f"step time | vs {base} | measured peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    mib = lambda x: f"{x / 2**20:,.0f} MiB"
    for r in records:
        t = f"{r['step_time_s']:.2f} s" if r["step_time_s"] else "not run"
        ratio = r.get(f"time_ratio_to_{base}")
        k = r.get("accumulate", 1)
        micro = f"{k} × {r['batch_size'] // k}" if k > 1 else "1"
        lines.append(
            f"| {r['tier']} | {r['batch_size']} | {micro} | "
            f"{mib(r['argument_bytes'])} | "
            f"{mib(r['output_bytes'])} | {mib(r['temp_bytes'])} | "
            f"{mib(r.get('host_temp_bytes', 0))} | "
            f"{r['generated_code_bytes'] / 2**10:,.0f} KiB | {t} | "
            f"{f'{ratio:.2f}×' if ratio else '–'} | {_peak(r)} |"
        )
    return "\n".join(lines)


def _peak(r: dict) -> str:
    if r.get("peak_bytes_in_use"):
        plan = r["total_bytes"]
        return (
            f"{r['peak_bytes_in_use'] / 2**20:,.0f} MiB ({r['peak_bytes_in_use'] / plan:.2f}× plan)"
        )
    return r.get("peak_note", "–")


def format_plan(rows: list[dict], tiers, budgets) -> str:
    if not rows:
        return (
            "largest batch per budget: needs two or more --batch-sizes to fit bytes against batch"
        )
    lines = [
        "| tier | " + " | ".join(f"{g} GB" for g in budgets) + " |",
        "|---|" + "---|" * len(budgets),
    ]
    for tier in tiers:
        cells = [str(r["max_batch"]) for r in rows if r["tier"] == tier]
        lines.append(f"| {tier} | " + " | ".join(cells) + " |")
    checked = any(r["checked_total_bytes"] is not None for r in rows)
    how = (
        "linear fit, checked by compiling (bisection)"
        if checked
        else "linear fit of compiled bytes against batch; --verify checks it by compiling"
    )
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
