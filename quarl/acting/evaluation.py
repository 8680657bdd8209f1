"""Agent-agnostic greedy evaluation of a (quantized) policy: what post-training-quantization sweeps measure.

Agents' actors explore, keep RNG state and pull weights; none of that belongs in an offline measurement of
"how good is this policy at this precision". Here a policy is just `spec + QuantizedParams` run through a
`quarl.runtimes` executor, acting deterministically: a discrete task takes the argmax of the Q-values, a
continuous task takes the network's output as the action. Paired comparisons across precisions come from
`evaluate_seeds`, which plays episode i in a fresh environment seeded `seeds[i]`, so every precision faces
the same initial states whatever the previous episodes did.

Every episode here is stepped by the environment stepper (`quarl.acting.loop.VectorEnvLoop`, one environment, an
episode at a time), and a policy is what that loop calls: `policy(observations[K]) -> actions[K]` (or
`(actions, extras)`: an agent's `actor.act`), one observation being a batch of one.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import dm_env
import numpy as np
from dm_env import specs

from quarl.acting.loop import NoSink, ObservationSink, PolicyOutput, VectorEnvLoop
from quarl.envs.factory import make_environment
from quarl.envs.vector import VectorEnvironment
from quarl.policy.spec import PolicySpec
from quarl.quant.calibration import MAX_CALIBRATION_OBS
from quarl.quant.quantization import QuantizedParams
from quarl.runtimes import PolicyExecutor, make_executor

# What the loop calls: a batch [K, ...] of observations -> K actions (or the actions and per-row extras).
Policy = Callable[[np.ndarray], PolicyOutput]


def check_compatible(spec: PolicySpec, observation_spec: specs.Array, action_spec: specs.Array) -> None:
    """ValueError unless `spec` reads this task's observations and produces one value per action
    (Q-values for a DiscreteArray, the action vector otherwise)."""
    obs_dim = int(np.prod(observation_spec.shape, dtype=np.int64))
    if spec.input_dim != obs_dim:
        raise ValueError(f"policy reads {spec.input_dim} observation values, the task has {obs_dim}")
    _check_outputs(spec.output_dim, action_spec)


def _check_outputs(out: int, action_spec: specs.Array) -> None:
    if isinstance(action_spec, specs.DiscreteArray):
        if out != action_spec.num_values:
            raise ValueError(f"policy outputs {out} Q-values, the task has {action_spec.num_values} actions")
    elif out != int(np.prod(action_spec.shape, dtype=np.int64)):
        raise ValueError(f"policy outputs {out} values, the task's action shape is {action_spec.shape}")


class GreedyPolicy:
    """`policy(observations[K]) -> actions[K]`, executed by a quarl runtime in one call."""

    def __init__(self, executor: PolicyExecutor, action_spec: specs.Array):
        self.executor = executor
        _check_outputs(executor.output_dim, action_spec)
        self.discrete = isinstance(action_spec, specs.DiscreteArray)
        self._shape = tuple(action_spec.shape)
        self._dtype = np.dtype(action_spec.dtype)

    @property
    def backend(self) -> str:
        return self.executor.backend

    @property
    def precision(self) -> str:
        return self.executor.precision

    @property
    def simulated(self) -> bool:
        """True when the precision's rounding is applied to the weights but the arithmetic runs in fp32."""
        return bool(self.executor.simulated)

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        obs = np.asarray(observations, np.float32)
        out = np.asarray(self.executor(obs.reshape(obs.shape[0], -1)))
        if not np.all(np.isfinite(out)):  # an overflowing low-precision network must not pick actions
            raise ValueError(f"policy produced non-finite outputs {out!r} at precision {self.precision}")
        if self.discrete:
            return np.argmax(out, axis=1).astype(self._dtype)  # ties -> lowest index: deterministic
        return out.reshape(out.shape[0], *self._shape).astype(self._dtype)


def make_greedy_policy(spec: PolicySpec, qparams: QuantizedParams, action_spec: specs.Array, *,
                       backend: str = "jax") -> GreedyPolicy:
    """A deterministic policy for `action_spec` (DiscreteArray -> argmax; otherwise the output itself)."""
    return GreedyPolicy(make_executor(spec, qparams, backend), action_spec)


