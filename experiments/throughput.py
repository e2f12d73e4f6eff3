"""Training throughput of the TFT: samples/s and compile time per batch size.

    python experiments/throughput.py [--preset tft225] [--batch-sizes 64,256] [--remat off] [--steps 5]

For each batch size: compile time of the jitted train step (lower + compile),
then ``--steps`` timed steps after one warm-up step on the bundled ES data;
reports the median step time and samples/s (with min–max), and XLA's
compiled temp memory. Steps run back to back in one process, so ratios
between rows are side by side; absolute numbers move with machine load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.config import TrainConfig, preset
from tftjax.data import epoch_batches, load_dataset, to_device
from tftjax.memory.report import timed_steps
from tftjax.runner.provenance import write_result
from tftjax.training import create_train_state, make_train_step


def measure(
    preset_name: str,
    batch: int,
    remat: str,
    steps: int,
    ds,
    data,
    precision: str = "f32",
    kernels: str = "xla",
    kernels_exclude: tuple[str, ...] = (),
) -> dict:
    cfg = preset(
        preset_name,
        remat=remat,
        precision=precision,
        kernels=kernels,
        kernels_exclude=kernels_exclude,
    )
    tc = TrainConfig(batch_size=batch)
    state = create_train_state(cfg, tc, jax.random.key(0))
    step = make_train_step(cfg)
    key = jax.random.key(1, impl="rbg")
    idx, _ = epoch_batches(ds.splits.train, batch, seed=0, epoch=1)
    batches = [jnp.asarray(idx[i % len(idx)]) for i in range(steps + 1)]
    t0 = time.perf_counter()
    compiled = step.lower(state, data, batches[0], key).compile()
    compile_s = time.perf_counter() - t0
    temp = compiled.memory_analysis().temp_size_in_bytes
    times, state, m = timed_steps(compiled, state, data, batches, key)  # the first: warm-up
    med = statistics.median(times)
    return {
        "preset": preset_name,
        "remat": remat,
        "kernels": kernels,
        "kernels_exclude": list(kernels_exclude),
        "pallas_families": list(cfg.execution.pallas_families),
        "batch_size": batch,
        "compile_s": compile_s,
        "step_s_median": med,
        "step_s_min": min(times),
        "step_s_max": max(times),
        "samples_per_s": batch / med,
        "temp_bytes": temp,
        "loss_finite": bool(np.isfinite(float(m["loss"]))),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tft225")
    ap.add_argument("--batch-sizes", default="64,256")
    ap.add_argument("--remat", default="off", help="comma-separated tiers")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--precision", default="f32", help="comma-separated: f32, bf16")
    ap.add_argument(
        "--kernels",
        default="xla",
        choices=("xla", "pallas"),
        help="xla, or pallas: every Pallas kernel family (tftjax.models.kernels; a GPU)",
    )
    ap.add_argument(
        "--kernels-exclude",
        default="",
        help="comma-separated families left to XLA under --kernels pallas "
        "(vsn, lstm, grn, attention, optimizer)",
    )
    ap.add_argument("--out", type=Path, default=Path("experiments/results/throughput.json"))
    args = ap.parse_args()
    cfg = preset(args.preset)
    ds = load_dataset(None, cfg.data)
    data = to_device(ds.features)
    rows = []
    print(f"device: {jax.devices()[0].device_kind}")
    print(
        f"{args.preset} on {jax.devices()[0].device_kind}, jax {jax.__version__}, "
        f"median of {args.steps} steps"
    )
    print("| precision | remat | batch | compile | step (median; min–max) | samples/s | XLA temp |")
    print("|---|---|---|---|---|---|---|")
    for prec, remat, b in [
        (p, r, int(b))
        for p in args.precision.split(",")
        for r in args.remat.split(",")
        for b in args.batch_sizes.split(",")
    ]:
        r = measure(
            args.preset,
            b,
            remat,
            args.steps,
            ds,
            data,
            prec,
            args.kernels,
            tuple(f for f in args.kernels_exclude.split(",") if f),
        )
        r["precision"] = prec
        rows.append(r)
        print(
            f"| {prec} | {remat} | {b} | {r['compile_s']:.1f} s | {r['step_s_median']:.4f} s "
            f"({r['step_s_min']:.4f}–{r['step_s_max']:.4f}) | {r['samples_per_s']:.0f} "
            f"| {r['temp_bytes'] / 2**20:,.0f} MiB |",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, rows, args)


if __name__ == "__main__":
    main()
