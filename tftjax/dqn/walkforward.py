"""``python -m tftjax.dqn --folds K``: the DQN walk-forward, as the TFT's
(:mod:`tftjax.backtest`): the last ``--test-fraction`` of the bars cut into K consecutive test
stretches; fold k trains ``--seeds`` agents from scratch on every bar before its own
validation stretch (feature statistics and the reward scale from those rows), selects each
on that validation stretch, and trades its test stretch once, from flat. The folds' test
stretches tile the test region; each seed's out-of-sample net returns are stitched across
folds into one equity curve, scored pooled (Sharpe with its SE and PSR, return, drawdown,
turnover, costs) beside the baselines stitched the same way.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import numpy as np

from tftjax.config import ConfigError
from tftjax.dqn.config import DQNConfig
from tftjax.dqn.env import greedy_rollout, policy_rollout
from tftjax.dqn.metrics import report_metrics, trading_metrics
from tftjax.dqn.seeds import SHOWN, _fmt, baseline_paths, gates, pooled_lines, train_seeds
from tftjax.dqn.significance import min_detectable_sharpe, pooled


def check_plan(folds: int, test_fraction: float, seeds: int, workdir: Path) -> None:
    """Refuse a walk-forward that cannot run, before anything is read (one line)."""
    if folds < 2:
        raise ConfigError(f"--folds must be >= 2 (a walk-forward needs several), got {folds}")
    if not 0 < test_fraction < 1:
        raise ConfigError(f"--test-fraction must be in (0, 1), got {test_fraction}")
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    if workdir.exists() and any(workdir.iterdir()):
        raise ConfigError(f"--workdir {workdir} is not empty; choose a new folder")


def walk_forward(
    cfg: DQNConfig,
    seeds: int,
    parquet_file,
    workdir: Path,
    folds: int = 5,
    test_fraction: float = 0.4,
    log=print,
    extra=None,
    keep_records: bool = False,
) -> dict:
    """Every fold's agents and test trades; the pooled report (``walk_forward.json`` and
    ``.md`` in ``workdir``). ``extra``: a function ``(fold index, fold times, dataset) ->
    [n, k]`` more observation columns for that fold (out-of-fold forecasts,
    :mod:`tftjax.dqn.oof`), in place of ``--tft-checkpoint``'s. ``keep_records``: the
    returned dict (not the file) also holds the stitched records, net returns and positions
    held: ``shipped_records`` and ``agent_records`` per seed, ``baseline_records``."""
    from tftjax.data import default_parquet
    from tftjax.data.bars import read_series
    from tftjax.data.windows import walk_forward_times
    from tftjax.dqn.env import TradingEnv
    from tftjax.dqn.loop import build_envs, data_config

    workdir = Path(workdir)
    check_plan(folds, test_fraction, seeds, workdir)
    path = parquet_file or default_parquet()
    ts = [b.ts for b in read_series(path)]
    if len(ts) != 1:
        raise ConfigError(f"{path}: the DQN trades one series; this file holds {len(ts)}")
    times = walk_forward_times(ts, data_config(cfg), folds, test_fraction)
    nets, helds = [[] for _ in range(seeds)], [[] for _ in range(seeds)]  # shipped
    agent_nets, agent_helds = [[] for _ in range(seeds)], [[] for _ in range(seeds)]
    base_parts: dict[str, list] = {}
    fold_out = []
    cost = annual = None
    for k, fold in enumerate(times, 1):
        columns = None if extra is None else (lambda ds, k=k, fold=fold: extra(k - 1, fold, ds))
        envs, ds, fcfg = build_envs(cfg, path, fold=fold, extra=columns)
        dqn, params, best, best_epoch, history = train_seeds(fcfg, seeds, envs, log=lambda *a: None)
        test, val = envs["test"], envs["val"]
        assert isinstance(test, TradingEnv) and isinstance(val, TradingEnv)  # trading
        cost, annual = float(test.cost), test.annualisation
        rollout = jax.jit(jax.vmap(functools.partial(greedy_rollout, dqn.apply), in_axes=(0, None)))
        _, val_net, _ = jax.device_get(rollout(params, val))
        fold_gates = gates(val_net, history, fcfg, val.annualisation)
        held, net, _ = jax.device_get(rollout(params, test))
        ship = [g["passes"] or not fcfg.flat_fallback for g in fold_gates]
        for i in range(seeds):  # the shipped policy trades the test stretch
            agent_nets[i].append(net[i])
            agent_helds[i].append(held[i])
            nets[i].append(net[i] if ship[i] else np.zeros_like(net[i]))
            helds[i].append(held[i] if ship[i] else np.zeros_like(held[i]))
        turnover = float(
            np.mean([trading_metrics(net[i], held[i], 1.0)["turnover"] for i in range(seeds)])
        )
        for name, path_pos in baseline_paths(test, turnover).items():
            h, n, _ = jax.device_get(policy_rollout(test, jax.numpy.asarray(path_pos)))
            base_parts.setdefault(name, []).append((h, n))
        fold_out.append(
            {
                "fold": k,
                "test_from": str(np.datetime64(int(fold[1]), "ns")) + "Z",
                "test_bars": int(test.decisions),
                "best_epoch": best_epoch,
                "best_val_smoothed": best,
                "candidates": fold_gates[0]["trials"],
                "val_dsr": [g["dsr"] for g in fold_gates],
                "shipped": ["dqn" if s else "flat" for s in ship],
                "test_sharpe": [
                    trading_metrics(nets[i][-1], helds[i][-1], annual)["sharpe"]
                    for i in range(seeds)
                ],
            }
        )
        log(
            f"fold {k}/{folds}: test from {fold_out[-1]['test_from'][:16]} UTC, "
            f"{test.decisions} bars; shipped {fold_out[-1]['shipped']}"
        )
    assert cost is not None and annual is not None  # at least two folds ran
    per_seed = [
        report_metrics(np.concatenate(nets[i]), np.concatenate(helds[i]), annual, cost)
        for i in range(seeds)
    ]
    agents = [
        report_metrics(np.concatenate(agent_nets[i]), np.concatenate(agent_helds[i]), annual, cost)
        for i in range(seeds)
    ]
    base = {
        name: report_metrics(
            np.concatenate([n for _, n in parts]),
            np.concatenate([h for h, _ in parts]),
            annual,
            cost,
        )
        for name, parts in base_parts.items()
    }
    hold = base["buy_and_hold"]["total_log_return"]
    stitched = sum(len(n) for n in nets[0])
    out = {
        "folds": fold_out,
        "per_seed": per_seed,
        "agents": agents,
        "baselines": base,
        "pooled": {
            "shipped": pooled([np.concatenate(n) for n in nets], annual),
            "agent": pooled([np.concatenate(n) for n in agent_nets], annual),
        },
        "test_bars": stitched,
        "annualisation": annual,
        "min_detectable_sharpe": min_detectable_sharpe(stitched, annual),
        "counts": {
            "seeds": seeds,
            "beats_flat": int(sum(m["total_log_return"] > 0 for m in per_seed)),
            "beats_buy_and_hold": int(sum(m["total_log_return"] > hold for m in per_seed)),
        },
        "config": cfg.to_json(),
    }
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "walk_forward.json").write_text(json.dumps(out, indent=1))
    text = format_walk_forward(out)
    (workdir / "walk_forward.md").write_text(text + "\n")
    log(text)
    if keep_records:
        out["shipped_records"] = {
            "net": [np.concatenate(n) for n in nets],
            "held": [np.concatenate(h) for h in helds],
        }
        out["agent_records"] = {
            "net": [np.concatenate(n) for n in agent_nets],
            "held": [np.concatenate(h) for h in agent_helds],
        }
        out["baseline_records"] = {
            name: (np.concatenate([n for _, n in parts]), np.concatenate([h for h, _ in parts]))
            for name, parts in base_parts.items()
        }
    return out


def format_walk_forward(out: dict) -> str:
    """Markdown: each seed's stitched out-of-sample record, mean ± sd, the baselines."""
    lines = [
        f"walk-forward, {len(out['folds'])} folds, test stretches stitched; net of costs",
        "| policy | " + " | ".join(SHOWN) + " |",
        "|---|" + "---|" * len(SHOWN),
    ]
    for kind, rows in (("agent", out["agents"]), ("shipped", out["per_seed"])):
        for i, m in enumerate(rows):
            lines.append(
                f"| seed {out['config']['seed'] + i} ({kind}) | "
                + " | ".join(_fmt(k, m[k]) for k in SHOWN)
                + " |"
            )
        vals = {k: np.array([m[k] for m in rows]) for k in SHOWN}
        lines.append(
            f"| **mean ± sd, {kind}** | "
            + " | ".join(
                f"{_fmt(k, vals[k].mean())} ± "
                f"{_fmt(k, vals[k].std(ddof=1) if vals[k].size > 1 else 0.0, sd=True)}"
                for k in SHOWN
            )
            + " |"
        )
    for name, m in out["baselines"].items():
        lines.append(f"| {name} | " + " | ".join(_fmt(k, m[k]) for k in SHOWN) + " |")
    lines += pooled_lines(out["pooled"])
    lines.append(
        f"{out['test_bars']:,} test bars stitched: they detect an annualised Sharpe "
        f"of {out['min_detectable_sharpe']:.2f} or more (5% one-sided, 80% power); "
        "each fold's agents were gated on validation against "
        f"{out['folds'][0]['candidates']} candidates (epochs ranked x seeds)"
    )
    c = out["counts"]
    lines.append(
        f"out of sample, {c['beats_flat']}/{c['seeds']} seeds beat flat and "
        f"{c['beats_buy_and_hold']}/{c['seeds']} beat buy-and-hold (total net log return)"
    )
    return "\n".join(lines)
