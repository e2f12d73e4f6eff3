"""gymnax CartPole-v1 behind the trading environment's interface (for verifying the agent
and the loop on a solved problem)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tftjax.config import ConfigError
from tftjax.dqn.env import Step

EVAL_EPISODES = 10


class GymnaxEnv(struct.PyTreeNode):
    """A gymnax environment (CartPole-v1) behind the same interface. A time limit
    is a truncation, not a terminal state: the target bootstraps through it."""

    params: Any
    env: Any = struct.field(pytree_node=False)
    max_steps: int = struct.field(pytree_node=False, default=500)
    reward_scale: float = struct.field(pytree_node=False, default=1.0)

    score_name = "return"
    eval_note = f"greedy return over {EVAL_EPISODES} fresh episodes each epoch"
    default_steps_per_epoch = 10_000

    def evaluate(self, apply_fn, params, key, episodes: int = EVAL_EPISODES) -> dict:
        returns = np.asarray(_greedy_episodes(apply_fn, params, self, key, episodes))
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
        obs_st, state_st, reward, terminated, _ = self.env.step_env(
            k_step, state, action, self.params
        )
        truncated = state_st.time >= self.params.max_steps_in_episode
        terminated = jnp.logical_and(terminated, jnp.logical_not(truncated))
        done = jnp.logical_or(terminated, truncated)
        obs_re, state_re = self.env.reset_env(k_reset, self.params)
        state_out = jax.tree.map(lambda a, b: jnp.where(done, a, b), state_re, state_st)
        obs = jnp.where(done, obs_re, obs_st)
        reward = jnp.asarray(reward, jnp.float32)
        return Step(
            obs,
            obs_st,
            state_out,
            reward * self.reward_scale,
            reward,
            terminated.astype(jnp.float32),
            done,
            obs_st,
        )

    def key_of(self, obs: jax.Array, state) -> jax.Array:
        """The replay buffer keeps CartPole's 4 floats as they are."""
        return obs

    def decode(self, key: jax.Array) -> jax.Array:
        return key


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
