"""Where a TFT training step spends its time: the share of each block.

    python experiments/profile_step.py [--preset tft225] [--remat full] [--batch-size 64]

Runs the model once with Flax's method interceptor to record every top-level
block's inputs (static/encoder/decoder VSN, static encoders, LSTMs, gate and
enrichment, attention, output gates and head), then times each block's forward
*and* backward pass (``jax.value_and_grad`` of a fixed random projection of its
outputs, w.r.t. its parameters and float inputs) as its own jitted function, plus
the optimizer update and the gather of a batch of windows, beside the whole
jitted train step. Shares are of the whole step; "rest" is what the blocks do not
explain (the loss, gluing, dispatch). Blocks are timed one after the other in one
process: compare shares, not absolute times between runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tftjax.config import TrainConfig, preset
from tftjax.data import epoch_batches, load_dataset, to_device
from tftjax.data.windows import gather
from tftjax.models.tft import TFT
from tftjax.runner.provenance import write_result
from tftjax.training import create_train_state, make_train_step

GROUPS = {  # block name → row of the table
    "static_vsn": "static VSN",
    "encoder_vsn": "encoder VSN",
    "decoder_vsn": "decoder VSN",
    "static_selection": "static encoders (4 GRNs)",
    "static_enrichment": "static encoders (4 GRNs)",
    "static_state_h": "static encoders (4 GRNs)",
    "static_state_c": "static encoders (4 GRNs)",
    "lstm_encoder": "LSTM encoder + decoder",
    "lstm_decoder": "LSTM encoder + decoder",
    "lstm_gate": "LSTM gate + static enrichment GRN",
    "enrichment": "LSTM gate + static enrichment GRN",
    "attention": "attention",
    "attention_gate": "attention gate, position-wise GRN, head",
    "positionwise": "attention gate, position-wise GRN, head",
    "output_gate": "attention gate, position-wise GRN, head",
    "quantiles": "attention gate, position-wise GRN, head",
}


def timeit(fn, *args, repeat: int) -> float:
    out = fn(*args)
    jax.block_until_ready(out)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def record_blocks(cfg, params, inputs, key):
    """(name, unbound module, args, kwargs) of every direct child of the TFT, in call order."""
    calls, seen = [], set()

    def interceptor(next_fun, args, kwargs, ctx):
        mod = ctx.module
        if (
            ctx.method_name == "__call__"
            and mod.scope is not None
            and len(mod.scope.path) == 1
            and mod.name not in seen
        ):
            seen.add(mod.name)  # a remat-wrapped block calls in again, with tracers: shapes only
            shapes = jax.tree.map(
                lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") else a, args
            )
            calls.append((mod.name, mod.clone(parent=None, name=None), shapes, kwargs))
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
        TFT(cfg).apply({"params": params}, *inputs, False, rngs={"dropout": key})
    return calls


def block_fn(module, arrays):
    """value_and_grad of ``Σ r ⊙ outputs`` w.r.t. the block's params and float inputs."""
    is_float = tuple(
        a is not None and all(jnp.issubdtype(x.dtype, jnp.floating) for x in jax.tree.leaves(a))
        for a in arrays
    )

    def loss(p, floats, others, static_args, proj, key):
        fl, ot = iter(floats), iter(others)
        args = [next(fl) if f else next(ot) for f in is_float]
        out = module.apply({"params": p}, *args, *static_args, rngs={"dropout": key})
        return sum(jnp.sum(o * r) for o, r in zip(jax.tree.leaves(out), proj))

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=(3,))
    floats = tuple(a for a, f in zip(arrays, is_float) if f)
    others = tuple(a for a, f in zip(arrays, is_float) if not f)
    return lambda p, static_args, proj, key: fn(p, floats, others, static_args, proj, key)


