"""MinAtar (Young & Tian, 2019) games as `dm_env.Environment`s with image observations.

MinAtar re-implements five Atari games on a 10x10 grid: each observation is a 10x10xC boolean image, one
channel per object kind (Breakout: paddle, ball, trail, brick). It is the CI-scale stand-in for ALE: the
same conv-policy code path (image observations, uint8 in replay, a conv Q-network, int8 conv actors) at a
few microseconds per env step.

Contract (as `quarl.envs.factory` for the vector tasks, except the observation):
- observations are uint8 [10, 10, C] (0/1), kept as integers so replay stores one byte per cell; the
  networks cast them to float;
- the action spec is `DiscreteArray(6)`: MinAtar's full action set, as the authors' DQN baseline uses;
- rewards and discounts are float32; the game's own end is a termination (discount 0); `max_episode_steps`
  (default `MAX_EPISODE_STEPS`) truncates an episode with discount 1, so n-step targets bootstrap through it;
- sticky actions with probability 0.1 and difficulty ramping, MinAtar's defaults (the authors' settings);
- one `seed` drives the whole game (MinAtar's RandomState): the same (task, seed) and actions replay the
  same episodes.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import dm_env
import numpy as np
from dm_env import specs

from quarl.envs.pixel import PixelEnvironment, check_task_and_seed

if TYPE_CHECKING:  # MinAtar is imported lazily (see `_minatar_environment`)
    import minatar

MINATAR_PREFIX = "MinAtar/"
# Task name -> MinAtar's module name.
MINATAR_GAMES = {"Asterix": "asterix", "Breakout": "breakout", "Freeway": "freeway", "Seaquest": "seaquest",
                 "SpaceInvaders": "space_invaders"}
MINATAR_TASKS = tuple(f"{MINATAR_PREFIX}{name}" for name in MINATAR_GAMES)
STICKY_ACTION_PROB = 0.1
# Truncation limit: Seaquest and Space Invaders episodes of a good policy otherwise never end, and an actor
# must reach episode boundaries to report returns. 10k steps is far beyond what the reduced-size runs reach.
MAX_EPISODE_STEPS = 10_000


def _minatar_environment(game: str, sticky_action_prob: float, ramping: bool) -> minatar.Environment:
    """MinAtar's `Environment`; its import logs a warning when seaborn (rendering only) is missing: silenced."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        from minatar import Environment  # pylint: disable=import-outside-toplevel
    finally:
        root.setLevel(level)
    return Environment(game, sticky_action_prob=sticky_action_prob, difficulty_ramping=ramping)


class MinAtarEnvironment(PixelEnvironment):
    """One MinAtar game behind the dm_env interface (see the module docstring)."""

    def __init__(self, task: str, seed: int, *, max_episode_steps: int = MAX_EPISODE_STEPS,
                 sticky_action_prob: float = STICKY_ACTION_PROB, difficulty_ramping: bool = True):
        check_task_and_seed(task, MINATAR_TASKS, "MinAtar", seed)
        if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be a positive int, got {max_episode_steps!r}")
        self._game = _minatar_environment(MINATAR_GAMES[task[len(MINATAR_PREFIX):]], sticky_action_prob,
                                          difficulty_ramping)
        self._game.seed(int(seed))  # one RandomState for the game and its sticky actions
        self._num_actions = int(self._game.num_actions())
        self._obs_spec = specs.BoundedArray(tuple(int(d) for d in self._game.state_shape()), np.uint8, 0, 1,
                                            name="observation")
        self._max_steps = max_episode_steps
        self._steps = 0
        self._reset_next_step = True

    def _observation(self) -> np.ndarray:
        return self._game.state().astype(np.uint8)

    def _new_episode(self) -> None:
        self._game.reset()
        self._steps = 0

    def _act(self, index: int) -> dm_env.TimeStep:
        reward, terminal = self._game.act(index)
        self._steps += 1
        return self._end_step(reward, self._observation(), terminal=bool(terminal),
                              truncated=self._steps >= self._max_steps)



def make_minatar(task: str, seed: int = 0, *, max_episode_steps: int = MAX_EPISODE_STEPS,
                 sticky_action_prob: float = STICKY_ACTION_PROB, difficulty_ramping: bool = True) -> MinAtarEnvironment:
    """The MinAtar game `task` ("MinAtar/Breakout", ...), seeded; the options are `MinAtarEnvironment`'s."""
    return MinAtarEnvironment(task, seed, max_episode_steps=max_episode_steps, sticky_action_prob=sticky_action_prob,
                              difficulty_ramping=difficulty_ramping)
