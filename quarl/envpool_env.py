"""envpool's C++ DM Control tasks as a `quarl.vector_env.VectorEnvironment`, for the tasks proven to match.

envpool steps K environments of a task in one C++ call (one thread here: an actor is one core), several times
cheaper per env step than dm_control's Python loop, so a vectorized actor's time goes to its policy. It is
used only for the tasks in `ENVPOOL_TASKS`: `tests/quarl/test_envpool_env.py` shows for each that, after our
flattening, observations (keys, shapes, order), action spec, rewards, discounts and episode length are
dm_control's, and that from the same physics state the same actions give the same trajectory (within
float32 rounding over a full 1000-step episode), with initial states from the same distribution. Every
other task, and any machine without envpool, keeps dm_control (`make_vector_environment` decides).

Each timestep is converted to our single-environment contract (`quarl.envs`): observation keys sorted and
concatenated to float32, actions taken in [-1, 1] and mapped onto the task's bounds, float32 reward and
discount, non-finite observations refused. envpool restarts a finished environment itself on its next step;
here `reset_one(i)` restarts it explicitly instead, as `VectorEnvironment` prescribes.
"""
from __future__ import annotations

import functools
from typing import Any

import dm_env
import numpy as np
from dm_env import specs

from quarl.envs import _check_finite, canonical_to_bounds

# Our task name -> envpool's, for the tasks whose equivalence to dm_control a test proves.
ENVPOOL_TASKS = {
    "cartpole:balance": "CartpoleBalance-v1",
    "cartpole:swingup": "CartpoleSwingup-v1",
}
_NOT_OBSERVATIONS = ("env_id", "players", "elapsed_step")  # envpool's bookkeeping fields in its State
_STEP_TYPES = tuple(dm_env.StepType)  # index = envpool's step_type code (FIRST 0, MID 1, LAST 2)


@functools.lru_cache(maxsize=1)
def envpool_available() -> bool:
    """Whether envpool imports here (it is optional: without it every task runs on dm_control)."""
    try:
        import envpool  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        return False
    return True


class EnvpoolVectorEnvironment:
    """K environments of one envpool DM Control task, one C++ thread, each seeded with its own seed."""

    def __init__(self, task: str, seeds: list[int]):
        if task not in ENVPOOL_TASKS:
            raise ValueError(f"no envpool task verified against dm_control for {task!r}; "
                             f"verified: {', '.join(ENVPOOL_TASKS)}")
        import envpool  # pylint: disable=import-outside-toplevel

        self._k = len(seeds)
        self._pool = envpool.make_dm(ENVPOOL_TASKS[task], num_envs=self._k, batch_size=self._k, num_threads=1,
                                     seed=int(seeds[0]), env_seed=[int(s) for s in seeds])
        obs_spec = self._pool.observation_spec()
        self._keys = sorted(k for k in obs_spec._fields if k not in _NOT_OBSERVATIONS)
        dim = sum(int(np.prod(getattr(obs_spec, k).shape, dtype=np.int64)) for k in self._keys)
        self._obs_spec = specs.Array((dim,), np.float32, name="observation")
        act = self._pool.action_spec()
        self._act_dtype = act.dtype
        self._low = np.broadcast_to(np.asarray(act.minimum, np.float64), act.shape).copy()
        self._high = np.broadcast_to(np.asarray(act.maximum, np.float64), act.shape).copy()
        self._act_spec = specs.BoundedArray(act.shape, np.float32, -1.0, 1.0, name="action")
        self._all = np.arange(self._k, dtype=np.int32)

    @property
    def num_envs(self) -> int:
        return self._k

    def observation_spec(self) -> specs.Array:
        return self._obs_spec

    def action_spec(self) -> specs.BoundedArray:
        return self._act_spec

    def _observations(self, state: Any) -> np.ndarray:
        rows = len(state.env_id)
        parts = [np.asarray(getattr(state, k), np.float32).reshape(rows, -1) for k in self._keys]
        return _check_finite(np.concatenate(parts, axis=1))

    def _timesteps(self, batch: dm_env.TimeStep, first: bool) -> list[dm_env.TimeStep]:
        """One TimeStep per environment, in env-id order, built from the batch arrays in a few numpy ops."""
        obs = self._observations(batch.observation)
        order = None
        if len(obs) > 1:  # envpool may answer out of order (one row needs no check: a per-step cost at K=1)
            ids = np.asarray(batch.observation.env_id)
            order = np.argsort(ids) if (ids[1:] < ids[:-1]).any() else None
        if first:
            rows = obs if order is None else obs[order]
            return [dm_env.restart(o) for o in rows]
        step_types = np.asarray(batch.step_type)
        rewards = np.asarray(batch.reward, np.float32)
        discounts = np.asarray(batch.discount, np.float32)
        if order is not None:
            obs, step_types, rewards, discounts = obs[order], step_types[order], rewards[order], discounts[order]
        return [dm_env.TimeStep(_STEP_TYPES[t], r, d, o)
                for t, r, d, o in zip(step_types.tolist(), rewards, discounts, obs)]

    def reset(self) -> list[dm_env.TimeStep]:
        return self._timesteps(self._pool.reset(self._all), first=True)

    def reset_one(self, index: int) -> dm_env.TimeStep:
        return self._timesteps(self._pool.reset(np.array([index], np.int32)), first=True)[0]

    def step(self, actions: Any) -> list[dm_env.TimeStep]:
        if len(actions) != self._k:
            raise ValueError(f"got {len(actions)} actions for {self._k} environments")
        scaled = canonical_to_bounds(actions, self._low, self._high, self._act_dtype, batch=self._k)
        return self._timesteps(self._pool.step(scaled, self._all), first=False)

    def close(self) -> None:
        self._pool.close()
