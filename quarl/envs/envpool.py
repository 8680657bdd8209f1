"""envpool's C++ DM Control tasks as a `quarl.envs.vector.VectorEnvironment`, for the tasks proven to match.

envpool steps K environments of a task in one C++ call (one thread here: an actor is one core), several times
cheaper per env step than dm_control's Python loop, so a vectorized actor's time goes to its policy. It is
used only for the tasks in `ENVPOOL_TASKS`: `tests/quarl/test_envpool_env.py` shows for each that, after our
flattening, observations (keys, shapes, order), action spec, rewards, discounts and episode length are
dm_control's, and that from the same physics state the same actions give the same trajectory (within
float32 rounding over a full 1000-step episode), with initial states from the same distribution. Every
other task, and any machine without envpool, keeps dm_control (`make_vector_environment` decides).

Each timestep is converted to our single-environment contract (`quarl.envs.factory`): observation keys sorted and
concatenated to float32, actions taken in [-1, 1] and mapped onto the task's bounds, float32 reward and
discount, non-finite observations refused. envpool restarts a finished environment itself on its next step;
here `reset_one(i)` restarts it explicitly instead, as `VectorEnvironment` prescribes.

Per-step cost at K=1 (one actor, one environment): envpool's physics is ~20 us, but a step also pays the hand-off
to envpool's worker thread and back (~80-100 us, more when the policy ran long enough for the worker to sleep)
and envpool's per-call Python (~50 us: its config dict rebuilt twice per step, a tree unflattening and a TimeStep
per batch). `step` therefore calls envpool's C++ send/receive directly when the pool has the key layout of
envpool 1.2.5 (`_direct_layout`, checked at construction; any other layout steps through the public API), and
converts with plain ufuncs; the results are identical either way (tests/quarl/test_envpool_env.py).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, TypedDict

import dm_env
import numpy as np
from dm_env import specs

from quarl.envs.spec import BatchActions
from quarl.envs.wrappers import canonical_to_bounds, check_finite

if TYPE_CHECKING:  # envpool is optional and imported lazily
    from envpool.python.protocol import DMEnvPool

# Our task name -> envpool's, for the tasks whose equivalence to dm_control a test proves.
ENVPOOL_TASKS = {
    "cartpole:balance": "CartpoleBalance-v1",
    "cartpole:swingup": "CartpoleSwingup-v1",
}
_NOT_OBSERVATIONS = ("env_id", "players", "elapsed_step")  # envpool's bookkeeping fields in its State
_STEP_TYPES = tuple(dm_env.StepType)  # index = envpool's step_type code (FIRST 0, MID 1, LAST 2)
# envpool 1.2.5's flat action layout for a single-player task (what its public `send` builds per call).
_DIRECT_ACTION_KEYS = ("env_id", "players.env_id", "action")


class _DirectLayout(TypedDict):
    """Where `step` finds its fields in the list envpool's C++ `_recv` returns (indices into that list)."""

    env_id: int | None  # None: the pool reports no env ids (then only K=1 steps directly)
    step_type: int
    reward: int
    discount: int
    obs: list[int]  # the observation fields, in `EnvpoolVectorEnvironment._keys` order


