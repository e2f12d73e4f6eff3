"""Environments for the DQN, in pure JAX: a bar-by-bar trading environment and
gymnax CartPole-v1 (for verifying the agent), behind one small interface.

Trading (:class:`TradingEnv`): at bar ``t`` the agent sees the last ``W``
rows of a compact, causal feature subset (rows ``t-W+1 .. t``; every feature
at a row depends only on bars up to it) and its current position, one-hot.
It picks ``a ∈ {0: short, 1: flat, 2: long}``, i.e. the position
``p' = a - 1`` held from ``t`` to ``t+1``, and earns

    reward = p' · r_{t+1} − cost · |p' − p|,    r_{t+1} = log(c_{t+1} / c_t),

``cost`` being ``cost_bps · 1e-4`` per unit of position change (a flip from
short to long pays twice). The learning reward is that times
``reward_scale`` (1e4: basis points, so that Q-values are O(1)); every
reported figure uses the raw log return. Episodes are random contiguous
segments of ``episode_len`` decisions inside one split's rows, starting
flat; they end by time limit (never terminal: the target bootstraps
through), and the environment resets itself.

Both environments implement ``reset(key) -> (obs, state)`` and
``step(key, state, action) -> Step`` for one episode (the training loop vmaps
them over parallel episodes), and what the host loop asks of them:
``default_steps_per_epoch``, ``score_name``, ``evaluate(apply_fn, params, key)``
(greedy metrics), ``baselines()`` and ``rollout(apply_fn, params)`` (for the
equity plot; ``None`` where there is no equity).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tftjax.config import ConfigError
from tftjax.data.features import CLIP, HISTORICAL_NAMES, KNOWN_NAMES

NUM_POSITIONS = 3  # short, flat, long
R1 = "r1"
"""Feature name of the normalised 1-bar log return ``r_t / std`` (clipped to ±10)."""
DEFAULT_FEATURES = (R1, "ret_5", "ret_20", "ret_60", "rvol_10", "rvol_60", "clv_20", "vz_20",
                    "rsi_13", "sma_30", "tod_sin", "tod_cos")  # fmt: skip
_YEAR_NS = 365.25 * 86400 * 1e9


class Step(NamedTuple):
    obs: jax.Array  # observation to act on next (after an auto-reset)
    next_obs: jax.Array  # the true next observation s' (before any reset)
    state: Any
    reward: jax.Array  # learning reward (scaled)
    raw_reward: jax.Array  # unscaled (log return for trading)
    terminal: jax.Array  # float32, 1.0 only for a real terminal state
    done: jax.Array  # bool, the episode ended (terminal or time limit)


# ------------------------------------------------------------------ trading
def feature_names() -> tuple[str, ...]:
    return (R1,) + HISTORICAL_NAMES + KNOWN_NAMES


def select_features(features, names: tuple[str, ...], source: str = "features") -> np.ndarray:
    """``[n, len(names)]`` float32 columns of a :class:`~tftjax.data.FeatureSet` by name."""
    cols = []
    for name in names:
        if name == R1:
            cols.append(np.clip(features.target, -CLIP, CLIP))
        elif name in HISTORICAL_NAMES:
            cols.append(features.historical[:, HISTORICAL_NAMES.index(name)])
        elif name in KNOWN_NAMES:
            cols.append(features.known[:, KNOWN_NAMES.index(name)])
        else:
            raise ConfigError(f"{source}: unknown feature {name!r} (known: {R1}, the 210 historical "
                             f"names such as ret_5 or rvol_60, and {', '.join(KNOWN_NAMES)})")
    return np.stack(cols, axis=1).astype(np.float32)


def bars_per_year(ts: np.ndarray) -> float:
    """Bars per calendar year at the density of this series (sessions and gaps included):
    the annualisation factor of a per-bar Sharpe ratio."""
    span = float(ts[-1] - ts[0])
    return (len(ts) - 1) / (span / _YEAR_NS) if span > 0 else 252.0


@struct.dataclass
class TradingState:
    t: jax.Array  # int32: the bar the agent is at
    pos: jax.Array  # int32 in {-1, 0, 1}
    steps: jax.Array  # int32: decisions made in this episode


@struct.dataclass
class TradingEnv:
    feats: jax.Array  # [n, F] float32, causal features
    ret: jax.Array  # [n] float32, ret[t] = log(c_t / c_{t-1})
    lo: int = struct.field(pytree_node=False)  # rows [lo, hi) of the split episodes live in
    hi: int = struct.field(pytree_node=False)
    window: int = struct.field(pytree_node=False)
    episode_len: int = struct.field(pytree_node=False)
    cost: float = struct.field(pytree_node=False)  # per unit of position change (fraction)
    reward_scale: float = struct.field(pytree_node=False)
    annualisation: float = struct.field(pytree_node=False)  # bars per year

    num_actions = NUM_POSITIONS
    score_name = "sharpe"
    eval_note = "one greedy pass over each split from flat, net of costs"

    @property
    def default_steps_per_epoch(self) -> int:
        """One epoch = as many env steps as the split has rows."""
        return self.hi - self.lo

    @property
    def obs_dim(self) -> int:
        return self.window * self.feats.shape[1] + NUM_POSITIONS

    @property
    def first_decision(self) -> int:
        return self.lo + self.window - 1

    @property
    def decisions(self) -> int:
        """Decisions in one pass over the split (the last one needs ``r`` of the last row)."""
        return self.hi - 1 - self.first_decision

    @property
    def horizon(self) -> int:
        return max(1, min(self.episode_len, self.decisions))

    def on(self, rows: tuple[int, int]) -> "TradingEnv":
        """The same market on other rows (e.g. the validation split)."""
        env = self.replace(lo=int(rows[0]), hi=int(rows[1]))
        if env.decisions < 1:
            raise ConfigError(f"rows {rows} hold no decision with a {self.window}-bar window: "
                              "too few bars for this split (lower --window or add data)")
        return env

    def observe(self, t: jax.Array, pos: jax.Array) -> jax.Array:
        """Rows ``t-W+1 .. t`` of the features, flattened, and the position one-hot."""
        rows = jax.lax.dynamic_slice_in_dim(self.feats, t - self.window + 1, self.window, axis=0)
        return jnp.concatenate([rows.reshape(-1), jax.nn.one_hot(pos + 1, NUM_POSITIONS)])

    def reset(self, key: jax.Array) -> tuple[jax.Array, TradingState]:
        t0 = jax.random.randint(key, (), self.first_decision,
                                self.first_decision + self.decisions - self.horizon + 1)
        state = TradingState(t0.astype(jnp.int32), jnp.zeros((), jnp.int32),
                             jnp.zeros((), jnp.int32))
        return self.observe(state.t, state.pos), state

    def step(self, key: jax.Array, state: TradingState, action: jax.Array) -> Step:
        new_pos = action.astype(jnp.int32) - 1
        raw = trade_reward(state.pos, new_pos, self.ret[state.t + 1], self.cost)
        nxt = TradingState(state.t + 1, new_pos, state.steps + 1)
        next_obs = self.observe(nxt.t, nxt.pos)
        done = nxt.steps >= self.horizon
        obs_re, state_re = self.reset(key)
        state_out = jax.tree.map(lambda a, b: jnp.where(done, a, b), state_re, nxt)
        obs = jnp.where(done, obs_re, next_obs)
        return Step(obs, next_obs, state_out, raw * self.reward_scale, raw,
                    jnp.zeros((), jnp.float32), done)


    def rollout(self, apply_fn, params) -> dict:
        """Positions, net returns and bar returns of a greedy pass over the rows (host numpy)."""
        pos, net, nxt = jax.device_get(_greedy_rollout(apply_fn, params, self))
        return {"positions": pos, "net": net, "next_ret": nxt}

    def evaluate(self, apply_fn, params, key=None) -> dict:
        r = self.rollout(apply_fn, params)
        return trading_metrics(r["net"], r["positions"], self.annualisation)

    def baselines(self) -> dict[str, dict]:
        nxt = np.asarray(self.ret[self.first_decision + 1 : self.hi])
        return baseline_metrics(nxt, self.cost, self.annualisation)


def trade_reward(pos: jax.Array, new_pos: jax.Array, next_ret: jax.Array, cost: float) -> jax.Array:
    """``new_pos · next_ret − cost · |new_pos − pos|`` (log return of one bar, net of costs)."""
    return new_pos * next_ret - cost * jnp.abs(new_pos - pos).astype(jnp.float32)


def make_trading_env(ds, *, window: int, features: tuple[str, ...], episode_len: int,
                     cost_bps: float, reward_scale: float, split: str = "train") -> TradingEnv:
    """A :class:`TradingEnv` over a :class:`~tftjax.data.Dataset`'s ``split`` rows."""
    feats = select_features(ds.features, features, source=str(ds.bars.path))
    ret = np.zeros(len(ds.bars), np.float32)
    ret[1:] = np.diff(np.log(ds.bars.close))
    env = TradingEnv(jnp.asarray(feats), jnp.asarray(ret), 0, len(ret), window, episode_len,
                     cost_bps * 1e-4, reward_scale, bars_per_year(ds.bars.ts))
    return env.on(ds.splits.rows(split))


