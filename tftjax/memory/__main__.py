"""``python -m tftjax.memory``: compiled memory and step time per remat tier and batch size,
the largest batch per memory budget, and ``jax.profiler`` device memory profiles."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tftjax.cli import CommandLine, Parsed, data_file, first_paragraph
from tftjax.cli import main as cli_main
from tftjax.config import SECTIONS, ConfigError, TFTConfig, get_preset
from tftjax.config.execution import RematTier
from tftjax.config.fields import setting
from tftjax.config.presets import PresetName
from tftjax.memory import BUDGETS_GB, report

MODEL_PARTS = ("model", "head", "quant", "execution")


@dataclasses.dataclass(frozen=True)
class MemoryOptions:
    """What to measure, and where the report goes."""

    preset: PresetName = "tft225"
    """The model and how it runs (tftjax.config.presets); the model and execution flags
    override single fields."""
    tiers: tuple[RematTier, ...] = ("off", "minimal", "aggressive", "full")
    """The remat tiers to measure (comma-separated)."""
    batch_sizes: tuple[int, ...] = (1, 8, 64, 256)
    """The batch sizes to measure (comma-separated)."""
    out: Path = Path("runs/memory")
    """Where memory.json, batch_plan.json, memory.png and the .prof files go."""
    steps: int = 3
    """Timed steps per point (0: compile and analyse only)."""
    budgets: tuple[float, ...] = tuple(BUDGETS_GB)
    """Memory budgets in GB for the batch plan."""
    verify: bool = False
    """Check each budget's largest batch by compiling (bisection: a few compiles per tier and
    budget); default: the linear fit only."""
    accumulate: tuple[int, ...] = (1,)
    """Also each batch as K accumulated micro-batches, e.g. 1,4 (K must divide the batch
    size)."""
    parquet_file: Path | None = None
    """The bars whose row count sizes the data arrays (default: the bundled ES bars)."""
    dataset: str | None = None
    """A bundled set instead: es, spx, nasdaq or btc."""
    isolate: bool | None = None
    """Time each point in its own process, so that each device peak is its own (default on
    a GPU/TPU, where JAX cannot reset the peak)."""
    target: str | None = None
    """Compile for this GPU on this machine, no GPU needed (h100, h200, a100, rtx4090, a4000;
    the cuda12 extra): compiled bytes, batch plan and --remat auto's choice for its memory;
    no steps run."""
    cost: bool = False
    """With --target: instead of the memory report, each tier's step census on that GPU
    (kernels per step, HBM bytes per sample, FLOPs, temp bytes) and a roofline estimate of
    its samples/s (tftjax.memory.cost)."""
    soak: int | None = None
    """Instead of the report: train N epochs (validation and a checkpoint each) and check
    that device bytes, live arrays and host memory do not grow after the first; exit 1
    when they do."""
    soak_steps: int = 50
    """Train steps per soak epoch."""
    point_config: Path | None = setting(None, hidden=True)
    """An isolated point's model config (what the report passes its subprocesses)."""


COMMAND_LINE = CommandLine(
    "python -m tftjax.memory",
    first_paragraph(__doc__),
    {**{name: SECTIONS[name] for name in MODEL_PARTS}, "options": MemoryOptions},
    {
        **{name: getattr(get_preset("tft225").model, name) for name in MODEL_PARTS},
        "options": MemoryOptions(),
    },
    legacy_kernel_flags=True,
    exclude=("execution.remat", "execution.memory_budget"),
)


def model_config(parsed: Parsed, opts: MemoryOptions) -> TFTConfig:
    """The preset's model (an isolated point's own) with the model flags given on top."""
    if opts.point_config is not None:
        import json

        return TFTConfig.from_json(json.loads(opts.point_config.read_text()))
    from tftjax.config.execution import legacy_kernels

    cfg = get_preset(opts.preset).model.override(**parsed.model_settings(MODEL_PARTS))
    if parsed.legacy_kernels:
        cfg = cfg.override(
            execution=legacy_kernels(
                cfg.execution, parsed.legacy_kernels, parsed.given_flag("execution", "kernels")
            )
        )
    return cfg


def check_options(opts: MemoryOptions) -> None:
    """Refuse what cannot be measured, before anything compiles.

    Raises:
      ConfigError: one line naming the flag.
    """
    if not opts.tiers:
        raise ConfigError("--tiers: give at least one tier")
    if not opts.batch_sizes or min(opts.batch_sizes) < 1:
        raise ConfigError("--batch-sizes must be >= 1")
    if not opts.accumulate or min(opts.accumulate) < 1:
        raise ConfigError(f"--accumulate {opts.accumulate}: give integers >= 1, e.g. 1,4")
    if not any(b % k == 0 for b in opts.batch_sizes for k in opts.accumulate):
        raise ConfigError(
            f"--accumulate {opts.accumulate} divides none of --batch-sizes {opts.batch_sizes}"
        )
    if opts.cost and opts.target is None:
        raise ConfigError("--cost needs --target NAME (the GPU to compile for, e.g. --target h100)")
    if opts.target is not None:
        from tftjax.memory.targets import compile_only_device, spec

        spec(opts.target)
        if opts.cost:
            compile_only_device(opts.target)  # the cuda12 extra, named when missing


