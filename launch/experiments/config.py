"""One experiment, described once (as Acme's `ExperimentConfig`): a frozen, validated record that every CLI,
`launch.reproduce`, the benchmarks and the tests build, that either runner runs
(`launch.experiments.run_experiment.run_experiment` in one process, `launch.distributed.supervisor.run_program`
distributed), and that both write whole into summary.json under "experiment".

Plain data: importing this module costs nothing (no JAX, no Ray), so CLIs build and check a config before the
heavy imports (the precision is parsed by the JAX-free `quarl.quant.precision`); the few checks that need a
library (backends, kernel forms, agent config keys) import it lazily.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import TYPE_CHECKING, Mapping

import agents
from agents.loops import check_loop_form
from launch.program.devices import LEARNER_DEVICES
from quarl.envs.factory import task_family
from quarl.ops.checks import ConfigError, check_bool, check_int, check_number, is_finite
from quarl.ops.io import JSONValue
from quarl.quant.precision import Precision, parse_precision, precision_names

if TYPE_CHECKING:  # agents.base imports JAX; this module stays light (CLIs check their flags with it first)
    from agents import AgentConfig
    from agents.base import BuilderBase, ExecutorFactory

SERVICE_SHARE = 0.01  # of each learner resource, asked by the learner, every service and the evaluator
ROLLOUT_MODES = ("sync", "async")  # DistributedConfig.rollout_mode


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """What only the distributed runner (`launch.distributed.supervisor`) reads: the actors, the learner's
    publishing and prefetch, checkpoints and where nodes run. Validated at construction (`ConfigError` naming the field)."""

    num_actors: int = 1
    publish_period: int = 10  # learner steps between weight versions
    publish_min_interval_s: float = 0.0  # seconds at least between weight versions
    # SGD steps per learner call (one `lax.scan` over K batches); None: chosen for the learner's device
    # (`launch.distributed.nodes.learner_feed.default_steps_per_call`: 4 on CPU, as measured there).
    learner_steps_per_call: int | None = None
    insert_batch: int = 64  # transitions per replay insert call
    prefetch: int = 2  # sampled blocks the learner keeps in flight
    checkpoint_every: int = 0  # learner steps; 0 = only at shutdown
    resume: str | None = None  # checkpoint directory to continue from
    log_every_s: float = 1.0  # learner.csv cadence (seconds)
    # Each actor pins its acting thread to a core of its machine that no other actor holds (`quarl.ops.affinity`);
    # the learner is never pinned.
    pin_actors: bool = False
    actor_resources: Mapping[str, float] = dataclasses.field(default_factory=dict)  # Ray custom resources
    # Ray custom resources marking the learner's machine: learner, services and evaluator each ask for
    # SERVICE_SHARE of every one, so they run there together.
    learner_resources: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # On-policy agents (PPO, A2C; `launch.distributed.nodes.rollout_learner`): "sync" waits for one rollout of the
    # current weights from every actor per update (PPO with N actors, exactly); "async" trains on each rollout as
    # it comes and drops those acted with weights more than `max_staleness` versions old. None: 2 x num_actors + 2,
    # what the pipeline itself holds when actors outpace the learner (each actor acts one rollout while another
    # waits in its outbox; measured: lag 5 with 2 actors), so only data held up further (a restart) is dropped.
    rollout_mode: str = "sync"
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_actors", "publish_period", "insert_batch", "prefetch"):
            check_int(name, getattr(self, name), minimum=1)
        if self.rollout_mode not in ROLLOUT_MODES:
            raise ConfigError("rollout_mode", f"must be one of {', '.join(ROLLOUT_MODES)}, got {self.rollout_mode!r}")
        if self.max_staleness is not None:
            object.__setattr__(self, "max_staleness", check_int("max_staleness", self.max_staleness, minimum=0))
        if self.learner_steps_per_call is not None:
            object.__setattr__(self, "learner_steps_per_call",
                               check_int("learner_steps_per_call", self.learner_steps_per_call, minimum=1))
        check_int("checkpoint_every", self.checkpoint_every, minimum=0)
        check_number("publish_min_interval_s", self.publish_min_interval_s, low=0.0)
        check_number("log_every_s", self.log_every_s, low=0.0, low_open=True)
        check_bool("pin_actors", self.pin_actors)
        if self.resume is not None and (not isinstance(self.resume, str) or not self.resume):
            raise ConfigError("resume", f"must be a checkpoint path or null, got {self.resume!r}")
        for name in ("actor_resources", "learner_resources"):
            value = getattr(self, name)
            if not isinstance(value, Mapping) or not all(
                    isinstance(k, str) and k and is_finite(v) and v > 0 for k, v in value.items()):
                raise ConfigError(name, f"must map resource names to finite amounts > 0, got {value!r}")
            object.__setattr__(self, name, dict(value))
        for name in ("num_actors", "publish_period", "insert_batch", "prefetch", "checkpoint_every"):
            object.__setattr__(self, name, int(getattr(self, name)))

    def staleness_bound(self) -> int:
        """`max_staleness`, or its default for this many actors."""
        return 2 * self.num_actors + 2 if self.max_staleness is None else int(self.max_staleness)

    def to_dict(self) -> dict[str, JSONValue]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, JSONValue]) -> "DistributedConfig":
        unknown = sorted(set(data) - set(DISTRIBUTED_FIELDS))
        if unknown:
            raise ConfigError("distributed", f"has unknown field(s) {', '.join(unknown)}")
        return cls(**dict(data))


DISTRIBUTED_FIELDS = tuple(f.name for f in dataclasses.fields(DistributedConfig))


# ALE episodes run to thousands of agent steps (up to 27,000): an evaluation of 10 of them every tenth of a short
# run took 53 of a 2,000-step Pong run's 60 s. They get 3 episodes at most once every 25,000 steps.
ALE_EVAL_EPISODES = 3
ALE_MIN_EVAL_EVERY = 25_000
EVALUATION_HELP = f"a tenth of the run; ALE games at most once every {ALE_MIN_EVAL_EVERY:,} steps"


def default_evaluation(task: str, max_actor_steps: int) -> tuple[int, int]:
    """(actor steps between evaluations, episodes per evaluation) when the run does not set them: 10 episodes
    every tenth of the run, but ALE games' long episodes fewer and less often (`EVALUATION_HELP`)."""
    every = max(1, int(max_actor_steps) // 10)
    if isinstance(task, str) and task_family(task) == "ale":
        return max(every, ALE_MIN_EVAL_EVERY), ALE_EVAL_EPISODES
    return every, 10


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """Everything one ActorQ training run is made of, in one object: the experiment's own fields, the agent's
    config (`agent_config`, resolved), the task preset it started from and the distributed settings. Validated at
    construction (`ConfigError`, one line); `--set SECTION.FIELD=VALUE` addresses any field (`launch.settings`).

    `overrides` are the agent config fields the experiment sets over the agent's defaults: the task preset
    (`task_preset`, folded in under them at construction), then a CLI's quick preset and `--set`. `agent_config` is
    the agent config they resolve to (`agents.make_config(agent, **overrides)`), what `builder()` builds; the
    actors' weight-pull period is one of its fields (`actor_update_period`), so it is that period's single source.
    `eval_every=None` and `eval_episodes=None` are resolved at construction (`default_evaluation`), so a saved
    config is complete.
    `precision` is a `Precision`, parsed once here from whatever text built the config (a flag, a JSON file:
    "int8", "8"), so nothing downstream parses the name again; JSON (`to_dict`, summary.json) keeps its name.
    `distributed` (a `DistributedConfig`) is ignored by the single-process runner, fields marked [single] by the
    distributed one. `create(**fields)` takes the distributed fields flat (as the CLIs' flags name them).
    """

    agent: str
    task: str
    max_actor_steps: int  # environment steps over all actors (with `resume`: including the steps before it)
    logdir: str  # a path (str or os.PathLike; stored as str)
    # The actors' (deployed) precision; the learner is always fp32. Given as text, it is parsed at construction.
    precision: Precision = parse_precision("int8")
    seed: int = 0
    overrides: Mapping[str, object] = dataclasses.field(default_factory=dict)
    # The agent's tuned settings for the task (`agents.task_defaults(agent, task)`, as the CLIs fill it), recorded
    # apart so a reader tells them from the run's own choices. {}: a config built by hand, or recorded before this.
    task_preset: Mapping[str, object] = dataclasses.field(default_factory=dict)
    backend: str = "auto"  # policy runtime of actors and evaluator: auto | jax | onnx | onnx-nbits
    # The ONNX integer kernel form actors and evaluator try first (`quarl.runtimes.kernel_forms`: u8s8, u8u8,
    # fp32 = the dequantized graph ...; still self-checked), None: this CPU's choice. With backend onnx it pins the
    # executor, so a rerun computes the same numerics on another machine of the same CPU class.
    kernel_form: str | None = None
    eval_every: int | None = None  # actor steps between evaluations (None: `default_evaluation`)
    eval_episodes: int | None = None  # greedy episodes per evaluation (None: `default_evaluation`)
    envs_per_actor: int = 1  # environments each actor steps with one batched policy call (the paper: 1)
    target_return: float | None = None  # end the run once `target_streak` evaluations in a row reach it
    target_streak: int = 1
    eval_fp32: bool = False  # [single] also evaluate an fp32 actor next to the deployed-precision one
    # What only the distributed runner reads (the single-process runner has one actor, no services, no checkpoints).
    distributed: DistributedConfig = dataclasses.field(default_factory=lambda: DistributedConfig())
    # Where the learner's JAX runs: auto (a GPU when its process sees one, else the CPU) | cpu | gpu. Every other
    # process runs JAX on the CPU whatever this says (`launch.program.devices`).
    learner_device: str = "auto"
    # The form of the learner's SGD loops (agents.loops): auto (the scan, see there) | scan | unroll.
    learner_loop: str = "auto"
    # Resolved at construction from `overrides` (never given): the agent's whole config. JSON writes it whole, and
    # `from_dict` pins any value a later default would change, so a recorded run reruns with the values it ran.
    agent_config: "AgentConfig" = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self._check()
        put = object.__setattr__  # frozen: normalised values are set once, here
        put(self, "precision", _precision(self.precision))
        put(self, "task_preset", {k: _tuples(v) for k, v in dict(self.task_preset).items()})
        put(self, "overrides", {**self.task_preset, **{k: _tuples(v) for k, v in dict(self.overrides).items()}})
        put(self, "agent_config", _agent_config(self.agent, self.overrides))
        put(self, "logdir", os.fspath(self.logdir))
        every, episodes = default_evaluation(self.task, int(self.max_actor_steps))
        if self.eval_every is None:
            put(self, "eval_every", every)
        if self.eval_episodes is None:
            put(self, "eval_episodes", episodes)
        for name in _INTS:
            put(self, name, int(getattr(self, name)))
        if self.target_return is not None:
            put(self, "target_return", float(self.target_return))

    def _check(self) -> None:
        """Every value check, in one place (CLIs map `ConfigError.field` to their flag)."""
        if self.agent not in agents.AGENT_NAMES:
            raise ConfigError("agent", f"{self.agent!r} is an unknown agent; valid agents: {', '.join(agents.AGENT_NAMES)}")
        for name, value in (("task", self.task), ("logdir", self.logdir)):
            if not isinstance(value, (str, os.PathLike)) or not str(value):
                raise ConfigError(name, f"must be a non-empty string, got {value!r}")
        for name in ("max_actor_steps", "envs_per_actor", "target_streak"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("eval_every", "eval_episodes"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), minimum=1)
        check_int("seed", self.seed, minimum=0)
        if isinstance(self.distributed, Mapping):  # from JSON
            object.__setattr__(self, "distributed", DistributedConfig.from_dict(self.distributed))
        if not isinstance(self.distributed, DistributedConfig):
            raise ConfigError("distributed", f"must be a DistributedConfig, got {type(self.distributed).__name__}")
        from quarl.runtimes import BACKEND_NAMES  # pylint: disable=import-outside-toplevel
        if self.backend not in BACKEND_NAMES:
            raise ConfigError("backend", f"{self.backend!r} is an unknown backend; valid: {', '.join(BACKEND_NAMES)}")
        if self.kernel_form is not None:
            from quarl.runtimes.kernel_forms import forms  # pylint: disable=import-outside-toplevel
            if self.kernel_form not in forms():
                raise ConfigError("kernel_form", f"{self.kernel_form!r} is an unknown kernel form; valid: "
                                                 f"{', '.join(sorted(forms()))}")
            if self.backend == "jax":
                raise ConfigError("kernel_form", "applies to the onnx backends (jax has one integer kernel); "
                                                 "use --backend onnx")
        if self.target_return is not None and not is_finite(self.target_return):
            raise ConfigError("target_return", f"must be a finite number, got {self.target_return!r}")
        check_bool("eval_fp32", self.eval_fp32)
        if self.learner_device not in LEARNER_DEVICES:
            raise ConfigError("learner_device", f"must be one of {', '.join(LEARNER_DEVICES)}, "
                                                f"got {self.learner_device!r}")
        try:
            check_loop_form(self.learner_loop)
        except ValueError as e:
            raise ConfigError("learner_loop", str(e)) from None
        for name in ("overrides", "task_preset"):
            if not isinstance(getattr(self, name), Mapping):
                raise ConfigError(name, f"must map agent config keys to values, got {getattr(self, name)!r}")

    # ------------------------------------------------------------------------------------------ use

    def builder(self) -> "BuilderBase":
        """The agent builder this experiment trains, on `agent_config`."""
        return agents.builder_class(self.agent)(self.agent_config)

    @classmethod
    def create(cls, **fields: object) -> "ExperimentConfig":
        """`ExperimentConfig(**fields)` with `DistributedConfig`'s fields given flat (`num_actors=2`), as the
        CLIs' flags, the grid and the benchmarks name them; `precision` may be text ("int8", "8") or a `Precision`."""
        return cls(**_nest(fields))

    def replace(self, **changes: object) -> "ExperimentConfig":
        """A copy with `changes` (validated again); distributed fields may be named flat (`resume=...`)."""
        changes = _nest(changes)
        if isinstance(changes.get("distributed"), Mapping):
            changes["distributed"] = dataclasses.replace(self.distributed, **changes["distributed"])
        return dataclasses.replace(self, **changes)

    def executor_factory(self) -> "ExecutorFactory | None":
        """What builders make actors' executors with: None (the default) or `make_executor` pinned to
        `kernel_form`."""
        return executor_factory(self.kernel_form)

    # ------------------------------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, JSONValue]:
        """Plain JSON types, field by field (`_json`: the precision its name, the distributed and agent configs
        their fields, tuples lists); `from_dict` restores the identical config."""
        return {f.name: _json(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, JSONValue]) -> "ExperimentConfig":
        """The config `to_dict` wrote (lists in overrides become tuples: agent configs hold tuples), or one written
        before the distributed fields were nested (flat, as in older summaries) or before the agent config and task
        preset were recorded. A recorded `agent_config` is the agent config the run had: where today's defaults
        resolve a field otherwise, its recorded value joins `overrides`. Unknown or missing fields raise
        ConfigError."""
        if not isinstance(data, Mapping):
            raise ConfigError("config", f"must be a JSON object, got {type(data).__name__}")
        data = _nest(dict(data))
        recorded = data.pop("agent_config", None)
        fields = [f for f in dataclasses.fields(cls) if f.init]
        unknown = sorted(set(data) - {f.name for f in fields})
        if unknown:
            raise ConfigError("config", f"has unknown field(s) {', '.join(unknown)}")
        missing = sorted(f.name for f in fields if f.name not in data
                         and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        if missing:
            raise ConfigError("config", f"lacks required field(s) {', '.join(missing)}")
        config = cls(**dict(data))
        pinned = _pinned(config, recorded)
        return config.replace(overrides={**config.overrides, **pinned}) if pinned else config


_INTS = ("max_actor_steps", "seed", "eval_every", "eval_episodes", "envs_per_actor", "target_streak")


def _agent_config(agent: str, overrides: Mapping[str, object]) -> "AgentConfig":
    try:
        return agents.make_config(agent, **overrides)
    except (TypeError, ValueError) as e:
        raise ConfigError("overrides", f"are not a valid {agent} config: {' '.join(str(e).split())}") from None


def agent_config_dict(agent_config: "AgentConfig") -> dict[str, JSONValue]:
    """An agent config's fields as JSON types (tuples as lists)."""
    return _json(agent_config)  # type: ignore[return-value]  (a dataclass: a dict)


def _json(value: object) -> JSONValue:
    """A config field's value as JSON types: a precision its name, a sub-config (dataclass) its fields, tuples lists."""
    if isinstance(value, Precision):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _json(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return _lists(value)


def _pinned(config: ExperimentConfig, recorded: object) -> dict[str, object]:
    """The fields of a recorded agent config (`to_dict`'s `agent_config`) whose value differs from what `config`
    resolves them to (a default changed since it was written): the overrides that rerun the recorded values."""
    if recorded is None:
        return {}
    names = {f.name for f in dataclasses.fields(config.agent_config) if f.init}
    if not isinstance(recorded, Mapping) or set(recorded) - names:
        extra = sorted(set(recorded) - names) if isinstance(recorded, Mapping) else recorded
        raise ConfigError("agent_config", f"is not a {config.agent} config: unknown field(s) {extra}")
    return {k: _tuples(v) for k, v in recorded.items() if _tuples(v) != getattr(config.agent_config, k)}


def _nest(fields: dict[str, object]) -> dict[str, object]:
    """`fields` with `DistributedConfig`'s fields, given flat, moved under "distributed" (one may not give both)."""
    flat = {k: fields.pop(k) for k in list(fields) if k in DISTRIBUTED_FIELDS}
    if flat:
        if "distributed" in fields:
            raise ConfigError("distributed", f"is given twice: nested and as {', '.join(sorted(flat))}")
        fields["distributed"] = flat
    return fields


def executor_factory(kernel_form: str | None) -> "ExecutorFactory | None":
    """None, or `quarl.runtimes.make_executor` with its ONNX kernel form pinned (see ExperimentConfig.kernel_form)."""
    if kernel_form is None:
        return None
    from quarl.runtimes import make_executor  # pylint: disable=import-outside-toplevel

    return functools.partial(make_executor, kernel_form=kernel_form)


ACTOR_PRECISIONS = precision_names("actor")  # what actors may run (quarl.quant.precision says why)


def actor_precision(name: object) -> Precision:
    """An actor precision, parsed from its name (shorthands 32, 16, 8 ... 2 accepted) or given as a `Precision`;
    ValueError otherwise."""
    return parse_precision(name if isinstance(name, Precision) else str(name), "actor")


def _precision(name: object) -> Precision:
    try:
        return actor_precision(name)
    except ValueError as e:
        raise ConfigError("precision", f"is not valid: {' '.join(str(e).split())}") from None


def _tuples(value: object) -> object:
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def _lists(value: object) -> JSONValue:
    return [_lists(v) for v in value] if isinstance(value, (list, tuple)) else value
