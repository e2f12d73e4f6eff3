"""How the trading environment's orders fill, and passes over a split.

:func:`execute` is one bar of execution (fills at the next open or the close, latency, costs
per unit traded, a session's end closing everything); :func:`session_ends` and
:func:`bars_to_close` read the calendar's sessions; :func:`greedy_rollout` and
:func:`policy_rollout` run a whole split from flat through them, deciding on every
``every``-th bar and closing what is still held after the last.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tftjax.config import ConfigError


def execute(hist, new_pos, gap, intra, session_end, cost, next_open: bool, latency: int):
    """One bar of execution: ``(net log return over (c_t, c_{t+1}], held position, decisions
    after)``.

    ``hist`` holds the decisions made on closes ``t-1, …, t-L-1`` (``L = latency``); with
    ``new_pos`` decided on close ``t`` in front, the order decided on close ``t-L`` fills now:
    at the close ``t`` (``--fill close``: held over the whole bar) or at the next open
    (``next-open``: the position filled at open ``t`` is held until then, over the gap).
    Each fill pays ``cost`` per unit of change. On the last bar of a session (``session_end``)
    everything is closed at that close and pending orders are cancelled."""
    full = jnp.concatenate([new_pos[None].astype(jnp.int32), hist])  # decisions t, t-1, …
    after, before = full[latency], full[latency + 1]  # the fill now, what it replaces
    a, b = after.astype(jnp.float32), before.astype(jnp.float32)
    if next_open:
        net = b * gap + a * intra - cost * jnp.abs(a - b)
    else:
        net = a * (gap + intra) - cost * jnp.abs(a - b)
    # session end: ``before`` is what is held at close t (either fill); closed there, flat after
    net = jnp.where(session_end, -cost * jnp.abs(b), net)
    held = jnp.where(session_end, 0, after)
    new_hist = jnp.where(session_end, jnp.zeros_like(hist), full[: latency + 1])
    return net, held, new_hist


TO_CLOSE_CAP = 64
"""Bars to the session's close, as a feature: counted up to this many (then constant)."""


def bars_to_close(ends: np.ndarray) -> np.ndarray:
    """``[n]`` float32 in [0, 1]: bars left until the session's last bar (0 on it), capped at
    :data:`TO_CLOSE_CAP` and divided by it; the observation's time-to-close under
    ``--flatten-at-session-end`` (the agent learns that a position is closed there)."""
    idx = np.flatnonzero(ends)
    t = np.arange(ends.size)
    k = np.searchsorted(idx, t)
    left = (
        np.where(k < idx.size, idx[np.minimum(k, max(idx.size - 1, 0))] - t, TO_CLOSE_CAP)
        if idx.size
        else np.full(ends.size, TO_CLOSE_CAP)
    )
    return (np.minimum(left, TO_CLOSE_CAP) / TO_CLOSE_CAP).astype(np.float32)


def session_ends(timeline) -> np.ndarray:
    """``[n]`` bool: bar ``t`` is the last bar of its calendar session. Closing there is a
    market-on-close order, decided from the calendar alone and filled at the session's last
    price, which is ``t``'s close even where the session's last minutes have no bar."""
    if timeline is None or timeline.sess is None:
        raise ConfigError("--flatten-at-session-end needs --calendar (the sessions to flatten at)")
    if timeline.clock.daily:
        raise ConfigError(
            "--flatten-at-session-end: daily bars end a session every bar (the "
            "agent could never hold); it is for intraday bars"
        )
    here = np.searchsorted(timeline.sess.open, timeline.utc, side="right") - 1
    return here != np.r_[here[1:], -1]


def greedy_rollout(apply_fn, params, env) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One greedy pass over ``env``'s rows from flat: ``(held positions, net log returns, next
    returns)``, each ``[env.decisions]`` (jittable; ``env``'s row bounds are static)."""
    return _rollout(
        env,
        lambda t, hist: jnp.argmax(apply_fn(params, env.observe(t, hist))).astype(jnp.int32) - 1,
    )


def _rollout(env, decide):
    """A pass over the split from flat; a decision on every ``env.every``-th bar (the last
    one held in between), and the position still held at the end closed at the last close
    (its cost charged to the last bar: a record that ends in a position has not paid to
    leave it)."""
    ts = env.first_decision + jnp.arange(env.decisions, dtype=jnp.int32)

    def body(hist, t):
        new = decide(t, hist)
        if env.every > 1:
            new = jnp.where((t - env.first_decision) % env.every == 0, new, hist[0])
        net, held, hist = env.execute(t, hist, new)
        return hist, (held, net, env.gap[t + 1] + env.intra[t + 1])

    _, (held, net, nxt) = jax.lax.scan(body, env.flat(), ts)
    net = net.at[-1].add(-env.cost * jnp.abs(held[-1]).astype(jnp.float32))
    return held, net, nxt


_greedy_rollout = jax.jit(
    lambda apply_fn, params, env: greedy_rollout(apply_fn, params, env), static_argnums=0
)


def policy_rollout(env, positions: jax.Array):
    """:func:`greedy_rollout` of a fixed path: ``positions[k]`` decided on close
    ``first_decision + k`` (``[decisions]`` int32), through the same fills and costs."""
    return _policy_rollout(env, positions)


_policy_rollout = jax.jit(
    lambda env, path: _rollout(env, lambda t, hist: path[t - env.first_decision].astype(jnp.int32))
)
_constant_rollout = jax.jit(
    lambda env, p: _rollout(env, lambda t, hist: jnp.int32(p)), static_argnums=1
)