@dataclasses.dataclass(frozen=True)
class EpisodeStats:
    """Undiscounted return and length of each evaluated episode, in order."""

    returns: np.ndarray  # float64 [episodes]
    lengths: np.ndarray  # int64 [episodes]

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))


class EpisodeInterrupted(Exception):
    """`run_episode`'s `should_stop` said stop before the episode ended (its partial return is discarded)."""


def run_episode(env: dm_env.Environment, policy: Policy, *,
                should_stop: Callable[[], bool] | None = None) -> tuple[float, int]:
    """Play one full episode of `env` through the environment stepper (a batch of one; the episode is not restarted at
    its end, so consecutive episodes of one environment start from its own `reset()`); returns (undiscounted
    return, steps). The evaluators' episode (PTQ sweeps, the single-process runner, the distributed evaluator).

    `should_stop` is checked before each step; when it returns True the episode is abandoned with
    EpisodeInterrupted (a stopping program must not wait for a 1000-step episode to end)."""
    loop = VectorEnvLoop(VectorEnvironment([env]), sink=NoSink(), restart=False)  # the caller closes `env`
    loop.reset()
    steps = 0
    while True:
        if should_stop is not None and should_stop():
            raise EpisodeInterrupted(f"stopped after {steps} steps")
        out = loop.step(policy)
        steps += 1
        if out.episodes:
            return out.episodes[0].episode_return, out.episodes[0].length


def run_episodes(env: dm_env.Environment, policy: Policy, episodes: int) -> EpisodeStats:
    """`episodes` consecutive episodes in one environment (its RNG carries over between them)."""
    if isinstance(episodes, bool) or not isinstance(episodes, (int, np.integer)) or episodes <= 0:
        raise ValueError(f"episodes must be a positive int, got {episodes!r}")
    results = [run_episode(env, policy) for _ in range(int(episodes))]
    return EpisodeStats(np.array([r for r, _ in results], np.float64), np.array([n for _, n in results], np.int64))


def evaluate_seeds(task: str, policy: Policy, seeds: Sequence[int], *,
                   make_env: Callable[[str, int], dm_env.Environment] = make_environment) -> EpisodeStats:
    """One episode per seed, each in a fresh `make_env(task, seed)`: episode i is the same start for every
    policy evaluated with the same seeds, which makes differences between policies paired."""
    if not len(seeds):
        raise ValueError("evaluate_seeds needs at least one seed")
    returns, lengths = [], []
    for seed in seeds:
        env = make_env(task, int(seed))
        try:
            total, steps = run_episode(env, policy)
        finally:
            env.close()
        returns.append(total)
        lengths.append(steps)
    return EpisodeStats(np.array(returns, np.float64), np.array(lengths, np.int64))


def evaluate_policy(env: dm_env.Environment, spec: PolicySpec, qparams: QuantizedParams, episodes: int, *,
                    backend: str = "jax") -> EpisodeStats:
    """Greedy returns of `spec` at `qparams`' precision over `episodes` episodes of `env`."""
    check_compatible(spec, env.observation_spec(), env.action_spec())
    return run_episodes(env, make_greedy_policy(spec, qparams, env.action_spec(), backend=backend), episodes)


def rollout_observations(env: dm_env.Environment, policy: Policy, steps: int = MAX_CALIBRATION_OBS) -> np.ndarray:
    """The first `steps` observations [steps, *obs_shape] (the environment's dtype) that `policy` meets acting in
    `env` through the environment stepper, episodes restarted as they end (each episode's LAST observation included):
    calibration data for a trained policy without a replay (`quarl.quant.calibration.activation_ranges`, in
    post-training quantization sweeps of a saved policy)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    sink = ObservationSink()
    loop = VectorEnvLoop(VectorEnvironment([env]), sink=sink)  # the caller closes `env`
    loop.reset()
    while len(sink.observations) < steps:
        loop.step(policy)
    return np.stack(sink.observations[:steps])
