"""Environments for the DQN, in pure JAX: a bar-by-bar trading environment and
gymnax CartPole-v1 (for verifying the agent), behind one small interface.

Trading (:class:`TradingEnv`): at bar ``t`` the agent sees the last ``W``
rows of a compact, causal feature subset (rows ``t-W+1 .. t``; every feature
at a row depends only on bars up to it) and its decisions not yet superseded,
one-hot. It picks ``a ∈ {0: short, 1: flat, 2: long}``, the position ``a - 1``,
on bar ``t``'s close. The order fills (:func:`execute`) at the next bar's open
(``--fill next-open``, the default) or at that close (``close``), ``--latency``
bars later, paying ``cost`` per unit of position change: half the spread plus
fee plus slippage (a flip pays twice). The net log return of bar ``t+1`` is
then ``p_before · log(o/c_t) + p_after · log(c_{t+1}/o) − cost · |Δp|`` (next
open) or ``p_after · log(c_{t+1}/c_t) − cost · |Δp|`` (close); with
``--flatten-at-session-end`` the last bar of each calendar session closes
everything at its close. The learning reward is that times ``reward_scale``
(default 1 / the training split's target scale, the std of its returns, so
that rewards and Q are O(1) on any market); every reported figure uses the raw
log return. Episodes are random contiguous segments of ``episode_len``
decisions inside one split's rows, starting flat; they end by time limit
(never terminal: the target bootstraps through), and the environment resets
itself.

Both environments implement ``reset(key) -> (obs, state)`` and
``step(key, state, action) -> Step`` for one episode (the training loop vmaps
them over parallel episodes), and what the host loop asks of them:
``default_steps_per_epoch``, ``score_name``, ``evaluate(apply_fn, params, key)``
(greedy metrics), ``baselines()`` and ``rollout(apply_fn, params)`` (for the
equity plot; ``None`` where there is no equity).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tftjax.config import ConfigError
from tftjax.data.features import CLIP, HISTORICAL_NAMES, KNOWN_NAMES
from tftjax.dqn.execution import (
    TO_CLOSE_CAP,
    _constant_rollout,
    _greedy_rollout,
    bars_to_close,
    execute,
    greedy_rollout,
    policy_rollout,
    session_ends,
)
from tftjax.dqn.metrics import bars_per_year, baseline_metrics, trading_metrics

__all__ = [
    "Step",
    "TO_CLOSE_CAP",
    "TradingEnv",
    "TradingState",
    "bars_to_close",
    "baseline_metrics",
    "bars_per_year",
    "execute",
    "greedy_rollout",
    "make_trading_env",
    "policy_rollout",
    "select_features",
    "session_ends",
    "trading_metrics",
]

NUM_POSITIONS = 3  # short, flat, long
R1 = "r1"
"""Feature name of the normalised 1-bar log return ``r_t / std`` (clipped to ±10)."""
DEFAULT_FEATURES = (R1, "ret_5", "ret_20", "ret_60", "rvol_10", "rvol_60", "clv_20", "vz_20",
                    "rsi_13", "sma_30", "tod_sin", "tod_cos")  # fmt: skip


class Step(NamedTuple):
    obs: jax.Array  # observation to act on next (after an auto-reset)
    next_obs: jax.Array  # the true next observation s' (before any reset)
    state: Any
    reward: jax.Array  # learning reward (scaled)
    raw_reward: jax.Array  # unscaled (log return for trading)
    terminal: jax.Array  # float32, 1.0 only for a real terminal state
    done: jax.Array  # bool, the episode ended (terminal or time limit)
    next_key: jax.Array  # what the replay buffer keeps of s' (:meth:`TradingEnv.key_of`)


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
            raise ConfigError(
                f"{source}: unknown feature {name!r} (known: {R1}, the 210 historical "
                f"names such as ret_5 or rvol_60, and {', '.join(KNOWN_NAMES)})"
            )
    return np.stack(cols, axis=1).astype(np.float32)


class TradingState(struct.PyTreeNode):
    t: jax.Array  # int32: the bar the agent is at
    hist: jax.Array  # [latency + 1] int32 in {-1, 0, 1}: decisions at t-1, t-2, … (pending or held)
    steps: jax.Array  # int32: decisions made in this episode

    @property
    def pos(self) -> jax.Array:
        """The latest decision (the position ordered)."""
        return self.hist[..., 0]


class TradingEnv(struct.PyTreeNode):
    """Bars, their returns split at the open (``gap``: close to open, ``intra``: open to
    close), the session ends, and the execution terms (static)."""

    feats: jax.Array  # [n, F] float32, causal features
    gap: jax.Array  # [n] float32, log(o_t / c_{t-1})
    intra: jax.Array  # [n] float32, log(c_t / o_t)
    session_end: jax.Array  # [n] bool: bar t is the last of its session (flatten there)
    cost: jax.Array  # float32 []: per unit of position change (a fraction)
    reward_scale: jax.Array  # float32 []: learning reward per unit of net log return
    lo: int = struct.field(pytree_node=False)  # rows [lo, hi) of the split episodes live in
    hi: int = struct.field(pytree_node=False)
    window: int = struct.field(pytree_node=False)
    episode_len: int = struct.field(pytree_node=False)
    annualisation: float = struct.field(pytree_node=False)  # bars per year
    next_open: bool = struct.field(pytree_node=False, default=True)  # fill at the next open
    latency: int = struct.field(pytree_node=False, default=0)  # bars before the fill
    every: int = struct.field(pytree_node=False, default=1)  # bars per decision (held between)

    num_actions = NUM_POSITIONS
    score_name = "sharpe"
    eval_note = "one greedy pass over each split from flat, net of costs"

    @property
    def ret(self) -> jax.Array:
        """Close-to-close log returns ``ret[t] = log(c_t / c_{t-1})``."""
        return self.gap + self.intra

    @property
    def default_steps_per_epoch(self) -> int:
        """One epoch = as many env steps as the split has rows."""
        return self.hi - self.lo

    @property
    def obs_dim(self) -> int:
        return self.window * self.feats.shape[1] + NUM_POSITIONS * (self.latency + 1)

    @property
    def first_decision(self) -> int:
        """The split's first bar: its observation's earlier rows are bars before the split
        (causal features, known then), so no bar of the split goes untraded."""
        return max(self.lo, self.window - 1)

    @property
    def decisions(self) -> int:
        """Bars traded in one pass over the split (the last one needs ``r`` of the last row;
        with ``every`` > 1 a decision is taken on every ``every``-th of them)."""
        return self.hi - 1 - self.first_decision

    @property
    def horizon(self) -> int:
        """Decisions per training episode (each spans ``every`` bars)."""
        return max(1, min(self.episode_len, self.decisions // self.every))

    def on(self, rows: tuple[int, int]) -> TradingEnv:
        """The same market on other rows (e.g. the validation split)."""
        env = self.replace(lo=int(rows[0]), hi=int(rows[1]))
        if env.decisions < max(1, self.every):
            raise ConfigError(
                f"rows {rows} hold {max(env.decisions, 0)} bars to trade with a "
                f"{self.window}-bar window and a decision every {self.every} "
                "bar(s): too few bars for this split (lower --window or "
                "--decision-every, or add data)"
            )
        return env

    def flat(self) -> jax.Array:
        return jnp.zeros((self.latency + 1,), jnp.int32)

    def observe(self, t: jax.Array, hist: jax.Array) -> jax.Array:
        """Rows ``t-W+1 .. t`` of the features, flattened, and the decisions not yet
        superseded by a fill (the latest first), one-hot."""
        rows = jax.lax.dynamic_slice_in_dim(self.feats, t - self.window + 1, self.window, axis=0)
        return jnp.concatenate(
            [rows.reshape(-1), jax.nn.one_hot(hist + 1, NUM_POSITIONS).reshape(-1)]
        )

    def execute(self, t: jax.Array, hist: jax.Array, new_pos: jax.Array):
        """``(net log return of bar t+1, held position, decisions after)`` for the decision
        ``new_pos`` on bar ``t``'s close (:func:`execute`)."""
        return execute(
            hist,
            new_pos,
            self.gap[t + 1],
            self.intra[t + 1],
            self.session_end[t],
            self.cost,
            self.next_open,
            self.latency,
        )

    def reset(self, key: jax.Array) -> tuple[jax.Array, TradingState]:
        t0 = jax.random.randint(
            key,
            (),
            self.first_decision,
            self.first_decision + self.decisions - self.horizon * self.every + 1,
        )
        state = TradingState(t0.astype(jnp.int32), self.flat(), jnp.zeros((), jnp.int32))
        return self.observe(state.t, state.hist), state

    def step(self, key: jax.Array, state: TradingState, action: jax.Array) -> Step:
        raw, hist = self.advance(state.t, state.hist, action.astype(jnp.int32) - 1)
        nxt = TradingState(state.t + self.every, hist, state.steps + 1)
        next_obs = self.observe(nxt.t, nxt.hist)
        done = nxt.steps >= self.horizon
        obs_re, state_re = self.reset(key)
        state_out = jax.tree.map(lambda a, b: jnp.where(done, a, b), state_re, nxt)
        obs = jnp.where(done, obs_re, next_obs)
        return Step(
            obs,
            next_obs,
            state_out,
            raw * self.reward_scale,
            raw,
            jnp.zeros((), jnp.float32),
            done,
            self.key_of(next_obs, nxt),
        )

    def advance(self, t: jax.Array, hist: jax.Array, new_pos: jax.Array):
        """``(net log return, decisions after)`` of deciding ``new_pos`` on bar ``t``'s close
        and holding that decision over the next ``every - 1`` bars (flat after a session's
        end until the next decision)."""
        net, _, hist = self.execute(t, hist, new_pos)
        if self.every == 1:
            return net, hist

        def hold(carry, j):
            total, h = carry
            n, _, h = self.execute(t + j, h, h[0])
            return (total + n, h), None

        (net, hist), _ = jax.lax.scan(hold, (net, hist), jnp.arange(1, self.every))
        return net, hist

    def outcomes(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``([3] raw rewards, [3, K] next keys)``: what each action would have earned from
        the state of buffer key ``key``, and where it leads. The agent does not move the
        market, so all three are known (``--action-augment``)."""

        def one(a):
            raw, hist = self.advance(key[0], key[1:], a - 1)
            return raw, jnp.concatenate([(key[0] + self.every)[None], hist]).astype(jnp.int32)

        return jax.vmap(one)(jnp.arange(NUM_POSITIONS, dtype=jnp.int32))

    # -- what the replay buffer stores: the bar and the decisions, not the observation
    def key_of(self, obs: jax.Array, state: TradingState) -> jax.Array:
        """``[t, decisions…]`` int32: all an observation is made of (:meth:`decode`)."""
        return jnp.concatenate([state.t[None], state.hist]).astype(jnp.int32)

    def decode(self, key: jax.Array) -> jax.Array:
        """The observation of a :meth:`key_of` key (the same computation, bit for bit)."""
        return self.observe(key[0], key[1:])

    def rollout(self, apply_fn, params) -> dict:
        """Held positions, net returns and bar returns of a greedy pass over the rows (host
        numpy)."""
        pos, net, nxt = jax.device_get(_greedy_rollout(apply_fn, params, self))
        return {"positions": pos, "net": net, "next_ret": nxt}

    def evaluate(self, apply_fn, params, key=None) -> dict:
        r = self.rollout(apply_fn, params)
        return trading_metrics(r["net"], r["positions"], self.annualisation)

    def baselines(self) -> dict[str, dict]:
        """Buy-and-hold (long throughout, entering like any order) and flat, through the same
        fills, latency, costs and session flattening as the agent."""
        out = {}
        for name, p in (("buy_and_hold", 1), ("flat", 0)):
            pos, net, _ = jax.device_get(_constant_rollout(self, p))
            out[name] = trading_metrics(net, pos, self.annualisation)
        return out


def make_trading_env(
    ds,
    cfg,
    split: str = "train",
    reward_scale: float | None = None,
    extra: np.ndarray | None = None,
) -> TradingEnv:
    """A :class:`TradingEnv` over a :class:`~tftjax.data.Dataset`'s ``split`` rows with the
    execution terms of a :class:`~tftjax.dqn.config.DQNConfig` (costs filled in); ``extra``
    ``[n, k]``: more causal feature columns (e.g. a TFT's forecasts)."""
    b = ds.bars
    feats = select_features(ds.features, tuple(cfg.features), source=str(b.path))
    if extra is not None:
        feats = np.concatenate([feats, np.asarray(extra, np.float32)], axis=1)
    close = np.asarray(b.close, np.float64)
    opn = np.asarray(b.open, np.float64)
    gap = np.zeros(len(b), np.float32)
    gap[1:] = np.log(opn[1:] / close[:-1])
    intra = np.log(close / opn).astype(np.float32)
    intra[0] = 0.0
    ends = (
        session_ends(ds.features.timeline) if cfg.flatten_at_session_end else np.zeros(len(b), bool)
    )
    if cfg.flatten_at_session_end:  # when the position will be closed: known from the calendar
        feats = np.concatenate([feats, bars_to_close(ends)[:, None]], axis=1)
    scale = reward_scale if reward_scale is not None else cfg.reward_scale
    annual, _ = bars_per_year(b.ts, ds.features.timeline)
    env = TradingEnv(
        jnp.asarray(feats),
        jnp.asarray(gap),
        jnp.asarray(intra),
        jnp.asarray(ends),
        jnp.float32(cfg.cost),
        jnp.float32(scale),
        0,
        len(b),
        cfg.window,
        cfg.episode_len,
        annual,
        cfg.fill == "next-open",
        cfg.latency,
        cfg.decision_every,
    )
    return env.on(ds.splits.rows(split))
