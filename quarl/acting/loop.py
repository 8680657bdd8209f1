"""The acting side of one actor with K environments: K n-step adders, one batched policy call per step.

Both runners (`launch.experiments.run_experiment` in one process, `launch.distributed.nodes.actor.ActorNode` on Ray) drive an actor the same
way, so the per-environment bookkeeping lives here once:
- one `NStepTransitionAdder` per environment, so n-step windows never mix two environments' steps and an
  episode boundary in one environment closes only that environment's windows (every transition kept);
- an environment whose step was LAST is restarted at once (its adder gets the new FIRST timestep), and the
  finished episode's return and length are reported;
- the policy sees the K current observations as one `[K, obs_dim]` batch (`policy(observations)`).
With K=1 this is exactly the single-environment loop the runners had before.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from quarl.envs.vector import VectorEnvironment


@dataclasses.dataclass(frozen=True)
class EpisodeEnd:
    """One finished episode: which environment, its undiscounted return and its length in env steps."""

    env_index: int
    episode_return: float
    length: int


@dataclasses.dataclass
class VectorStep:
    """What one `VectorEnvLoop.step` produced: n-step transitions (all environments, each environment's in
    order), finished episodes, the sum of this step's rewards, and the seconds spent in the policy, in the
    environments (steps and restarts) and in the adders."""

    transitions: list[dict[str, np.ndarray]]
    episodes: list[EpisodeEnd]
    reward_sum: float
    policy_s: float
    env_s: float
    adder_s: float


class VectorEnvLoop:
    """Steps K environments with one batched policy call; see the module docstring."""

    def __init__(self, env: VectorEnvironment, make_adder: Callable[[], Any]):
        self.env = env
        self.num_envs = env.num_envs
        self._adders = [make_adder() for _ in range(self.num_envs)]
        self._timesteps: list[Any] = []
        self._returns = np.zeros(self.num_envs, np.float64)
        self._lengths = np.zeros(self.num_envs, np.int64)

    @property
    def adders(self) -> Sequence[Any]:
        return tuple(self._adders)

    def reset(self) -> float:
        """Starts an episode in every environment; returns the seconds it took."""
        t0 = time.perf_counter()
        self._timesteps = self.env.reset()
        for adder, timestep in zip(self._adders, self._timesteps):
            adder.add_first(timestep)
        self._returns[:] = 0.0
        self._lengths[:] = 0
        return time.perf_counter() - t0

    def observations(self) -> np.ndarray:
        """The K current observations as one float32 batch `[K, obs_dim]`."""
        if not self._timesteps:
            raise ValueError("call reset() before stepping a VectorEnvLoop")
        return np.stack([np.asarray(t.observation, np.float32) for t in self._timesteps])

    def step(self, policy: Callable[[np.ndarray], Any]) -> VectorStep:
        """One policy call on the K observations, then one step of every environment."""
        obs = self.observations()
        t0 = time.perf_counter()
        actions = policy(obs)
        t1 = time.perf_counter()
        if len(actions) != self.num_envs:
            raise ValueError(f"the policy returned {len(actions)} actions for {self.num_envs} environments")
        timesteps = self.env.step(actions)
        t2 = time.perf_counter()
        reset_s = 0.0
        transitions: list[dict[str, np.ndarray]] = []
        episodes: list[EpisodeEnd] = []
        reward_sum = 0.0
        for i, (adder, action, timestep) in enumerate(zip(self._adders, actions, timesteps)):
            transitions.extend(adder.add(action, timestep))
            reward = float(timestep.reward)
            reward_sum += reward
            self._returns[i] += reward
            self._lengths[i] += 1
            if timestep.last():
                episodes.append(EpisodeEnd(i, float(self._returns[i]), int(self._lengths[i])))
                self._returns[i], self._lengths[i] = 0.0, 0
                t = time.perf_counter()
                timestep = self.env.reset_one(i)
                reset_s += time.perf_counter() - t
                adder.add_first(timestep)
            timesteps[i] = timestep
        self._timesteps = timesteps
        t3 = time.perf_counter()
        return VectorStep(transitions, episodes, reward_sum, policy_s=t1 - t0, env_s=t2 - t1 + reset_s,
                          adder_s=t3 - t2 - reset_s)

    def close(self) -> None:
        self.env.close()
