"""Atari 2600 games through the Arcade Learning Environment (ale-py 0.12.1, ROMs in its wheel) as `dm_env`s.

The standard DQN preprocessing (Mnih et al., 2015; Machado et al., 2018 for the v5 settings), written on
`ale_py.ALEInterface` directly (no gymnasium or OpenCV needed):
- sticky actions: the emulator repeats the previous action with probability 0.25 (ALE v5), seeded;
- frame skip 4: an agent step is 4 emulator frames, rewards summed, the observation the max over the last two
  frames' greyscale screens (flicker removal);
- 84x84 greyscale: area-averaging resize of the 210x160 screen (what OpenCV's INTER_AREA computes for a
  downscale), rounded to uint8;
- frame stack 4: observations are uint8 [84, 84, 4], oldest frame first (the first observation of an episode
  repeats its frame 4 times);
- the minimal action set of the game; an episode ends at game over (a termination) or after 108,000 emulator
  frames (a truncation, v5's limit);
- rewards are the game score, unclipped: `clip_rewards=True` (what `quarl.envs.vector` builds for actors, that
  is for training only) clips each step's reward to [-1, 1]; evaluation environments report the score.
"""
from __future__ import annotations

import collections
import functools

import dm_env
import numpy as np
from dm_env import specs

from quarl.envs.pixel import PixelEnvironment, check_task_and_seed

ALE_PREFIX = "ALE/"
# Task name -> ale-py ROM id (a subset of its 100+ ROMs: the games the DQN literature reports most).
ALE_GAMES = {"Pong": "pong", "Breakout": "breakout", "SpaceInvaders": "space_invaders", "Seaquest": "seaquest",
             "Qbert": "qbert", "BeamRider": "beam_rider", "Enduro": "enduro", "MsPacman": "ms_pacman",
             "Asterix": "asterix", "Freeway": "freeway"}
ALE_TASKS = tuple(f"{ALE_PREFIX}{name}" for name in ALE_GAMES)
# Gymnasium's ids for the same games and settings (`ALE/Pong-v5`): accepted as aliases (`quarl.envs.factory`).
GYMNASIUM_ALE_SUFFIX = "-v5"
FRAME_SKIP = 4
FRAME_STACK = 4
FRAME_SIZE = 84
STICKY_ACTION_PROB = 0.25
MAX_EPISODE_FRAMES = 108_000


@functools.lru_cache(maxsize=4)
def area_weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), both [n_out, K], of an area-averaging resize along one axis: output pixel i averages
    the input interval [i * n_in / n_out, (i + 1) * n_in / n_out), partial pixels weighted by their overlap."""
    scale = n_in / n_out
    taps = int(np.ceil(scale)) + 1
    idx = np.zeros((n_out, taps), np.int64)
    w = np.zeros((n_out, taps), np.float32)
    for i in range(n_out):
        lo, hi = i * scale, (i + 1) * scale
        for k, j in enumerate(range(int(np.floor(lo)), min(int(np.ceil(hi)), n_in))):
            idx[i, k], w[i, k] = j, (min(hi, j + 1) - max(lo, j)) / scale
    return idx, w


def resize_area(frame: np.ndarray, size: int = FRAME_SIZE) -> np.ndarray:
    """A greyscale [H, W] uint8 frame resized to [size, size] uint8 by area averaging: a few weighted gathers
    per axis (no BLAS call, whose thread start-up costs more than the arithmetic at this size)."""
    ri, rw = area_weights(frame.shape[0], size)
    ci, cw = area_weights(frame.shape[1], size)
    f = frame.astype(np.float32)
    rows = sum(f[ri[:, k]] * rw[:, k:k + 1] for k in range(ri.shape[1]))  # [size, W]
    out = sum(rows[:, ci[:, k]] * cw[:, k] for k in range(ci.shape[1]))  # [size, size]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


class AtariEnvironment(PixelEnvironment):
    """One ALE game with the standard DQN preprocessing (see the module docstring)."""

    def __init__(self, task: str, seed: int, *, clip_rewards: bool = False,
                 sticky_action_prob: float = STICKY_ACTION_PROB, max_episode_frames: int = MAX_EPISODE_FRAMES):
        from ale_py import ALEInterface, LoggerMode, roms  # pylint: disable=import-outside-toplevel

        check_task_and_seed(task, ALE_TASKS, "ALE", seed)
        ALEInterface.setLoggerMode(LoggerMode.Error)
        self._ale = ALEInterface()
        self._ale.setInt("random_seed", int(seed) % (2**31 - 1))
        self._ale.setFloat("repeat_action_probability", float(sticky_action_prob))
        self._ale.setInt("max_num_frames_per_episode", int(max_episode_frames))
        self._ale.loadROM(roms.get_rom_path(ALE_GAMES[task[len(ALE_PREFIX):]]))
        self._actions = list(self._ale.getMinimalActionSet())
        self._clip = bool(clip_rewards)
        h, w = self._ale.getScreenDims()
        self._screens = np.zeros((2, h, w), np.uint8)  # the last two frames of a skip, for the max-pool
        self._stack: collections.deque = collections.deque(maxlen=FRAME_STACK)
        self._obs_spec = specs.BoundedArray((FRAME_SIZE, FRAME_SIZE, FRAME_STACK), np.uint8, 0, 255,
                                            name="observation")
        self._num_actions = len(self._actions)
        self._reset_next_step = True

    def _frame(self) -> np.ndarray:
        return resize_area(np.maximum(self._screens[0], self._screens[1]))

    def _observation(self) -> np.ndarray:
        return np.stack(self._stack, axis=-1)

    def _new_episode(self) -> None:
        self._ale.reset_game()
        self._ale.getScreenGrayscale(self._screens[1])
        self._screens[0] = self._screens[1]
        frame = self._frame()
        for _ in range(FRAME_STACK):
            self._stack.append(frame)

    def _act(self, index: int) -> dm_env.TimeStep:
        reward = 0.0
        for i in range(FRAME_SKIP):
            reward += self._ale.act(self._actions[index])
            if i >= FRAME_SKIP - 2:
                self._ale.getScreenGrayscale(self._screens[i - (FRAME_SKIP - 2)])
            if self._ale.game_over(with_truncation=True):
                if i < FRAME_SKIP - 2:  # ended before the pooled frames: pool the last screen with itself
                    self._ale.getScreenGrayscale(self._screens[1])
                    self._screens[0] = self._screens[1]
                break
        self._stack.append(self._frame())
        obs = self._observation()
        reward = np.clip(reward, -1.0, 1.0) if self._clip else reward
        return self._end_step(reward, obs, terminal=self._ale.game_over(with_truncation=False),
                              truncated=self._ale.game_truncated())

