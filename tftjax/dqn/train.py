"""The DQN training loop, PureJaxRL style: ``make_train(cfg, env)`` builds pure
functions, collection and updates run inside ``lax.scan``/``lax.cond``, one jit
per epoch.

One loop iteration: ε-greedy actions for ``num_envs`` parallel episodes, one
vmapped environment step (auto-reset), the transitions into the replay
buffer, and, once ``learning_starts`` env steps are stored and every
``train_every`` iterations, one double-DQN gradient step (Huber loss, global
norm clipping, Adam); every ``target_update_every`` gradient steps the target
network is copied from the online one (``tau = 1``); with ``tau < 1`` it
follows by Polyak averaging after every update instead. An epoch is
``ceil(steps_per_epoch / num_envs)`` iterations in one ``lax.scan``: for
trading, ``steps_per_epoch`` defaults to the training split's length.

The whole loop state (:class:`DQNState`: online and target parameters,
optimiser state, replay buffer, environment states, ε/step counters, RNG
key) is one pytree: it is what a checkpoint holds, so ``--resume`` continues
exactly where the run stopped.

The host side (greedy validation, checkpoints, resume, early stopping) is
:mod:`tftjax.dqn.loop` on the shared :mod:`tftjax.runner.loop`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from tftjax.dqn import agent, buffer
from tftjax.dqn.config import DQNConfig


class DQNState(struct.PyTreeNode):
    params: Any
    target_params: Any
    opt_state: Any
    buffer: buffer.ReplayBuffer
    env_state: Any
    obs: jax.Array  # [E, D]: what each episode acts on next
    ep_return: jax.Array  # [E] raw return of each running episode
    key: jax.Array  # uint32[2]
    step: jax.Array  # int32: env steps so far (drives ε)
    updates: jax.Array  # int32: gradient steps so far


class DQN(NamedTuple):
    """What :func:`make_train` returns: pure functions of one resolved config."""

    cfg: DQNConfig
    network: agent.QNetwork
    init: Callable  # (key, env) -> DQNState
    epoch: Callable  # jitted (state, env) -> (state, metrics); donates state
    train: Callable  # jitted key -> (state, per-epoch metrics): cfg.epochs epochs in one scan
    apply: Callable  # (params, obs) -> Q


def resolve(cfg: DQNConfig, env) -> DQNConfig:
    """Fill the defaults that depend on the data: steps per epoch and ε decay."""
    spe = cfg.steps_per_epoch
    if spe is None:
        spe = env.default_steps_per_epoch
    decay = cfg.eps_decay_steps
    if decay is None:
        decay = max(1, int(0.3 * cfg.epochs * spe))
    return dataclasses.replace(cfg, steps_per_epoch=int(spe), eps_decay_steps=int(decay))


def iterations_per_epoch(cfg: DQNConfig) -> int:
    """Loop iterations in an epoch of a resolved config (:func:`resolve`)."""
    assert cfg.steps_per_epoch is not None, "resolve the config against its env first"
    return -(-cfg.steps_per_epoch // cfg.num_envs)


def learn(cfg: DQNConfig, tx, apply: Callable, env, s: DQNState, key):
    """One gradient update from a sampled batch (double-DQN targets from the target
    network), and the target network's update: ``(state, (loss, mean Q, 1))``."""
    batch = buffer.sample(s.buffer, key, cfg.batch_size)
    if cfg.action_augment:  # every action's transition from each sampled state
        batch = agent.augmented(env, batch.obs)
    elif cfg.compact_buffer:  # rebuild the observations from their keys
        batch = batch.replace(
            obs=jax.vmap(env.decode)(batch.obs).astype(jnp.float32),
            next_obs=jax.vmap(env.decode)(batch.next_obs).astype(jnp.float32),
        )
    (loss, q), grads = jax.value_and_grad(agent.dqn_loss, has_aux=True)(
        s.params, s.target_params, apply, batch, cfg.gamma, cfg.huber_delta
    )
    upd, opt_state = tx.update(grads, s.opt_state, s.params)
    params = optax.apply_updates(s.params, upd)
    n = s.updates + 1
    if cfg.tau < 1:  # Polyak averaging after every update (time constant 1/tau updates)
        target = agent.polyak(s.target_params, params, cfg.tau)
    else:  # a hard copy every target_update_every updates
        target = jax.lax.cond(
            n % cfg.target_update_every == 0, lambda: params, lambda: s.target_params
        )
    s = s.replace(params=params, opt_state=opt_state, target_params=target, updates=n)
    return s, (loss, q, jnp.ones((), jnp.float32))


