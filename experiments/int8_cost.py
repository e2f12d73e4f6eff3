"""XLA's cost estimate of the TFT's forward, float against int8 (issue 27: the int8 path must
be as lean as the float one): ``python experiments/int8_cost.py [--preset tft225]
[--batch 256]``.

Compiles the forward of random-initialised weights (observers set from one batch, so the
int8 path is defined) in float and int8 for this machine's backend, and prints
``compiled.cost_analysis()``'s flops and bytes accessed for each. No timing: see
``experiments/qat_accuracy.py`` for windows/s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tftjax.config import preset
from tftjax.models.compute import quant_spec
from tftjax.models.tft import TFT, init_variables
from tftjax.quant.core import update_observers
from tftjax.quant.tree import int8_variables
from tftjax.runner.provenance import describe, provenance


def random_inputs(cfg, batch: int, key):
    k = jax.random.split(key, 3)
    te, td = cfg.data.encoder_steps, cfg.data.decoder_steps
    return (
        jax.random.normal(k[0], (batch, cfg.model.num_static)),
        jax.random.normal(k[1], (batch, te, cfg.model.num_historical)),
        jax.random.normal(k[2], (batch, te + td, cfg.model.num_known)),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tft225")
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    cfg = preset(args.preset, qat=True)
    x = random_inputs(cfg, args.batch, jax.random.key(1))
    v = init_variables(cfg, jax.random.key(0))
    spec = quant_spec(cfg)
    _, rec = jax.jit(lambda v, *x: TFT(cfg).apply(v, *x, mutable=["quant_batch"]))(v, *x)
    stats = update_observers(v["quant_stats"], rec["quant_batch"], spec)
    variants = {
        "float": ({"params": v["params"]}, "float"),
        "int8": (
            {**int8_variables(v["params"], quant_spec(cfg, "int8")), "quant_stats": stats},
            "int8",
        ),
    }
    print(describe(provenance(args)))
    out = {}
    for name, (variables, mode) in variants.items():
        fwd = jax.jit(lambda v, *x, mode=mode: TFT(cfg, mode).apply(v, *x)[0])
        cost = fwd.lower(variables, *x).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        out[name] = cost
        print(
            f"{args.preset} batch {args.batch}, {name}: {cost.get('flops', 0):.3g} flops, "
            f"{cost.get('bytes accessed', 0):.3g} bytes accessed"
        )
    print(f"int8 / float flops: {out['int8']['flops'] / out['float']['flops']:.2f}")


if __name__ == "__main__":
    main()
