"""What every agent shares: the interfaces the runners rely on (typed Protocols) and the builder scaffolding,
split by concern as Acme splits its builders (`acme/agents/jax/builders.py`: learner, policy and actor parts
beside the replay part), so an agent's builder only says what differs.

- `BuilderBase` is what every agent has: its policy spec, learner, actors, where its actors' steps go
  (`make_sink`), its weight cadence and the extras its payloads carry beside the weights.
- `ReplayBuilder` adds the replay part, which only the replay agents (DQN, D4PG) have: the n-step adder, the
  transition signature, the table and its rate limiter. An on-policy agent (PPO, A2C) derives `BuilderBase`
  alone, so a runner that needs replay asks `isinstance(builder, ReplayBuilder)` and never meets a method that
  refuses.

The runners in `launch/` depend only on these two ABCs and the `Learner` and `Actor` Protocols below
(docs/ARCHITECTURE.md, "Builder details"): what they read of an actor (its backend, its integer kernel, its
exploration) is part of the Protocol, not looked up by name, and an actor acts one way, `act` on a batch.
"""
from __future__ import annotations

import abc
import math
from typing import TYPE_CHECKING, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from agents.rate_limits import error_buffer  # noqa: F401  (re-exported: `agents.base.error_buffer` still works)
from quarl.acting.loop import AdderSink, Sink
from quarl.envs.spec import EnvSpec
from quarl.policy.spec import PolicySpec
from quarl.quant.quantization import QuantizedParams
from quarl.replay import table_from_config
from quarl.replay.adders import NStepTransitionAdder
from quarl.replay.items import Rollout, SamplerSettings, StackedSample, TableConfig, Transition
from quarl.replay.table import Table
from quarl.runtimes import make_executor
from quarl.runtimes.base import PolicyExecutor
from quarl.runtimes.kernel_check import KernelRecord, kernel_summary

if TYPE_CHECKING:  # for type checkers only: the learner's JAX types (actors never load JAX), and the configs
    from chex import ArrayTree

    from agents.configs import AgentConfig, ReplayAgentConfig
    from agents.learner_base import Batch, Block, Metrics

Signature = dict[str, tuple[tuple[int, ...], np.dtype]]


@runtime_checkable
class Learner(Protocol):
    """An fp32 learner: one jitted update per sampled batch (or K per call: `prepare` + `run_block`), its
    policy's weights and a checkpointable state (`agents.learner_base.JaxLearner` implements all of it)."""

    @property
    def steps(self) -> int: ...

    def step(self, sample: Batch) -> Metrics: ...

    def compile(self, sample: Batch) -> None: ...

    def prepare(self, samples: Sequence[Batch] | StackedSample) -> Block: ...

    def run_block(self, block: Block) -> Metrics: ...

    def wait(self) -> None: ...

    def policy_snapshot(self) -> ArrayTree: ...

    def policy_params(self) -> ArrayTree: ...

    def get_state(self) -> dict[str, ArrayTree]: ...

    def restore(self, state: Mapping[str, ArrayTree]) -> None: ...


@runtime_checkable
class OnPolicyLearner(Learner, Protocol):
    """An on-policy learner (PPO, A2C): `step` takes one whole rollout; `log_std` is the Gaussian's log-std its
    actors sample with (None on discrete tasks), handed to them beside the weights."""

    def log_std(self) -> np.ndarray | None: ...


@runtime_checkable
class Actor(Protocol):
    """An actor acting through a quantized policy executor; `update` swaps in new weights of the same spec.

    `act` is the one way to act (the acting loop, the evaluations and the benchmarks all call it): the actions
    for a batch [K, ...] of observations, one policy call, exploration per row unless `evaluation`, and the
    per-row extras its agent's sink keeps (none for replay agents; the behaviour log-probs for on-policy ones).
    One observation is a batch of one (`observation[None]`).
    `backend` and `kernel` say what ran the policy (summary.json); `exploration` is the setting the episode
    log records (DQN's epsilon, the Gaussian's sigma; NaN for an actor without one)."""

    evaluation: bool

    @property
    def backend(self) -> str: ...

    @property
    def kernel(self) -> KernelRecord | None: ...

    @property
    def exploration(self) -> float: ...

    def act(self, observations: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]: ...

    def update(self, qparams: QuantizedParams) -> None: ...


@runtime_checkable
class OnPolicyActor(Actor, Protocol):
    """An on-policy actor: its `act` returns, beside the actions, their log-probabilities under the quantized
    policy (`behaviour_logp`); a continuous one samples with the learner's log-std (`set_log_std`)."""

    discrete: bool

    def set_log_std(self, log_std: np.ndarray) -> None: ...


