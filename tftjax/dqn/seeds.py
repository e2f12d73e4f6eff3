"""``python -m tftjax.dqn --seeds N``: N agents (seeds ``seed .. seed+N-1``) trained in one
vmapped program, each selected on its own smoothed validation Sharpe, and a report of
what a single seed cannot show: per seed and mean ± sd, the Sharpe with its standard
error (Lo 2002) and probabilistic Sharpe ratio, return, drawdown, turnover, costs paid,
and how many seeds beat flat and buy-and-hold on test; beside the baselines every seed
faces alike (buy-and-hold, flat, one-bar momentum and reversal, random at the agent's
turnover), all through the same fills, costs and session flattening.

Every seed trains every epoch (no early stop: the seeds share one program); seed ``i``'s
agent is that of its epoch of best ``--smooth-epochs`` mean validation Sharpe, exactly what
``python -m tftjax.dqn --seed (seed+i) --patience 0`` keeps (tested), and flat is shipped
for a seed whose best does not beat flat's (unless ``--no-flat-fallback``).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.config import ConfigError
from tftjax.dqn.config import DQNConfig
from tftjax.dqn.env import greedy_rollout, policy_rollout
from tftjax.dqn.metrics import report_metrics, trading_metrics

SHOWN = ("sharpe", "sharpe_se", "psr", "total_log_return", "max_drawdown", "turnover", "costs_paid")


def run_seeds(cfg: DQNConfig, seeds: int, workdir: Path, parquet_file=None, log=print) -> dict:
    """Train ``seeds`` agents in one vmapped program; the report (``seeds.json``,
    ``seeds.md``) and the agents (``checkpoints/dqn_seeds_final_epoch{N}``, stacked)."""
    from tftjax.dqn.loop import build_envs
    from tftjax.runner.checkpoints import EpochCheckpointer
    from tftjax.runner.provenance import provenance

    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    if cfg.env != "trading":
        raise ConfigError(
            "--seeds is for --env trading (CartPole's seeds: experiments/dqn_cartpole.py)"
        )
    workdir = Path(workdir)
    if workdir.exists() and any(workdir.iterdir()):
        raise ConfigError(f"--workdir {workdir} is not empty; choose a new folder")
    envs, ds, cfg = build_envs(cfg, parquet_file)
    assert ds is not None  # trading: bars
    workdir.mkdir(parents=True, exist_ok=True)
    dqn, stacked, best, best_epoch, history = train_seeds(cfg, seeds, envs, log)
    cfg = dqn.cfg
    report = evaluate_seeds(dqn, envs, stacked, best, best_epoch, cfg, history)
    report.update(
        config=cfg.to_json(),
        seeds=seeds,
        history=history,
        data=ds.identity(workdir),
        provenance=provenance(),
    )
    ck = EpochCheckpointer(workdir / "checkpoints", "dqn_seeds")
    try:
        ck.save_final(
            cfg.epochs,
            stacked,
            {
                "kind": "dqn_seeds",
                "config": cfg.to_json(),
                "best_epoch": best_epoch,
                "shipped": report["shipped"],
            },
        )
    finally:
        ck.close()
    (workdir / "seeds.json").write_text(json.dumps(report, indent=1))
    text = format_seeds(report)
    (workdir / "seeds.md").write_text(text + "\n")
    log(text)
    return report


def train_seeds(cfg: DQNConfig, seeds: int, envs: dict, log=print):
    """``(dqn, stacked best params, best smoothed scores, best epochs, val Sharpe history)``
    of ``seeds`` agents trained in one vmapped program on ``envs["train"]``, each selected on
    its own smoothed validation Sharpe on ``envs["val"]``."""
    from tftjax.dqn.train import make_train

    env = envs["train"]
    dqn = make_train(cfg, env)
    cfg = dqn.cfg
    keys = jnp.stack([jax.random.PRNGKey(cfg.seed + i) for i in range(seeds)])
    state = jax.jit(jax.vmap(dqn.init, in_axes=(0, None)))(keys, env)
    epoch = jax.jit(jax.vmap(dqn.epoch, in_axes=(0, None)))
    val = envs["val"]
    rollout = jax.jit(jax.vmap(lambda p, e: greedy_rollout(dqn.apply, p, e), in_axes=(0, None)))
    history = [[] for _ in range(seeds)]
    best: list[float | None] = [None] * seeds
    best_epoch = [0] * seeds
    best_params = [None] * seeds
    w = min(cfg.smooth_epochs, cfg.epochs)  # only full windows compete
    log(
        f"{seeds} seeds ({cfg.seed} … {cfg.seed + seeds - 1}) in one program, {cfg.epochs} "
        f"epochs each, selected on the {w}-epoch mean validation Sharpe"
    )
    for e in range(1, cfg.epochs + 1):
        state, m = epoch(state, env)
        held, net, _ = jax.device_get(rollout(state.params, val))
        for i in range(seeds):
            history[i].append(trading_metrics(net[i], held[i], val.annualisation)["sharpe"])
            if e < w:
                continue
            score = float(np.mean(history[i][-w:]))
            if (b := best[i]) is None or score > b:
                best[i], best_epoch[i] = score, e
                best_params[i] = jax.device_get(jax.tree.map(lambda x, i=i: x[i], state.params))
        log(f"epoch {e}/{cfg.epochs}: val Sharpe " + " ".join(f"{h[-1]:+.2f}" for h in history))
    return dqn, jax.tree.map(lambda *x: np.stack(x), *best_params), best, best_epoch, history


def gates(val_nets, history: list[list[float]], cfg: DQNConfig, annualisation: float) -> list[dict]:
    """Each seed's :func:`~tftjax.dqn.significance.gate` on its validation record
    ``val_nets[i]``, deflated by every candidate compared: the ranked epochs of every seed
    (their per-epoch validation Sharpes give the candidates' spread)."""
    from tftjax.dqn.significance import gate

    w = min(cfg.smooth_epochs, cfg.epochs)
    ranked = np.asarray([h[w - 1 :] for h in history], np.float64) / np.sqrt(annualisation)
    return [
        gate(val_nets[i], ranked.size, ranked.reshape(-1), cfg.psr_gate)
        for i in range(len(val_nets))
    ]


def evaluate_seeds(
    dqn,
    envs: dict,
    params,
    best: list,
    best_epoch: list,
    cfg: DQNConfig,
    history: list[list[float]],
) -> dict:
    """Per seed (agent and shipped policy) and baseline metrics on validation and test; an
    agent is shipped where its validation record clears the gate (:func:`gates`)."""
    seeds = len(best)
    out = {"per_seed": [], "baselines": {}, "best_epoch": best_epoch, "best_val_smoothed": best}
    ship = None
    for split in ("val", "test"):
        env = envs[split]
        roll = jax.jit(jax.vmap(lambda p, env=env: greedy_rollout(dqn.apply, p, env)))
        held, net, nxt = jax.device_get(roll(params))
        if ship is None:
            out["gates"] = gates(net, history, cfg, env.annualisation)
            out["candidates"] = out["gates"][0]["trials"]
            ship = [g["passes"] or not cfg.flat_fallback for g in out["gates"]]
            out["shipped"] = ["dqn" if s else "flat" for s in ship]
        cost = float(env.cost)
        flat = report_metrics(
            np.zeros(net.shape[1]), np.zeros(net.shape[1]), env.annualisation, cost
        )
        base = baselines(
            env,
            cost,
            turnover=float(
                np.mean([trading_metrics(net[i], held[i], 1.0)["turnover"] for i in range(seeds)])
            ),
        )
        out["baselines"][split] = base
        for i in range(seeds):
            agent = report_metrics(net[i], held[i], env.annualisation, cost)
            if split == "val":
                out["per_seed"].append({"seed": cfg.seed + i, "best_epoch": best_epoch[i]})
            row = out["per_seed"][i]
            row[split] = {"agent": agent, "shipped": agent if ship[i] else flat}
        if split == "test":
            from tftjax.dqn.significance import min_detectable_sharpe, pooled

            out["pooled"] = {
                "agent": pooled(list(net), env.annualisation),
                "shipped": pooled(
                    [net[i] if ship[i] else np.zeros_like(net[i]) for i in range(seeds)],
                    env.annualisation,
                ),
            }
            out["min_detectable_sharpe"] = min_detectable_sharpe(net.shape[1], env.annualisation)
    hold = out["baselines"]["test"]["buy_and_hold"]["total_log_return"]
    out["counts"] = {"seeds": seeds, "shipped_agent": int(sum(ship))}
    for kind in ("agent", "shipped"):
        test = [r["test"][kind]["total_log_return"] for r in out["per_seed"]]
        out["counts"][f"{kind}_beats_flat_on_test"] = int(sum(t > 0 for t in test))
        out["counts"][f"{kind}_beats_buy_and_hold_on_test"] = int(sum(t > hold for t in test))
    return out


def baseline_paths(env, turnover: float, seed: int = 0) -> dict:
    """The decision paths (``[decisions]`` int32) of buy-and-hold, flat, one-bar momentum (the
    sign of the last bar's return), reversal (its opposite) and a random policy whose
    position changes at ``turnover``: at each bar, with probability ``q``, a uniformly drawn
    other position (a switch moves 4/3 units on average, so ``q = turnover · 3/4``)."""
    t = env.first_decision + np.arange(env.decisions)
    last = np.sign(np.asarray(env.gap + env.intra)[t]).astype(np.int32)
    rng = np.random.default_rng(seed)
    q = min(1.0, turnover * 0.75)
    rand = np.empty(t.size, np.int32)
    p = 0
    for k in range(t.size):
        if rng.random() < q:
            p = rng.choice([x for x in (-1, 0, 1) if x != p])
        rand[k] = p
    return {
        "buy_and_hold": np.ones(t.size, np.int32),
        "flat": np.zeros(t.size, np.int32),
        "momentum": last,
        "reversal": -last,
        "random (matched turnover)": rand,
    }


def baselines(env, cost: float, turnover: float, seed: int = 0) -> dict:
    """:func:`baseline_paths`' metrics, each through the environment's fills and costs."""
    out = {}
    for name, path in baseline_paths(env, turnover, seed).items():
        held, net, _ = jax.device_get(policy_rollout(env, jnp.asarray(path)))
        out[name] = report_metrics(net, held, env.annualisation, cost)
    return out


def _fmt(k: str, v: float, sd: bool = False) -> str:
    if k == "max_drawdown":
        return f"{v:.2%}"
    if k in ("psr", "turnover"):
        return f"{v:.3f}"
    if k in ("total_log_return", "costs_paid"):
        return f"{v:+.4f}" if k == "total_log_return" and not sd else f"{v:.4f}"
    return f"{v:+.2f}" if k == "sharpe" and not sd else f"{v:.2f}"


def pooled_lines(pooled: dict) -> list[str]:
    """The agents' and the shipped policies' pooled figures (the seeds that traded), a line
    each."""
    return [
        f"{kind}, the {p['seeds_trading']} seeds that traded pooled (equal-weight mix): "
        f"Sharpe {p['pooled_sharpe']:+.2f}, SE {p['pooled_se']:.2f}, PSR "
        f"{p['pooled_psr']:.3f}; {p['seeds_flat']} seed(s) never held a position"
        for kind, p in ((k, pooled[k]) for k in ("agent", "shipped"))
    ]


def format_seeds(report: dict) -> str:
    """Markdown: per seed, mean ± sd over seeds, the baselines, and the counts (test)."""
    head = "| policy | " + " | ".join(SHOWN) + " |"
    lines = [
        "test split, net of costs; Sharpe annualised, SE by Lo (2002), PSR against 0",
        head,
        "|---|" + "---|" * len(SHOWN),
    ]
    for r in report["per_seed"]:
        for kind in ("agent", "shipped"):
            m = r["test"][kind]
            name = (
                f"seed {r['seed']} agent (epoch {r['best_epoch']})"
                if kind == "agent"
                else f"seed {r['seed']} shipped ({'agent' if m is r['test']['agent'] else 'flat'})"
            )
            lines.append(f"| {name} | " + " | ".join(_fmt(k, m[k]) for k in SHOWN) + " |")
    for kind in ("agent", "shipped"):
        vals = {k: np.array([r["test"][kind][k] for r in report["per_seed"]]) for k in SHOWN}
        lines.append(
            f"| **mean ± sd, {kind}** | "
            + " | ".join(
                f"{_fmt(k, vals[k].mean())} ± "
                f"{_fmt(k, vals[k].std(ddof=1) if vals[k].size > 1 else 0.0, sd=True)}"
                for k in SHOWN
            )
            + " |"
        )
    for name, m in report["baselines"]["test"].items():
        lines.append(f"| {name} | " + " | ".join(_fmt(k, m[k]) for k in SHOWN) + " |")
    lines += pooled_lines(report["pooled"])
    lines.append(
        f"this test stretch detects an annualised Sharpe of "
        f"{report['min_detectable_sharpe']:.2f} or more (5% one-sided, 80% power)"
    )
    c = report["counts"]
    n = c["seeds"]
    lines.append(
        f"{c['shipped_agent']}/{n} seeds clear the validation gate (deflated Sharpe "
        f">= {report['config']['psr_gate']:g} over {report['candidates']} candidates: "
        f"epochs ranked x seeds; their agent is shipped). On test (total net log return): agents beat flat "
        f"{c['agent_beats_flat_on_test']}/{n}, buy-and-hold "
        f"{c['agent_beats_buy_and_hold_on_test']}/{n}; shipped policies beat flat "
        f"{c['shipped_beats_flat_on_test']}/{n}, buy-and-hold "
        f"{c['shipped_beats_buy_and_hold_on_test']}/{n}"
    )
    return "\n".join(lines)
