"""The on-policy acting node (PPO, A2C): the actor's loop every actor runs (`launch.experiments.acting.ActingLoop`)
with the agent's rollout sink, handing out fixed-length rollouts instead of inserting transitions into replay.

Each rollout is a `quarl.replay.items.Rollout` of [T steps x K environments] (with the behaviour log-probs of the
quantized policy that chose the actions) and carries the weights version it was
collected with, so a learner can tell how far behind its own weights the data is (PPO's ratio pi / pi_actor is
the importance weight for exactly that policy). Finished rollouts wait in a small outbox until a learner takes
them (`take`); the actor stops acting while the outbox is full, so on-policy data never piles up. With
`sync=True` (the default, synchronous PPO) the actor then waits for a weights version newer than the one it
collected the rollout with before it acts again, as the single-process runner does.

On continuous tasks the actor samples with the learner's Gaussian log-std, which comes in each weight payload
beside the weights (`BuilderBase.payload_extras`).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Protocol, Sequence, TypedDict, cast

from agents.base import ReplayBuilder
from launch.distributed.clients import CounterClient, ServiceClient
from launch.distributed.nodes.actor import ACTOR_ENV_STREAM, CountReport, first_actor, log_restart, update_actor
from launch.distributed.nodes.base import POLL_S, NodeBase, NodeRecord, counter_totals, csv_logger, energy_tracker
from launch.distributed.nodes.weights_client import PolicyClient
from launch.experiments.acting import EPISODE_FIELDS, ActingLoop
from launch.experiments.agent_spec import AgentSpec, derive_seed
from launch.experiments.stages import StageTimes
from launch.program.graph import NodeHandle, WorkerControl, connect
from quarl.envs.vector import make_vector_environment
from quarl.ops.carbon import stop_tracking
from quarl.quant.precision import Precision, parse_precision
from quarl.replay.items import Rollout

if TYPE_CHECKING:
    from agents.base import OnPolicyActor


class HandedRollout(TypedDict):
    """What `RolloutActorNode.take` hands out: one rollout ([T, K, ...] per field), the weights version that acted
    it, which actor, and the actor's env steps (this process) when it finished."""

    rollout: Rollout
    weights_version: int
    actor_id: int
    actor_steps: int



class RolloutActorClient(ServiceClient, WorkerControl, Protocol):
    """What a rollout learner calls on a `RolloutActorNode` (`launch.program.graph.connect`)."""

    def finished(self) -> bool: ...

    def ready(self, timeout: float = POLL_S) -> bool: ...

    def take(self, timeout: float = POLL_S) -> HandedRollout | None: ...


