"""Remat tiers side by side: XLA temp bytes and step time of the TFT-225 train step.

    python experiments/remat_tiers.py [--batch-size 256] [--steps 3] [--out experiments/results/remat]

1. Where the activations are: the residuals that ``off`` saves for the
   backward pass (``jax.ad_checkpoint`` saved-residual listing), split into
   the VSNs' per-variable GRNs and everything else.
2. For each tier (off, minimal, aggressive, full) at one batch size: XLA's
   compiled argument/output/temp bytes and the measured step time (median of
   ``--steps``), with ratios to ``off``; written as ``memory.json`` and
   ``memory.png`` through ``tftjax.memory.report``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
from jax._src.ad_checkpoint import saved_residuals

from tftjax import memory
from tftjax.config import preset
from tftjax.models.tft import TFT, dummy_inputs, init_params
from tftjax.runner.provenance import write_result
from tftjax.stats import losses


def residual_share(cfg, batch: int) -> dict:
    """Bytes of saved residuals under ``off``: in the VSNs vs elsewhere (arguments excluded)."""
    s, h, k = dummy_inputs(cfg, batch)
    y = jax.numpy.zeros((batch, cfg.data.decoder_steps))
    params = init_params(cfg, jax.random.key(0))

    def loss(p):
        pred, _ = TFT(cfg).apply({"params": p}, s, h, k, True)
        return losses.quantile_loss(y, pred, cfg.head.quantiles)

    vsn = other = 0
    for aval, src in saved_residuals(loss, params):
        if src.startswith("from the argument") or src.startswith("from a literal"):
            continue
        nbytes = aval.size * aval.dtype.itemsize
        if "_stacked_grn" in src or "VariableSelection" in src:
            vsn += nbytes
        else:
            other += nbytes
    return {"vsn_bytes": vsn, "other_bytes": other, "vsn_share": vsn / (vsn + other)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tft225")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/remat"))
    args = ap.parse_args()
    cfg = preset(args.preset)
    share = residual_share(cfg, args.batch_size)
    print(
        f"saved residuals under 'off' at batch {args.batch_size}: VSN per-variable GRNs "
        f"{share['vsn_bytes'] / 2**20:,.0f} MiB, elsewhere {share['other_bytes'] / 2**20:,.0f} MiB "
        f"({100 * share['vsn_share']:.1f}% in the VSNs)"
    )
    tiers = ["off", "minimal", "aggressive", "full"]
    records = memory.report(
        cfg, tiers, [args.batch_size], args.out, budgets_gb=(), steps=args.steps
    )
    off = next(r for r in records if r["tier"] == "off")
    print("\n| tier | XLA temp | temp vs off | step time | time vs off |")
    print("|---|---|---|---|---|")
    for r in records:
        t, t0 = r["step_time_s"], off["step_time_s"]
        time_s = f"{t:.2f} s" if t else "not run"
        ratio = f"{t / t0:.2f}×" if t and t0 else "–"
        print(
            f"| {r['tier']} | {r['temp_bytes'] / 2**20:,.0f} MiB | "
            f"{r['temp_bytes'] / off['temp_bytes']:.2f} | {time_s} | {ratio} |"
        )
    write_result(args.out / "residual_share.json", share, args)


if __name__ == "__main__":
    main()