def _direct_layout(pool: DMEnvPool, keys: list[str]) -> _DirectLayout | None:
    """Positions of the fields `step` reads in the list envpool's C++ `_recv` returns, or None when the pool
    is not laid out as envpool 1.2.5's single-player DM tasks are (then `step` uses the public API)."""
    try:
        action_keys, state_keys = tuple(pool._action_keys), list(pool._state_keys)
        single = pool.config.get("max_num_players", 1) == 1
        callable_ = callable(pool._send) and callable(pool._recv)
    except (AttributeError, TypeError):
        return None
    needed = ["step_type", "reward", "discount", *(f"obs:{k}" for k in keys)]
    if not (single and callable_ and action_keys == _DIRECT_ACTION_KEYS and all(k in state_keys for k in needed)):
        return None
    return {"env_id": state_keys.index("info:env_id") if "info:env_id" in state_keys else None,
            "step_type": state_keys.index("step_type"), "reward": state_keys.index("reward"),
            "discount": state_keys.index("discount"), "obs": [state_keys.index(f"obs:{k}") for k in keys]}


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

    def __init__(self, task: str, seeds: list[int], direct: bool = True):
        """`direct=False` steps through envpool's public send/recv only (the reference the tests compare
        the direct path with)."""
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
        self._direct = _direct_layout(self._pool, self._keys) if direct else None
        if self._direct is not None and self._direct["env_id"] is None and self._k > 1:
            self._direct = None  # without env ids an out-of-order answer could not be reordered

    @property
    def num_envs(self) -> int:
        return self._k

    def observation_spec(self) -> specs.Array:
        return self._obs_spec

    def action_spec(self) -> specs.BoundedArray:
        return self._act_spec

    @property
    def direct(self) -> bool:
        """Whether `step` calls envpool's C++ send/receive directly (see the module docstring)."""
        return self._direct is not None

    def _rows(self, ids: np.ndarray, obs_parts: list[np.ndarray], step_types: np.ndarray | None = None,
              rewards: np.ndarray | None = None, discounts: np.ndarray | None = None) -> list[dm_env.TimeStep]:
        """One TimeStep per environment, in env-id order, from envpool's batch fields (observation fields in
        `self._keys` order; FIRST timesteps when `step_types` is None), in a few numpy ops."""
        n = len(ids)
        obs = check_finite(np.concatenate([np.asarray(x, np.float32).reshape(n, -1) for x in obs_parts], axis=1))
        order = None
        if n > 1:  # envpool may answer out of order (one row needs no check: a per-step cost at K=1)
            ids = np.asarray(ids)
            order = np.argsort(ids) if (ids[1:] < ids[:-1]).any() else None
        if step_types is None:
            return [dm_env.restart(o) for o in (obs if order is None else obs[order])]
        step_types = np.asarray(step_types)
        rewards = np.asarray(rewards, np.float32)
        discounts = np.asarray(discounts, np.float32)
        if order is not None:
            obs, step_types, rewards, discounts = obs[order], step_types[order], rewards[order], discounts[order]
        return [dm_env.TimeStep(_STEP_TYPES[t], r, d, o)
                for t, r, d, o in zip(step_types.tolist(), rewards, discounts, obs)]

    def _first(self, batch: dm_env.TimeStep) -> list[dm_env.TimeStep]:
        state = batch.observation
        return self._rows(state.env_id, [getattr(state, k) for k in self._keys])

    def reset(self) -> list[dm_env.TimeStep]:
        return self._first(self._pool.reset(self._all))

    def reset_one(self, index: int) -> dm_env.TimeStep:
        return self._first(self._pool.reset(np.array([index], np.int32)))[0]

    def step(self, actions: BatchActions) -> list[dm_env.TimeStep]:
        if len(actions) != self._k:
            raise ValueError(f"got {len(actions)} actions for {self._k} environments")
        scaled = canonical_to_bounds(actions, self._low, self._high, self._act_dtype, batch=self._k)
        d = self._direct
        if d is None:
            batch = self._pool.step(scaled, self._all)
            state = batch.observation
            return self._rows(state.env_id, [getattr(state, k) for k in self._keys], batch.step_type, batch.reward,
                              batch.discount)
        # What envpool's public send would pass (its layout checked at construction), minus its Python.
        self._pool._send([self._all, self._all, scaled])  # pylint: disable=protected-access
        fields = self._pool._recv()  # pylint: disable=protected-access
        ids = self._all if d["env_id"] is None else fields[d["env_id"]]
        return self._rows(ids, [fields[i] for i in d["obs"]], fields[d["step_type"]], fields[d["reward"]],
                          fields[d["discount"]])

    def close(self) -> None:
        self._pool.close()
