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
    ap.add_argument("--dataset", default=None, help="a bundled set instead: es, spx, nasdaq or btc")
    iso = ap.add_mutually_exclusive_group()
    iso.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                     help="time each point in its own process, so that each device peak is "
                          "its own (default on a GPU/TPU, where JAX cannot reset the peak)")
    iso.add_argument("--no-isolate", dest="isolate", action="store_false")
    ap.add_argument("--precision", default="f32", help="compute precision: f32 or bf16")
    ap.add_argument("--matmul-precision", default="default",
                    help="float32 matmul precision: default, high or highest")
    ap.add_argument("--vsn-kernel", default="xla",
                    help="the float VSNs' per-variable GRNs: xla (each tier's plan) or pallas "
                         "(the Pallas/Triton GPU kernels, tftjax.models.pallas_vsn; for a GPU "
                         "or --target)")
    ap.add_argument("--lstm-kernel", default="xla",
                    help="the float LSTMs' recurrences: xla (scans) or pallas (one persistent "
                         "Pallas/Triton kernel each way, tftjax.models.pallas_lstm; for a GPU "
                         "or --target)")
    ap.add_argument("--grn-kernel", default="xla",
                    help="the float model's GRNs and gates outside the VSNs: xla or pallas "
                         "(Pallas/Triton kernels, tftjax.models.pallas_grn and pallas_gated; "
                         "for a GPU or --target)")
    ap.add_argument("--attention-kernel", default="xla",
                    help="the attention's softmax and mix: xla or pallas (one Pallas/Triton "
                         "kernel each way, tftjax.models.pallas_attention; for a GPU or "
                         "--target)")
    ap.add_argument("--optimizer-kernel", default="xla",
                    help="the optimizer step: xla (optax) or pallas (a norm kernel and an "
                         "update kernel per 48 leaves, tftjax.training.pallas_adamw; for a "
                         "GPU or --target)")
    ap.add_argument("--target", default=None,
                    help="compile for this GPU on this machine, no GPU needed (h100, h200, "
                         "a100, rtx4090, a4000; the cuda12 extra): compiled bytes, batch plan "
                         "and --remat auto's choice for its memory; no steps run")
    ap.add_argument("--cost", action="store_true",
                    help="with --target: instead of the memory report, each tier's step "
                         "census on that GPU (kernels per step, HBM bytes per sample, FLOPs, "
                         "temp bytes) and a roofline estimate of its samples/s "
                         "(tftjax.memory.cost)")
    ap.add_argument("--soak", type=int, default=None, metavar="N",
                    help="instead of the report: train N epochs (validation and a checkpoint "
                         "each) and check that device bytes, live arrays and host memory do "
                         "not grow after the first; exit 1 when they do")
    ap.add_argument("--soak-steps", type=int, default=50, help="train steps per soak epoch")
    ap.add_argument("--point-config", type=Path, help=argparse.SUPPRESS)  # an isolated point
    args = ap.parse_args(argv)
    try:
        if args.point_config:
            import json

            from tftjax.config import TFTConfig
            cfg = TFTConfig.from_json(json.loads(args.point_config.read_text()))
        else:
            cfg = preset(args.preset, precision=args.precision,
                         matmul_precision=args.matmul_precision, vsn_kernel=args.vsn_kernel,
                         lstm_kernel=args.lstm_kernel, grn_kernel=args.grn_kernel,
                         attention_kernel=args.attention_kernel,
                         optimizer_kernel=args.optimizer_kernel)
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
        if args.soak is not None:
            return soak_cli(cfg, tiers[0], batch_sizes[-1], args)
        if args.cost and args.target is None:
            raise ConfigError("--cost needs --target NAME (the GPU to compile for, e.g. "
                              "--target h100)")
        if args.target is not None:
            from tftjax.memory.targets import compile_only_device, spec

            spec(args.target)
            if args.cost:
                compile_only_device(args.target)  # the cuda12 extra, named when missing
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.cost:
        from tftjax.data import load_dataset
        from tftjax.memory import cost

        rows = len(load_dataset(data_file(args.parquet_file, args.dataset), cfg.data).features)
        cost.report(cfg, tiers, batch_sizes, rows, args.target, args.out)
        print(f"wrote {args.out}/cost.json")
        return 0
    report(cfg, tiers, batch_sizes, args.out, budgets_gb=[g if not g.is_integer() else int(g)
                                                         for g in budgets],
           steps=args.steps, verify=args.verify,
           parquet_file=data_file(args.parquet_file, args.dataset), isolate=args.isolate,
           accumulate=accumulate, target=args.target)
    print(f"wrote {args.out}/memory.json, batch_plan.json, memory.png and memory_*.prof")
    if args.target is not None:
        target_plan(cfg, batch_sizes[-1], args)
    return 0


def target_plan(cfg, batch_size: int, args) -> None:
    """``--remat auto``'s choice for the target GPU's memory at the largest ``--batch-sizes``
    (the fastest tier that fits, by the GPU's step-time model)."""
    import dataclasses

    from tftjax.data import load_dataset
    from tftjax.memory import HEADROOM, for_target, plan_auto
    from tftjax.memory.targets import spec

    from tftjax.memory.targets import jax_pool_fraction

    s = spec(args.target)
    rows = len(load_dataset(data_file(args.parquet_file, args.dataset), cfg.data).features)
    pool = jax_pool_fraction()
    with for_target(args.target):
        # at the batch asked for (growing it would be a bisection of GPU compiles: the
        # plan table above has each tier's largest batch from the fit); against the pool a
        # run on that GPU will have, never this machine's own card
        tier, batch, k = plan_auto(dataclasses.replace(cfg, remat="off"),
                                   HEADROOM * pool * s.memory_bytes, batch_size, rows,
                                   backend="gpu", log=lambda *a: None, grow_batch=False)
    print(f"--remat auto on {s.description} ({s.memory_bytes / 1e9:.1f} GB; JAX's pool "
          f"{pool:.0%} of it, XLA_PYTHON_CLIENT_MEM_FRACTION; planned for {HEADROOM:.0%} of "
          f"the pool): --remat {tier} --batch-size {batch}"
          + (f" --accumulate {k}" if k > 1 else ""))
    print("not modelled: the CUDA context and NCCL buffers (outside JAX's pool) and pinned "
          "host memory")


def soak_cli(cfg, tier: str, batch_size: int, args) -> int:
    import json

    from tftjax.config import TrainConfig
    from tftjax.memory.soak import format_soak, soak

    if args.soak < 2:
        raise ConfigError(f"--soak {args.soak}: a soak needs 2 or more epochs (growth is "
                          "measured after the first)")
    if args.soak_steps < 1:
        raise ConfigError(f"--soak-steps must be >= 1, got {args.soak_steps}")
    import dataclasses

    tc = TrainConfig(batch_size=batch_size, max_steps_per_epoch=args.soak_steps)
    args.out.mkdir(parents=True, exist_ok=True)
    records, grew = soak(dataclasses.replace(cfg, remat=tier), tc, args.soak,
                         args.out / "soak_run", parquet_file=data_file(args.parquet_file,
                                                                       args.dataset))
    (args.out / "soak.json").write_text(json.dumps({"records": records, "grew": grew}, indent=2))
    print(format_soak(records))
    for line in grew:
        print(f"LEAK? {line}")
    print("no growth (tftjax.memory.soak.growth)" if not grew else
          f"memory grew: {len(grew)} measure(s), see above")
    return 1 if grew else 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


if __name__ == "__main__":
    from tftjax.cli import exit as cli_exit

    cli_exit(main())
