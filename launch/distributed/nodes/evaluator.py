"""The evaluator node: greedy episodes with the deployed (quantized) policy."""
from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Mapping

import dm_env

from launch.distributed.nodes.base import POLL_S, NodeBase, NodeRecord, counter_totals, csv_logger, energy_tracker
from launch.distributed.nodes.weights_client import PolicyClient
from launch.experiments.acting import EVAL_FIELDS, EvalRow, crossed, evaluation_returns, evaluation_row
from launch.experiments.agent_spec import AgentSpec, derive_seed
from launch.experiments.config import executor_factory
from launch.experiments.stages import StageTimes
from launch.distributed.clients import CounterClient, LearnerClient
from launch.program.graph import NodeHandle, connect
from quarl.acting.evaluation import EpisodeInterrupted
from quarl.envs.factory import make_environment
from quarl.ops.carbon import stop_tracking
from quarl.ops.logs import Logger
from quarl.quant.payload import Payload
from quarl.quant.precision import Precision, parse_precision

if TYPE_CHECKING:
    from agents.base import Actor

EVAL_ENV_STREAM = 11
KEPT_PAYLOADS = 4  # evaluated versions kept for a final evaluation of the solving one (a streak needs its last)


class Evaluator(NodeBase):
    """Greedy episodes with the deployed (quantized) policy, every `eval_every` actor steps and at the end.
    `precision`: the actors' (a name still parses). With a `learner` handle, every version evaluated is pinned
    there (`LearnerNode.pin`), so that a run its evaluations solved can end on that very policy: `stop(True,
    version)` evaluates that version once more, where a plain final evaluation takes the newest weights."""

    LOG_FIELDS = list(EVAL_FIELDS)

    def __init__(self, spec: AgentSpec, seed: int, precision: Precision, backend: str, weights: NodeHandle,
                 counter: NodeHandle, logdir: str, eval_every: int, episodes: int, kernel_form: str | None = None,
                 learner: NodeHandle | None = None):
        self._spec = spec
        self._seed = int(seed)
        self._precision, self._backend = parse_precision(precision), backend
        self._kernel_form = kernel_form  # ONNX integer kernel form pinned by the config (None: the CPU's choice)
        self._weights, self._counter = weights, connect(counter, CounterClient)  # weights: the PolicyClient's
        self._learner = None if learner is None else connect(learner, LearnerClient)
        self._logdir = logdir
        self._eval_every = int(eval_every)
        self._episodes = int(episodes)
        self._stop = threading.Event()
        self._final = threading.Event()
        self._builder = spec.builder()
        self._env_spec = spec.env_spec()
        self._results: list[EvalRow] = []
        self._evaluated: collections.OrderedDict[int, Payload] = collections.OrderedDict()
        self._final_version: int | None = None

    def stop(self, final_eval: bool = False, version: int | None = None) -> None:
        """Ends `run()`; with `final_eval`, after one last evaluation of the newest weights, or of weights `version`
        (one this evaluator evaluated: the run's solving version) when given."""
        self._final_version = None if version is None else int(version)
        if final_eval:
            self._final.set()
        self._stop.set()

    def results(self) -> list[EvalRow]:
        return list(self._results)

    def run(self) -> NodeRecord:
        tracker = energy_tracker(self._logdir, "evaluator")
        log = csv_logger(self._logdir, "evaluator", self.LOG_FIELDS, "actor_steps")
        times = StageTimes()
        client = PolicyClient(self._weights, times, spec=self._builder.policy_spec(self._env_spec),
                               precision=self._precision, logdir=self._logdir,
                               node="evaluator")
        env = make_environment(self._spec.task, derive_seed(self._seed, EVAL_ENV_STREAM))
        actor: Actor | None = None
        try:
            last = int(counter_totals(self._counter)["actor_steps"])  # a resumed run continues its cadence
            while not self._stop.is_set():
                totals = counter_totals(self._counter)
                if not crossed(last, int(totals["actor_steps"]), self._eval_every):
                    self._stop.wait(POLL_S)
                    continue
                actor = self._evaluate(client, actor, env, totals, log, final=False)
                last = int(totals["actor_steps"])
            if self._final.is_set():
                actor = self._evaluate(client, actor, env, counter_totals(self._counter), log, final=True)
        finally:
            log.close()
            env.close()
            energy = stop_tracking(tracker)
        final = self._results[-1] if self._results else None
        return {"evaluations": len(self._results), "final": final, "energy": energy}

    def _evaluate(self, client: PolicyClient, actor: Actor | None, env: dm_env.Environment,
                  totals: Mapping[str, float], log: Logger, final: bool) -> Actor | None:
        def apply(payload: Payload) -> None:
            nonlocal actor
            if actor is None:
                actor = self._builder.make_actor(self._env_spec, payload.params, seed=self._seed, actor_id=0,
                                                 evaluation=True, backend=self._backend,
                                                 executor_factory=executor_factory(self._kernel_form))
            else:
                actor.update(payload.params)

        version = self._final_version if final else None
        if version is not None and version in self._evaluated:
            if version != client.version:  # a later evaluation moved on: back to the solving version
                apply(self._evaluated[version])
        else:
            version = None
            payload = client.fetch(apply=apply)
            if payload is not None:
                self._keep(payload)
        if actor is None:
            return None
        stop = None if final else self._stop.is_set
        try:
            returns = evaluation_returns(actor, env, self._episodes, should_stop=stop)
        except EpisodeInterrupted:
            return actor
        # Evaluating here costs the learner and the actors nothing: the training clock is the wall clock.
        clock = float(totals["wall_clock_s"])
        row = evaluation_row(returns, actor_steps=int(totals["actor_steps"]), learner_steps=int(totals["learner_steps"]),
                             wall_clock_s=clock, train_clock_s=clock,
                             weights_version=client.version if version is None else version)
        log.write(row)
        self._results.append(row)
        return actor

    def _keep(self, payload: Payload) -> None:
        """Keeps an evaluated version's payload here and its fp32 snapshot at the learner (best effort: a learner
        that cannot pin it ends a solved run on its newest weights and says so)."""
        self._evaluated[payload.version] = payload
        while len(self._evaluated) > KEPT_PAYLOADS:
            self._evaluated.popitem(last=False)
        if self._learner is not None:
            try:
                self._learner.pin(payload.version)
            except Exception:  # pylint: disable=broad-except
                pass  # a lost learner ends the run by itself
