"""Data-parallel scaling: steps/s and samples/s of the TFT train step on meshes of 1, 2, 4 … devices.

    python experiments/scaling.py [--preset tft225] [--batch-size 64] [--devices 1,2,4]
                                  [--accumulate 1] [--steps 10] [--remat full]
                                  [--out experiments/results/scaling]

On a CPU the devices are simulated (``--xla_force_host_platform_device_count``, set here
before jax is imported, to the largest count asked for): they share this machine's cores, so
the table shows that the sharded step is correct and what the mesh costs, not a speed-up. On
a GPU host the same script uses the real devices (``--devices`` up to the local count).

Every mesh trains the same global batches from the same initial weights with
:class:`tftjax.training.Trainer` (the run loop's step: batch sharded over ``data``,
state replicated); the table gives the compile time, the median step time over ``--steps``
timed steps (after one untimed), steps/s, samples/s, the ratio to one device, and the
largest relative difference of the losses from the 1-device run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tft225")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--devices", default="1,2,4")
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--remat", default=None, help="tier (default: the platform's default)")
    ap.add_argument("--out", type=Path, default=Path("experiments/results/scaling"))
    args = ap.parse_args()
    counts = [int(n) for n in args.devices.split(",")]
    if os.environ.get("JAX_PLATFORMS", "cpu") == "cpu" or "--cpu" in sys.argv:
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
        os.environ["XLA_FLAGS"] = " ".join(
            flags + [f"--xla_force_host_platform_device_count={max(counts)}"]
        )

    import jax
    import numpy as np

    from tftjax.config import TrainConfig, preset
    from tftjax.data import load_dataset
    from tftjax.models.remat import default_tier
    from tftjax.runner.mesh import make_parallel
    from tftjax.runner.provenance import write_result
    from tftjax.training import Trainer, create_train_state

    cfg = preset(args.preset, remat=args.remat or default_tier())
    tc = TrainConfig(batch_size=args.batch_size, accumulate=args.accumulate)
    ds = load_dataset(None, cfg.data)
    rng = np.random.default_rng(0)
    batches = [rng.choice(ds.splits.train, args.batch_size) for _ in range(args.steps + 1)]
    kind = jax.devices()[0].device_kind
    print(
        f"{args.preset}, remat={cfg.execution.remat}, batch {args.batch_size}"
        + (f" as {args.accumulate} micro-batches" if args.accumulate > 1 else "")
        + f", {len(jax.devices())} {jax.default_backend()} devices ({kind}), "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    rows, ref = [], None
    for n in counts:
        par = make_parallel(n, "replicated")
        trainer = Trainer(cfg, tc, par.put_data(ds.features), par=par)
        state = par.replicate(create_train_state(cfg, tc, jax.random.key(0)))
        key = par.replicate(jax.random.key(1, impl="rbg"))
        t0 = time.perf_counter()
        state, m = trainer.train_step(state, batches[0], key)
        jax.block_until_ready(m)
        compile_s = time.perf_counter() - t0
        losses, times = [float(m["loss"])], []
        for b in batches[1:]:
            t0 = time.perf_counter()
            state, m = trainer.train_step(state, b, key)
            jax.block_until_ready(m)
            times.append(time.perf_counter() - t0)
            losses.append(float(m["loss"]))
        ref = ref or losses
        step = float(np.median(times))
        row = {
            "devices": n,
            "compile_s": compile_s,
            "step_s": step,
            "step_s_range": [float(min(times)), float(max(times))],
            "steps_per_s": 1 / step,
            "samples_per_s": args.batch_size / step,
            "loss_rel_diff_vs_first": float(max(abs(a - b) / abs(b) for a, b in zip(losses, ref))),
        }
        rows.append(row)
        print(
            f"{n} device(s): compile {compile_s:.1f} s, step {step:.3f} s "
            f"({min(times):.3f}-{max(times):.3f}), {1 / step:.2f} steps/s, "
            f"{args.batch_size / step:.1f} samples/s, losses vs {counts[0]} device(s): "
            f"{row['loss_rel_diff_vs_first']:.1e}",
            flush=True,
        )
    base = rows[0]["samples_per_s"]
    print(
        f"\n| devices | compile | step (median) | steps/s | samples/s | vs {counts[0]} | "
        "loss diff |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['devices']} | {r['compile_s']:.1f} s | {r['step_s']:.3f} s | "
            f"{r['steps_per_s']:.2f} | {r['samples_per_s']:.1f} | "
            f"{r['samples_per_s'] / base:.2f}× | {r['loss_rel_diff_vs_first']:.0e} |"
        )
    write_result(
        args.out / "scaling.json",
        {
            "config": {
                **vars(args),
                "out": str(args.out),
                "remat": cfg.execution.remat,
                "device": kind,
            },
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
