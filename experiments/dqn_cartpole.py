"""The DQN agent and loop on gymnax CartPole-v1: speed and time to a greedy return of 475.

    python experiments/dqn_cartpole.py [--seeds 5] [--epochs 30] [--out experiments/results/dqn_cartpole]

Runs the same agent, loop and jitted epoch function as ``python -m tftjax.dqn
--env cartpole`` (the ``cartpole`` preset of ``tftjax.config.DQN_PRESETS``)
for each seed. After every epoch (10,000 env steps) it evaluates the greedy
policy on 10 episodes. It reports per seed:

- env steps/s excluding compile (epoch calls only) and including compile
  (first compile of the epoch function added, as a one-seed run pays it);
- wall time (compile included) and env steps until the greedy mean return
  first reaches 475, and the greedy return at the end and at its best;

and, PureJaxRL's trick, all seeds at once: ``jax.vmap`` of the whole run in
one jit (steps/s summed over seeds). Writes ``dqn_cartpole.json`` and
``dqn_cartpole.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import jax
import numpy as np

from tftjax.dqn.cartpole import EVAL_EPISODES, greedy_episodes, make_cartpole
from tftjax.dqn.config import DQN_PRESETS
from tftjax.dqn.train import iterations_per_epoch, make_train
from tftjax.runner.provenance import write_result

TARGET = 475.0
_many = None


def evaluate_many(params, env, key, n: int = 100):
    return _many(params, env, key)


def one_seed(dqn, env, seed: int, epochs: int, evaluate, compile_s: float, compiled) -> dict:
    cfg = dqn.cfg
    steps_per_epoch = iterations_per_epoch(cfg) * cfg.num_envs
    t0 = time.perf_counter()
    state = dqn.init(jax.random.PRNGKey(seed), env)
    jax.block_until_ready(state)
    train_s, curve, hit = 0.0, [], None
    eval_key = jax.random.PRNGKey(10_000 + seed)
    best, best_params, best_epoch = None, None, 0
    for epoch in range(1, epochs + 1):
        t = time.perf_counter()
        state, _ = compiled(state, env)
        jax.block_until_ready(state)
        train_s += time.perf_counter() - t
        # fresh episodes every epoch: no epoch is chosen on the episodes it is scored on
        ret = float(
            np.mean(np.asarray(evaluate(state.params, env, jax.random.fold_in(eval_key, epoch))))
        )
        wall = compile_s + time.perf_counter() - t0
        curve.append(
            {
                "epoch": epoch,
                "env_steps": epoch * steps_per_epoch,
                "wall_s": wall,
                "greedy_return": ret,
            }
        )
        if hit is None and ret >= TARGET:
            hit = curve[-1]
        smoothed = float(np.mean([c["greedy_return"] for c in curve[-cfg.smooth_epochs :]]))
        if best is None or smoothed > best:  # the loop's selection: the smoothed score
            best, best_epoch = smoothed, epoch
            best_params = jax.device_get(state.params)
    steps = epochs * steps_per_epoch
    # the selected agent and the last one, each on 100 episodes no evaluation has seen
    fresh = jax.random.PRNGKey(77_777 + seed)
    shipped = np.asarray(evaluate_many(best_params, env, fresh))
    last = np.asarray(evaluate_many(state.params, env, fresh))
    tail = [c["greedy_return"] for c in curve[-10:]]
    return {
        "seed": seed,
        "steps_per_s_excl_compile": steps / train_s,
        "steps_per_s_incl_compile": steps / (train_s + compile_s),
        "time_to_475_s": hit["wall_s"] if hit else None,
        "steps_to_475": hit["env_steps"] if hit else None,
        "final_greedy_return": curve[-1]["greedy_return"],
        "best_greedy_return": max(c["greedy_return"] for c in curve),
        "selected_epoch": best_epoch,
        "selected_fresh_return": float(shipped.mean()),
        "selected_fresh_min": float(shipped.min()),
        "last_fresh_return": float(last.mean()),
        "last10_at_475": float(np.mean([r >= TARGET for r in tail])),
        "curve": curve,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=None, help="default: the preset's")
    ap.add_argument("--out", type=Path, default=Path("experiments/results/dqn_cartpole"))
    args = ap.parse_args()
    cfg = DQN_PRESETS["cartpole"]
    if args.epochs:
        cfg = dataclasses.replace(cfg, epochs=args.epochs)
    env = make_cartpole(cfg.reward_scale)
    dqn = make_train(cfg, env)
    t = time.perf_counter()
    probe = dqn.init(jax.random.PRNGKey(0), env)
    compiled = dqn.epoch.lower(probe, env).compile()
    compile_s = time.perf_counter() - t
    evaluate = jax.jit(lambda p, e, k: greedy_episodes(dqn.apply, p, e, k, EVAL_EPISODES))
    global _many
    _many = jax.jit(lambda p, e, k: greedy_episodes(dqn.apply, p, e, k, 100))
    evaluate(probe.params, env, jax.random.PRNGKey(0)).block_until_ready()
    print(
        f"CartPole-v1, {jax.devices()[0].platform}: {cfg.num_envs} envs, "
        f"{iterations_per_epoch(cfg) * cfg.num_envs:,} env steps per epoch, {cfg.epochs} epochs; "
        f"compile of the epoch step {compile_s:.2f} s"
    )
    rows = [
        one_seed(dqn, env, s, cfg.epochs, evaluate, compile_s, compiled) for s in range(args.seeds)
    ]

    # All seeds in one jit: vmap of the whole run (PureJaxRL style).
    keys = jax.vmap(jax.random.PRNGKey)(np.arange(args.seeds))
    t = time.perf_counter()
    vtrain = jax.jit(jax.vmap(dqn.train)).lower(keys).compile()
    v_compile = time.perf_counter() - t
    t = time.perf_counter()
    vstate, _ = vtrain(keys)
    jax.block_until_ready(vstate)
    v_run = time.perf_counter() - t
    v_steps = args.seeds * cfg.epochs * iterations_per_epoch(cfg) * cfg.num_envs
    v_returns = [
        float(
            np.mean(
                np.asarray(
                    evaluate(
                        jax.tree.map(lambda x: x[i], vstate.params),
                        env,
                        jax.random.PRNGKey(10_000 + i),
                    )
                )
            )
        )
        for i in range(args.seeds)
    ]

    fmt = lambda x, f: "not reached" if x is None else format(x, f)
    print(
        "| seed | steps/s (excl. compile) | steps/s (incl. compile) | time to 475 (incl. compile) "
        "| env steps to 475 | selected epoch (5-epoch mean) | its return, 100 fresh episodes "
        "(worst) | last epoch's, fresh | last 10 evaluations at 475+ |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['steps_per_s_excl_compile']:,.0f} | "
            f"{r['steps_per_s_incl_compile']:,.0f} | {fmt(r['time_to_475_s'], '.1f')} s | "
            f"{fmt(r['steps_to_475'], ',')} | {r['selected_epoch']} | "
            f"{r['selected_fresh_return']:.1f} ({r['selected_fresh_min']:.0f}) | "
            f"{r['last_fresh_return']:.1f} | {r['last10_at_475']:.0%} |"
        )
    ok = sum(r["selected_fresh_return"] >= TARGET for r in rows)
    print(
        f"{ok}/{len(rows)} seeds: the selected agent's greedy return over 100 fresh episodes "
        f">= {TARGET:.0f}"
    )
    print(
        f"all {args.seeds} seeds in one jit (vmap): {v_steps / v_run:,.0f} env steps/s summed "
        f"({v_run:.1f} s run + {v_compile:.1f} s compile); final greedy returns "
        f"{', '.join(f'{x:.0f}' for x in v_returns)}"
    )

    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "config": cfg.to_json(),
        "compile_s": compile_s,
        "seeds": rows,
        "vmap": {
            "seeds": args.seeds,
            "compile_s": v_compile,
            "run_s": v_run,
            "steps_per_s": v_steps / v_run,
            "final_greedy_returns": v_returns,
        },
    }
    write_result(args.out / "dqn_cartpole.json", result, args)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        ax.plot(
            [c["wall_s"] for c in r["curve"]],
            [c["greedy_return"] for c in r["curve"]],
            "o-",
            ms=3,
            label=f"seed {r['seed']}",
        )
    ax.axhline(TARGET, color="grey", ls="--", lw=0.8)
    ax.set(
        xlabel="wall time incl. compile (s)",
        ylabel="greedy return (10 episodes)",
        title="DQN on gymnax CartPole-v1",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "dqn_cartpole.png", dpi=110)
    print(f"wrote {args.out}/dqn_cartpole.json and dqn_cartpole.png")


if __name__ == "__main__":
    main()