def init_state(cfg: DQNConfig, network, tx, key, env) -> DQNState:
    """A fresh agent: its network and target, optimizer, empty replay buffer and
    ``num_envs`` environments reset."""
    k_net, k_env, k_run = jax.random.split(key, 3)
    params = network.init(k_net, jnp.zeros((env.obs_dim,), jnp.float32))["params"]
    obs, env_state = jax.vmap(env.reset)(jax.random.split(k_env, cfg.num_envs))
    if cfg.compact_buffer:  # the buffer keeps each observation's key, not its values
        k = jax.eval_shape(env.key_of, obs[0], jax.tree.map(lambda x: x[0], env_state))
        buf = buffer.init(cfg.buffer_size, k.shape[0], k.dtype)
    else:
        buf = buffer.init(cfg.buffer_size, env.obs_dim)
    return DQNState(
        params=params,
        target_params=jax.tree.map(jnp.copy, params),
        opt_state=tx.init(params),
        buffer=buf,
        env_state=env_state,
        obs=obs.astype(jnp.float32),
        ep_return=jnp.zeros((cfg.num_envs,), jnp.float32),
        key=k_run,
        step=jnp.zeros((), jnp.int32),
        updates=jnp.zeros((), jnp.int32),
    )


def make_train(cfg: DQNConfig, env) -> DQN:
    """Pure init/epoch/train functions for ``cfg`` (resolved against ``env``)."""
    cfg = resolve(cfg, env)
    network = agent.QNetwork(env.num_actions, tuple(cfg.hidden))
    E = cfg.num_envs
    iters = iterations_per_epoch(cfg)
    tx = agent.make_optimizer(
        cfg.learning_rate,
        cfg.max_grad_norm,
        end_fraction=cfg.lr_end_fraction,
        decay_steps=cfg.epochs * iters // cfg.train_every,
    )

    def epsilon(step):
        # with action augmentation every action is learnt at every state: no exploration
        # schedule; a constant eps_end only varies the positions held (part of the state)
        if cfg.action_augment:
            return jnp.float32(cfg.eps_end)
        assert cfg.eps_decay_steps is not None  # resolved
        return agent.linear_epsilon(step, cfg.eps_start, cfg.eps_end, cfg.eps_decay_steps)

    def apply(params, obs):
        return network.apply({"params": params}, obs)

    init = functools.partial(init_state, cfg, network, tx)

    def skip(env, s: DQNState, key):
        z = jnp.zeros((), jnp.float32)
        return s, (z, z, z)

    def iteration(env, s: DQNState, it):
        key, k_act, k_env, k_upd = jax.random.split(s.key, 4)
        q: Any = apply(s.params, s.obs)
        eps = epsilon(s.step)
        action = agent.epsilon_greedy(k_act, q, eps)
        out = jax.vmap(env.step)(jax.random.split(k_env, E), s.env_state, action)
        if cfg.compact_buffer:
            keys = jax.vmap(env.key_of)(s.obs, s.env_state)
            buf = buffer.add(
                s.buffer, buffer.Transitions(keys, action, out.reward, out.next_key, out.terminal)
            )
        else:
            buf = buffer.add(
                s.buffer,
                buffer.Transitions(
                    s.obs, action, out.reward, out.next_obs.astype(jnp.float32), out.terminal
                ),
            )
        ep_return = s.ep_return + out.raw_reward
        finished = out.done.astype(jnp.float32)
        s = s.replace(
            buffer=buf,
            env_state=out.state,
            obs=out.obs.astype(jnp.float32),
            ep_return=ep_return * (1.0 - finished),
            key=key,
            step=s.step + E,
        )
        ready = (buf.size >= cfg.learning_starts) & (it % cfg.train_every == 0)
        s, (loss, qm, did) = jax.lax.cond(
            ready,
            functools.partial(learn, cfg, tx, apply, env),
            functools.partial(skip, env),
            s,
            k_upd,
        )
        return s, dict(
            loss=loss,
            q=qm,
            did=did,
            reward=out.raw_reward.mean(),
            ep_sum=(ep_return * finished).sum(),
            ep_n=finished.sum(),
        )

    def epoch(s: DQNState, env) -> tuple[DQNState, dict]:
        s, m = jax.lax.scan(
            lambda c, i: iteration(env, c, i), s, jnp.arange(iters, dtype=jnp.int32)
        )
        n_upd = m["did"].sum()
        metrics = {
            "loss": jnp.where(
                n_upd > 0, (m["loss"] * m["did"]).sum() / jnp.maximum(n_upd, 1), jnp.nan
            ),
            "q_mean": (m["q"] * m["did"]).sum() / jnp.maximum(n_upd, 1),
            "updates": n_upd,
            "epsilon": epsilon(s.step),
            "reward_per_step": m["reward"].mean(),
            "episodes": m["ep_n"].sum(),
            "episode_return": m["ep_sum"].sum() / jnp.maximum(m["ep_n"].sum(), 1),
            "env_steps": s.step,
        }
        return s, metrics

    def train(key):
        s = init(key, env)
        return jax.lax.scan(lambda c, _: epoch(c, env), s, None, length=cfg.epochs)

    return DQN(cfg, network, init, jax.jit(epoch, donate_argnums=0), jax.jit(train), apply)
