"""The acting node: K environments (`envs_per_actor`), one quantized policy executor called once per step on the K
observations, n-step adders and batched replay inserts."""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from agents.base import replay_builder
from launch.distributed.nodes.base import (
    POLL_S, NodeBase, NodeRecord, counter_totals, csv_logger, energy_tracker, log_event,
)
from launch.distributed.nodes.weights_client import PolicyClient
from launch.experiments.acting import EPISODE_FIELDS, ActingLoop
from launch.experiments.agent_spec import AgentSpec, derive_seed
from launch.experiments.config import executor_factory
from launch.experiments.stages import StageTimes
from launch.distributed.clients import CounterClient, ReplayClient
from launch.program.graph import NodeHandle, connect, result_as
from quarl.acting.loop import Sink
from quarl.envs.vector import VectorEnv, make_vector_environment
from quarl.ops.affinity import claim_core
from quarl.ops.carbon import stop_tracking
from quarl.quant.payload import Payload
from quarl.quant.precision import Precision, parse_precision
from quarl.replay.adders import TransitionBuffer
from quarl.replay.items import Transition

if TYPE_CHECKING:
    from agents.base import Actor, BuilderBase
    from quarl.envs.spec import EnvSpec

ACTOR_ENV_STREAM = 10


class _StoppedEarly(Exception):
    """Stopped before the first weights arrived."""


def first_actor(builder: BuilderBase, env_spec: EnvSpec, client: PolicyClient, stop: threading.Event, *, seed: int,
                attempt: int, actor_id: int, num_actors: int, num_envs: int, backend: str,
                kernel_form: str | None) -> Actor | None:
    """The actor built on the first weights `client` receives (None: stopped before any came), for every acting
    node. Its seed comes from the attempt, so a process restarted after a crash explores anew."""
    built: list[Actor] = []

    def build(p: Payload) -> None:
        actor = builder.make_actor(env_spec, p.params, seed=derive_seed(seed, attempt), actor_id=actor_id,
                                   evaluation=False, backend=backend, num_actors=num_actors, batch_size=num_envs,
                                   executor_factory=executor_factory(kernel_form))
        builder.apply_extras(actor, p.extras)
        built.append(actor)

    payload = client.first(stop, apply=build)
    return None if payload is None else built[-1]


def log_restart(logdir: str, name: str, attempt: int, version: int, start: Mapping[str, float]) -> None:
    """The events.log line of an acting node started again after its process died (`attempt` > 1; `start` is
    the counter's answer to the start, with the node's own steps so far)."""
    if attempt > 1:
        log_event(logdir, name, f"restarted (start #{attempt}: the previous process died); acting again with the "
                                f"latest weights, version {version}, after {int(start.get(f'{name}_steps', 0))} "
                                "steps of its own so far", logging.WARNING)


def update_actor(builder: BuilderBase, actor: Actor) -> Callable[[Payload], None]:
    """What an acting node does with each newer payload: the new weights, and the agent's extras beside them."""
    def apply(p: Payload) -> None:
        actor.update(p.params)
        builder.apply_extras(actor, p.extras)
    return apply


class CountReport:
    """This actor's steps and episodes not yet added to the run's counter; `send()` adds them (after every
    batched insert and at the end) and reads back the run's total actor steps, which ends the acting loop."""

    def __init__(self, counter: CounterClient, name: str, total: int):
        self._counter, self._name = counter, name
        self.total = int(total)
        self.steps = self.episodes = 0

    def send(self) -> None:
        if not (self.steps or self.episodes):
            return
        totals = counter_totals(self._counter, actor_steps=self.steps, episodes=self.episodes,
                                **{f"{self._name}_steps": self.steps})
        self.steps = self.episodes = 0
        self.total = int(totals["actor_steps"])


