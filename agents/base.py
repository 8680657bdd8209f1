"""What every agent shares: the interfaces the runners rely on (Protocols, not `Any`) and the builder scaffolding
that is the same for every agent (config check, n-step adder, transition signature, replay table), so an agent's
builder only says what differs: its networks, learner, actor and action column.

The runners in `launch/` depend only on `BuilderBase` (an ABC: the one builder type), and the `Learner` and
`Actor` Protocols below (docs/ARCHITECTURE.md, "Builder details").
"""
from __future__ import annotations

import abc
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from quarl.envs.spec import EnvSpec
from quarl.policy.spec import PolicySpec
from quarl.quant.quantization import QuantizedParams
from quarl.replay import table_from_config
from quarl.replay.adders import NStepTransitionAdder
from quarl.replay.items import Sample
from quarl.replay.table import Table
from quarl.runtimes.base import policy_rows

Signature = dict[str, tuple[tuple[int, ...], np.dtype]]


def error_buffer(batch_size: int, min_replay_size: int, samples_per_insert: float, tolerance: float) -> float:
    """Rate-limiter slack in sampled items, for every agent: Acme's `min_replay_size * samples_per_insert *
    tolerance`, but never less than one batch, so that a single-process loop can always alternate one insert and
    one learner step."""
    return max(float(batch_size), tolerance * samples_per_insert * min_replay_size)


@runtime_checkable
class Learner(Protocol):
    """An fp32 learner: one jitted update per sampled batch (or K per call: `prepare` + `run_block`), its
    policy's weights and a checkpointable state (`agents.learner_base.JaxLearner` implements all of it)."""

    steps: int

    def step(self, sample: Sample) -> Mapping[str, Any]: ...

    def prepare(self, samples: Sequence[Sample]) -> Any: ...

    def run_block(self, block: Any) -> Mapping[str, Any]: ...

    def policy_snapshot(self) -> Any: ...

    def policy_params(self) -> dict: ...

    def get_state(self) -> Any: ...

    def restore(self, state: Any) -> None: ...


@runtime_checkable
class Actor(Protocol):
    """An actor acting through a quantized policy executor; `update` swaps in new weights of the same spec."""

    evaluation: bool

    def select_action(self, observation: np.ndarray) -> np.ndarray: ...

    def select_actions(self, observations: np.ndarray) -> np.ndarray: ...

    def update(self, qparams: QuantizedParams) -> None: ...


# What makes an actor's executor: `quarl.runtimes.make_executor`'s signature (tests pass fakes).
ExecutorFactory = Callable[..., Any]


class ExecutorActor:
    """What every agent's actor shares: the quantized policy executor it acts through (`self._executor`, made
    by the subclass with `_make_executor`, which also keeps its spec), what runs it (backend, precision, integer
    kernel form) and the weight swap."""

    _executor: Any
    _spec: PolicySpec
    _obs_dim: int

    def _make_executor(self, spec: PolicySpec, qparams: QuantizedParams, backend: str, batch_size: int,
                       executor_factory: ExecutorFactory | None) -> None:
        """Sets `self._executor` (from `executor_factory`, default `quarl.runtimes.make_executor`) and
        `self._obs_dim`. batch_size: how many observations one call carries (K environments per actor); `auto`
        measures the runtimes at that batch."""
        if executor_factory is None:
            from quarl.runtimes import make_executor  # pylint: disable=import-outside-toplevel
            executor_factory = make_executor
        self._executor = executor_factory(spec, qparams, backend=backend, batch_size=int(batch_size))
        self._spec = spec
        self._obs_dim = spec.input_dim

    def _one_row(self, observation: Any) -> np.ndarray:
        """One observation as the [1, input_dim] batch the executor takes (`quarl.runtimes.base.policy_rows`:
        validated; uint8 for pixel policies); ValueError naming the size when it has the wrong number of values."""
        obs = np.asarray(observation)
        if obs.size != self._obs_dim:
            raise ValueError(f"observation must have {self._obs_dim} values, got shape {obs.shape}")
        return policy_rows(obs.reshape(1, -1), self._spec)

    @property
    def backend(self) -> str:
        return str(getattr(self._executor, "backend", "unknown"))

    @property
    def precision(self) -> str:
        return str(getattr(self._executor, "precision", "unknown"))

    @property
    def kernel(self) -> dict:
        """The executor's integer kernel form and self-check outcome (`quarl.runtimes.kernel_summary`)."""
        from quarl.runtimes import kernel_summary  # pylint: disable=import-outside-toplevel

        return kernel_summary(self._executor)

    def update(self, qparams: QuantizedParams) -> None:
        """New policy weights (same spec); the executor swaps them in place."""
        self._executor.update(qparams)


class BuilderBase(abc.ABC):
    """The one builder type (what `agents.get_builder` and `launch.experiments.agent_spec.AgentSpec.builder`
    return): makes every piece of one agent from its config; precision and backend are run-level arguments. The parts that are
    the same for every agent live here; subclasses set `name` and `config_class` and implement the abstract
    methods (`policy_spec`, `make_learner`, `make_actor`, `action_column`, `sampler_settings`): a builder
    missing one fails when it is instantiated, not mid-run."""

    name: ClassVar[str]
    config_class: ClassVar[type]
    # An on-policy agent (PPO, A2C) has no replay: the runners train it with `launch.experiments.onpolicy`.
    on_policy: ClassVar[bool] = False
    config: Any  # an instance of `config_class` (a frozen dataclass)

    def __init__(self, config: Any = None):
        config = self.config_class() if config is None else config
        if not isinstance(config, self.config_class):
            raise ValueError(f"{self.name} Builder needs a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config

    @abc.abstractmethod
    def policy_spec(self, env_spec: EnvSpec) -> PolicySpec:
        """The actor's policy network as a `PolicySpec` (what the runtimes execute)."""

    @abc.abstractmethod
    def make_learner(self, env_spec: EnvSpec, seed: int) -> Learner:
        """The fp32 learner, its networks initialised from `seed`."""

    @abc.abstractmethod
    def make_actor(self, env_spec: EnvSpec, qparams: QuantizedParams, *, seed: int, actor_id: int = 0,
                   evaluation: bool = False, backend: str = "auto", num_actors: int = 1,
                   executor_factory: Any = None, batch_size: int = 1) -> Actor:
        """An actor acting through `qparams` on `backend` (`executor_factory`: how its policy executor is made,
        None for the default; `batch_size`: the K observations it acts on per call)."""

    @abc.abstractmethod
    def action_column(self, env_spec: EnvSpec) -> tuple[tuple[int, ...], np.dtype]:
        """(per-item shape, dtype) of the action column."""

    @abc.abstractmethod
    def sampler_settings(self) -> dict[str, Any]:
        """The table's `sampler` and `priority_exponent`."""

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

    def table_config(self) -> dict[str, Any]:
        """Sampler and rate-limiter settings (plain data, so a remote replay server can build the table)."""
        c = self.config
        return {"capacity": c.max_replay_size, **self.sampler_settings(), "samples_per_insert": c.samples_per_insert,
                "min_size_to_sample": c.min_replay_size, "error_buffer": self.error_buffer_setting()}

    def make_table(self, env_spec: EnvSpec, seed: int | None = None) -> Table:
        """The replay table for this config; `seed` fixes its sampling RNG for reproducible runs."""
        return table_from_config(self.transition_signature(env_spec), self.table_config(), seed=seed)
