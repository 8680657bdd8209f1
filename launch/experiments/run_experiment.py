"""Single-process ActorQ run (Acme's `run_experiment`) of every agent: one acting loop, one learner, and the
agent's learning side (`launch.experiments.feeds`: an in-memory replay table, or rollouts straight into an
on-policy learner).

It runs the same pieces, in the same order, as the distributed runner, just in one thread: the actor only ever
sees weights that went learner.policy_params() -> quantize_for_actors(precision) -> encode_payload -> bytes ->
decode_payload -> actor.update, so quantization and the wire format are exercised on every pull, and each stage
is timed. The actor acts through `launch.experiments.acting.ActingLoop` with its builder's sink, as a distributed
actor does. With replay, acting and learning are interleaved under the table's samples-per-insert rate limiter:
after every env step the learner takes as many steps as the limiter allows (never blocking). On-policy, each
rollout of T steps of the K environments is one learner update, after which the actor takes the new weights.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, TypedDict

import numpy as np

from agents.base import ReplayBuilder
from agents.loops import loop_form_record, use_loop_form
from analysis.schema import solved_at, sum_energy
from launch.experiments.acting import (
    EPISODE_FIELDS, EVAL_FIELDS, ActingLoop, EvalRow, crossed, evaluation_returns, evaluation_row,
)
from launch.experiments.config import ExperimentConfig
from launch.experiments.feeds import make_feed
from launch.experiments.stages import StageTimes, runtime_section
from launch.experiments.summary import Summary, build_summary, final_policy_record
from launch.program.devices import device_report, use_learner_device
from quarl.acting.evaluation import EpisodeInterrupted
from quarl.envs.factory import make_environment
from quarl.envs.spec import environment_spec
from quarl.envs.vector import make_vector_environment
from quarl.ops.carbon import start_tracking, stop_tracking
from quarl.ops.io import JSONValue, jsonable, write_json_atomic
from quarl.ops.logs import CSVLogger
from quarl.policy.spec import PolicySpec
from quarl.quant.calibration import learner_observations, quantize_for_actors
from quarl.quant.payload import decode_payload, encode_payload, fp32_payload_nbytes
from quarl.quant.precision import Precision, parse_precision
from quarl.quant.quantization import QuantizedParams
from quarl.runtimes.policy_io import save_policy

if TYPE_CHECKING:
    from agents import AgentConfig
    from agents.base import Actor, BuilderBase, Learner
    from launch.experiments.progress import StepProgress

EVAL_SEED_OFFSET = 10_000  # evaluation episodes come from their own env instance and seed
FP32 = parse_precision("fp32")  # the --eval-fp32 actor's


class RunOptions(TypedDict, total=False):
    """How this process runs an experiment (`run_experiment`'s keyword arguments), not part of it."""

    progress: bool
    energy: bool
    sync_learner: bool
    on_eval: Callable[[EvalRow], bool | None] | None
    on_builder: Callable[["BuilderBase"], None] | None
    should_stop: Callable[[], bool] | None


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


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator["StepProgress"]:
    """A bar on a terminal, plain lines every few seconds in a log (`launch.experiments.progress.StepProgress`)."""
    from launch.experiments.progress import StepProgress  # pylint: disable=import-outside-toplevel
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
    (policy_fp32.qrlp + .json, see `quarl.runtimes.policy_io`) under `config.logdir`.
    """
    launched = time.perf_counter()  # summary.json's wall_clock_s counts building the run too; its run clock does not
    use_learner_device(config.learner_device)  # one process: the learner's device is the process's
    use_loop_form(config.learner_loop)  # before the learner is built: read when its update is traced
    builder = config.builder()
    if on_builder is not None:
        on_builder(builder)
    task, prec, seed = config.task, config.precision, config.seed
    max_actor_steps, eval_every, eval_episodes = config.max_actor_steps, int(config.eval_every), config.eval_episodes
    backend = config.backend
    agent_config = builder.config
    num_envs = builder.num_envs(config.envs_per_actor)
    update_period = builder.actor_update_period(num_envs)
    run_steps = builder.run_steps(max_actor_steps, num_envs)  # whole rollouts for an on-policy agent

    env = make_vector_environment(task, seed, num_envs)
    eval_env = make_environment(task, seed + EVAL_SEED_OFFSET)
    env_spec = environment_spec(env)
    spec = builder.policy_spec(env_spec)
    learner = builder.make_learner(env_spec, seed, max_actor_steps=max_actor_steps, num_envs=num_envs)

    logdir = Path(config.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    times = StageTimes()  # the actor's stages, as a distributed actor times them (`launch.experiments.stages`)
    clock = {"sample_s": 0.0, "learner_s": 0.0, "evaluation_s": 0.0}  # the learner's and the evaluator's share
    channel = WeightChannel(learner, spec, prec, times)
    qparams = channel.pull(count=False)
    t0 = time.perf_counter()
    pinned = config.executor_factory()  # make_executor with the config's kernel form, or None
    actor = builder.make_actor(env_spec, qparams, seed=seed, actor_id=0, evaluation=False, backend=backend,
                               batch_size=num_envs, executor_factory=pinned)
    actor_build_s = time.perf_counter() - t0  # includes `auto` measuring backends; not an update
    eval_actor = builder.make_actor(env_spec, qparams, seed=seed + 1, actor_id=0, evaluation=True,
                                    backend=backend, executor_factory=pinned)
    fp32_channel = WeightChannel(learner, spec, FP32, StageTimes())
    fp32_actor = None
    if config.eval_fp32 and prec != FP32:
        fp32_actor = builder.make_actor(env_spec, fp32_channel.pull(), seed=seed + 2, actor_id=0,
                                        evaluation=True, backend=backend, executor_factory=pinned)

    evaluator_log = CSVLogger(logdir / "evaluator.csv", EVAL_FIELDS)
    learner_log = CSVLogger(logdir / "learner.csv")
    actor_log = CSVLogger(logdir / "actor.csv", EPISODE_FIELDS)
    tracker = start_tracking(logdir, "run") if energy else None
    evals: list[EvalRow] = []
    start = time.perf_counter()
    loop = ActingLoop(env, builder.make_sink(num_envs), times, update_period=update_period, episode_log=actor_log,
                      clock=lambda: time.perf_counter() - start)
    feed = make_feed(builder, env_spec, learner, seed=seed, times=times, clock=clock, log=learner_log,
                     steps=lambda: loop.steps, start=start, sync_learner=sync_learner)
    acting_version = [channel.version]  # the weights the actor acts with (an evaluation pulls newer ones)
    stopping = should_stop if should_stop is not None else (lambda: False)

    best_file: str | None = None
    best_return = -math.inf

    def keep_best(row: EvalRow) -> None:
        """The policy of the best evaluation so far, beside the final one (a QAT or DQN run can peak early and
        end lower): policy_best_<precision>.qrlp, fp32 weights as `launch.ptq` reads them."""
        nonlocal best_file, best_return
        if row["return"] > best_return:
            best_file, best_return = save_best_policy(config, spec, learner, row), row["return"]

    def run_evaluation(actor_steps: int) -> bool:
        t = time.perf_counter()
        try:
            eval_actor.update(channel.pull(count=False))
            returns = evaluation_returns(eval_actor, eval_env, eval_episodes, should_stop=stopping)
            fp32_return = None
            if fp32_actor is not None:
                fp32_actor.update(fp32_channel.pull())
                fp32_return = float(np.mean(evaluation_returns(fp32_actor, eval_env, eval_episodes,
                                                               should_stop=stopping)))
        except EpisodeInterrupted:  # stopped mid-evaluation: no row for it
            clock["evaluation_s"] += time.perf_counter() - t
            return True
        # Clocks at the start of this evaluation; train_clock_s leaves out all evaluation time.
        row = evaluation_row(returns, actor_steps=actor_steps, learner_steps=learner.steps,
                             wall_clock_s=t - start, train_clock_s=t - start - clock["evaluation_s"],
                             weights_version=channel.version, return_fp32=fp32_return)
        evaluator_log.write(row)
        evals.append(row)
        keep_best(row)
        clock["evaluation_s"] += time.perf_counter() - t
        solved = solved_at(evals, config.target_return, config.target_streak) is not None
        stop = bool(on_eval(row)) if on_eval is not None else False
        return stop or solved

    def pull() -> None:
        qp = channel.pull()
        t = time.perf_counter()
        actor.update(qp)
        feed.on_pull((actor, eval_actor, fp32_actor))
        times.load_s += time.perf_counter() - t
        acting_version[0] = channel.version
        times.updates += 1
        times.pulls += 1

    loop.reset()
    step = evaluated_to = 0  # evaluated_to: the step of the last point where the learner was ready
    status = "completed"
    try:
        with _progress(run_steps, progress) as bar:
            while step < run_steps:
                if stopping():
                    status = "interrupted"
                    break
                prev = step
                loop.step(actor, feed.insert, pull, weights_version=acting_version[0])
                step = loop.steps
                feed.learn()
                stop = False
                if feed.ready():
                    if crossed(evaluated_to, step, eval_every) or step >= max_actor_steps:
                        stop = run_evaluation(step)
                        if evals:
                            bar.set_postfix(eval_return=f"{evals[-1]['return']:.1f}", learner_steps=learner.steps,
                                            refresh=False)
                    evaluated_to = step
                if crossed(prev, step, 100) or step >= run_steps or stop:
                    bar.update(min(step, run_steps) - bar.n, learner_steps=learner.steps)
                if stop:
                    if stopping():
                        status = "interrupted"
                    break
        feed.finish()
    finally:
        for log in (evaluator_log, learner_log, actor_log):
            log.close()
        energy_result = stop_tracking(tracker)
        loop.close()
        eval_env.close()

    return finish_run(config, spec, learner, channel, evals, (launched, start), times, clock,
                      actor=actor, actor_build_s=actor_build_s, episodes=loop.episodes, table_info=feed.info(),
                      energy_result=energy_result, best_policy_file=best_file,
                      sync_learner=sync_learner, update_period=update_period, agent_config=agent_config,
                      status=status, num_envs=num_envs,
                      # On-policy, the actor stands still while the learner updates on its rollout.
                      learner_wait_s=None if isinstance(builder, ReplayBuilder) else clock["learner_s"])


def save_best_policy(config: ExperimentConfig, spec: PolicySpec, learner: "Learner", row: EvalRow) -> str:
    """The policy of the best evaluation so far, beside the final one (a QAT or DQN run can peak early and end
    lower): policy_best_<precision>.qrlp, fp32 weights as `launch.ptq` reads them; returns the file name."""
    path = save_policy(Path(config.logdir) / f"policy_best_{config.precision}.qrlp", spec, learner.policy_params(),
                       task=config.task, agent=config.agent, steps=int(learner.steps),
                       extra={"seed": config.seed, "evaluated_at": config.precision.name, "eval_return": row["return"],
                              "actor_steps": row["actor_steps"]})
    return path.name


def save_final_policy(config: ExperimentConfig, spec: PolicySpec, learner: "Learner", channel: WeightChannel,
                      evals: list[EvalRow]) -> tuple[int, str]:
    """Writes the trained fp32 policy into the run folder, for offline analysis (`python -m launch.ptq
    --checkpoint LOGDIR`); returns its fp32 payload size and its file name."""
    final_params = learner.policy_params()  # one device-to-host copy, for the fp32 size and the saved policy
    fp32_bytes = fp32_payload_nbytes(final_params, version=max(channel.version, 0), spec_hash=spec.digest())
    path = save_policy(config.logdir, spec, final_params, task=config.task, agent=config.agent,
                       steps=int(learner.steps), extra={"seed": config.seed, "precision": config.precision.name,
                                                        "final_eval_return": evals[-1]["return"] if evals else None})
    return fp32_bytes, path.name


def finish_run(config: ExperimentConfig, spec: PolicySpec, learner: "Learner", channel: WeightChannel,
               evals: list[EvalRow], started: tuple[float, float], times: StageTimes, clock: dict[str, float], *,
               actor: "Actor", actor_build_s: float, episodes: int, table_info: dict[str, JSONValue],
               energy_result: dict[str, JSONValue] | None, best_policy_file: str | None, sync_learner: bool,
               update_period: int, agent_config: "AgentConfig", status: str = "completed",
               num_envs: int = 1, learner_wait_s: float | None = None) -> Summary:
    """Ends a single-process run the one way every agent's run ends, whether it completed or was stopped
    (`status` "interrupted"): saves the final policy, writes summary.json atomically (with where the learner
    ran) and returns the summary. `started`: the `time.perf_counter()` readings when the launcher began building
    the run and when the run began (the origins of summary.json's wall_clock_s and run_wall_clock_s)."""
    wall = time.perf_counter() - started[1]  # the run clock stops here; the launcher's also counts the saving
    fp32_bytes, policy_file = save_final_policy(config, spec, learner, channel, evals)
    launcher_wall = time.perf_counter() - started[0]
    summary = _summary(config, (launcher_wall, wall), times, clock, channel=channel, fp32_bytes=fp32_bytes,
                       actor=actor, actor_build_s=actor_build_s, episodes=episodes, learner=learner, evals=evals,
                       table_info=table_info, energy_result=energy_result, policy_file=policy_file,
                       best_policy_file=best_policy_file, sync_learner=sync_learner, update_period=update_period,
                       agent_config=jsonable(dataclasses.asdict(agent_config)), status=status, num_envs=num_envs,
                       learner_wait_s=learner_wait_s)
    summary["learner_device"] = device_report()
    write_json_atomic(Path(config.logdir) / "summary.json", summary)
    return summary


def _summary(run: ExperimentConfig, clocks: tuple[float, float], times: StageTimes, clock: dict[str, float], *,
             channel: WeightChannel, fp32_bytes: int, actor: "Actor", actor_build_s: float, episodes: int,
             learner: "Learner", evals: list[EvalRow], table_info: dict[str, JSONValue],
             energy_result: dict[str, JSONValue] | None, policy_file: str, best_policy_file: str | None,
             sync_learner: bool, update_period: int, agent_config: dict[str, JSONValue], status: str, num_envs: int,
             learner_wait_s: float | None) -> Summary:
    """This run in summary.json's one layout (`launch.experiments.summary.build_summary`): one actor, one learner, and a
    weight channel that publishes one version per update, all in this process. `clocks`: (the launcher's wall
    clock, the run clock)."""
    launcher_wall, wall = clocks
    steps, updates = int(learner.steps), times.updates
    publish = {"versions": updates, "quantize_encode_s": times.quantize_encode_s, "put_s": None,
               "payload_bytes": channel.payload_bytes,
               "quantize_encode_ms_per_version": 1e3 * times.quantize_encode_s / updates if updates else None,
               "put_ms_per_version": None}  # no weight server to put the bytes on
    payload = {"precision": run.precision.name, "bytes": channel.payload_bytes, "fp32_bytes": fp32_bytes,
               "compression": round(fp32_bytes / max(1, channel.payload_bytes), 3), **publish,
               "published": updates, "requests": updates, "payloads_served": updates, "not_modified": 0}
    del payload["payload_bytes"]
    actor_entry = {"actor_id": 0, "attempt": 1, "starts": 1, "actor_steps": times.env_steps,
                   "total_steps": times.env_steps, "episodes": episodes, "envs_per_actor": num_envs,
                   "elapsed_s": wall, "steps_per_s": times.env_steps / max(wall, 1e-9), "backend": actor.backend,
                   "kernel": actor.kernel,  # integer kernel form + self-check (None on floats)
                   "weights_version": channel.version, "first_weights_version": 0,
                   "transitions_inserted": int(table_info.get("inserts", 0)), "payloads_rejected": 0,
                   "last_payload_rejection": None, "build_s": actor_build_s, "times": times.summary(),
                   "learner_wait_s": learner_wait_s, "energy": None}  # one process: its energy is energy.nodes.run
    learner_entry = {"learner_steps": steps, "steps_this_run": steps, "training_s": None,
                     "steps_per_s": steps / max(wall, 1e-9), "step_s": clock["learner_s"],
                     "step_s_mean": clock["learner_s"] / steps if steps else 0.0,
                     "sample_wait_s": clock["sample_s"], "weights_version": channel.version,
                     "resumed_from": None, "policy_file": policy_file, "publish": publish, "energy": None,
                     "loop_form": loop_form_record()}
    return build_summary(
        run, runner="single", status=status, error=None, wall_clock_s=launcher_wall, run_wall_clock_s=wall,
        counts={"actor_steps": times.env_steps, "learner_steps": steps, "episodes": episodes}, evals=evals,
        final_eval_return=evals[-1]["return"] if evals else None, actors=[actor_entry], learner=learner_entry,
        runtime=runtime_section([times.summary()], times.quantize_encode_s, updates), payload=payload,
        replay=table_info, energy=sum_energy({"run": energy_result}), agent_config=agent_config,
        train_clock_s=round(wall - clock["evaluation_s"], 3), evaluation_s=clock["evaluation_s"],
        sync_learner=bool(sync_learner), final_eval_return_fp32=evals[-1].get("return_fp32") if evals else None,
        actor_update_period=update_period, policy_file=policy_file, best_policy_file=best_policy_file,
        final_policy=final_policy_record(steps, steps, solved=None))