# What makes an actor's executor: `quarl.runtimes.make_executor`'s signature (tests pass fakes).
ExecutorFactory = Callable[..., PolicyExecutor]


class ExecutorActor(abc.ABC):
    """What every agent's actor shares: the quantized policy executor it acts through (`self._executor`, made
    by the subclass with `_make_executor`, which also keeps its spec), what runs it (backend, precision, integer
    kernel form) and the weight swap. Each agent's actor says itself how it acts (`act`) and what the episode
    log records of its exploration (`exploration`)."""

    _executor: PolicyExecutor
    _spec: PolicySpec
    _obs_dim: int

    def _make_executor(self, spec: PolicySpec, qparams: QuantizedParams, backend: str, batch_size: int,
                       executor_factory: ExecutorFactory | None) -> None:
        """Sets `self._executor` (from `executor_factory`, default `quarl.runtimes.make_executor`) and
        `self._obs_dim`. batch_size: how many observations one call carries (K environments per actor); `auto`
        measures the runtimes at that batch."""
        if executor_factory is None:
            executor_factory = make_executor
        self._executor = executor_factory(spec, qparams, backend=backend, batch_size=int(batch_size))
        self._spec = spec
        self._obs_dim = spec.input_dim

    @property
    def backend(self) -> str:
        return str(getattr(self._executor, "backend", "unknown"))

    @property
    def precision(self) -> str:
        return str(getattr(self._executor, "precision", "unknown"))

    @property
    def kernel(self) -> KernelRecord:
        """The executor's integer kernel form and self-check outcome (`quarl.runtimes.kernel_summary`)."""
        return kernel_summary(self._executor)

    @property
    def exploration(self) -> float:
        """NaN: an actor that explores says with what (DQN's epsilon, the Gaussian's sigma) by overriding this."""
        return math.nan

    @abc.abstractmethod
    def act(self, observations: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One action per row of `observations` [K, ...] (one policy call), exploring unless this is an evaluation
        actor, and the per-row extras the agent's sink keeps."""

    def update(self, qparams: QuantizedParams) -> None:
        """New policy weights (same spec); the executor swaps them in place."""
        self._executor.update(qparams)


class BuilderBase(abc.ABC):
    """The one builder type (what `agents.get_builder` and `launch.experiments.agent_spec.AgentSpec.builder`
    return): makes every piece one agent has from its config; precision and backend are run-level arguments.
    Subclasses set `name` and `config_class` and implement the abstract methods (`policy_spec`, `make_learner`,
    `make_actor`, `action_column`, `make_sink`): a builder missing one fails when it is instantiated, not mid-run.
    A replay agent's builder derives `ReplayBuilder`, which adds the replay part."""

    name: ClassVar[str]
    config_class: ClassVar[type]
    config: AgentConfig  # an instance of `config_class` (a frozen dataclass)

    def __init__(self, config: AgentConfig | None = None):
        config = self.config_class() if config is None else config
        if not isinstance(config, self.config_class):
            raise ValueError(f"{self.name} Builder needs a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config

    @abc.abstractmethod
    def policy_spec(self, env_spec: EnvSpec) -> PolicySpec:
        """The actor's policy network as a `PolicySpec` (what the runtimes execute)."""

    @abc.abstractmethod
    def make_learner(self, env_spec: EnvSpec, seed: int, *, max_actor_steps: int | None = None,
                     num_envs: int = 1) -> Learner:
        """The fp32 learner, its networks initialised from `seed`: the one way a run makes it. A run passes its
        length (`max_actor_steps` env steps over `num_envs` environments per actor) so that a learner with a
        schedule over the run (PPO's annealed learning rate) can size it; None: no run length (tests, benchmarks)."""

    @abc.abstractmethod
    def make_actor(self, env_spec: EnvSpec, qparams: QuantizedParams, *, seed: int, actor_id: int = 0,
                   evaluation: bool = False, backend: str = "auto", num_actors: int = 1,
                   executor_factory: ExecutorFactory | None = None, batch_size: int = 1) -> Actor:
        """An actor acting through `qparams` on `backend` (`executor_factory`: how its policy executor is made,
        None for the default; `batch_size`: the K observations it acts on per call)."""

    @abc.abstractmethod
    def action_column(self, env_spec: EnvSpec) -> tuple[tuple[int, ...], np.dtype]:
        """(per-item shape, dtype) of the action column (of a replay transition, or of a rollout)."""

    @abc.abstractmethod
    def make_sink(self, num_envs: int) -> Sink[Transition] | Sink[Rollout]:
        """Where an actor's steps go (`quarl.acting.loop`): n-step adders for replay, rollouts for a learner."""

    def num_envs(self, envs_per_actor: int = 1) -> int:
        """Environments one actor steps together (`--envs-per-actor K`)."""
        return int(envs_per_actor)

    def steps_per_update(self, num_envs: int) -> int | None:
        """Env steps the learner needs between two updates: one rollout's for an on-policy agent; None for a
        replay agent (it learns whenever the rate limiter allows)."""
        del num_envs
        return None

    def actor_update_period(self, num_envs: int) -> int:
        """Env steps between an actor's weight pulls: the config's `actor_update_period`, or after every
        rollout for an on-policy agent (its learner updates once per rollout)."""
        rollout = self.steps_per_update(num_envs)
        return int(rollout) if rollout else int(self.config.actor_update_period)

    def run_steps(self, max_actor_steps: int, num_envs: int) -> int:
        """The env steps a run of `max_actor_steps` takes: rounded up to whole rollouts for an on-policy agent."""
        rollout = self.steps_per_update(num_envs)
        return int(max_actor_steps) if not rollout else rollout * max(1, math.ceil(max_actor_steps / rollout))

    def payload_extras(self, learner: Learner) -> dict[str, np.ndarray]:
        """What a distributed actor needs from the learner beside the network's weights, sent in the weight
        payload with each version (`quarl.quant.payload`, unquantized); none by default."""
        del learner
        return {}

    def apply_extras(self, actor: Actor, extras: Mapping[str, np.ndarray] | None) -> None:
        """Hands an actor the `payload_extras` that came with its weights; nothing by default."""
        del actor, extras


class ReplayBuilder(BuilderBase):
    """A replay agent's builder (DQN, D4PG): `BuilderBase` plus the replay part (Acme's `make_adder` /
    `make_replay_tables`): one n-step adder per environment as the sink, the transition signature, and the table
    with its sampler and rate limiter (`table_config`, plain data a remote replay server builds from). A subclass
    implements `sampler_settings` beside `BuilderBase`'s abstract methods."""

    config: ReplayAgentConfig

    @abc.abstractmethod
    def sampler_settings(self) -> SamplerSettings:
        """The table's `sampler` and `priority_exponent`."""

    def make_sink(self, num_envs: int) -> AdderSink:
        """One n-step adder per environment (`make_adder`)."""
        return AdderSink(self.make_adder, num_envs)

    def error_buffer_setting(self) -> float | tuple[float, float]:
        """The rate limiter's `error_buffer` (a number, or a (min_diff, max_diff) pair)."""
        return self.config.error_buffer

    def make_adder(self) -> NStepTransitionAdder:
        return NStepTransitionAdder(self.config.n_step, self.config.discount)

    def transition_signature(self, env_spec: EnvSpec) -> Signature:
        """Column name -> (per-item shape, dtype) of what the adder emits and the learner reads."""
        # Image tasks keep their [H, W, C] uint8 observations in replay (a byte a value, not four).
        obs = (tuple(env_spec.observation_shape), np.dtype(env_spec.obs_dtype))
        return {"observation": obs, "action": self.action_column(env_spec), "reward": ((), np.dtype(np.float32)),
                "discount": ((), np.dtype(np.float32)), "next_observation": obs}

    def table_config(self) -> TableConfig:
        """Sampler and rate-limiter settings (plain data, so a remote replay server can build the table)."""
        c = self.config
        return {"capacity": c.max_replay_size, **self.sampler_settings(), "samples_per_insert": c.samples_per_insert,
                "min_size_to_sample": c.min_replay_size, "error_buffer": self.error_buffer_setting()}

    def make_table(self, env_spec: EnvSpec, seed: int | None = None) -> Table:
        """The replay table for this config; `seed` fixes its sampling RNG for reproducible runs."""
        return table_from_config(self.transition_signature(env_spec), self.table_config(), seed=seed)


def replay_builder(builder: BuilderBase) -> ReplayBuilder:
    """`builder` as a `ReplayBuilder`, for a runner piece that needs the replay part (a table, an n-step actor);
    a one-line ValueError naming the agent when it has none. A runner that only branches asks `isinstance`."""
    if not isinstance(builder, ReplayBuilder):
        raise ValueError(f"{builder.name} is on-policy and has no replay: its actors' steps go into rollouts "
                         "(make_sink), not into adders and a replay table")
    return builder
