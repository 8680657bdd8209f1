"""K environments of one task stepped together, so an actor runs its policy once per step on a batch of K.

The paper's actor steps one environment and calls its policy at batch 1; a vectorized actor
(`--envs-per-actor K`) amortises one policy call over K environments. `VectorEnvironment` is the smallest
interface that needs: `reset()` gives K FIRST timesteps, `step(actions[K])` K next timesteps, and
`reset_one(i)` restarts environment i after its LAST step (auto-reset is left to the caller, who must
close the episode in its n-step adder first). Every environment keeps the single-environment contract of
`quarl.envs.factory` (flat float32 observations, canonical actions, finite values).

`make_vector_environment(task, seed, K)` builds K `quarl.envs.factory.make_environment(training=True)` instances (ALE
rewards clipped for training; the evaluator's environment is not), the first seeded
with `seed` itself (so K=1 is exactly the single-environment actor) and the others with independent seeds;
for the DM Control tasks verified against envpool's C++ versions (`quarl.envs.envpool.ENVPOOL_TASKS`) it runs
envpool instead when it is installed (several times cheaper per env step), same seeds, same contract.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import dm_env
import numpy as np
from dm_env import specs

from quarl.envs.factory import make_environment
from quarl.envs.spec import BatchActions


class VectorEnv(Protocol):
    """What an actor steps: K environments of one task behind one interface (see the module docstring), whichever
    implementation runs them (`VectorEnvironment`, `quarl.envs.envpool.EnvpoolVectorEnvironment`)."""

    @property
    def num_envs(self) -> int: ...

    def observation_spec(self) -> specs.Array: ...

    def action_spec(self) -> specs.Array: ...

    def reset(self) -> list[dm_env.TimeStep]:
        """K FIRST timesteps, one per environment."""

    def reset_one(self, index: int) -> dm_env.TimeStep:
        """Environment `index`'s next FIRST timestep (after its LAST step)."""

    def step(self, actions: BatchActions) -> list[dm_env.TimeStep]:
        """Environment i's next timestep for `actions[i]`, for every i."""

    def close(self) -> None: ...


def env_seeds(seed: int, num_envs: int) -> list[int]:
    """Seeds of K environments: `seed` first, then independent child seeds (never `seed + i`, which
    would overlap the streams of runs with nearby seeds)."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    children = [int(np.random.SeedSequence([int(seed), 1, i]).generate_state(1, np.uint32)[0] & 0x7FFFFFFF)
                for i in range(1, int(num_envs))]
    return [int(seed), *children]


class VectorEnvironment:
    """K dm_env environments with identical specs, stepped in lock-step (one thread, one after another)."""

    def __init__(self, environments: Sequence[dm_env.Environment]):
        envs = list(environments)
        if not envs:
            raise ValueError("a vector environment needs at least one environment")
        first = envs[0]
        for i, env in enumerate(envs[1:], start=1):
            if env.observation_spec() != first.observation_spec() or env.action_spec() != first.action_spec():
                raise ValueError(f"environment {i} has other specs than environment 0")
        self._envs = envs

    @property
    def num_envs(self) -> int:
        return len(self._envs)

    def observation_spec(self) -> specs.Array:
        return self._envs[0].observation_spec()

    def action_spec(self) -> specs.Array:
        return self._envs[0].action_spec()

    @property
    def environments(self) -> list[dm_env.Environment]:
        """The K single environments (for per-environment inspection in tests)."""
        return list(self._envs)

    def reset(self) -> list[dm_env.TimeStep]:
        """Starts a new episode in every environment."""
        return [env.reset() for env in self._envs]

    def reset_one(self, index: int) -> dm_env.TimeStep:
        """Starts a new episode in environment `index` (after its LAST step)."""
        return self._envs[index].reset()

    def step(self, actions: BatchActions) -> list[dm_env.TimeStep]:
        """Steps environment i with `actions[i]`; `actions` has a leading axis of length K."""
        if len(actions) != len(self._envs):
            raise ValueError(f"got {len(actions)} actions for {len(self._envs)} environments")
        return [env.step(action) for env, action in zip(self._envs, actions)]

    def close(self) -> None:
        for env in self._envs:
            env.close()


ENV_IMPLEMENTATIONS = ("auto", "dm_control", "envpool")


def env_implementation(task: str, requested: str = "auto") -> str:
    """Which implementation runs `task`: "envpool" for the tasks `quarl.envs.envpool` verified against
    dm_control (when envpool is installed), else "dm_control" (DM Control tasks) or "gymnasium"."""
    from quarl.envs import envpool as envpool_env  # pylint: disable=import-outside-toplevel
    from quarl.envs.gym import GYM_TASKS  # pylint: disable=import-outside-toplevel

    if requested not in ENV_IMPLEMENTATIONS:
        raise ValueError(f"unknown environment implementation {requested!r}: valid are "
                         f"{', '.join(ENV_IMPLEMENTATIONS)}")
    verified = task in envpool_env.ENVPOOL_TASKS
    if requested == "envpool":
        if not verified:
            raise ValueError(f"envpool is not verified against dm_control for {task!r} (verified: "
                             f"{', '.join(envpool_env.ENVPOOL_TASKS)})")
        if not envpool_env.envpool_available():
            raise ValueError("envpool is not installed (pip install envpool==1.2.5)")
        return "envpool"
    if requested == "auto" and verified and envpool_env.envpool_available():
        return "envpool"
    return "gymnasium" if task in GYM_TASKS else "dm_control"


def make_vector_environment(task: str, seed: int, num_envs: int, implementation: str = "auto") -> VectorEnv:
    """K environments of `task` (see `env_seeds` for their seeds) on the implementation `env_implementation`
    picks; raises ValueError on a bad task, K or implementation."""
    seeds = env_seeds(seed, num_envs)
    if env_implementation(task, implementation) == "envpool":
        from quarl.envs.envpool import EnvpoolVectorEnvironment  # pylint: disable=import-outside-toplevel

        return EnvpoolVectorEnvironment(task, seeds)
    return VectorEnvironment([make_environment(task, s, training=True) for s in seeds])
