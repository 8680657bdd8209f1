"""The evaluator node: greedy episodes with the deployed (quantized) policy."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Mapping

import dm_env

from launch.distributed.nodes.base import POLL_S, NodeBase, csv_logger, energy_tracker
from launch.distributed.nodes.weights_client import PolicyClient
from launch.experiments.acting import EVAL_FIELDS, crossed, evaluation_returns, evaluation_row
from launch.experiments.agent_spec import AgentSpec, derive_seed
from launch.experiments.config import executor_factory
from launch.experiments.stages import StageTimes
from launch.program.graph import NodeHandle
from quarl.acting.evaluation import EpisodeInterrupted
from quarl.envs.factory import make_environment
from quarl.ops.carbon import stop_tracking
from quarl.ops.logs import Logger
from quarl.quant.payload import Payload
from quarl.quant.precision import Precision, parse_precision

if TYPE_CHECKING:
    from agents.base import Actor

EVAL_ENV_STREAM = 11


class Evaluator(NodeBase):
    """Greedy episodes with the deployed (quantized) policy, every `eval_every` actor steps and at the end.
    `precision`: the actors' (a name still parses)."""

    LOG_FIELDS = list(EVAL_FIELDS)

    def __init__(self, spec: AgentSpec, seed: int, precision: Precision, backend: str, weights: NodeHandle,
                 counter: NodeHandle, logdir: str, eval_every: int, episodes: int, kernel_form: str | None = None):
        self._spec = spec
        self._seed = int(seed)
        self._precision, self._backend = parse_precision(precision), backend
        self._kernel_form = kernel_form  # ONNX integer kernel form pinned by the config (None: the CPU's choice)
        self._weights, self._counter = weights, counter
        self._logdir = logdir
        self._eval_every = int(eval_every)
        self._episodes = int(episodes)
        self._stop = threading.Event()
        self._final = threading.Event()
        self._builder = spec.builder()
        self._env_spec = spec.env_spec()
        self._results: list[dict[str, Any]] = []

    def stop(self, final_eval: bool = False) -> None:
        """Ends `run()`; with `final_eval`, after one last evaluation of the newest weights."""
        if final_eval:
            self._final.set()
        self._stop.set()

    def results(self) -> list[dict[str, Any]]:
        return list(self._results)

    def run(self) -> dict[str, Any]:
        tracker = energy_tracker(self._logdir, "evaluator")
        log = csv_logger(self._logdir, "evaluator", self.LOG_FIELDS, "actor_steps")
        times = StageTimes()
        client = PolicyClient(self._weights, times, spec=self._builder.policy_spec(self._env_spec),
                               precision=self._precision, logdir=self._logdir,
                               node="evaluator")
        env = make_environment(self._spec.task, derive_seed(self._seed, EVAL_ENV_STREAM))
        actor: Actor | None = None
        try:
            last = int(self._counter.call("get")["actor_steps"])  # a resumed run continues its cadence
            while not self._stop.is_set():
                totals = self._counter.call("get")
                if not crossed(last, int(totals["actor_steps"]), self._eval_every):
                    self._stop.wait(POLL_S)
                    continue
                actor = self._evaluate(client, actor, env, totals, log, final=False)
                last = int(totals["actor_steps"])
            if self._final.is_set():
                actor = self._evaluate(client, actor, env, self._counter.call("get"), log, final=True)
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

        client.fetch(apply=apply)
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
                             wall_clock_s=clock, train_clock_s=clock, weights_version=client.version)
        log.write(row)
        self._results.append(row)
        return actor
