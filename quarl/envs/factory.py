"""Environment factories: DM Control Suite and Gymnasium classic control, both as `dm_env.Environment`.

Every environment an agent sees has the same shape, whatever it came from, so that actors, adders and
replay never special-case a task:
- observations are one flat float32 vector (DM Control's observation dict is concatenated in sorted key
  order, which is the order Acme's `ConcatObservationWrapper` produces through `tree.flatten`); MinAtar's
  games (`quarl.envs.minatar`) are the exception: uint8 [H, W, C] images, kept as bytes in replay;
- continuous actions live in [-1, 1] and are mapped affinely onto the task's bounds (then clipped), so a
  tanh policy head never needs to know the task's action range;
- rewards and discounts are float32; non-finite observations raise instead of poisoning replay.
Gymnasium's `terminated` becomes a LAST step with discount 0 and `truncated` (time limit) a LAST step with
discount 1, so n-step targets keep bootstrapping through a time limit.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import dm_env
import numpy as np
from dm_env import specs

from quarl.envs.ale import ALE_TASKS, AtariEnvironment
from quarl.envs.minatar import MINATAR_TASKS, make_minatar

GYM_TASKS = ("CartPole-v1", "MountainCar-v0", "Acrobot-v1", "Pendulum-v1")


def _suite() -> Any:
    """Import dm_control's suite lazily, with rendering disabled unless the user chose a GL backend.

    No rendering is needed, and EGL/GLFW are unavailable on these machines: without MUJOCO_GL dm_control
    probes GLFW and warns about a missing display on every import.
    """
    os.environ.setdefault("MUJOCO_GL", "disable")
    from dm_control import suite  # pylint: disable=import-outside-toplevel

    return suite


@functools.lru_cache(maxsize=1)
def list_tasks() -> tuple[str, ...]:
    """All task names `make_environment` accepts: DM Control benchmarking tasks, Gymnasium ids, then MinAtar
    and ALE games (image observations, `quarl.envs.minatar`, `quarl.envs.ale`)."""
    control = tuple(f"{domain}:{task}" for domain, task in _suite().BENCHMARKING)
    return control + GYM_TASKS + MINATAR_TASKS + ALE_TASKS


def _check_finite(observation: np.ndarray) -> np.ndarray:
    if not np.isfinite(observation).all():
        raise ValueError(f"environment produced a non-finite observation: {observation!r}")
    return observation


class _Wrapper(dm_env.Environment):
    """Forwards everything to the wrapped environment; subclasses override what they change."""

    def __init__(self, environment: dm_env.Environment):
        self._environment = environment

    def reset(self) -> dm_env.TimeStep:
        return self._environment.reset()

    def step(self, action: Any) -> dm_env.TimeStep:
        return self._environment.step(action)

    def observation_spec(self) -> Any:
        return self._environment.observation_spec()

    def action_spec(self) -> Any:
        return self._environment.action_spec()

    def reward_spec(self) -> Any:
        return self._environment.reward_spec()

    def discount_spec(self) -> Any:
        return self._environment.discount_spec()

    @property
    def environment(self) -> dm_env.Environment:
        """The wrapped environment (one level down)."""
        return self._environment

    def close(self) -> None:
        self._environment.close()


class ConcatObservationWrapper(_Wrapper):
    """Concatenates a dict observation into one float32 vector, keys in sorted order (as Acme does)."""

    def __init__(self, environment: dm_env.Environment):
        super().__init__(environment)
        obs_spec = environment.observation_spec()
        self._keys = sorted(obs_spec)
        dim = sum(int(np.prod(obs_spec[k].shape, dtype=np.int64)) for k in self._keys)
        self._spec = specs.Array((dim,), np.float32, name="observation")

    def _convert(self, timestep: dm_env.TimeStep) -> dm_env.TimeStep:
        obs = timestep.observation
        flat = np.concatenate([np.asarray(obs[k], dtype=np.float32).reshape(-1) for k in self._keys])
        return timestep._replace(observation=_check_finite(flat))

    def reset(self) -> dm_env.TimeStep:
        return self._convert(self._environment.reset())

    def step(self, action: Any) -> dm_env.TimeStep:
        return self._convert(self._environment.step(action))

    def observation_spec(self) -> specs.Array:
        return self._spec


def canonical_to_bounds(action: Any, low: np.ndarray, high: np.ndarray, dtype: Any, *,
                        batch: int | None = None) -> np.ndarray:
    """An action in [-1, 1] (clipped there first) mapped affinely onto [low, high], as `dtype`; with `batch=K`,
    K such actions stacked on a leading axis, mapped in one go.

    Raises ValueError on a shape other than `low`'s (or `(K, *low.shape)`) or a non-finite value."""
    a = np.asarray(action, dtype=np.float64)
    expected = low.shape if batch is None else (int(batch), *low.shape)
    if a.shape != expected:
        raise ValueError(f"action shape {a.shape} does not match the action spec shape {expected}")
    if not np.isfinite(a).all():
        raise ValueError(f"non-finite action: {action!r}")
    # Plain ufuncs rather than np.clip (equal on finite values): this runs on every env step, and np.clip's
    # Python-level dispatch costs a one-environment actor more than the arithmetic.
    a = np.minimum(np.maximum(a, -1.0), 1.0)
    scaled = low + (a + 1.0) * 0.5 * (high - low)
    return np.minimum(np.maximum(scaled, low), high).astype(dtype)


