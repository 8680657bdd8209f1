"""The environment stepper (the lower of the two acting layers): K environments, one batched policy call per step,
and a sink that turns the steps into what a learner takes (Acme's `EnvironmentLoop` with its adder: the stepper owns
stepping and episode bookkeeping, the sink says where the steps go). It knows no weights, cadence, timing or logs:
those are the actor's loop above it (`launch.experiments.acting.ActingLoop`), which every runner's actors and the
evaluator run over this stepper; greedy evaluation (`quarl.acting.evaluation`) drives it directly. The agents
differ only in their sink
(`agents.base.BuilderBase.make_sink`):
- `AdderSink`, the replay agents' (DQN, D4PG): one `NStepTransitionAdder` per environment, so n-step windows
  never mix two environments' steps and an episode boundary in one environment closes only that environment's
  windows (every transition kept); its items are n-step `Transition`s for a replay table;
- `RolloutSink`, the on-policy agents' (PPO, A2C): a buffer of fixed length [T steps x K environments] with the
  behaviour log-probs the policy returned beside its actions; its item is one whole `Rollout`;
- `NoSink` (evaluation: nothing is learnt from the steps) and `ObservationSink` (every observation met, the
  calibration data of a saved policy), for `quarl.acting.evaluation`.
The loop: the policy sees the K current observations as one `[K, obs_dim]` batch (`policy(observations)`, which
returns the actions, or `(actions, extras)` with per-environment extras such as the behaviour log-probs); an
environment whose step was LAST is restarted at once (the sink gets the new FIRST timestep) and the finished
episode's return and length are reported. With K=1 this is the single-environment loop; `restart=False` leaves a
finished episode finished (evaluation plays whole episodes, and the next starts with `reset()`).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Generic, Mapping, Never, Protocol, Sequence, TypeAlias, TypeVar, cast

import dm_env
import numpy as np
import numpy.typing as npt

from quarl.envs.spec import BatchActions
from quarl.envs.vector import VectorEnv
from quarl.replay.items import ROLLOUT_KEYS, Rollout, Transition

Extras = Mapping[str, np.ndarray]
# What a policy returns for a batch of observations: the actions, or (actions, per-environment extras).
PolicyOutput: TypeAlias = BatchActions | tuple[BatchActions, Extras]
# What a sink finishes: an n-step `Transition` (AdderSink), one whole `Rollout` (RolloutSink), nothing (NoSink).
ItemT = TypeVar("ItemT", covariant=True)


@dataclasses.dataclass(frozen=True)
class EpisodeEnd:
    """One finished episode: which environment, its undiscounted return and its length in env steps."""

    env_index: int
    episode_return: float
    length: int


@dataclasses.dataclass
class VectorStep(Generic[ItemT]):
    """What one `VectorEnvLoop.step` produced: the sink's finished `items` (n-step transitions of all
    environments, each environment's in order; or whole rollouts), finished episodes, the sum of this step's
    rewards, and the seconds spent in the policy, in the environments (steps and restarts) and in the sink."""

    items: Sequence[ItemT]
    episodes: list[EpisodeEnd]
    reward_sum: float
    policy_s: float
    env_s: float
    sink_s: float


class Sink(Protocol[ItemT]):
    """Where the loop's steps go: `start` with the K first timesteps, `add` after every step of the K
    environments (returns the items finished by it), `restart` when environment i began a new episode, `flush`
    for what is still held (an actor that stops); `pending` counts the steps held."""

    @property
    def pending(self) -> int: ...

    def start(self, timesteps: Sequence[dm_env.TimeStep]) -> None: ...

    def add(self, actions: BatchActions, extras: Extras, timesteps: Sequence[dm_env.TimeStep]) -> Sequence[ItemT]: ...

    def restart(self, index: int, timestep: dm_env.TimeStep) -> None: ...

    def flush(self) -> Sequence[ItemT]: ...


class Adder(Protocol):
    """One environment's adder (`quarl.replay.adders.NStepTransitionAdder`): its FIRST timestep, then each action
    with the timestep it led to; returns the items each step finished, `flush` the ones still open."""

    @property
    def pending(self) -> int: ...

    def add_first(self, timestep: dm_env.TimeStep) -> None: ...

    def add(self, action: npt.ArrayLike, next_timestep: dm_env.TimeStep) -> list[Transition]: ...

    def flush(self) -> list[Transition]: ...


class AdderSink:
    """The replay agents' sink: one adder per environment (`make_adder()`, e.g. an `NStepTransitionAdder`)."""

    def __init__(self, make_adder: Callable[[], Adder], num_envs: int):
        self.adders = tuple(make_adder() for _ in range(int(num_envs)))

    @property
    def pending(self) -> int:
        return sum(int(adder.pending) for adder in self.adders)

    def start(self, timesteps: Sequence[dm_env.TimeStep]) -> None:
        for adder, timestep in zip(self.adders, timesteps):
            adder.add_first(timestep)

    def add(self, actions: BatchActions, extras: Extras, timesteps: Sequence[dm_env.TimeStep]) -> list[Transition]:
        del extras  # transitions carry no policy extras
        out: list[Transition] = []
        for adder, action, timestep in zip(self.adders, actions, timesteps):
            out.extend(adder.add(action, timestep))
        return out

    def restart(self, index: int, timestep: dm_env.TimeStep) -> None:
        self.adders[index].add_first(timestep)

    def flush(self) -> list[Transition]:
        """Every open n-step window, as truncated transitions."""
        return [t for adder in self.adders for t in adder.flush()]


