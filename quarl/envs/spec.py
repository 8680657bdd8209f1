"""What agents need to know about an environment (`EnvironmentSpec`): the observation and action shapes networks
and replay signatures are built from."""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence, TypeAlias

import dm_env
import numpy as np
import numpy.typing as npt
from dm_env import specs

# An observation spec as environments give it: one array spec, or DM Control's {name: array spec} (before
# `quarl.envs.wrappers.ConcatObservationWrapper` flattens it into one vector).
ObservationSpec: TypeAlias = specs.Array | Mapping[str, specs.Array]
# The actions of K environments stepped together (`quarl.envs.vector`): a [K, ...] array, or K actions in a sequence.
BatchActions: TypeAlias = np.ndarray | Sequence[npt.ArrayLike]


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