class RolloutActorNode(NodeBase):
    """One on-policy acting process; see the module docstring. `take(timeout)` hands out the oldest finished
    rollout (a `HandedRollout`; None when none is ready). `precision`: the actors' (a name still parses)."""

    LOG_FIELDS = list(EPISODE_FIELDS)

    def __init__(self, spec: AgentSpec, actor_id: int, num_actors: int, seed: int, precision: Precision, backend: str,
                 counter: NodeHandle, weights: NodeHandle, logdir: str, max_actor_steps: int,
                 envs_per_actor: int = 1, kernel_form: str | None = None, outbox_size: int = 2, sync: bool = True):
        self._spec = spec
        self._builder = spec.builder()
        if isinstance(self._builder, ReplayBuilder):
            raise ValueError(f"--agent {spec.agent} learns from replay: its actors are "
                             "launch.distributed.nodes.actor.ActorNode, not rollout actors")
        self._env_spec = spec.env_spec()
        if int(outbox_size) < 1:
            raise ValueError(f"outbox_size must be >= 1, got {outbox_size!r}")
        self._id, self._num_actors, self._seed = int(actor_id), int(num_actors), int(seed)
        self._precision, self._backend, self._kernel_form = parse_precision(precision), backend, kernel_form
        self._counter, self._weights, self._logdir = connect(counter, CounterClient), weights, logdir
        self._max_steps, self._num_envs = int(max_actor_steps), self._builder.num_envs(int(envs_per_actor))
        self._sync = bool(sync)
        self._outbox: queue.Queue[HandedRollout] = queue.Queue(maxsize=int(outbox_size))
        self._stop = threading.Event()
        self._finished = threading.Event()
        self._handed = threading.Condition()  # notified when a rollout enters the outbox
        self.times = StageTimes()
        self.rollouts = 0  # rollouts handed to the outbox (this process)
        self.outbox_wait_s = 0.0  # handing rollouts out: waiting for room, i.e. for the learner to take one

    def stop(self) -> None:
        self._stop.set()

    def finished(self) -> bool:
        """True once `run()` has returned (its step budget spent, or told to stop) and no rollout is left to take:
        a synchronous learner then stops waiting for this actor."""
        return self._finished.is_set() and self._outbox.empty()

    def ready(self, timeout: float = POLL_S) -> bool:
        """Whether a finished rollout waits in the outbox, waiting up to `timeout` seconds for one: a learner asks
        this before it claims room for the rollout, so waiting on a slow actor holds no room others could use."""
        with self._handed:
            return self._handed.wait_for(lambda: not self._outbox.empty(), max(0.0, float(timeout)))

    def take(self, timeout: float = POLL_S) -> HandedRollout | None:
        """The oldest finished rollout, waiting up to `timeout` seconds for one; None if none came."""
        try:
            return self._outbox.get(timeout=max(0.0, float(timeout)))
        except queue.Empty:
            return None

    def run(self) -> NodeRecord:
        self._finished.clear()
        try:
            return self._run()
        finally:
            self._finished.set()

    def _run(self) -> NodeRecord:
        name = f"actor_{self._id}"
        start = counter_totals(self._counter, **{f"{name}_starts": 1})
        attempt = int(start[f"{name}_starts"])
        t_origin = time.monotonic() - start["wall_clock_s"]
        tracker = energy_tracker(self._logdir, name)
        log = csv_logger(self._logdir, name, self.LOG_FIELDS, "total_actor_steps")
        times = self.times = StageTimes()
        self.outbox_wait_s = 0.0
        client = PolicyClient(self._weights, times, spec=self._builder.policy_spec(self._env_spec),
                              precision=self._precision, logdir=self._logdir, node=name)
        env = make_vector_environment(self._spec.task, derive_seed(self._seed, ACTOR_ENV_STREAM, attempt),
                                      self._num_envs)
        result: NodeRecord = {"actor_id": self._id, "attempt": attempt, "actor_steps": 0}
        first_version = None
        try:
            actor = cast("OnPolicyActor | None", first_actor(
                self._builder, self._env_spec, client, self._stop, seed=self._seed, attempt=attempt,
                actor_id=self._id, num_actors=self._num_actors, num_envs=self._num_envs, backend=self._backend,
                kernel_form=self._kernel_form))  # an on-policy builder's actor (checked in __init__)
            if actor is not None:
                first_version = client.version
                log_restart(self._logdir, name, attempt, first_version, start)
                loop = ActingLoop(env, self._builder.make_sink(self._num_envs), times,
                                  update_period=self._builder.actor_update_period(self._num_envs), episode_log=log,
                                  clock=lambda: time.monotonic() - t_origin)
                counts = CountReport(self._counter, name, int(start["actor_steps"]))
                acted_with = [client.version]

                def insert(rollouts: Sequence[Rollout]) -> None:
                    counts.steps += self._num_envs
                    for rollout in rollouts:
                        self._hand_out({"rollout": rollout, "weights_version": acted_with[0], "actor_id": self._id,
                                        "actor_steps": loop.steps})
                        counts.send()

                apply = update_actor(self._builder, actor)

                def pull() -> None:  # at every rollout's end; synchronous: until newer weights came
                    while (client.fetch(apply=apply, wait_s=POLL_S if self._sync else 0.0) is None and self._sync
                           and not self._stop.is_set()):
                        pass
                    acted_with[0] = client.version

                t_run = time.monotonic()
                loop.reset()
                while not self._stop.is_set() and counts.total < self._max_steps:
                    out = loop.step(actor, insert, pull, weights_version=client.version,
                                    total_actor_steps=lambda: counts.total)
                    counts.episodes += len(out.episodes)
                loop.sink.flush()  # a partial rollout: acted and counted, but no learner takes part of one
                counts.send()
                elapsed = time.monotonic() - t_run
                result.update(actor_steps=loop.steps, episodes=loop.episodes, envs_per_actor=self._num_envs,
                              elapsed_s=elapsed, steps_per_s=loop.steps / elapsed if elapsed > 0 else 0.0,
                              backend=actor.backend, kernel=actor.kernel, weights_version=client.version,
                              rollouts=self.rollouts)
        finally:
            log.close()
            env.close()
            energy = stop_tracking(tracker)
        return {**result, "times": times.summary(), "first_weights_version": first_version,
                "learner_wait_s": client.waited_s + self.outbox_wait_s, "payloads_rejected": client.rejected,
                "last_payload_rejection": client.last_rejection, "energy": energy}

    def _hand_out(self, item: HandedRollout) -> None:
        """Puts a finished rollout in the outbox, waiting while it is full (re-checking the stop flag every
        POLL_S); a stopping actor still leaves it there, for a learner to take, if there is room. The time is
        waiting for the learner (`outbox_wait_s`; the put itself is a queue append), not filling the rollout."""
        t0 = time.perf_counter()
        try:
            while True:
                try:
                    self._outbox.put(item, timeout=POLL_S)
                    self.rollouts += 1
                    with self._handed:
                        self._handed.notify_all()
                    return
                except queue.Full:
                    if self._stop.is_set():
                        return
        finally:
            self.outbox_wait_s += time.perf_counter() - t0
