"""The bar an agent must clear: a cost-aware rule on the TFT's forecast (issue 39).

At each bar the rule reads ``f``, the TFT's median forecast of the cumulative log return over
its horizon (out of fold: :mod:`tftjax.dqn.oof`). It goes long where ``f`` exceeds the entry
threshold, short where ``f`` is below its negative, and holds a position while the forecast
keeps its side beyond the exit threshold (hysteresis: a position is not closed, at a cost,
for a forecast that merely weakens). Both thresholds are in units of the round-trip cost
(``2 · cost`` per unit: in and out), so that a trade is taken only where the forecast pays
for it. The thresholds are chosen on each fold's validation stretch (best Sharpe net of
costs, the larger threshold on a tie) and applied once to its test stretch, through the same
fills, latency, costs and session flattening as the agent (:func:`~tftjax.dqn.env.policy_rollout`).
Where no forecast exists yet the rule is flat.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.dqn.metrics import report_metrics

ENTRY = (0.0, 0.5, 1.0, 2.0, 4.0)
"""Entry thresholds tried, in round-trip costs."""
EXIT = (0.0, 0.5, 1.0)
"""Exit thresholds tried, as a fraction of the entry threshold (1: no hysteresis)."""


def rule_path(forecast: np.ndarray, valid: np.ndarray, entry: float, exit_: float) -> np.ndarray:
    """``[n]`` int32 positions in {-1, 0, 1} decided on each bar's close from flat: long above
    ``entry``, short below ``-entry``; a long is held while the forecast stays above
    ``exit_``, a short while below ``-exit_`` (``exit_ <= entry``); flat without a forecast."""
    f = np.asarray(forecast, np.float64)
    out = np.zeros(f.size, np.int32)
    p = 0
    for t in range(f.size):
        if not valid[t]:
            p = 0
        elif f[t] > entry:
            p = 1
        elif f[t] < -entry:
            p = -1
        elif (p == 1 and f[t] <= exit_) or (p == -1 and f[t] >= -exit_):
            p = 0
        out[t] = p
    return out


def split_path(
    env, forecast: np.ndarray, valid: np.ndarray, entry: float, exit_: float
) -> np.ndarray:
    """The rule's decisions over ``env``'s pass (``[env.decisions]``, from flat at its first
    bar), from the forecasts at the file's rows."""
    rows = slice(env.first_decision, env.first_decision + env.decisions)
    return rule_path(forecast[rows], valid[rows], entry, exit_)


def run_path(env, path: np.ndarray) -> dict:
    """:func:`~tftjax.dqn.metrics.report_metrics` of a decision path through ``env`` with
    the net returns (``"net"``) and positions held (``"held"``)."""
    from tftjax.dqn.env import policy_rollout

    held, net, _ = jax.device_get(policy_rollout(env, jnp.asarray(path, jnp.int32)))
    m = report_metrics(net, held, env.annualisation, float(env.cost))
    return {**m, "net": np.asarray(net), "held": np.asarray(held)}


def choose(val_env, forecast: np.ndarray, valid: np.ndarray) -> dict:
    """The thresholds of best validation Sharpe over :data:`ENTRY` × :data:`EXIT` (ties: the
    larger entry, then the larger exit: less trading), and every candidate's score."""
    round_trip = 2.0 * float(val_env.cost)
    scores = []
    for c, h in itertools.product(ENTRY, EXIT):
        entry = c * round_trip
        m = run_path(val_env, split_path(val_env, forecast, valid, entry, h * entry))
        scores.append(
            {"entry_costs": c, "exit_fraction": h, "val_sharpe": m["sharpe"], "val_net": m["net"]}
        )
    best = max(scores, key=lambda s: (s["val_sharpe"], s["entry_costs"], s["exit_fraction"]))
    return {
        "entry_costs": best["entry_costs"],
        "exit_fraction": best["exit_fraction"],
        "val_sharpe": best["val_sharpe"],
        "val_net": best["val_net"],
        "candidates": len(scores),
        "val_sharpes": [s["val_sharpe"] for s in scores],
    }


def trade(env, forecast: np.ndarray, valid: np.ndarray, chosen: dict) -> dict:
    """The rule with ``chosen`` thresholds over ``env``'s pass (e.g. a fold's test)."""
    entry = chosen["entry_costs"] * 2.0 * float(env.cost)
    return run_path(env, split_path(env, forecast, valid, entry, chosen["exit_fraction"] * entry))


def walk_forward_rule(cfg, path, times: list, blocks: list) -> dict:
    """The rule over a walk-forward (:func:`~tftjax.data.windows.walk_forward_times` ``times``)
    on out-of-fold forecasts (:func:`tftjax.dqn.oof.build` ``blocks``): each fold's thresholds
    chosen on its validation stretch, its test stretch traded once, the test records
    stitched. Returns ``{"net", "held", "folds", "annualisation", "cost"}``."""
    from tftjax.dqn.env import TradingEnv
    from tftjax.dqn.loop import build_envs
    from tftjax.dqn.oof import for_fold

    nets, helds, folds = [], [], []
    for fold in times:
        envs, ds, _ = build_envs(cfg, path, fold=fold)
        assert ds is not None  # trading: bars
        f = for_fold(blocks, ds.bars.ts, fold[0])
        chosen = choose(envs["val"], f["cum"], f["valid"])
        res = trade(envs["test"], f["cum"], f["valid"], chosen)
        nets.append(res["net"])
        helds.append(res["held"])
        folds.append(
            {k: v for k, v in chosen.items() if k != "val_net"} | {"test_sharpe": res["sharpe"]}
        )
    test = envs["test"]
    assert isinstance(test, TradingEnv)
    return {
        "net": np.concatenate(nets),
        "held": np.concatenate(helds),
        "folds": folds,
        "annualisation": test.annualisation,
        "cost": float(test.cost),
    }
