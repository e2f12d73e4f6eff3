"""The one prepared GPU check: the targets first, one compile per row, a file per row.

    python experiments/gpu_check.py --out experiments/results/gpu_check   # one GPU, ~9 min
    python experiments/gpu_check.py --dry-run --out /tmp/gpu_check        # CPU, tiny, < 3 min

Stages run in this order, each row in its own process group with its own time box (a row
that runs out is killed whole, grandchildren too, and recorded as such; the next row
starts). After every row ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` are rewritten, and
each row's own output is ``OUT/rows/NAME.json``:

1. ``tests``: the GPU-marked tests first (``tests/models/kernels/test_on_gpu.py``), then the equality,
   precision and fused-kernel tests on the GPU;
2. ``throughput``: TFT-225 samples/s, one row per point in the order of the targets: bf16
   ``off`` at batch 256 (target 40,000 samples/s on an H200); f32 ``off`` at 64 and 256;
   bf16 ``off`` at 64; then every other tier at 256, bf16 and f32;
3. ``peer``: pytorch-forecasting and tftjax side by side at batch 64 on the same GPU, f32 and
   bf16-mixed (target: tftjax 100x; needs the bench extra, else recorded as skipped);
4. ``memory``: compiled bytes and each tier's measured peak at batch 256, a process per point
   (``python -m tftjax.memory --isolate``; target: within 10% of the plan; the dry run
   measures in one process: on the CPU there is no device peak to isolate);
5. ``soak``: three epochs of training, device, array and host memory per epoch;
6. ``dqn``: ``python -m tftjax.dqn --epochs 100``.

The orchestrating process never touches the device (no JAX import, so no preallocation of
75% of the card); each row's process gets ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless it
measures memory, a persistent compilation cache (``OUT/jax_cache``) and XLA's per-fusion
autotune cache (``OUT/autotune``), so a rerun after a timeout recompiles nothing.

``--dry-run`` runs every stage and row on the CPU with the tiny preset, small batches and a
few steps, compiled as the quick test tier compiles, the throughput rows two at a time
(compile-bound on the CPU), each row's box ``DRY_BOX`` times its GPU box (a loaded CPU
compiling, not a GPU running: the dry run checks that a row runs, not how fast), and writes
the same files: the check of the check (tests/experiments/test_gpu_check.py). ``--rows A,B``: only
those rows (by name, in the plan's order).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
STAGES = ("tests", "throughput", "peer", "memory", "soak", "dqn")
TIERS = ("off", "minimal", "aggressive", "full")
DRY_BOX = 4
"""A dry run's time box per row, in GPU boxes."""