class ActorNode(NodeBase):
    """One acting process: environment + quantized policy + n-step adder; see the module docstring. `precision`:
    the actors' (a name still parses)."""

    LOG_FIELDS = list(EPISODE_FIELDS)

    def __init__(self, spec: AgentSpec, actor_id: int, num_actors: int, seed: int, precision: Precision,
                 backend: str, replay: NodeHandle, counter: NodeHandle, weights: NodeHandle, logdir: str,
                 max_actor_steps: int, insert_batch: int = 64, envs_per_actor: int = 1, pin: bool = False,
                 kernel_form: str | None = None):
        self._spec = spec
        self._id, self._num_actors = int(actor_id), int(num_actors)
        self._seed = int(seed)
        self._precision, self._backend = parse_precision(precision), backend
        self._kernel_form = kernel_form  # ONNX integer kernel form pinned by the config (None: the CPU's choice)
        self._replay, self._counter = connect(replay, ReplayClient), connect(counter, CounterClient)
        self._weights = weights  # the PolicyClient's
        self._logdir = logdir
        self._max_steps = int(max_actor_steps)
        self._insert_batch = int(insert_batch)
        self._num_envs = int(envs_per_actor)
        self._pin = bool(pin)  # claim a core of this machine for the acting thread (quarl.ops.affinity)
        self.core: int | None = None
        self._stop = threading.Event()
        self._builder = replay_builder(spec.builder())  # on-policy agents act in rollout_actor.RolloutActorNode
        self._env_spec = spec.env_spec()
        self.times = StageTimes()
        self.inserted = 0  # transitions this actor put into replay (this process)

    def stop(self) -> None:
        self._stop.set()

    def _make_environment(self, seed: int) -> VectorEnv:
        """The actor's K environments (a separate method so tests can wrap it, e.g. to make an actor slow)."""
        return make_vector_environment(self._spec.task, seed, self._num_envs)

    def run(self) -> NodeRecord:
        name = f"actor_{self._id}"
        start = counter_totals(self._counter, **{f"{name}_starts": 1})
        attempt = int(start[f"{name}_starts"])  # > 1 after a crash: fresh env seed, resume latest weights
        t_origin = time.monotonic() - start["wall_clock_s"]
        if self._pin and self.core is None:  # before the runtime and environments start their threads
            self.core = claim_core()
            log_event(self._logdir, name, f"pinned to CPU {self.core}" if self.core is not None else
                      "--pin-actors: every CPU here is claimed by another actor; acting unpinned", logging.INFO
                      if self.core is not None else logging.WARNING)
        tracker = energy_tracker(self._logdir, name)
        log = csv_logger(self._logdir, name, self.LOG_FIELDS, "total_actor_steps")
        times = self.times = StageTimes()
        client = PolicyClient(
            self._weights, times, spec=self._builder.policy_spec(self._env_spec),
            precision=self._precision, logdir=self._logdir, node=name)
        env = self._make_environment(derive_seed(self._seed, ACTOR_ENV_STREAM, attempt))
        update_period = self._builder.actor_update_period(self._num_envs)
        first_version = None
        try:
            actor = first_actor(self._builder, self._env_spec, client, self._stop, seed=self._seed, attempt=attempt,
                                actor_id=self._id, num_actors=self._num_actors, num_envs=self._num_envs,
                                backend=self._backend, kernel_form=self._kernel_form)
            if actor is None:
                raise _StoppedEarly
            first_version = client.version
            kernel = actor.kernel or {}
            if kernel.get("fallback"):  # the CPU's preferred int kernel was not exact here (summary.json has why)
                log_event(self._logdir, name, f"integer kernel self-check refused "
                                              f"{[c['form'] for c in kernel['checks'][:-1]]}; acting with "
                                              f"{kernel['form']}", logging.WARNING)
            log_restart(self._logdir, name, attempt, first_version, start)
            buffer = TransitionBuffer(self._insert_batch, self._builder.transition_signature(self._env_spec))
            loop = ActingLoop(env, self._builder.make_sink(self._num_envs), times, update_period=update_period,
                              episode_log=log, clock=lambda: time.monotonic() - t_origin)
            counts = CountReport(self._counter, name, int(start["actor_steps"]))

            def insert(transitions: Sequence[Transition]) -> None:
                counts.steps += self._num_envs
                for batch in buffer.extend(transitions):
                    self._insert(batch)
                    counts.send()

            def pull() -> None:
                client.fetch(apply=update_actor(self._builder, actor))

            t_run = time.monotonic()
            loop.reset()
            try:
                while not self._stop.is_set() and counts.total < self._max_steps:
                    out = loop.step(actor, insert, pull, weights_version=client.version,
                                    total_actor_steps=lambda: counts.total)
                    counts.episodes += len(out.episodes)
            except Exception as e:
                self._flush_after_error(buffer, loop.sink, name, e)
                raise
            self._flush(buffer, loop.sink)
            counts.send()
            elapsed = time.monotonic() - t_run
            steps = loop.steps
            result = {"actor_id": self._id, "attempt": attempt, "actor_steps": steps, "episodes": loop.episodes,
                      "envs_per_actor": self._num_envs, "pinned_core": self.core,
                      "elapsed_s": elapsed, "steps_per_s": steps / elapsed if elapsed > 0 else 0.0,
                      "backend": actor.backend, "weights_version": client.version, "kernel": actor.kernel,
                      "transitions_inserted": self.inserted, "times": times.summary()}
        except _StoppedEarly:
            result = {"actor_id": self._id, "attempt": attempt, "actor_steps": 0, "times": times.summary()}
        finally:
            log.close()
            env.close()
            energy = stop_tracking(tracker)
        return {**result, "first_weights_version": first_version, "payloads_rejected": client.rejected,
                "last_payload_rejection": client.last_rejection, "energy": energy}

    def _insert(self, batch: Transition) -> None:
        """One batched insert, whole: waits while the rate limiter holds actors back, re-checking the stop flag
        every POLL_S; once stopped, the rest goes in past the limiter (the learner that would release it is
        stopping too), so no transition in hand is lost."""
        n = len(batch.reward)
        done = 0
        t0 = time.perf_counter()
        try:
            while done < n:
                part = batch if done == 0 else Transition(*(v[done:] for v in batch))
                k = result_as(int, self._replay.insert(part, None, POLL_S, self._stop.is_set()),
                              "replay.insert")
                done += k
                self.inserted += k
        finally:
            self.times.insert_s += time.perf_counter() - t0

    def _flush_after_error(self, buffer: TransitionBuffer, sink: Sink[Transition], name: str,
                           error: BaseException) -> None:
        """`_flush` on the way out of a failed loop (e.g. the counter is gone but the replay server is not);
        never masks `error`: when the flush fails too, the loss is logged with its size."""
        held = len(buffer) + sink.pending
        try:
            self._flush(buffer, sink)
        except Exception as flush_error:  # pylint: disable=broad-except
            log_event(self._logdir, name, f"stopped by {type(error).__name__}; {held} transitions held by this "
                                          f"actor could not be inserted ({type(flush_error).__name__})",
                      logging.WARNING)

    def _flush(self, buffer: TransitionBuffer, sink: Sink[Transition]) -> None:
        """Inserts everything still held on this side: the buffer's partial batch and every adder's open n-step
        windows (as truncated transitions). Called on every way out of the acting loop."""
        for batch in buffer.extend(sink.flush()):
            self._insert(batch)
        rest = buffer.flush()
        if rest is not None:
            self._insert(rest)