def greedy_rollout(apply_fn, params, env: TradingEnv) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One greedy pass over ``env``'s rows from flat: ``(positions, net log returns, next returns)``,
    each ``[env.decisions]`` (jittable; ``env``'s row bounds are static)."""
    ts = env.first_decision + jnp.arange(env.decisions, dtype=jnp.int32)

    def body(pos, t):
        q = apply_fn(params, env.observe(t, pos))
        new_pos = jnp.argmax(q).astype(jnp.int32) - 1
        r = env.ret[t + 1]
        return new_pos, (new_pos, trade_reward(pos, new_pos, r, env.cost), r)

    _, out = jax.lax.scan(body, jnp.zeros((), jnp.int32), ts)
    return out


def trading_metrics(net: np.ndarray, positions: np.ndarray, annualisation: float) -> dict:
    """Total log return, annualised Sharpe, max drawdown (fraction of peak equity), turnover
    (mean |position change| per bar, the first entry from flat included)."""
    net = np.asarray(net, np.float64)
    positions = np.asarray(positions, np.float64)
    equity = np.concatenate([[0.0], np.cumsum(net)])
    drawdown = float(np.max(np.maximum.accumulate(equity) - equity))
    std = float(net.std())
    sharpe = float(net.mean() / std * math.sqrt(annualisation)) if std > 1e-15 else 0.0
    turnover = float(np.abs(np.diff(np.concatenate([[0.0], positions]))).mean())
    return {"total_log_return": float(equity[-1]), "sharpe": sharpe,
            "max_drawdown": 1.0 - math.exp(-drawdown), "turnover": turnover}


def baseline_metrics(next_ret: np.ndarray, cost: float, annualisation: float) -> dict[str, dict]:
    """Buy-and-hold (long from the first bar, one entry cost) and flat on the same bars."""
    next_ret = np.asarray(next_ret, np.float64)
    long = np.ones_like(next_ret)
    hold = next_ret.copy()
    hold[0] -= cost
    return {"buy_and_hold": trading_metrics(hold, long, annualisation),
            "flat": trading_metrics(np.zeros_like(next_ret), np.zeros_like(next_ret), annualisation)}


_greedy_rollout = jax.jit(lambda apply_fn, params, env: greedy_rollout(apply_fn, params, env),
                          static_argnums=0)

EVAL_EPISODES = 10


# ----------------------------------------------------------------- cartpole
@struct.dataclass
class GymnaxEnv:
    """A gymnax environment (CartPole-v1) behind the same interface. A time limit
    is a truncation, not a terminal state: the target bootstraps through it."""

    params: Any
    env: Any = struct.field(pytree_node=False)
    max_steps: int = struct.field(pytree_node=False, default=500)
    reward_scale: float = struct.field(pytree_node=False, default=1.0)

    score_name = "return"
    eval_note = f"greedy return over {EVAL_EPISODES} episodes"
    default_steps_per_epoch = 10_000

    def evaluate(self, apply_fn, params, key) -> dict:
        returns = np.asarray(_greedy_episodes(apply_fn, params, self, key, EVAL_EPISODES))
        return {"return": float(returns.mean()), "return_min": float(returns.min())}

    def baselines(self) -> dict:
        return {}

    def rollout(self, apply_fn, params) -> None:
        return None

    @property
    def num_actions(self) -> int:
        return self.env.num_actions

    @property
    def obs_dim(self) -> int:
        return int(np.prod(self.env.observation_space(self.params).shape))

    def reset(self, key: jax.Array):
        return self.env.reset_env(key, self.params)

    def step(self, key: jax.Array, state, action: jax.Array) -> Step:
        k_step, k_reset = jax.random.split(key)
        obs_st, state_st, reward, terminated, _ = self.env.step_env(k_step, state, action,
                                                                   self.params)
        truncated = state_st.time >= self.params.max_steps_in_episode
        terminated = jnp.logical_and(terminated, jnp.logical_not(truncated))
        done = jnp.logical_or(terminated, truncated)
        obs_re, state_re = self.env.reset_env(k_reset, self.params)
        state_out = jax.tree.map(lambda a, b: jnp.where(done, a, b), state_re, state_st)
        obs = jnp.where(done, obs_re, obs_st)
        reward = jnp.asarray(reward, jnp.float32)
        return Step(obs, obs_st, state_out, reward * self.reward_scale, reward,
                    terminated.astype(jnp.float32), done)


def make_cartpole(reward_scale: float = 1.0) -> GymnaxEnv:
    try:
        import gymnax
    except ImportError as e:  # pragma: no cover - gymnax is a dependency
        raise ConfigError(f"--env cartpole needs gymnax ({e}); pip install gymnax six") from e
    env, params = gymnax.make("CartPole-v1")
    return GymnaxEnv(params, env, int(params.max_steps_in_episode), float(reward_scale))


def greedy_episodes(apply_fn, params, env: GymnaxEnv, key: jax.Array, n: int) -> jax.Array:
    """Undiscounted returns ``[n]`` of ``n`` greedy episodes (jittable)."""
    obs, state = jax.vmap(env.reset)(jax.random.split(key, n))

    def body(carry, k):
        obs, state, ret, alive = carry
        action = jnp.argmax(apply_fn(params, obs), axis=-1)
        out = jax.vmap(env.step)(jax.random.split(k, n), state, action)
        ret = ret + alive * out.raw_reward
        return (out.obs, out.state, ret, alive * (1.0 - out.done)), None

    init = (obs, state, jnp.zeros(n), jnp.ones(n))
    (_, _, ret, _), _ = jax.lax.scan(body, init, jax.random.split(key, env.max_steps))
    return ret


_greedy_episodes = jax.jit(greedy_episodes, static_argnums=(0, 4))
