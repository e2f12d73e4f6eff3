"""``python -m tftjax.memory``: compiled memory and step time per remat tier and batch size,
the largest batch per memory budget, and ``jax.profiler`` device memory profiles."""

from __future__ import annotations

from pathlib import Path

from tftjax import remat
from tftjax.cli import data_file
from tftjax.cli import main as cli_main
from tftjax.config import ConfigError, preset
from tftjax.memory import BUDGETS_GB, report


def run(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tftjax.memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tft225")
    ap.add_argument("--tiers", default="off,minimal,aggressive,full")
    ap.add_argument("--batch-sizes", default="1,8,64,256")
    ap.add_argument("--out", type=Path, default=Path("runs/memory"))
    ap.add_argument("--steps", type=int, default=3, help="timed steps per point")
    ap.add_argument("--budgets", default=",".join(str(g) for g in BUDGETS_GB),
                    help="memory budgets in GB for the batch plan")
    ap.add_argument("--verify", action="store_true",
                    help="check each budget's largest batch by compiling (bisection: a few "
                         "compiles per tier and budget); default: the linear fit only")
    ap.add_argument("--no-verify", action="store_true", help=argparse.SUPPRESS)  # the default now
    ap.add_argument("--accumulate", default="1",
                    help="also each batch as K accumulated micro-batches, e.g. 1,4 (K must "
                         "divide the batch size)")
    ap.add_argument("--parquet-file", type=Path, default=None,
                    help="the bars whose row count sizes the data arrays (default: bundled ES)")
    ap.add_argument("--dataset", default=None, help="a bundled set instead: es, spx or btc")
    iso = ap.add_mutually_exclusive_group()
    iso.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                     help="time each point in its own process, so that each device peak is "
                          "its own (default on a GPU/TPU, where JAX cannot reset the peak)")
    iso.add_argument("--no-isolate", dest="isolate", action="store_false")
    ap.add_argument("--point-config", type=Path, help=argparse.SUPPRESS)  # an isolated point
    args = ap.parse_args(argv)
    try:
        if args.point_config:
            import json

            from tftjax.config import TFTConfig
            cfg = TFTConfig.from_json(json.loads(args.point_config.read_text()))
        else:
            cfg = preset(args.preset)
        tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
        for t in tiers:
            remat.plan(t)
        batch_sizes = sorted({int(b) for b in args.batch_sizes.split(",")})
        budgets = [float(g) for g in args.budgets.split(",") if g.strip()]
        if min(batch_sizes) < 1:
            raise ValueError("--batch-sizes must be >= 1")
        accumulate = [int(k) for k in args.accumulate.split(",") if k.strip()]
        if not accumulate or min(accumulate) < 1:
            raise ValueError(f"--accumulate {args.accumulate!r}: give integers >= 1, e.g. 1,4")
        if not any(b % k == 0 for b in batch_sizes for k in accumulate):
            raise ValueError(f"--accumulate {args.accumulate} divides none of --batch-sizes "
                             f"{args.batch_sizes}")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    report(cfg, tiers, batch_sizes, args.out, budgets_gb=[g if not g.is_integer() else int(g)
                                                         for g in budgets],
           steps=args.steps, verify=args.verify,
           parquet_file=data_file(args.parquet_file, args.dataset), isolate=args.isolate,
           accumulate=accumulate)
    print(f"wrote {args.out}/memory.json, batch_plan.json, memory.png and memory_*.prof")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit

    cli_exit(main())