def rows(out: Path, dry: bool) -> list[tuple[str, str, int, list[str]]]:
    """(stage, row name, seconds, command) in the order they run (about 9 minutes on a GPU)."""
    preset = "tiny" if dry else "tft225"
    big, small = (16, 8) if dry else (256, 64)
    steps = "2" if dry else "10"
    r = out / "rows"
    tests = (
        ["tests/models/kernels/test_on_gpu.py"]
        if dry
        else [
            "tests/models/kernels/test_on_gpu.py",
            "tests/models/test_bf16_census.py",
            "tests/models/test_precision.py",
            "tests/models/test_remat.py",
            "tests/models/kernels/test_fused.py",
            "tests/models/kernels/test_pallas_vsn.py",
            "tests/models/kernels/test_pallas_adamw.py",
            "tests/models/kernels/test_pallas_grn.py",
            "tests/models/kernels/test_pallas_gated.py",
            "tests/models/kernels/test_pallas_attention.py",
            "tests/models/kernels/test_multi_tensor.py",
            "tests/models/test_recurrence.py",
        ]
    )
    plan = [
        (
            "tests",
            "tests",
            200,
            [PY, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider", *tests],
        )
    ]
    # the six Pallas kernels (tftjax.models.kernels.pallas_vsn, pallas_lstm, pallas_grn and
    # pallas_gated, pallas_attention, tftjax.models.kernels.pallas_adamw) right after the
    # target's own row: the design's candidate for it (predicted from the compile-only
    # census at 78ba504: 262 launches and 5.6 MB per sample against 1,690 and 93.0)
    points = [
        ("bf16", "off", big, "xla"),
        ("bf16", "off", big, "pallas"),
        ("f32", "off", small, "xla"),
        ("f32", "off", big, "xla"),
        ("f32", "off", big, "pallas"),
        ("bf16", "off", small, "xla"),
    ]
    points += [(p, t, big, "xla") for t in TIERS[1:] for p in ("bf16", "f32")]
    for prec, tier, b, kernel in points:
        name = f"{prec}_{tier}_b{b}" + ("_pallas" if kernel == "pallas" else "")
        plan.append(
            (
                "throughput",
                name,
                45,
                [
                    PY,
                    "experiments/throughput.py",
                    "--preset",
                    preset,
                    "--batch-sizes",
                    str(b),
                    "--remat",
                    tier,
                    "--precision",
                    prec,
                    "--steps",
                    steps,
                    "--kernels",
                    kernel,
                    "--out",
                    str(r / f"{name}.json"),
                ],
            )
        )
    for prec in ("f32", "bf16"):
        plan.append(
            (
                "peer",
                f"peer_{prec}",
                60,
                [
                    PY,
                    "experiments/vs_pytorch_forecasting.py",
                    "--accelerator",
                    "cpu" if dry else "gpu",
                    "--precision",
                    prec,
                    "--batch-sizes",
                    str(small),
                    "--steps",
                    "3" if dry else "10",
                    "--out",
                    str(r / f"peer_{prec}.json"),
                ],
            )
        )
    plan.append(
        (
            "memory",
            "memory",
            100,
            [
                PY,
                "-m",
                "tftjax.memory",
                "--preset",
                preset,
                "--tiers",
                # the dry run: one tier (the row runs; every tier's program is the tests')
                "off" if dry else ",".join(TIERS[::-1]),
                "--batch-sizes",
                str(big),
                "--steps",
                "2",
                "--isolate" if not dry else "--no-isolate",
                "--budgets",
                "24,80",
                "--out",
                str(r / "memory"),
            ],
        )
    )
    plan.append(
        (
            "soak",
            "soak",
            60,
            [
                PY,
                "-m",
                "tftjax.memory",
                "--preset",
                preset,
                "--tiers",
                "off",
                "--batch-sizes",
                str(small),
                "--soak",
                "2" if dry else "3",  # the dry run: the fewest epochs a soak takes
                "--soak-steps",
                "3" if dry else "20",
                "--out",
                str(r / "soak"),
            ],
        )
    )
    plan.append(
        (
            "dqn",
            "dqn",
            60,
            [
                PY,
                "-m",
                "tftjax.dqn",
                "--epochs",
                "2" if dry else "100",
                "--no-progress",
                "--no-tensorboard",
                "--workdir",
                str(r / "dqn"),
            ],
        )
    )
    return plan


def env_for(stage: str, out: Path, dry: bool) -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        JAX_COMPILATION_CACHE_DIR=str(out / "jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="1",
    )
    env["JAX_PLATFORMS"] = "cpu" if dry else os.environ.get("JAX_PLATFORMS", "cuda")
    if not dry:
        flag = f"--xla_gpu_per_fusion_autotune_cache_dir={out / 'autotune'}"
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
    if stage not in ("memory", "soak"):  # those measure what a user's run would hold
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if dry:  # the check of the check: compiles as the quick test tier does (tests/conftest.py)
        env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
        env["XLA_FLAGS"] = (
            env.get("XLA_FLAGS", "") + " --xla_cpu_use_fusion_emitters=false"
        ).strip()
    return env


def run_row(stage: str, name: str, seconds: int, cmd: list[str], env: dict) -> dict:
    """One row in its own process group, killed whole (grandchildren too) on timeout."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = p.communicate(timeout=seconds)
        rc: int | str = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        stdout, stderr = p.communicate()
        rc = "timed out"
    return {
        "stage": stage,
        "row": name,
        "rc": rc,
        "seconds": round(time.perf_counter() - t0, 1),
        "box_s": seconds,
        "command": " ".join(str(c) for c in cmd[1:]),
        "stdout_tail": (stdout or "")[-6000:],
        "stderr_tail": (stderr or "")[-2000:],
    }


def skipped(stage: str, name: str, why: str) -> dict:
    return {
        "stage": stage,
        "row": name,
        "rc": f"skipped: {why}",
        "seconds": 0.0,
        "box_s": 0,
        "command": "",
        "stdout_tail": "",
        "stderr_tail": "",
    }


def markdown(record: dict) -> str:
    lines = [
        f"# GPU check{' (dry run: CPU, tiny preset)' if record['dry_run'] else ''}",
        "",
        f"device: {record['device'] or 'not known yet'}",
        "",
        "| stage | row | status | seconds (box) |",
        "|---|---|---|---|",
    ]
    for r in record["rows"]:
        status = "ok" if r["rc"] == 0 else r["rc"]
        lines.append(f"| {r['stage']} | {r['row']} | {status} | {r['seconds']} ({r['box_s']}) |")
    for r in record["rows"]:
        found = [
            ln
            for ln in r["stdout_tail"].splitlines()
            if ln.startswith("|") or "samples/s" in ln or " passed" in ln
        ]
        if found:
            lines += ["", f"## {r['row']}", "", f"`{r['command']}`", "", *found]
    return "\n".join(lines) + "\n"


def device_of(rows_done: list[dict]) -> str | None:
    for r in rows_done:
        for ln in r["stdout_tail"].splitlines():
            if ln.startswith("device: "):
                return ln[len("device: ") :]
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("experiments/results/gpu_check"))
    ap.add_argument(
        "--stages",
        default=",".join(STAGES),
        help=f"comma-separated, run in the fixed order: {', '.join(STAGES)}",
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="on the CPU, tiny preset, small batches: every stage, the same files",
    )
    ap.add_argument(
        "--rows", default=None, help="comma-separated row names: only these (default: every row)"
    )
    args = ap.parse_args(argv)
    wanted = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in wanted if s not in STAGES]
    if bad or not wanted:
        print(
            f"gpu_check: --stages {args.stages!r}: not a stage: {', '.join(bad) or '(none)'}; "
            f"choose from {', '.join(STAGES)}",
            file=sys.stderr,
        )
        return 2
    out = args.out.resolve()
    plan = [row for row in rows(out, args.dry_run) if row[0] in wanted]
    if args.rows is not None:
        names = [r.strip() for r in args.rows.split(",") if r.strip()]
        bad = [r for r in names if r not in {name for _, name, _, _ in plan}]
        if bad or not names:
            print(
                f"gpu_check: --rows {args.rows!r}: not a row of these stages: "
                f"{', '.join(bad) or '(none)'}; choose from "
                f"{', '.join(name for _, name, _, _ in plan)}",
                file=sys.stderr,
            )
            return 2
        plan = [row for row in plan if row[1] in names]
    if args.dry_run:
        plan = [(st, nm, sec * DRY_BOX, cm) for st, nm, sec, cm in plan]
    (out / "rows").mkdir(parents=True, exist_ok=True)
    record = {"dry_run": args.dry_run, "device": None, "rows": []}
    have_peer = _importable("pytorch_forecasting")
    # the dry run's throughput rows are compile-bound and independent: two at a time on the
    # CPU (on a GPU every row has the device to itself)
    pool = ThreadPoolExecutor(2) if args.dry_run else None
    ahead: dict[str, Future] = {}
    for i, (stage, name, seconds, cmd) in enumerate(plan):
        print(f"[{name}] up to {seconds} s: {' '.join(str(c) for c in cmd[1:])}", flush=True)
        if stage == "peer" and not have_peer:
            r = skipped(stage, name, "the bench extra (pytorch-forecasting) is not installed")
        elif pool is not None and stage == "throughput":
            for st, nm, sec, cm in plan[i : i + 2]:
                if st == "throughput" and nm not in ahead:
                    ahead[nm] = pool.submit(
                        run_row, st, nm, sec, cm, env_for(st, out, args.dry_run)
                    )
            r = ahead.pop(name).result()
        else:
            r = run_row(stage, name, seconds, cmd, env_for(stage, out, args.dry_run))
        record["rows"].append(r)
        record["device"] = record["device"] or device_of([r])
        (out / "rows" / f"{name}.row.json").write_text(json.dumps(r, indent=2))
        (out / "gpu_check.json").write_text(json.dumps(record, indent=2))
        (out / "gpu_check.md").write_text(markdown(record))
        print(f"[{name}] {r['rc']} in {r['seconds']} s", flush=True)
    print(f"wrote {out}/gpu_check.json and gpu_check.md")
    return 0


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    raise SystemExit(main())