def time_whole_step(cfg, state, data, batch_idx, key, repeat: int) -> float:
    """The median time of the compiled train step (it donates its state: run on copies)."""
    compiled = make_train_step(cfg).lower(state, data, batch_idx, key).compile()
    whole = []
    st = state
    for i in range(repeat + 1):
        st_in = jax.tree.map(jnp.copy, state) if i == 0 else st
        t0 = time.perf_counter()
        st, m = compiled(st_in, data, batch_idx, key)
        jax.block_until_ready(m)
        if i:
            whole.append(time.perf_counter() - t0)
    return statistics.median(whole)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tft225")
    ap.add_argument("--remat", default="full")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/profile_step.json"))
    args = ap.parse_args()

    cfg = preset(args.preset, remat=args.remat)
    ds = load_dataset(None, cfg.data)
    data = to_device(ds.features)
    tc = TrainConfig(batch_size=args.batch_size)
    state = create_train_state(cfg, tc, jax.random.key(0))
    idx, _ = epoch_batches(ds.splits.train, args.batch_size, seed=0, epoch=1)
    batch_idx = jnp.asarray(idx[0])
    key = jax.random.key(1, impl="rbg")

    t_step = time_whole_step(cfg, state, data, batch_idx, key, args.repeat)

    gathered = jax.jit(gather, static_argnums=(2, 3))
    batch = gathered(data, batch_idx, cfg.data.encoder_steps, cfg.data.decoder_steps)
    t_gather = timeit(
        gathered,
        data,
        batch_idx,
        cfg.data.encoder_steps,
        cfg.data.decoder_steps,
        repeat=args.repeat,
    )
    inputs = (batch.static, batch.historical, batch.known)

    params = state.params
    times: dict[str, float] = defaultdict(float)
    rng = np.random.default_rng(0)
    for name, module, bargs, _kwargs in record_blocks(cfg, params, inputs, jax.random.key(2)):
        arrays = tuple(a for a in bargs if not isinstance(a, bool))
        arrays = jax.tree.map(  # random inputs of the recorded shapes
            lambda s: (
                jnp.asarray(rng.standard_normal(s.shape), s.dtype)
                if s.dtype != jnp.bool_
                else jnp.ones(s.shape, bool)
            ),
            arrays,
        )
        static = tuple(a for a in bargs if isinstance(a, bool))
        out = module.apply(
            {"params": params[name]}, *arrays, *static, rngs={"dropout": jax.random.key(3)}
        )
        proj = [jnp.asarray(rng.standard_normal(o.shape), o.dtype) for o in jax.tree.leaves(out)]
        fn = block_fn(module, arrays)
        times[GROUPS.get(name, name)] += timeit(
            fn, params[name], static, proj, jax.random.key(3), repeat=args.repeat
        )

    grads = jax.tree.map(jnp.ones_like, state.params)
    opt = state.tx

    @jax.jit
    def opt_update(g, s, p):
        return opt.update(g, s, p)

    times["optimizer (AdamW update)"] = timeit(
        opt_update, grads, state.opt_state, state.params, repeat=args.repeat
    )
    times["gather of the batch's windows"] = t_gather
    explained = sum(times.values())

    print(
        f"{args.preset}, --remat {args.remat}, batch {args.batch_size}, on "
        f"{jax.devices()[0].device_kind} ({jax.device_count()} device, "
        f"jax {jax.__version__}); whole jitted step {t_step * 1e3:.0f} ms "
        f"(median of {args.repeat})"
    )
    print("| block (forward + backward) | ms | share of the step |")
    print("|---|---|---|")
    rows = []
    for k, v in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"| {k} | {v * 1e3:.0f} | {100 * v / t_step:.0f}% |")
        rows.append({"block": k, "seconds": v, "share": v / t_step})
    rest = t_step - explained
    print(
        f"| rest (loss, glue, dispatch; negative: blocks overlap less alone) | "
        f"{rest * 1e3:.0f} | {100 * rest / t_step:.0f}% |"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, {"step_s": t_step, "blocks": rows, "rest_s": rest}, args)


if __name__ == "__main__":
    main()
