"""What the MinAtar and ALE environments share: a dm_env over uint8 images with a discrete action set.

Subclasses set `_obs_spec` and `_num_actions` and fill in `_new_episode`, `_observation` and `_act` (one step
of a checked action index, ending in `_end_step`); `reset` and `step` keep dm_env's contract (a step after an
episode's end resets) in one place, and the episode-end rule is written once: a game over is a termination
(discount 0), a time limit a truncation (discount 1, bootstrapped).
"""
from __future__ import annotations

import abc
from typing import Sequence

import dm_env
import numpy as np
import numpy.typing as npt
from dm_env import specs


def check_task_and_seed(task: str, tasks: Sequence[str], family: str, seed: object) -> None:
    """ValueError naming the valid tasks for an unknown `task`, or for a seed that is not a non-negative int."""
    if task not in tasks:
        raise ValueError(f"unknown {family} task {task!r}; valid: {', '.join(tasks)}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")


class PixelEnvironment(dm_env.Environment):
    """dm_env boilerplate for image observations and `_num_actions` discrete actions."""

    _obs_spec: specs.BoundedArray
    _num_actions: int
    _reset_next_step: bool = True

    @abc.abstractmethod
    def _new_episode(self) -> None:
        """Starts the game's next episode (the observation is read afterwards)."""

    @abc.abstractmethod
    def _observation(self) -> np.ndarray:
        """The current frame(s) as the observation spec's uint8 [H, W, C]."""

    @abc.abstractmethod
    def _act(self, index: int) -> dm_env.TimeStep:
        """One environment step of action `index` (already checked), its TimeStep from `_end_step`."""

    def reset(self) -> dm_env.TimeStep:
        self._new_episode()
        self._reset_next_step = False
        return dm_env.restart(self._observation())

    def step(self, action: npt.ArrayLike) -> dm_env.TimeStep:
        if self._reset_next_step:
            return self.reset()
        return self._act(self._check_action(action))

    def _check_action(self, action: npt.ArrayLike) -> int:
        """The action as an index in [0, num_actions); ValueError for anything else."""
        a = np.asarray(action)
        if a.size != 1 or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"discrete action must be one integer, got {action!r}")
        index = int(a.reshape(()))
        if not 0 <= index < self._num_actions:
            raise ValueError(f"action {index} outside [0, {self._num_actions})")
        return index

    def _end_step(self, reward: float, obs: np.ndarray, *, terminal: bool, truncated: bool) -> dm_env.TimeStep:
        """The TimeStep of a step that gave `reward` and `obs`; a game over wins over a time limit."""
        reward = np.float32(reward)
        if terminal or truncated:
            self._reset_next_step = True
        if terminal:
            return dm_env.termination(reward, obs)
        if truncated:
            return dm_env.truncation(reward, obs, discount=np.float32(1.0))
        return dm_env.transition(reward, obs, discount=np.float32(1.0))

    def observation_spec(self) -> specs.BoundedArray:
        return self._obs_spec

    def action_spec(self) -> specs.DiscreteArray:
        return specs.DiscreteArray(self._num_actions, np.int32, name="action")

    def reward_spec(self) -> specs.Array:
        return specs.Array((), np.float32, name="reward")

    def discount_spec(self) -> specs.BoundedArray:
        return specs.BoundedArray((), np.float32, 0.0, 1.0, name="discount")
