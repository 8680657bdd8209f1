"""What a single-process run is made of (`launch.experiments.run_experiment`): the agent and its environments
(`build_agent`), and the weight channel with the actors it feeds (`make_actors`). Each takes the config and reads
its own fields of it; nothing here runs the run.

The actor only ever sees weights that went learner.policy_params() -> quantize_for_actors(precision) ->
encode_payload -> bytes -> decode_payload -> actor.update (`WeightChannel`), so quantization and the wire format
are exercised on every pull, and each stage is timed, as in a distributed actor.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Callable, Sequence

from agents.loops import use_loop_form
from launch.experiments.config import ExperimentConfig
from launch.experiments.stages import StageTimes
from launch.program.devices import use_learner_device
from quarl.envs.factory import make_environment
from quarl.envs.spec import EnvSpec, environment_spec
from quarl.envs.vector import VectorEnv, make_vector_environment
from quarl.policy.spec import PolicySpec
from quarl.quant.calibration import learner_observations, quantize_for_actors
from quarl.quant.payload import decode_payload, encode_payload
from quarl.quant.precision import Precision, parse_precision
from quarl.quant.quantization import QuantizedParams

if TYPE_CHECKING:
    import dm_env

    from agents.base import Actor, BuilderBase, Learner

EVAL_SEED_OFFSET = 10_000  # evaluation episodes come from their own env instance and seed
FP32 = parse_precision("fp32")  # the --eval-fp32 actor's


@dataclasses.dataclass(frozen=True)
class Agent:
    """The agent and its environments (`build_agent`), and the counts the builder derives, in env steps: K
    environments per loop iteration, the actor's weight-pull period and the run's length (an on-policy agent's
    budget rounded up to whole rollouts)."""

    builder: "BuilderBase"
    env: VectorEnv
    eval_env: "dm_env.Environment"
    env_spec: EnvSpec
    spec: PolicySpec
    learner: "Learner"
    num_envs: int
    update_period: int
    run_steps: int


def build_agent(config: ExperimentConfig, on_builder: Callable[["BuilderBase"], None] | None = None) -> Agent:
    """The environment and the agent: the builder (`on_builder` sees it before anything is made from it), K
    acting environments and one for evaluation with its own seed, the policy spec and the learner. The learner's
    device and loop form are set first: both are read when its update is traced."""
    use_learner_device(config.learner_device)  # one process: the learner's device is the process's
    use_loop_form(config.learner_loop)
    builder = config.builder()
    if on_builder is not None:
        on_builder(builder)
    num_envs = builder.num_envs(config.envs_per_actor)
    env = make_vector_environment(config.task, config.seed, num_envs)
    eval_env = make_environment(config.task, config.seed + EVAL_SEED_OFFSET)
    env_spec = environment_spec(env)
    spec = builder.policy_spec(env_spec)
    learner = builder.make_learner(env_spec, config.seed, max_actor_steps=config.max_actor_steps, num_envs=num_envs)
    return Agent(builder, env, eval_env, env_spec, spec, learner, num_envs, builder.actor_update_period(num_envs),
                 builder.run_steps(config.max_actor_steps, num_envs))


class WeightChannel:
    """Learner -> actor weight transport in one process: exactly the bytes a remote actor would receive (the
    payload carries the learner step as its version and the policy spec's digest, as in the distributed run)."""

    def __init__(self, learner: "Learner", spec: PolicySpec, precision: Precision, times: StageTimes):
        self._learner, self._precision, self._times = learner, precision, times
        self._spec, self._spec_hash = spec, spec.digest()
        self.version = -1
        self.payload_bytes = 0

    def pull(self, count: bool = True) -> QuantizedParams:
        """Publishes the learner's current weights; returns the actor-side QuantizedParams."""
        t0 = time.perf_counter()
        version = int(self._learner.steps)
        qparams = quantize_for_actors(self._spec, self._learner.policy_params(), self._precision,
                                      learner_observations(self._learner))
        data = encode_payload(qparams, version=version, spec_hash=self._spec_hash)
        t1 = time.perf_counter()
        payload = decode_payload(data)
        t2 = time.perf_counter()
        if payload.version != version or payload.spec_hash != self._spec_hash:
            raise RuntimeError(f"payload version {payload.version} != published {version}")
        self.version = version
        self.payload_bytes = len(data)
        if count:
            self._times.quantize_encode_s += t1 - t0
            self._times.deserialize_s += t2 - t1
            self._times.payload_bytes += len(data)
        return payload.params


@dataclasses.dataclass
class Actors:
    """The acting actor (K environments), the greedy evaluation actor and, with `eval_fp32`, an fp32 one, with
    the channels they take weights from. `acting_version`: the weights the acting actor acts with (an evaluation
    pulls newer ones)."""

    actor: "Actor"
    eval_actor: "Actor"
    fp32_actor: "Actor | None"
    channel: WeightChannel
    fp32_channel: WeightChannel
    build_s: float  # building the acting actor (with `auto`, measuring the backends too); not an update
    times: StageTimes
    acting_version: int = -1

    def pull(self, on_pull: Callable[[Sequence["Actor | None"]], None]) -> None:
        """The acting actor's weight pull at its update period, timed as a distributed actor's; `on_pull` is the
        feed's (an on-policy learner's exploration follows it into every actor)."""
        qparams = self.channel.pull()
        t = time.perf_counter()
        self.actor.update(qparams)
        on_pull((self.actor, self.eval_actor, self.fp32_actor))
        self.times.load_s += time.perf_counter() - t
        self.acting_version = self.channel.version
        self.times.updates += 1
        self.times.pulls += 1


def make_actors(config: ExperimentConfig, agent: Agent, times: StageTimes) -> Actors:
    """The weight channel at the run's precision (and an fp32 one) and the actors built on its first weights, each
    on the config's backend and kernel form, seeded apart."""
    builder, env_spec, seed = agent.builder, agent.env_spec, config.seed
    channel = WeightChannel(agent.learner, agent.spec, config.precision, times)
    qparams = channel.pull(count=False)
    pinned = config.executor_factory()  # make_executor with the config's kernel form, or None
    t0 = time.perf_counter()
    actor = builder.make_actor(env_spec, qparams, seed=seed, actor_id=0, evaluation=False, backend=config.backend,
                               batch_size=agent.num_envs, executor_factory=pinned)
    build_s = time.perf_counter() - t0
    eval_actor = builder.make_actor(env_spec, qparams, seed=seed + 1, actor_id=0, evaluation=True,
                                    backend=config.backend, executor_factory=pinned)
    fp32_channel = WeightChannel(agent.learner, agent.spec, FP32, StageTimes())
    fp32_actor = None
    if config.eval_fp32 and config.precision != FP32:
        fp32_actor = builder.make_actor(env_spec, fp32_channel.pull(), seed=seed + 2, actor_id=0, evaluation=True,
                                        backend=config.backend, executor_factory=pinned)
    return Actors(actor, eval_actor, fp32_actor, channel, fp32_channel, build_s, times, channel.version)
