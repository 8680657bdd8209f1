"""The project's tasks as gymnax ports (gymnax 1.0.1): pure, jittable reset and step functions for the jitted trainer
(`launch.anakin`), set up to behave as the environments the rest of the project runs (`quarl.envs.factory`).

gymnax's environments are JAX ports of gymnasium's classic control and of MinAtar. Where a port's defaults differ
from the environment the project uses, this adapter sets or adds what makes them the same task:

- MinAtar: the full 6-action set (gymnax defaults to each game's minimal set; `quarl.envs.minatar` keeps MinAtar's
  6), sticky actions with probability 0.1 (MinAtar's default, which gymnax lacks: here, as in MinAtar, the previous
  action is repeated instead, the previous action surviving episode ends) and the truncation limit of
  `quarl.envs.minatar.MAX_EPISODE_STEPS` (gymnax: 1,000). Freeway's 2,500-frame end is the game's own end in
  MinAtar (a termination); gymnax implements it as its time limit, so here it terminates.
- Observations are what `make_environment` gives: float32 vectors, and MinAtar's 0/1 cells as uint8 [10, 10, C].
- Episodes auto-reset; a step reports `terminated` (discount 0) and `truncated` (a time limit, discount 1) apart,
  with the final observation of an episode that ended (what PPO bootstraps a time limit from).

What stays different is documented per task in docs/anakin.md and measured by tests/quarl/test_gymnax_env.py (the
same fixed policy's returns on both implementations) and the deployment tests of tests/launch/test_anakin.py and
tests/launch/test_anakin_minatar.py.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from dm_env import specs

from quarl.envs.minatar import MAX_EPISODE_STEPS, STICKY_ACTION_PROB
from quarl.envs.spec import EnvironmentSpec


@dataclasses.dataclass(frozen=True)
class PortSettings:
    """How one task is built from its gymnax port (see the module docstring)."""

    gymnax_id: str
    minatar: bool = False
    max_steps: int | None = None  # the truncation limit, None: gymnax's own (equal to gymnasium's)
    time_limit_terminates: bool = False  # the port's time limit is the game's own end (Freeway)


_MINATAR = {"minatar": True, "max_steps": MAX_EPISODE_STEPS}
PORTS: dict[str, PortSettings] = {
    "CartPole-v1": PortSettings("CartPole-v1"),
    "Acrobot-v1": PortSettings("Acrobot-v1"),
    "MountainCar-v0": PortSettings("MountainCar-v0"),
    "MinAtar/Breakout": PortSettings("Breakout-MinAtar", **_MINATAR),
    "MinAtar/SpaceInvaders": PortSettings("SpaceInvaders-MinAtar", **_MINATAR),
    "MinAtar/Asterix": PortSettings("Asterix-MinAtar", **_MINATAR),
    "MinAtar/Freeway": PortSettings("Freeway-MinAtar", minatar=True, time_limit_terminates=True),
}
GYMNAX_TASKS: tuple[str, ...] = tuple(PORTS)


class EnvState(NamedTuple):
    """One environment's state: gymnax's, and the previous action (sticky actions)."""

    inner: Any
    last_action: jax.Array


class Step(NamedTuple):
    """What one step gives: the next observation (of a new episode after an end), the reward, whether the
    episode terminated or was truncated, and the episode's last observation (equal to `obs` when it goes on)."""

    obs: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array


def check_gymnax_task(task: str) -> str:
    """`task` if the jitted trainer has a gymnax port of it, else a one-line ValueError listing them."""
    if task not in PORTS:
        raise ValueError(f"the jitted trainer runs {', '.join(GYMNAX_TASKS)} (gymnax ports); got {task!r}")
    return task


def _make(settings: PortSettings) -> tuple[Any, Any]:
    root = logging.getLogger()  # gymnax's import logs nothing useful; keep the CLI's output clean
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        import gymnax  # pylint: disable=import-outside-toplevel  (only the jitted trainer needs it)
    finally:
        root.setLevel(level)
    kwargs = {"use_minimal_action_set": False} if settings.minatar else {}
    env, params = gymnax.make(settings.gymnax_id, **kwargs)
    if settings.max_steps is not None:
        params = params.replace(max_steps_in_episode=settings.max_steps)
    return env, params


class GymnaxEnv:
    """One task's gymnax port: `reset(key)` and `step(key, state, action)` are pure and jittable (vmap them over
    environments); `spec` is the `EnvironmentSpec` the task's `make_environment` gives, so networks and policy
    files are the same for both implementations."""

    def __init__(self, task: str):
        self.task = check_gymnax_task(task)
        self.settings = PORTS[task]
        self._env, self._params = _make(self.settings)
        self.num_actions = int(self._env.num_actions)
        self.obs_shape: tuple[int, ...] = tuple(int(d) for d in self._env.observation_space(self._params).shape)
        self.obs_dtype = np.dtype(np.uint8 if self.settings.minatar else np.float32)
        self.sticky_prob = STICKY_ACTION_PROB if self.settings.minatar else 0.0

    @property
    def spec(self) -> EnvironmentSpec:
        actions = specs.DiscreteArray(self.num_actions, np.int32, name="action")
        dim = int(np.prod(self.obs_shape))
        if self.settings.minatar:
            obs = specs.BoundedArray(self.obs_shape, np.uint8, 0, 1, name="observation")
            return EnvironmentSpec(obs, actions, dim, 0, True, self.num_actions, self.obs_shape, np.dtype(np.uint8))
        obs = specs.Array(self.obs_shape, np.float32, name="observation")
        return EnvironmentSpec(obs, actions, dim, 0, True, self.num_actions)

    @property
    def max_steps(self) -> int:
        """The longest an episode runs (its time limit)."""
        return int(self._params.max_steps_in_episode)

    def _observation(self, obs: jax.Array) -> jax.Array:
        return obs.astype(jnp.uint8) if self.settings.minatar else obs.astype(jnp.float32)

    def reset(self, key: jax.Array) -> tuple[EnvState, jax.Array]:
        obs, inner = self._env.reset(key, self._params)
        return EnvState(inner, jnp.zeros((), jnp.int32)), self._observation(obs)

    def step(self, key: jax.Array, state: EnvState, action: jax.Array) -> tuple[EnvState, Step]:
        action = jnp.asarray(action, jnp.int32)
        if self.sticky_prob:  # MinAtar's: with probability p the previous action is taken instead
            key, k_sticky = jax.random.split(key)
            action = jnp.where(jax.random.uniform(k_sticky) < self.sticky_prob, state.last_action, action)
        obs, inner, reward, terminated, truncated, info = self._env.step(key, state.inner, action, self._params)
        if self.settings.time_limit_terminates:
            terminated, truncated = jnp.logical_or(terminated, truncated), jnp.zeros_like(truncated)
        else:
            truncated = jnp.logical_and(truncated, jnp.logical_not(terminated))
        step = Step(self._observation(obs), jnp.asarray(reward, jnp.float32), terminated, truncated,
                    self._observation(info["final_observation"]))
        return EnvState(inner, action), step
