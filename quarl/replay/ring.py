"""A replay buffer inside a jit: a ring of environment steps, time-major ([rows, N] for N environments stepped
together), with n-step transitions formed when they are sampled. Pure jnp on a NamedTuple, so it lives in the jitted
trainer's state (`agents.anakin.dqn`) and vmaps over seeds.

Why steps rather than transitions: an n-step transition is a window of n consecutive steps of one environment, and
those are adjacent rows of its column, so storing each step once and reading the window at sampling time stores
every observation pair once (not n times) and needs no adder state. The window is cut at the episode's end (the
first step that terminated or was truncated in it): rewards after it are not summed, and the bootstrap uses that
step's next observation, with discount 0 for a termination and gamma^k for a time limit, as the project's n-step
adders (`quarl.replay.adders`) give. The newest n - 1 rows are not sampled as window starts until their windows
are complete; the oldest rows are overwritten once the ring is full (uniform replay, FIFO removal).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class StepRing(NamedTuple):
    """`capacity` rows of N environments' steps: observation, action, reward, terminated, done (terminated or
    truncated) and the next observation (an episode's final one where it ended). `rows` counts rows ever written."""

    observation: jax.Array  # [capacity, N, ...]
    action: jax.Array  # [capacity, N] int32
    reward: jax.Array  # [capacity, N] float32
    terminated: jax.Array  # [capacity, N] bool
    done: jax.Array  # [capacity, N] bool
    next_observation: jax.Array  # [capacity, N, ...]
    rows: jax.Array  # int32 scalar

    @property
    def capacity(self) -> int:
        return int(self.action.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.action.shape[1])


def ring_init(capacity: int, num_envs: int, obs_shape: tuple[int, ...], obs_dtype: jnp.dtype) -> StepRing:
    """An empty ring of `capacity` rows (`capacity * num_envs` transitions)."""
    if capacity < 1 or num_envs < 1:
        raise ValueError(f"a step ring needs capacity and num_envs >= 1, got {capacity} and {num_envs}")
    obs = jnp.zeros((capacity, num_envs, *obs_shape), obs_dtype)
    flags = jnp.zeros((capacity, num_envs), bool)
    return StepRing(obs, jnp.zeros((capacity, num_envs), jnp.int32), jnp.zeros((capacity, num_envs), jnp.float32),
                    flags, flags, obs, jnp.zeros((), jnp.int32))


def ring_add(ring: StepRing, observation: jax.Array, action: jax.Array, reward: jax.Array, terminated: jax.Array,
             done: jax.Array, next_observation: jax.Array) -> StepRing:
    """One step of the N environments written as the newest row (over the oldest once full)."""
    i = ring.rows % ring.capacity
    put = lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x.astype(buf.dtype), i, 0)  # noqa: E731
    return StepRing(put(ring.observation, observation), put(ring.action, action), put(ring.reward, reward),
                    put(ring.terminated, terminated), put(ring.done, done), put(ring.next_observation, next_observation),
                    ring.rows + 1)


def ring_samplable(ring: StepRing, n_step: int) -> jax.Array:
    """Transitions that can be sampled now: window starts whose n steps are all written, times N environments."""
    rows = jnp.minimum(ring.rows, ring.capacity) - (n_step - 1)
    return jnp.maximum(rows, 0) * ring.num_envs


def ring_sample(ring: StepRing, key: jax.Array, batch_size: int, n_step: int, discount: float) -> dict[str, jax.Array]:
    """`batch_size` n-step transitions drawn uniformly with replacement (call only once `ring_samplable` > 0):
    {observation, action, reward (the discounted sum over the window), discount (gamma^k, 0 after a termination),
    next_observation (the bootstrap observation)}, the columns `agents.dqn.learning` trains on."""
    k_row, k_env = jax.random.split(key)
    filled = jnp.minimum(ring.rows, ring.capacity)
    starts = jnp.maximum(filled - (n_step - 1), 1)
    oldest = ring.rows - filled  # the oldest row still held, as a count of rows ever written
    row = oldest + jax.random.randint(k_row, (batch_size,), 0, starts)
    env = jax.random.randint(k_env, (batch_size,), 0, ring.num_envs)
    window = (row[:, None] + jnp.arange(n_step)[None, :]) % ring.capacity  # [B, n]
    reward = ring.reward[window, env[:, None]]
    terminated = ring.terminated[window, env[:, None]]
    done = ring.done[window, env[:, None]]
    # Steps up to and including the first end in the window count; later ones belong to the next episode.
    ended_before = jnp.cumsum(done, axis=1) - done.astype(jnp.int32) > 0
    live = jnp.logical_not(ended_before)
    length = jnp.sum(live, axis=1)  # k in 1..n
    powers = discount ** jnp.arange(n_step, dtype=jnp.float32)
    last = window[jnp.arange(batch_size), length - 1]
    ends_terminal = jnp.any(terminated & live, axis=1)
    bootstrap = jnp.where(ends_terminal, 0.0, discount ** length.astype(jnp.float32))
    here = row % ring.capacity
    return {"observation": ring.observation[here, env], "action": ring.action[here, env],
            "reward": jnp.sum(jnp.where(live, reward, 0.0) * powers, axis=1),
            "discount": bootstrap.astype(jnp.float32), "next_observation": ring.next_observation[last, env]}