class RolloutSink:
    """The on-policy agents' sink: every `num_steps` steps of the K environments, one `Rollout` of [T, K, ...]
    columns, its `behaviour_logp` the policy's extra of that name. `discount` is the environment's (0 at a
    termination, 1 otherwise); observations keep the environment's dtype."""

    EXTRAS = ("behaviour_logp",)  # what the policy returns beside its actions, for the rollout

    def __init__(self, num_steps: int, num_envs: int):
        for name, value in (("num_steps", num_steps), ("num_envs", num_envs)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.num_steps, self.num_envs = int(num_steps), int(num_envs)
        self._obs: np.ndarray | None = None  # [K, ...]: what the policy acts on next
        self._columns: dict[str, list[np.ndarray]] = {}
        self._clear()

    def _clear(self) -> None:
        self._columns = {k: [] for k in ROLLOUT_KEYS}

    @property
    def pending(self) -> int:
        """Env steps in the unfinished rollout (dropped at a stop: a learner takes whole rollouts only)."""
        return len(self._columns["reward"]) * self.num_envs

    def start(self, timesteps: Sequence[dm_env.TimeStep]) -> None:
        self._clear()
        self._obs = np.stack([np.asarray(t.observation) for t in timesteps])

    def add(self, actions: BatchActions, extras: Extras, timesteps: Sequence[dm_env.TimeStep]) -> list[Rollout]:
        if self._obs is None:
            raise ValueError("the rollout sink was not started (VectorEnvLoop.reset)")
        missing = [k for k in self.EXTRAS if k not in extras]
        if missing:
            raise ValueError(f"the rollout needs the policy's {missing} beside its actions (an on-policy actor's "
                             "`act` returns them)")
        cols = self._columns
        next_obs = np.stack([np.asarray(t.observation) for t in timesteps])  # a copy: safe from the env's buffers
        cols["observation"].append(self._obs)
        cols["action"].append(np.asarray(actions))  # an array stays itself (no copy), as np.stack takes it
        for key in self.EXTRAS:
            cols[key].append(np.asarray(extras[key]))
        cols["reward"].append(np.array([float(t.reward) for t in timesteps], np.float32))
        cols["discount"].append(np.array([float(t.discount) for t in timesteps], np.float32))
        cols["last"].append(np.array([t.last() for t in timesteps]).astype(np.float32))
        cols["next_observation"].append(next_obs)
        self._obs = next_obs.copy()  # restarts overwrite rows of this one, never the column just stored
        if len(cols["reward"]) < self.num_steps:
            return []
        rollout = Rollout(*(np.stack(cols[k]) for k in ROLLOUT_KEYS))
        self._clear()
        return [rollout]

    def restart(self, index: int, timestep: dm_env.TimeStep) -> None:
        assert self._obs is not None
        self._obs[index] = np.asarray(timestep.observation)

    def flush(self) -> list[Rollout]:
        """Nothing: a partial rollout is not one the learner can take (its steps were acted and counted)."""
        self._clear()
        return []


class NoSink:
    """A sink that keeps nothing: steps acted for a measurement (an evaluation), not for a learner."""

    pending = 0

    def start(self, timesteps: Sequence[dm_env.TimeStep]) -> None:
        del timesteps

    def add(self, actions: BatchActions, extras: Extras, timesteps: Sequence[dm_env.TimeStep]) -> list[Never]:
        del actions, extras, timesteps
        return []

    def restart(self, index: int, timestep: dm_env.TimeStep) -> None:
        del index, timestep

    def flush(self) -> list[Never]:
        return []


class ObservationSink(NoSink):
    """Keeps every observation the environments show, in order, in their own dtype (FIRST, MID and LAST ones
    alike, environment 0's before environment 1's at each step): what a saved policy's activation ranges are
    calibrated on."""

    def __init__(self) -> None:
        self.observations: list[np.ndarray] = []

    def start(self, timesteps: Sequence[dm_env.TimeStep]) -> None:
        self.observations.extend(np.asarray(t.observation) for t in timesteps)

    def add(self, actions: BatchActions, extras: Extras, timesteps: Sequence[dm_env.TimeStep]) -> list[Never]:
        del actions, extras
        self.start(timesteps)
        return []

    def restart(self, index: int, timestep: dm_env.TimeStep) -> None:
        del index
        self.observations.append(np.asarray(timestep.observation))


def _split(out: PolicyOutput) -> tuple[BatchActions, Extras]:
    """A policy's output as (actions, extras): `(actions, {name: [K] array})` or the actions alone."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping):
        return out[0], out[1]
    return out, {}


class VectorEnvLoop(Generic[ItemT]):
    """Steps K environments with one batched policy call and hands every step to a sink; see the module
    docstring. `VectorEnvLoop(env, make_adder)` is the replay agents' loop (an `AdderSink`); pass `sink=`
    for any other. `restart=False`: an environment whose episode ended is not restarted, and stepping the loop
    again before `reset()` is an error (a dm_env environment may not be stepped past its LAST step)."""

    def __init__(self, env: VectorEnv, make_adder: Callable[[], Adder] | None = None, *,
                 sink: Sink[ItemT] | None = None, restart: bool = True):
        if (make_adder is None) == (sink is None):
            raise ValueError("VectorEnvLoop takes either make_adder or sink")
        self.env = env
        self.restart = bool(restart)
        self.num_envs = env.num_envs
        # make_adder: the replay agents' loop, whose items are Transitions
        self.sink: Sink[ItemT] = sink if sink is not None else cast("Sink[ItemT]", AdderSink(make_adder, self.num_envs))
        self._timesteps: list[dm_env.TimeStep] = []
        self._returns = np.zeros(self.num_envs, np.float64)
        self._lengths = np.zeros(self.num_envs, np.int64)

    def reset(self) -> float:
        """Starts an episode in every environment; returns the seconds it took."""
        t0 = time.perf_counter()
        self._timesteps = self.env.reset()
        self.sink.start(self._timesteps)
        self._returns[:] = 0.0
        self._lengths[:] = 0
        return time.perf_counter() - t0

    def observations(self) -> np.ndarray:
        """The K current observations as one float32 batch `[K, obs_dim]`."""
        if not self._timesteps:
            raise ValueError("call reset() before stepping a VectorEnvLoop")
        return np.stack([np.asarray(t.observation, np.float32) for t in self._timesteps])

    def step(self, policy: Callable[[np.ndarray], PolicyOutput]) -> VectorStep[ItemT]:
        """One policy call on the K observations, then one step of every environment."""
        if not self.restart and any(t.last() for t in self._timesteps):
            raise ValueError("an episode ended and restart=False: call reset() before stepping again")
        obs = self.observations()
        t0 = time.perf_counter()
        actions, extras = _split(policy(obs))
        t1 = time.perf_counter()
        if len(actions) != self.num_envs:
            raise ValueError(f"the policy returned {len(actions)} actions for {self.num_envs} environments")
        timesteps = self.env.step(actions)
        t2 = time.perf_counter()
        items = self.sink.add(actions, extras, timesteps)
        reset_s = 0.0
        episodes: list[EpisodeEnd] = []
        reward_sum = 0.0
        for i, timestep in enumerate(timesteps):
            reward = float(timestep.reward)
            reward_sum += reward
            self._returns[i] += reward
            self._lengths[i] += 1
            if timestep.last():
                episodes.append(EpisodeEnd(i, float(self._returns[i]), int(self._lengths[i])))
                self._returns[i], self._lengths[i] = 0.0, 0
                if not self.restart:
                    continue
                t = time.perf_counter()
                timestep = self.env.reset_one(i)
                reset_s += time.perf_counter() - t
                self.sink.restart(i, timestep)
                timesteps[i] = timestep
        self._timesteps = timesteps
        t3 = time.perf_counter()
        return VectorStep(items, episodes, reward_sum, policy_s=t1 - t0, env_s=t2 - t1 + reset_s,
                          sink_s=t3 - t2 - reset_s)

    def close(self) -> None:
        self.env.close()