class CanonicalActionWrapper(_Wrapper):
    """Exposes a [-1, 1] float32 action spec and maps actions affinely onto the wrapped bounds.

    Actions are clipped to [-1, 1] first, so exploration noise can never push the simulator outside the
    task's valid range.
    """

    def __init__(self, environment: dm_env.Environment):
        super().__init__(environment)
        spec = environment.action_spec()
        if not isinstance(spec, specs.BoundedArray):
            raise ValueError(f"canonical actions need a BoundedArray action spec, got {spec!r}")
        self._inner_spec = spec
        self._low = np.broadcast_to(spec.minimum, spec.shape).astype(np.float64)
        self._high = np.broadcast_to(spec.maximum, spec.shape).astype(np.float64)
        if not (np.all(np.isfinite(self._low)) and np.all(np.isfinite(self._high))):
            raise ValueError("canonical actions need finite action bounds")
        self._spec = specs.BoundedArray(spec.shape, np.float32, -1.0, 1.0, name="action")

    def to_env_action(self, action: Any) -> np.ndarray:
        """Maps an agent action in [-1, 1] onto the wrapped environment's bounds (clipping first)."""
        return canonical_to_bounds(action, self._low, self._high, self._inner_spec.dtype)

    def step(self, action: Any) -> dm_env.TimeStep:
        return self._environment.step(self.to_env_action(action))

    def action_spec(self) -> specs.BoundedArray:
        return self._spec


class SinglePrecisionWrapper(_Wrapper):
    """Casts observations, rewards and discounts to float32 (None stays None on FIRST steps)."""

    def _convert(self, timestep: dm_env.TimeStep) -> dm_env.TimeStep:
        obs = _check_finite(np.asarray(timestep.observation, dtype=np.float32))
        reward = None if timestep.reward is None else np.float32(timestep.reward)
        discount = None if timestep.discount is None else np.float32(timestep.discount)
        return timestep._replace(observation=obs, reward=reward, discount=discount)

    def reset(self) -> dm_env.TimeStep:
        return self._convert(self._environment.reset())

    def step(self, action: Any) -> dm_env.TimeStep:
        return self._convert(self._environment.step(action))

    def observation_spec(self) -> specs.Array:
        spec = self._environment.observation_spec()
        return specs.Array(spec.shape, np.float32, name=spec.name)

    def reward_spec(self) -> specs.Array:
        return specs.Array((), np.float32, name="reward")

    def discount_spec(self) -> specs.BoundedArray:
        return specs.BoundedArray((), np.float32, 0.0, 1.0, name="discount")


