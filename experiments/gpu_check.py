"""The one prepared GPU check: everything tftjax claims about a GPU, in at most 8 minutes.

    python experiments/gpu_check.py --out experiments/results/gpu_check   # on a machine with one GPU

Stages, each in its own process with its own time box (a stage that runs out is killed and
recorded as such; the next one starts), results written after every stage to
``OUT/gpu_check.json`` and ``OUT/gpu_check.md``:

1. ``tests``: the GPU test subset (``JAX_PLATFORMS=cuda pytest -m "not slow"`` over the
   equality, precision, remat and fused-kernel tests, plus the ``gpu``-marked ones);
2. ``throughput``: TFT-225 samples/s per tier at batch 64, 256 and 1024, f32 and bf16
   (experiments/throughput.py);
3. ``memory``: compiled bytes and measured peaks per tier at batch 256, each point in its
   own process (``python -m tftjax.memory --isolate``);
4. ``peer``: pytorch-forecasting side by side at batch 64 on the same GPU, f32 and
   bf16-mixed (experiments/vs_pytorch_forecasting.py --accelerator gpu; needs the bench
   extra);
5. ``dqn``: ``python -m tftjax.dqn --epochs 100``.

The targets it checks (issue 22): bf16 TFT-225 >= 40,000 samples/s at batch 256; tftjax >= 100x
pytorch-forecasting's samples/s at batch 64; every tier's temp bytes <= ``off``'s; measured
peaks within 10% of the plan.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TIERS = "off,minimal,aggressive,full"


def stages(out: Path) -> list[tuple[str, int, list[str]]]:
    """(name, seconds, command) in the order they run; 480 s in all."""
    return [
        ("tests", 100, [PY, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
                        "tests/test_remat.py", "tests/test_fused.py", "tests/test_precision.py",
                        "tests/test_model.py", "tests/test_gpu.py"]),
        ("throughput", 140, [PY, "experiments/throughput.py", "--preset", "tft225",
                             "--batch-sizes", "64,256,1024", "--remat", TIERS, "--steps", "10",
                             "--precision", "f32,bf16", "--out", str(out / "throughput.json")]),
        ("memory", 90, [PY, "-m", "tftjax.memory", "--tiers", "full,aggressive,minimal,off",
                        "--batch-sizes", "256", "--steps", "3", "--isolate", "--budgets", "24,80",
                        "--out", str(out / "memory")]),
        ("peer", 90, [PY, "experiments/vs_pytorch_forecasting.py", "--accelerator", "gpu",
                      "--batch-sizes", "64", "--steps", "10", "--out", str(out / "peer.json")]),
        ("dqn", 60, [PY, "-m", "tftjax.dqn", "--epochs", "100", "--no-progress",
                     "--workdir", str(out / "dqn")]),
    ]


def run_stage(name: str, seconds: int, cmd: list[str], env: dict) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=seconds)
        rc, stdout, stderr = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = "timed out"
        stdout = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    return {"stage": name, "rc": rc, "seconds": round(time.perf_counter() - t0, 1),
            "box_s": seconds, "command": " ".join(cmd[1:]), "stdout_tail": stdout[-6000:],
            "stderr_tail": stderr[-2000:]}


def tables(r: dict) -> str:
    """The markdown lines of one stage: its status and the tables its command printed."""
    lines = [f"## {r['stage']}: {'ok' if r['rc'] == 0 else r['rc']} in {r['seconds']} s "
             f"(box {r['box_s']} s)", "", f"`{r['command']}`", ""]
    lines += [ln for ln in r["stdout_tail"].splitlines()
              if ln.startswith("|") or "passed" in ln or "failed" in ln or "samples/s" in ln]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("experiments/results/gpu_check"))
    ap.add_argument("--only", default=None, help="comma-separated stages to run")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cuda"),
               PYTHONPATH=str(ROOT))
    import jax

    record = {"device": None, "stages": []}
    try:
        record["device"] = str(jax.devices()[0].device_kind)
    except RuntimeError as e:  # no GPU: say so, run nothing
        print(f"no device for JAX_PLATFORMS={env['JAX_PLATFORMS']}: {e}")
        return 2
    md = [f"# GPU check on {record['device']} (jax {jax.__version__})", ""]
    only = set(args.only.split(",")) if args.only else None
    for name, seconds, cmd in stages(args.out.resolve()):
        if only and name not in only:
            continue
        print(f"[{name}] up to {seconds} s: {' '.join(cmd[1:])}", flush=True)
        r = run_stage(name, seconds, cmd, env)
        record["stages"].append(r)
        md.append(tables(r))
        (args.out / "gpu_check.json").write_text(json.dumps(record, indent=2))
        (args.out / "gpu_check.md").write_text("\n".join(md))
        print(f"[{name}] {r['rc']} in {r['seconds']} s", flush=True)
    print(f"wrote {args.out}/gpu_check.json and gpu_check.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
