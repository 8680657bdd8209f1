"""Honest environments: each gymnax port the jitted trainer runs (`quarl.envs.gymnax_env`) is the task the project
runs elsewhere (`quarl.envs.factory`: gymnasium 1.4, MinAtar 1.0.15). The specs are the same, and one fixed policy
scores the same mean return on both implementations within the episodes' noise. The returns are printed (`-s`): they
are docs/anakin.md's table."""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.anakin.common import evaluate
from quarl.envs.factory import make_environment
from quarl.envs.gymnax_env import GYMNAX_TASKS, GymnaxEnv
from quarl.envs.spec import environment_spec

# A policy: (observations [B, ...], key) -> actions [B]; the same jnp function acts on both implementations.
Policy = Callable[[jax.Array, jax.Array], jax.Array]
Z = 4.0  # returns may differ by Z standard errors of the difference of means before a port counts as different


def _cartpole(obs: jax.Array, key: jax.Array) -> jax.Array:
    """Push toward the side the pole leans to (angle only): tens of steps, a spread of returns that tells dynamics apart."""
    return (obs[:, 2] > 0).astype(jnp.int32)


def _acrobot(obs: jax.Array, key: jax.Array) -> jax.Array:
    """Torque with both joints' summed angular velocity (pumps energy into the swing): ~-120 +- 55 on gymnasium."""
    return jnp.where(obs[:, 4] + obs[:, 5] > 0, 2, 0).astype(jnp.int32)


def _mountain_car(obs: jax.Array, key: jax.Array) -> jax.Array:
    """Push with the velocity: reaches the flag in ~100-150 steps."""
    return jnp.where(obs[:, 1] > 0, 2, 0).astype(jnp.int32)


def _breakout(obs: jax.Array, key: jax.Array) -> jax.Array:
    """Move the paddle (channel 0, bottom row) under the ball (channel 1): left 1, right 3, else no-op."""
    paddle = jnp.argmax(obs[:, 9, :, 0], axis=-1)
    ball = jnp.argmax(jnp.max(obs[:, :, :, 1], axis=1), axis=-1)
    return jnp.where(ball < paddle, 1, jnp.where(ball > paddle, 3, 0)).astype(jnp.int32)


def _up(obs: jax.Array, key: jax.Array) -> jax.Array:
    """Freeway: always up (2), through the traffic until the 2,500-frame end."""
    return jnp.full((obs.shape[0],), 2, jnp.int32)


def _uniform(obs: jax.Array, key: jax.Array) -> jax.Array:
    """Uniformly random over MinAtar's 6 actions."""
    return jax.random.randint(key, (obs.shape[0],), 0, 6)


# task -> (policy, episodes per implementation)
POLICIES: dict[str, tuple[Policy, int]] = {
    "CartPole-v1": (_cartpole, 200), "Acrobot-v1": (_acrobot, 100), "MountainCar-v0": (_mountain_car, 100),
    "MinAtar/Breakout": (_breakout, 200), "MinAtar/SpaceInvaders": (_uniform, 100), "MinAtar/Asterix": (_uniform, 200),
    "MinAtar/Freeway": (_up, 20),
}


def gymnax_returns(task: str, policy: Policy, episodes: int, seed: int = 0) -> np.ndarray:
    """`episodes` episodes of `policy` on the gymnax port (in one jit, side by side)."""
    env = GymnaxEnv(task)
    run = jax.jit(lambda key: evaluate(env, policy, key, episodes)[0])
    return np.asarray(run(jax.random.PRNGKey(seed)), np.float64)


def project_returns(task: str, policy: Policy, episodes: int, seed: int = 0) -> np.ndarray:
    """`episodes` episodes of `policy` on the project's environment (`make_environment`: gymnasium, MinAtar)."""
    env = make_environment(task, seed)
    act = jax.jit(policy)
    key = jax.random.PRNGKey(seed + 1)
    out = []
    try:
        for _ in range(episodes):
            ts, total = env.reset(), 0.0
            while not ts.last():
                key, sub = jax.random.split(key)
                action = int(act(jnp.asarray(ts.observation)[None], sub)[0])
                ts = env.step(np.int32(action))
                total += float(ts.reward)
            out.append(total)
    finally:
        env.close()
    return np.asarray(out)


def compare(task: str) -> tuple[np.ndarray, np.ndarray, float]:
    """(gymnax returns, project returns, the difference of means in standard errors)."""
    policy, episodes = POLICIES[task]
    ours, theirs = gymnax_returns(task, policy, episodes), project_returns(task, policy, episodes)
    se = math.sqrt(ours.var(ddof=1) / len(ours) + theirs.var(ddof=1) / len(theirs))
    z = abs(ours.mean() - theirs.mean()) / se if se > 0 else (0.0 if ours.mean() == theirs.mean() else math.inf)
    print(f"\n{task}: gymnax {ours.mean():.2f} +- {ours.std():.2f}, project {theirs.mean():.2f} +- {theirs.std():.2f} "
          f"({len(ours)} episodes each), difference {z:.2f} standard errors")
    return ours, theirs, z


@pytest.mark.parametrize("task", GYMNAX_TASKS)
def test_each_port_has_the_project_environments_specs(task):
    env = make_environment(task, 0)
    try:
        want = environment_spec(env)
    finally:
        env.close()
    got = GymnaxEnv(task).spec
    assert (got.observation_shape, got.obs_dtype, got.num_actions, got.discrete) == (
        want.observation_shape, want.obs_dtype, want.num_actions, want.discrete)
    assert got.observations == want.observations and got.actions == want.actions


@pytest.mark.parametrize("task", [pytest.param(t, marks=() if t == "CartPole-v1" else pytest.mark.slow)
                                  for t in GYMNAX_TASKS])
def test_a_fixed_policy_scores_the_same_on_the_port_and_the_project_environment(task):
    ours, theirs, z = compare(task)
    assert z <= Z, f"{task}: gymnax {ours.mean():.2f} vs project {theirs.mean():.2f} ({z:.1f} standard errors)"
    assert np.ptp(np.concatenate([ours, theirs])) > 0 or task == "MinAtar/Freeway"  # the policy's returns vary
