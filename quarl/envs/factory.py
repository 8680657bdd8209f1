"""The environment factory: every task by name (DM Control, Gymnasium classic control, MinAtar, ALE) as a seeded
`dm_env.Environment`.

Every environment an agent sees has the same shape, whatever it came from, so that actors, adders and
replay never special-case a task:
- observations are one flat float32 vector (`quarl.envs.wrappers`); MinAtar's and ALE's games
  (`quarl.envs.minatar`, `quarl.envs.ale`) are the exception: uint8 [H, W, C] images, kept as bytes in replay;
- continuous actions live in [-1, 1] and are mapped affinely onto the task's bounds (then clipped), so a
  tanh policy head never needs to know the task's action range;
- rewards and discounts are float32; non-finite observations raise instead of poisoning replay.
"""
from __future__ import annotations

import functools

import dm_env
import numpy as np
from dm_env import specs

from quarl.envs.ale import ALE_TASKS, AtariEnvironment
from quarl.envs.dmc import suite
from quarl.envs.gym import GYM_TASKS, GymWrapper
from quarl.envs.minatar import MINATAR_TASKS, make_minatar
from quarl.envs.wrappers import CanonicalActionWrapper, ConcatObservationWrapper, SinglePrecisionWrapper


@functools.lru_cache(maxsize=1)
def list_tasks() -> tuple[str, ...]:
    """All task names `make_environment` accepts: DM Control benchmarking tasks, Gymnasium ids, then MinAtar
    and ALE games (image observations, `quarl.envs.minatar`, `quarl.envs.ale`)."""
    control = tuple(f"{domain}:{task}" for domain, task in suite().BENCHMARKING)
    return control + GYM_TASKS + MINATAR_TASKS + ALE_TASKS


def make_environment(task: str, seed: int = 0, *, training: bool = False) -> dm_env.Environment:
    """Builds the environment for `task` ("domain:task" for DM Control, or a Gymnasium id), seeded.

    The same (task, seed) pair yields the same sequence of episodes given the same actions. `training=True`
    (the actors' environments, `quarl.envs.vector`) clips ALE rewards to [-1, 1], DQN's training signal; the
    evaluator's environments report the game score. Other tasks are the same either way.
    """
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    seed = int(seed)
    if task in MINATAR_TASKS:  # uint8 image observations: none of the float wrappers below apply
        return make_minatar(task, seed)
    if task in ALE_TASKS:
        return AtariEnvironment(task, seed, clip_rewards=bool(training))
    if task in GYM_TASKS:
        import gymnasium  # pylint: disable=import-outside-toplevel

        env: dm_env.Environment = GymWrapper(gymnasium.make(task), seed)
    elif isinstance(task, str) and task in list_tasks():
        domain, name = task.split(":")
        env = ConcatObservationWrapper(suite().load(domain, name, task_kwargs={"random": seed}))
    else:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(list_tasks())}")
    if isinstance(env.action_spec(), specs.BoundedArray) and not isinstance(env.action_spec(), specs.DiscreteArray):
        env = CanonicalActionWrapper(env)
    return SinglePrecisionWrapper(env)


