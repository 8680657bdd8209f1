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

import difflib
import functools

import dm_env
import numpy as np
from dm_env import specs

from quarl.envs.ale import ALE_PREFIX, ALE_TASKS, GYMNASIUM_ALE_SUFFIX, AtariEnvironment
from quarl.envs.dmc import suite
from quarl.envs.gym import GYM_TASKS, GymWrapper
from quarl.envs.minatar import MINATAR_PREFIX, MINATAR_TASKS, make_minatar
from quarl.envs.wrappers import CanonicalActionWrapper, ConcatObservationWrapper, SinglePrecisionWrapper


@functools.lru_cache(maxsize=1)
def list_tasks() -> tuple[str, ...]:
    """All task names `make_environment` accepts: DM Control benchmarking tasks, Gymnasium ids, then MinAtar
    and ALE games (image observations, `quarl.envs.minatar`, `quarl.envs.ale`)."""
    control = tuple(f"{domain}:{task}" for domain, task in suite().BENCHMARKING)
    return control + GYM_TASKS + MINATAR_TASKS + ALE_TASKS


def task_family(task: str) -> str:
    """"minatar", "ale" (uint8 image observations), "gym" or "control", by the task's name (an alias included):
    what the agents' per-task presets and the evaluation defaults key on."""
    task = canonical_task(task)
    if task.startswith(MINATAR_PREFIX):
        return "minatar"
    if task.startswith(ALE_PREFIX):
        return "ale"
    return "control" if ":" in task else "gym"


# The episode returns a task can give, where its rules bound them (plots clip spread to them): gym's caps on
# episode length times the reward per step, DM Control's 1,000 steps of rewards in [0, 1], Pong's 21 points.
GYM_RETURN_RANGES = {"CartPole-v1": (0.0, 500.0), "Acrobot-v1": (-500.0, 0.0), "MountainCar-v0": (-200.0, 0.0),
                     "Pendulum-v1": (-200 * (np.pi ** 2 + 0.1 * 8 ** 2 + 0.001 * 2 ** 2), 0.0)}


def return_range(task: str) -> tuple[float, float] | None:
    """(lowest, highest) episode return `task` can give, or None where its rules set no bound (most games)."""
    task = canonical_task(task)
    if task in GYM_RETURN_RANGES:
        return GYM_RETURN_RANGES[task]
    if task_family(task) == "control":
        return 0.0, 1000.0
    return (-21.0, 21.0) if task == "ALE/Pong" else None


def canonical_task(task: str) -> str:
    """`task` as `list_tasks` names it. Gymnasium's own ALE ids (`ALE/Pong-v5`) name the same v5 settings
    `quarl.envs.ale` implements, so they are accepted for `ALE/Pong`; every other name is returned as it is."""
    if isinstance(task, str) and task.endswith(GYMNASIUM_ALE_SUFFIX):
        base = task[:-len(GYMNASIUM_ALE_SUFFIX)]
        if base in ALE_TASKS:
            return base
    return task


def closest_tasks(task: object, n: int = 3) -> list[str]:
    """Up to `n` valid task ids closest to `task` (case-insensitive), best first, for an unknown-task error."""
    names = {name.lower(): name for name in list_tasks()}
    matches = difflib.get_close_matches(str(task).lower(), list(names), n=n, cutoff=0.5)
    if not matches:  # a bare game or domain name ("pong", "walker"): every task whose name contains it
        key = str(task).lower().removesuffix(GYMNASIUM_ALE_SUFFIX.lower())
        matches = [low for low in names if key and key in low][:n]
    return [names[m] for m in matches]


def unknown_task_message(task: object) -> str:
    """One line: the unknown `task`, the closest valid ids, and how many there are."""
    close = closest_tasks(task)
    hint = f"closest valid ids: {', '.join(close)}" if close else "no valid id is close"
    return (f"unknown task {task!r}; {hint} (of {len(list_tasks())}: DM Control 'domain:task', gym ids, "
            "MinAtar/<Game>, ALE/<Game> or ALE/<Game>-v5)")


def make_environment(task: str, seed: int = 0, *, training: bool = False) -> dm_env.Environment:
    """Builds the environment for `task` ("domain:task" for DM Control, or a Gymnasium id; `canonical_task`'s
    aliases too), seeded.

    The same (task, seed) pair yields the same sequence of episodes given the same actions. `training=True`
    (the actors' environments, `quarl.envs.vector`) clips ALE rewards to [-1, 1], DQN's training signal; the
    evaluator's environments report the game score. Other tasks are the same either way.
    """
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    seed = int(seed)
    task = canonical_task(task)
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
        raise ValueError(unknown_task_message(task))
    if isinstance(env.action_spec(), specs.BoundedArray) and not isinstance(env.action_spec(), specs.DiscreteArray):
        env = CanonicalActionWrapper(env)
    return SinglePrecisionWrapper(env)