def run(argv: list[str] | None = None) -> int:
    parsed = COMMAND_LINE.parse(argv)
    opts = parsed.options(MemoryOptions)
    cfg = model_config(parsed, opts)
    check_options(opts)
    batch_sizes = sorted(set(opts.batch_sizes))
    bars = data_file(opts.parquet_file, opts.dataset)
    if opts.soak is not None:
        return soak_cli(cfg, opts.tiers[0], batch_sizes[-1], opts)
    if opts.cost:
        from tftjax.data import load_dataset
        from tftjax.memory import cost

        rows = len(load_dataset(bars, cfg.data).features)
        cost.report(cfg, list(opts.tiers), batch_sizes, rows, opts.target, opts.out)
        print(f"wrote {opts.out}/cost.json")
        return 0
    report(
        cfg,
        list(opts.tiers),
        batch_sizes,
        opts.out,
        budgets_gb=[g if not float(g).is_integer() else int(g) for g in opts.budgets],
        steps=opts.steps,
        verify=opts.verify,
        parquet_file=bars,
        isolate=opts.isolate,
        accumulate=list(opts.accumulate),
        target=opts.target,
    )
    print(f"wrote {opts.out}/memory.json, batch_plan.json, memory.png and memory_*.prof")
    if opts.target is not None:
        target_plan(cfg, batch_sizes[-1], opts)
    return 0


def target_plan(cfg, batch_size: int, args) -> None:
    """``--remat auto``'s choice for the target GPU's memory at the largest ``--batch-sizes``
    (the fastest tier that fits, by the GPU's step-time model)."""
    from tftjax.data import load_dataset
    from tftjax.memory import HEADROOM, for_target, plan_auto
    from tftjax.memory.targets import jax_pool_fraction, spec

    s = spec(args.target)
    rows = len(load_dataset(data_file(args.parquet_file, args.dataset), cfg.data).features)
    pool = jax_pool_fraction()
    with for_target(args.target):
        # at the batch asked for (growing it would be a bisection of GPU compiles: the
        # plan table above has each tier's largest batch from the fit); against the pool a
        # run on that GPU will have, never this machine's own card
        tier, batch, k = plan_auto(
            cfg.override(remat="off"),
            HEADROOM * pool * s.memory_bytes,
            batch_size,
            rows,
            backend="gpu",
            log=lambda *a: None,
            grow_batch=False,
        )
    print(
        f"--remat auto on {s.description} ({s.memory_bytes / 1e9:.1f} GB; JAX's pool "
        f"{pool:.0%} of it, XLA_PYTHON_CLIENT_MEM_FRACTION; planned for {HEADROOM:.0%} of "
        f"the pool): --remat {tier} --batch-size {batch}" + (f" --accumulate {k}" if k > 1 else "")
    )
    print(
        "not modelled: the CUDA context and NCCL buffers (outside JAX's pool) and pinned "
        "host memory"
    )


def soak_cli(cfg, tier: str, batch_size: int, args) -> int:
    import json

    from tftjax.config import TrainConfig
    from tftjax.memory.soak import format_soak, soak

    if args.soak < 2:
        raise ConfigError(
            f"--soak {args.soak}: a soak needs 2 or more epochs (growth is "
            "measured after the first)"
        )
    if args.soak_steps < 1:
        raise ConfigError(f"--soak-steps must be >= 1, got {args.soak_steps}")
    tc = TrainConfig(batch_size=batch_size, max_steps_per_epoch=args.soak_steps)
    args.out.mkdir(parents=True, exist_ok=True)
    records, grew = soak(
        cfg.override(remat=tier),
        tc,
        args.soak,
        args.out / "soak_run",
        parquet_file=data_file(args.parquet_file, args.dataset),
    )
    (args.out / "soak.json").write_text(json.dumps({"records": records, "grew": grew}, indent=2))
    print(format_soak(records))
    for line in grew:
        print(f"LEAK? {line}")
    print(
        "no growth (tftjax.memory.soak.growth)"
        if not grew
        else f"memory grew: {len(grew)} measure(s), see above"
    )
    return 1 if grew else 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


def main_exit() -> None:
    """The console script: :func:`main`, and the process ends with its exit code."""
    from tftjax.cli import exit as cli_exit

    cli_exit(main())


if __name__ == "__main__":
    main_exit()
