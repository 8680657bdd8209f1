"""Single-process ActorQ run (Acme's `run_experiment`) of every agent: one actor's loop, one learner, and the
agent's learning side (`launch.experiments.feeds`: an in-memory replay table, or rollouts straight into an
on-policy learner).

It runs the same pieces, in the same order, as the distributed runner, just in one thread, in steps that each do
one thing: the agent and its environments, the weight channel and the actors (`launch.experiments.run_parts`:
the actor only ever sees weights that went through quantization and the wire format), the feed
(`launch.experiments.feeds`), the actor's loop (`act`) with its evaluations (`Evaluations`), and the end
(`launch.experiments.run_end`: the policies and summary.json). The actor acts through
`launch.experiments.acting.ActingLoop` with its builder's sink, as a distributed actor does. With replay, acting
and learning are interleaved under the table's samples-per-insert rate limiter: after every env step the learner
takes as many steps as the limiter allows (never blocking). On-policy, each rollout of T steps of the K
environments is one learner update, after which the actor takes the new weights.
"""
from __future__ import annotations

import contextlib
import functools
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, TypedDict

import numpy as np

from analysis.schema import solved_at
from launch.experiments.acting import (
    EPISODE_FIELDS, EVAL_FIELDS, ActingLoop, EvalRow, crossed, evaluation_returns, evaluation_row,
)
from launch.experiments.config import ExperimentConfig
from launch.experiments.feeds import ReplayFeed, RolloutFeed, make_feed
from launch.experiments.progress import StepProgress
from launch.experiments.run_end import RunRecord, finish_run, save_best_policy
from launch.experiments.run_parts import Actors, Agent, build_agent, make_actors
from launch.experiments.stages import StageTimes
from launch.experiments.summary import Summary
from quarl.acting.evaluation import EpisodeInterrupted
from quarl.ops.carbon import start_tracking, stop_tracking
from quarl.ops.logs import CSVLogger

if TYPE_CHECKING:
    from agents.base import BuilderBase


class RunOptions(TypedDict, total=False):
    """How this process runs an experiment (`run_experiment`'s keyword arguments), not part of it."""

    progress: bool
    energy: bool
    sync_learner: bool
    on_eval: Callable[[EvalRow], bool | None] | None
    on_builder: Callable[["BuilderBase"], None] | None
    should_stop: Callable[[], bool] | None


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator["StepProgress"]:
    """A bar on a terminal, plain lines every few seconds in a log (`launch.experiments.progress.StepProgress`)."""
    bar = StepProgress(total, enabled)
    try:
        yield bar
    finally:
        bar.close()