class GymWrapper(dm_env.Environment):
    """A Gymnasium environment behind the dm_env interface.

    The seed is passed to the first `reset` only (Gymnasium seeds its RNG once; reseeding every episode
    would replay the same initial states). After a LAST step, `step` starts a new episode, as dm_env
    prescribes.
    """

    def __init__(self, env: Any, seed: int):
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

    def _observation(self, obs: Any) -> np.ndarray:
        return _check_finite(np.asarray(obs, dtype=np.float32))

    def reset(self) -> dm_env.TimeStep:
        self._reset_next_step = False
        if self._seed is not None:
            obs, _ = self._env.reset(seed=self._seed)
            self._seed = None
        else:
            obs, _ = self._env.reset()
        return dm_env.restart(self._observation(obs))

    def step(self, action: Any) -> dm_env.TimeStep:
        if self._reset_next_step:
            return self.reset()
        if isinstance(self._action_spec, specs.DiscreteArray):
            a = np.asarray(action)
            if a.size != 1 or not np.issubdtype(a.dtype, np.integer):
                raise ValueError(f"discrete action must be one integer, got {action!r}")
            env_action: Any = int(a.reshape(()))
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
        env = ConcatObservationWrapper(_suite().load(domain, name, task_kwargs={"random": seed}))
    else:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(list_tasks())}")
    if isinstance(env.action_spec(), specs.BoundedArray) and not isinstance(env.action_spec(), specs.DiscreteArray):
        env = CanonicalActionWrapper(env)
    return SinglePrecisionWrapper(env)


@dataclasses.dataclass(frozen=True)
class EnvironmentSpec:
    """What agents need to know about an environment to build networks and replay signatures.

    `action_dim` is the continuous action width (0 for discrete tasks); `num_actions` is the number of
    discrete actions (0 for continuous tasks). `obs_dim` is the number of observation values; image tasks
    (MinAtar) also give their `obs_shape` (H, W, C) and `obs_dtype` (uint8), which replay keeps.
    """

    observations: specs.Array
    actions: specs.Array
    obs_dim: int
    action_dim: int
    discrete: bool
    num_actions: int
    obs_shape: tuple[int, ...] = ()  # () = (obs_dim,), a flat vector
    obs_dtype: np.dtype = np.dtype(np.float32)

    @property
    def observation_shape(self) -> tuple[int, ...]:
        """The per-step observation shape: (obs_dim,) for vector tasks, (H, W, C) for image tasks."""
        return self.obs_shape or (self.obs_dim,)

    @property
    def action_spec(self) -> specs.Array:
        """Alias of `actions` (the name used in docs/ARCHITECTURE.md)."""
        return self.actions

    @property
    def action_shape(self) -> tuple[int, ...]:
        return tuple(self.actions.shape)

    @property
    def action_dtype(self) -> np.dtype:
        return np.dtype(self.actions.dtype)


EnvSpec = EnvironmentSpec  # the short name docs/ARCHITECTURE.md uses


def environment_spec(env: dm_env.Environment) -> EnvironmentSpec:
    """Summarises `env`'s specs: flat float32 vectors, or uint8 images [H, W, C] (as `make_environment` makes)."""
    obs = env.observation_spec()
    act = env.action_spec()
    image = isinstance(obs, specs.Array) and len(obs.shape) == 3 and np.dtype(obs.dtype) == np.uint8
    if not isinstance(obs, specs.Array) or (len(obs.shape) != 1 and not image):
        raise ValueError(f"expected a flat vector or a uint8 [H, W, C] observation spec, got {obs!r}")
    discrete = isinstance(act, specs.DiscreteArray)
    return EnvironmentSpec(
        observations=obs,
        actions=act,
        obs_dim=int(np.prod(obs.shape, dtype=np.int64)),
        action_dim=0 if discrete else int(np.prod(act.shape, dtype=np.int64)),
        discrete=discrete,
        num_actions=int(act.num_values) if discrete else 0,
        obs_shape=tuple(int(d) for d in obs.shape) if image else (),
        obs_dtype=np.dtype(obs.dtype) if image else np.dtype(np.float32),
    )
