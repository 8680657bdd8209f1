"""Gymnasium's classic-control tasks as `dm_env.Environment`: `terminated` becomes a LAST step with discount 0 and
`truncated` (a time limit) a LAST step with discount 1, so n-step targets keep bootstrapping through a time limit."""
from __future__ import annotations

from typing import TYPE_CHECKING

import dm_env
import numpy as np
import numpy.typing as npt
from dm_env import specs

from quarl.envs.wrappers import check_finite

if TYPE_CHECKING:  # gymnasium is imported lazily (only its tasks need it)
    import gymnasium

GYM_TASKS = ("CartPole-v1", "MountainCar-v0", "Acrobot-v1", "Pendulum-v1")


class GymWrapper(dm_env.Environment):
    """A Gymnasium environment behind the dm_env interface.

    The seed is passed to the first `reset` only (Gymnasium seeds its RNG once; reseeding every episode
    would replay the same initial states). After a LAST step, `step` starts a new episode, as dm_env
    prescribes.
    """

    def __init__(self, env: gymnasium.Env, seed: int):
        import gymnasium  # pylint: disable=import-outside-toplevel

        self._env = env
        self._seed: int | None = seed
        self._reset_next_step = True
        obs_space = env.observation_space
        if not isinstance(obs_space, gymnasium.spaces.Box):
            raise ValueError(f"only Box observation spaces are supported, got {obs_space!r}")
        self._obs_spec = specs.Array(obs_space.shape, np.float32, name="observation")
        act_space = env.action_space
        if isinstance(act_space, gymnasium.spaces.Discrete):
            if int(act_space.start) != 0:
                raise ValueError(f"discrete action spaces must start at 0, got {act_space!r}")
            self._action_spec: specs.Array = specs.DiscreteArray(int(act_space.n), np.int32, name="action")
        elif isinstance(act_space, gymnasium.spaces.Box):
            self._action_spec = specs.BoundedArray(
                act_space.shape, act_space.dtype, act_space.low, act_space.high, name="action")
        else:
            raise ValueError(f"unsupported action space {act_space!r}")

    def _observation(self, obs: npt.ArrayLike) -> np.ndarray:
        return check_finite(np.asarray(obs, dtype=np.float32))

    def reset(self) -> dm_env.TimeStep:
        self._reset_next_step = False
        if self._seed is not None:
            obs, _ = self._env.reset(seed=self._seed)
            self._seed = None
        else:
            obs, _ = self._env.reset()
        return dm_env.restart(self._observation(obs))

    def step(self, action: npt.ArrayLike) -> dm_env.TimeStep:
        if self._reset_next_step:
            return self.reset()
        if isinstance(self._action_spec, specs.DiscreteArray):
            a = np.asarray(action)
            if a.size != 1 or not np.issubdtype(a.dtype, np.integer):
                raise ValueError(f"discrete action must be one integer, got {action!r}")
            env_action: int | np.ndarray = int(a.reshape(()))
            if not 0 <= env_action < self._action_spec.num_values:
                raise ValueError(f"action {env_action} outside [0, {self._action_spec.num_values})")
        else:
            env_action = np.asarray(action, dtype=self._action_spec.dtype)
        obs, reward, terminated, truncated, _ = self._env.step(env_action)
        obs = self._observation(obs)
        reward = np.float32(reward)
        if terminated:
            self._reset_next_step = True
            return dm_env.termination(reward, obs)
        if truncated:
            self._reset_next_step = True
            return dm_env.truncation(reward, obs, discount=np.float32(1.0))
        return dm_env.transition(reward, obs, discount=np.float32(1.0))

    def observation_spec(self) -> specs.Array:
        return self._obs_spec

    def action_spec(self) -> specs.Array:
        return self._action_spec

    def reward_spec(self) -> specs.Array:
        return specs.Array((), np.float32, name="reward")

    def discount_spec(self) -> specs.BoundedArray:
        return specs.BoundedArray((), np.float32, 0.0, 1.0, name="discount")

    def close(self) -> None:
        self._env.close()

