"""The wrappers that give every vector task the same shape: one flat float32 observation vector (DM Control's
observation dict concatenated in sorted key order, as Acme's `ConcatObservationWrapper`), continuous actions in
[-1, 1] mapped affinely onto the task's bounds, float32 rewards and discounts, and non-finite observations refused
instead of poisoning replay."""
from __future__ import annotations

import dm_env
import numpy as np
import numpy.typing as npt
from dm_env import specs

from quarl.envs.spec import BatchActions, ObservationSpec


def check_finite(observation: np.ndarray) -> np.ndarray:
    if not np.isfinite(observation).all():
        raise ValueError(f"environment produced a non-finite observation: {observation!r}")
    return observation


class Wrapper(dm_env.Environment):
    """Forwards everything to the wrapped environment; subclasses override what they change."""

    def __init__(self, environment: dm_env.Environment):
        self._environment = environment

    def reset(self) -> dm_env.TimeStep:
        return self._environment.reset()

    def step(self, action: npt.ArrayLike) -> dm_env.TimeStep:
        return self._environment.step(action)

    def observation_spec(self) -> ObservationSpec:
        return self._environment.observation_spec()

    def action_spec(self) -> specs.Array:
        return self._environment.action_spec()

    def reward_spec(self) -> specs.Array:
        return self._environment.reward_spec()

    def discount_spec(self) -> specs.Array:
        return self._environment.discount_spec()

    @property
    def environment(self) -> dm_env.Environment:
        """The wrapped environment (one level down)."""
        return self._environment

    def close(self) -> None:
        self._environment.close()


class ConcatObservationWrapper(Wrapper):
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
        return timestep._replace(observation=check_finite(flat))

    def reset(self) -> dm_env.TimeStep:
        return self._convert(self._environment.reset())

    def step(self, action: npt.ArrayLike) -> dm_env.TimeStep:
        return self._convert(self._environment.step(action))

    def observation_spec(self) -> specs.Array:
        return self._spec


def canonical_to_bounds(action: npt.ArrayLike | BatchActions, low: np.ndarray, high: np.ndarray,
                        dtype: npt.DTypeLike, *, batch: int | None = None) -> np.ndarray:
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


class CanonicalActionWrapper(Wrapper):
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

    def to_env_action(self, action: npt.ArrayLike) -> np.ndarray:
        """Maps an agent action in [-1, 1] onto the wrapped environment's bounds (clipping first)."""
        return canonical_to_bounds(action, self._low, self._high, self._inner_spec.dtype)

    def step(self, action: npt.ArrayLike) -> dm_env.TimeStep:
        return self._environment.step(self.to_env_action(action))

    def action_spec(self) -> specs.BoundedArray:
        return self._spec


class SinglePrecisionWrapper(Wrapper):
    """Casts observations, rewards and discounts to float32 (None stays None on FIRST steps)."""

    def _convert(self, timestep: dm_env.TimeStep) -> dm_env.TimeStep:
        obs = check_finite(np.asarray(timestep.observation, dtype=np.float32))
        reward = None if timestep.reward is None else np.float32(timestep.reward)
        discount = None if timestep.discount is None else np.float32(timestep.discount)
        return timestep._replace(observation=obs, reward=reward, discount=discount)

    def reset(self) -> dm_env.TimeStep:
        return self._convert(self._environment.reset())

    def step(self, action: npt.ArrayLike) -> dm_env.TimeStep:
        return self._convert(self._environment.step(action))

    def observation_spec(self) -> specs.Array:
        spec = self._environment.observation_spec()
        return specs.Array(spec.shape, np.float32, name=spec.name)

    def reward_spec(self) -> specs.Array:
        return specs.Array((), np.float32, name="reward")

    def discount_spec(self) -> specs.BoundedArray:
        return specs.BoundedArray((), np.float32, 0.0, 1.0, name="discount")

