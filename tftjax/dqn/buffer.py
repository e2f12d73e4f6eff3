"""A uniform replay buffer that is a pytree (a ring buffer of fixed capacity).

Everything lives in device arrays, so adding and sampling run inside the
jitted training loop, and the whole buffer goes into a checkpoint with the
rest of the state (a resume that drops the buffer is not a resume).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


class Transitions(struct.PyTreeNode):
    """A batch of transitions ``(s, a, r, s', terminal)``; ``s'`` is the true next
    observation (before any auto-reset), ``terminal`` only for real terminal states
    (a time limit is not terminal: the target bootstraps through it)."""

    obs: jax.Array  # [N, D] float32
    action: jax.Array  # [N] int32
    reward: jax.Array  # [N] float32
    next_obs: jax.Array  # [N, D] float32
    terminal: jax.Array  # [N] float32 (1.0 = terminal)


class ReplayBuffer(struct.PyTreeNode):
    data: Transitions  # leading axis = capacity
    ptr: jax.Array  # int32: next slot to write
    size: jax.Array  # int32: filled slots (<= capacity)

    @property
    def capacity(self) -> int:
        return self.data.action.shape[0]


def init(capacity: int, obs_dim: int, dtype=jnp.float32) -> ReplayBuffer:
    """An empty buffer whose ``obs``/``next_obs`` rows are ``obs_dim`` values of ``dtype``
    (an observation, or the int32 key it is rebuilt from: the trading env's bar and
    decisions, a few bytes instead of the window of features)."""
    if capacity < 1:
        raise ValueError("buffer capacity must be >= 1")
    z = jnp.zeros
    data = Transitions(
        z((capacity, obs_dim), dtype),
        z((capacity,), jnp.int32),
        z((capacity,), jnp.float32),
        z((capacity, obs_dim), dtype),
        z((capacity,), jnp.float32),
    )
    return ReplayBuffer(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def add(buf: ReplayBuffer, batch: Transitions) -> ReplayBuffer:
    """Write a batch of ``n <= capacity`` transitions at the ring pointer."""
    n = batch.action.shape[0]
    cap = buf.capacity
    if n > cap:
        raise ValueError(f"cannot add {n} transitions to a buffer of {cap}")
    idx = (buf.ptr + jnp.arange(n, dtype=jnp.int32)) % cap
    data = jax.tree.map(lambda d, b: d.at[idx].set(b.astype(d.dtype)), buf.data, batch)
    return ReplayBuffer(data, (buf.ptr + n) % cap, jnp.minimum(buf.size + n, cap))


def sample(buf: ReplayBuffer, key: jax.Array, batch_size: int) -> Transitions:
    """Uniform sample (with replacement) from the filled slots."""
    idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(buf.size, 1))
    return jax.tree.map(lambda d: d[idx], buf.data)
