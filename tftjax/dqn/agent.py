"""The DQN agent: Q-network, double-DQN targets, Huber loss, target updates, ε schedule.

Pure functions over pytrees; the training loop (:mod:`tftjax.dqn.train`)
composes them inside one jitted epoch.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from tftjax.dqn.buffer import Transitions


class QNetwork(nn.Module):
    """MLP ``obs [..., D] -> Q [..., A]`` (ReLU hidden layers)."""

    num_actions: int
    hidden: Sequence[int] = (128, 128)

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs.astype(jnp.float32)
        for i, h in enumerate(self.hidden):
            x = nn.relu(nn.Dense(h, name=f"dense_{i}")(x))
        return nn.Dense(self.num_actions, name="q")(x)


def double_dqn_targets(
    q_next_online: jax.Array,
    q_next_target: jax.Array,
    reward: jax.Array,
    terminal: jax.Array,
    gamma: float,
) -> jax.Array:
    """``r + γ (1 - terminal) Q_target(s', argmax_a Q_online(s', a))`` (van Hasselt et al. 2016).

    The online network picks the next action, the target network values it.
    """
    a_star = jnp.argmax(q_next_online, axis=-1)
    q_star = jnp.take_along_axis(q_next_target, a_star[..., None], axis=-1)[..., 0]
    return reward + gamma * (1.0 - terminal) * q_star


def dqn_loss(
    params, target_params, apply_fn, batch: Transitions, gamma: float, huber_delta: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """Mean Huber loss of ``Q(s, a)`` against double-DQN targets; returns ``(loss, mean Q)``."""
    q = apply_fn(params, batch.obs)
    q_sa = jnp.take_along_axis(q, batch.action[:, None], axis=-1)[:, 0]
    q_next_online = apply_fn(params, batch.next_obs)
    q_next_target = apply_fn(target_params, batch.next_obs)
    y = jax.lax.stop_gradient(
        double_dqn_targets(q_next_online, q_next_target, batch.reward, batch.terminal, gamma)
    )
    loss = optax.huber_loss(q_sa, y, delta=huber_delta).mean()
    return loss, q_sa.mean()


def augmented(env, keys: jax.Array) -> Transitions:
    """Action augmentation: the transitions of all three actions from the states of buffer
    keys ``keys [B, K]`` (:meth:`~tftjax.dqn.env.TradingEnv.outcomes`), ``3B`` rows: state
    ``b``'s action ``a`` at row ``3b + a``, its learning reward and its own next state.
    The agent does not move the market, so these are the transitions it would have made."""
    raw, nxt = jax.vmap(env.outcomes)(keys)  # [B, A], [B, A, K]
    b, a = raw.shape
    obs = jax.vmap(env.decode)(keys).astype(jnp.float32)
    return Transitions(
        obs=jnp.repeat(obs, a, axis=0),
        action=jnp.tile(jnp.arange(a, dtype=jnp.int32), b),
        reward=(raw * env.reward_scale).reshape(-1),
        next_obs=jax.vmap(env.decode)(nxt.reshape(b * a, -1)).astype(jnp.float32),
        terminal=jnp.zeros((b * a,), jnp.float32),
    )


def polyak(target_params, params, tau: float):
    """``tau * online + (1 - tau) * target`` (``tau = 1``: a hard copy)."""
    return optax.incremental_update(params, target_params, tau)


def linear_epsilon(step: jax.Array, start: float, end: float, decay_steps: int) -> jax.Array:
    """ε falls linearly from ``start`` to ``end`` over ``decay_steps`` env steps, then stays."""
    frac = jnp.clip(step / max(decay_steps, 1), 0.0, 1.0)
    return start + frac * (end - start)


def epsilon_greedy(key: jax.Array, q: jax.Array, epsilon: jax.Array) -> jax.Array:
    """Per row of ``q [E, A]``: a uniform random action with probability ε, else argmax."""
    k_explore, k_action = jax.random.split(key)
    greedy = jnp.argmax(q, axis=-1)
    random = jax.random.randint(k_action, greedy.shape, 0, q.shape[-1])
    explore = jax.random.uniform(k_explore, greedy.shape) < epsilon
    return jnp.where(explore, random, greedy).astype(jnp.int32)


def make_optimizer(
    learning_rate: float, max_grad_norm: float, *, end_fraction: float = 1.0, decay_steps: int = 1
) -> optax.GradientTransformation:
    """Global-norm clipping and Adam; the rate falls linearly to ``end_fraction`` of itself
    over ``decay_steps`` gradient steps (constant for ``end_fraction = 1``)."""
    lr = (
        learning_rate
        if end_fraction == 1.0
        else optax.linear_schedule(learning_rate, learning_rate * end_fraction, max(decay_steps, 1))
    )
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(lr))
