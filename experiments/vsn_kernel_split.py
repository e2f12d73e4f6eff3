"""Does the fused VSN kernel leave a core idle? Split it into independent parts and time them.

    python experiments/vsn_kernel_split.py [--batch-size 64] [--reps 7]

The encoder VSN's per-variable GRN kernel (``tftjax.models.kernels.fused``, TFT-225 sizes: 220
variables, d 128, d_v 8, 50 steps per window, dropout 0.1) is ≈ 90% of a ``full`` step on
CPU. If XLA:CPU ran it on one core of two, two *independent* halves — the variables split
in two scans, or the rows split in two — could run side by side and take about half the
time. Each variant is the same function (summed halves); forward + backward
(``jax.grad`` of a fixed projection) is jitted and timed round-robin in one process.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.models.kernels import fused
from tftjax.runner.provenance import write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/vsn_kernel_split.json"))
    args = ap.parse_args()
    m, n, dv, d = 220, args.batch_size * 50, 8, 128
    rng = np.random.default_rng(0)

    def r(*shape, sc=0.3):
        return jnp.asarray(rng.normal(size=shape) * sc, jnp.float32)

    p = {
        "emb_k": r(m, dv),
        "emb_b": r(m, dv),
        "fc2_k": r(m, dv, dv),
        "fc2_b": r(m, dv),
        "fc1_k": r(m, dv, dv),
        "fc1_b": r(m, dv),
        "glu_k": r(m, dv, 2 * d),
        "glu_b": r(m, 2 * d),
        "skip_k": r(m, dv, d),
        "skip_b": r(m, d),
        "ln_scale": 1 + r(m, d),
        "ln_bias": r(m, d),
    }
    x, w = r(m, n, sc=1.0), jax.nn.softmax(r(m, n), axis=0)
    keep = jnp.asarray(rng.random((m, n, dv)) > 0.1)
    proj = r(n, d)

    def part(p, x, w, keep):
        return fused.weighted_grn_sum(p, x, w, keep, 0.1)

    def by_variables(k):
        b = np.linspace(0, m, k + 1).astype(int)
        return lambda p, x, w: sum(
            part(jax.tree.map(lambda a: a[i:j], p), x[i:j], w[i:j], keep[i:j])
            for i, j in zip(b[:-1], b[1:])
        )

    def by_rows(k):
        b = np.linspace(0, n, k + 1).astype(int)
        return lambda p, x, w: jnp.concatenate(
            [part(p, x[:, i:j], w[:, i:j], keep[:, i:j]) for i, j in zip(b[:-1], b[1:])]
        )

    variants = {
        "one kernel": lambda p, x, w: part(p, x, w, keep),
        "variables in 2 independent scans": by_variables(2),
        "rows in 2 independent halves": by_rows(2),
        "variables in 4 independent scans": by_variables(4),
    }
    steps = {}
    for name, f in variants.items():
        g = jax.jit(jax.grad(lambda p, x, w, f=f: jnp.sum(f(p, x, w) * proj), argnums=(0, 1, 2)))
        jax.block_until_ready(g(p, x, w))
        steps[name] = g
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(args.reps):
        for name, g in steps.items():
            t = time.perf_counter()
            jax.block_until_ready(g(p, x, w))
            times[name].append(time.perf_counter() - t)
    base = float(np.median(times["one kernel"]))
    print(
        f"| variant (batch {args.batch_size}, forward + backward) | median ms (min–max) "
        "| vs one kernel |\n|---|---|---|"
    )
    results = {}
    for name, v in times.items():
        med = float(np.median(v))
        results[name] = {"median_s": med, "min_s": min(v), "max_s": max(v)}
        print(
            f"| {name} | {med * 1e3:.0f} ({min(v) * 1e3:.0f}–{max(v) * 1e3:.0f}) "
            f"| {base / med:.2f}× |"
        )
    write_result(args.out, {"batch_size": args.batch_size, "times": results}, args)


if __name__ == "__main__":
    main()