def run_experiment(config: ExperimentConfig, *, progress: bool = True, energy: bool = True,
                   sync_learner: bool = False, on_eval: Callable[[EvalRow], bool | None] | None = None,
                   on_builder: Callable[["BuilderBase"], None] | None = None,
                   should_stop: Callable[[], bool] | None = None) -> Summary:
    """Trains `config`'s agent, whatever it is, on its task for `config.max_actor_steps` env steps (an
    on-policy agent's rounded up to whole rollouts); returns (and writes) the summary, with the whole config
    under "experiment". `config.distributed` (ExperimentConfig) is ignored here (one actor, no Ray, no
    checkpoints).

    Evaluations every `config.eval_every` actor steps run greedily at the deployed precision (plus fp32 with
    `eval_fp32`); a final one always runs. The run ends early once `target_streak` evaluations in a row reach
    `target_return`, or when `on_eval(row)` (it sees every evaluator row) returns True, or as soon as
    `should_stop()` is true (a signal: `launch.experiments.stopping`), then with status "interrupted", no final
    evaluation, and the logs, final policy and summary.json written as at any end.
    The keyword arguments are how this process runs the experiment, not part of it: `progress` (a bar),
    `energy` (the energy tracker), `on_builder(builder)` (sees the builder before anything is made from it:
    benchmarks wrap its factories to keep a handle on the learner). A replay agent's updates are dispatched
    asynchronously (JAX), so their compute overlaps acting and part of it shows up in the stage that next waits
    on the device (usually `quantize_encode_s`); `sync_learner=True` waits for every update so each stage's
    time is its own, at some cost in throughput. An on-policy update is always waited for where it is timed (the
    next rollout needs its weights, so nothing overlaps it): its `learner.step_s` is the update's work.
    The actor steps K environments (`envs_per_actor`, or an on-policy agent's `num_envs`) and runs its policy
    once per step on the batch of K observations (`quarl.acting.loop`); every count (steps, evaluation and
    update periods) is in env steps, so one loop iteration advances them by K.
    Writes evaluator.csv, learner.csv, actor.csv, summary.json and the final fp32 policy
    (policy_fp32.qrlp + .json, see `quarl.quant.policy_io`) under `config.logdir`.
    """
    launched = time.perf_counter()  # summary.json's wall_clock_s counts building the run too; its run clock does not
    agent = build_agent(config, on_builder)
    logdir = Path(config.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    times = StageTimes()  # the actor's stages, as a distributed actor times them (`launch.experiments.stages`)
    clock = {"sample_s": 0.0, "learner_s": 0.0, "evaluation_s": 0.0}  # the learner's and the evaluator's share
    actors = make_actors(config, agent, times)
    logs = {"evaluator": CSVLogger(logdir / "evaluator.csv", EVAL_FIELDS), "learner": CSVLogger(logdir / "learner.csv"),
            "actor": CSVLogger(logdir / "actor.csv", EPISODE_FIELDS)}
    tracker = start_tracking(logdir, "run") if energy else None
    start = time.perf_counter()
    loop = ActingLoop(agent.env, agent.builder.make_sink(agent.num_envs), times, update_period=agent.update_period,
                      episode_log=logs["actor"], clock=lambda: time.perf_counter() - start)
    feed = make_feed(agent.builder, agent.env_spec, agent.learner, seed=config.seed, times=times, clock=clock,
                     log=logs["learner"], steps=lambda: loop.steps, start=start, sync_learner=sync_learner)
    stopping = should_stop if should_stop is not None else (lambda: False)
    evaluations = Evaluations(config, agent, actors, logs["evaluator"], clock, start=start, on_eval=on_eval,
                              should_stop=stopping)
    try:
        status = act(loop, agent, actors, feed, evaluations, eval_every=int(config.eval_every),
                     max_actor_steps=config.max_actor_steps, progress=progress, should_stop=stopping)
        feed.finish()
    finally:
        for log in logs.values():
            log.close()
        energy_result = stop_tracking(tracker)
        loop.close()
        agent.eval_env.close()
    record = RunRecord(status, evaluations.rows, evaluations.best_file, loop.episodes, feed.info(), energy_result,
                       (launched, start), clock, sync_learner)
    return finish_run(config, agent, actors, record)


class Evaluations:
    """The run's evaluations: greedy episodes of the evaluation actor on the learner's newest weights (and of the
    fp32 actor with `eval_fp32`), one evaluator.csv row each, the best policy so far kept beside the final one
    (a QAT or DQN run can peak early and end lower), and whether the run should stop after one: the target
    reached `target_streak` times in a row, `on_eval(row)` true, or a stop requested mid-evaluation."""

    def __init__(self, config: ExperimentConfig, agent: Agent, actors: Actors, log: CSVLogger,
                 clock: dict[str, float], *, start: float, on_eval: Callable[[EvalRow], bool | None] | None,
                 should_stop: Callable[[], bool]):
        self._episodes, self._target = config.eval_episodes, (config.target_return, config.target_streak)
        self._save_best = functools.partial(save_best_policy, config, agent.spec, agent.learner)
        self._learner, self._env, self._actors = agent.learner, agent.eval_env, actors
        self._log, self._clock, self._start = log, clock, start
        self._on_eval, self._should_stop = on_eval, should_stop
        self.rows: list[EvalRow] = []
        self.best_file: str | None = None
        self._best_return = -math.inf

    def run(self, actor_steps: int) -> bool:
        """One evaluation at `actor_steps`; whether the run should stop."""
        t = time.perf_counter()
        try:
            returns, fp32_return = self._returns()
        except EpisodeInterrupted:  # stopped mid-evaluation: no row for it
            self._clock["evaluation_s"] += time.perf_counter() - t
            return True
        # Clocks at the start of this evaluation; train_clock_s leaves out all evaluation time.
        since_start = t - self._start
        row = evaluation_row(returns, actor_steps=actor_steps, learner_steps=self._learner.steps,
                             wall_clock_s=since_start, train_clock_s=since_start - self._clock["evaluation_s"],
                             weights_version=self._actors.channel.version, return_fp32=fp32_return)
        self._log.write(row)
        self.rows.append(row)
        if row["return"] > self._best_return:
            self.best_file, self._best_return = self._save_best(row), row["return"]
        self._clock["evaluation_s"] += time.perf_counter() - t
        solved = solved_at(self.rows, *self._target) is not None
        stop = bool(self._on_eval(row)) if self._on_eval is not None else False
        return stop or solved

    def _returns(self) -> tuple[list[float], float | None]:
        """The evaluation actor's episode returns and the fp32 actor's mean (None without one)."""
        actors, env, episodes = self._actors, self._env, self._episodes
        actors.eval_actor.update(actors.channel.pull(count=False))
        returns = evaluation_returns(actors.eval_actor, env, episodes, should_stop=self._should_stop)
        if actors.fp32_actor is None:
            return returns, None
        actors.fp32_actor.update(actors.fp32_channel.pull())
        return returns, float(np.mean(evaluation_returns(actors.fp32_actor, env, episodes,
                                                         should_stop=self._should_stop)))


def act(loop: ActingLoop, agent: Agent, actors: Actors, feed: ReplayFeed | RolloutFeed, evaluations: Evaluations, *,
        eval_every: int, max_actor_steps: int, progress: bool, should_stop: Callable[[], bool]) -> str:
    """The acting loop: the actor steps its environments and pulls weights at its period, the learner learns as
    the feed allows, and once the learner is ready an evaluation runs every `eval_every` env steps and at
    `max_actor_steps`; returns the run's status ("interrupted" when `should_stop()` ended it)."""
    learner, run_steps = agent.learner, agent.run_steps
    loop.reset()
    step = evaluated_to = 0  # evaluated_to: the step of the last point where the learner was ready

    def pull() -> None:
        actors.pull(feed.on_pull)

    with _progress(run_steps, progress) as bar:
        while step < run_steps:
            if should_stop():
                return "interrupted"
            prev = step
            loop.step(actors.actor, feed.insert, pull, weights_version=actors.acting_version)
            step = loop.steps
            feed.learn()
            stop = False
            if feed.ready():
                if crossed(evaluated_to, step, eval_every) or step >= max_actor_steps:
                    stop = evaluations.run(step)
                    if evaluations.rows:
                        bar.set_postfix(eval_return=f"{evaluations.rows[-1]['return']:.1f}",
                                        learner_steps=learner.steps, refresh=False)
                evaluated_to = step
            if crossed(prev, step, 100) or step >= run_steps or stop:
                bar.update(min(step, run_steps) - bar.n, learner_steps=learner.steps)
            if stop:
                return "interrupted" if should_stop() else "completed"
    return "completed"
