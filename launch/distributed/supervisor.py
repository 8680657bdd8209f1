"""Supervision of an ActorQ program, whatever runs it (the same loop drives Ray and the local runner): start the
workers, poll progress, notice failures and lost nodes (`launch.distributed.health`), stop every node in
dependency order within a bounded time (`launch.distributed.shutdown`; also on SIGINT or SIGTERM, as every runner
stops: `launch.experiments.stopping`), and write summary.json. `run_program` runs these as steps, each on the
parts of the config it needs."""
from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path
from typing import Any, Callable

from analysis.schema import solved_at
from launch.distributed.actorq_graph import NodeClasses, actor_names, build_actorq_program
from launch.distributed.health import (
    HOST_LOSS_WAIT_S, Interrupted, check_hosts, check_workers, first_line, lost_message, lost_nodes,
)
from launch.distributed.nodes.base import log_event
from launch.distributed.replay_log import ReplayLog
from launch.distributed.shutdown import LOST_GRACE_S, STOP_GRACE_S, stop_nodes
from launch.experiments.config import DistributedConfig, ExperimentConfig
from launch.experiments.progress import ProgressView, Snapshot
from launch.experiments.stopping import StopSignals, exit_code
from launch.experiments.summary import make_summary
from launch.program.devices import learner_device_error, pin_driver_to_cpu
from launch.distributed.clients import CounterClient, EvaluatorClient, LearnerClient, ReplayClient
from launch.program.graph import CallFuture, Launch, NodeLost, Program, Runner, connect
from launch.program.local_runner import LocalRunner
from launch.program.ray_runner import RayRunner
from quarl.ops.io import jsonable, write_json_atomic

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
POLL_S = 0.5


def make_runner(kind: str, ray_address: str | None = None) -> Runner:
    """"local" (threads in this process) or "ray" (one process per node; Ray itself is imported on launch)."""
    return LocalRunner() if kind == "local" else RayRunner(ray_address)


def run_program(config: ExperimentConfig, runner: Runner, *, progress: bool = False,
                node_classes: NodeClasses | None = None,
                on_launch: Callable[[Launch], None] | None = None) -> tuple[dict[str, Any], int]:
    """Builds and runs the ActorQ program; returns (summary, exit code). Writes summary.json.

    `on_launch(launch)` is called once every node is up (tests use it to inject faults)."""
    t_start = time.monotonic()
    pin_driver_to_cpu()  # the driver only builds specs and reads results: it never starts a GPU
    Path(config.logdir).mkdir(parents=True, exist_ok=True)
    run = Supervision(build_actorq_program(config, node_classes), config.logdir, config.distributed)
    run.run(runner, Watch.of(config, len(run.actors)), progress=progress, on_launch=on_launch)
    return record_run(config, run, time.monotonic() - t_start)


@dataclasses.dataclass(frozen=True)
class Watch:
    """What the driver watches a run for: the live view's title, the step budget, the target and its streak, and
    the learner device asked for (checked against where the learner's JAX runs)."""

    title: str
    max_actor_steps: int
    target_return: float | None
    target_streak: int
    learner_device: str

    @classmethod
    def of(cls, config: ExperimentConfig, num_actors: int) -> "Watch":
        return cls(f"ActorQ {config.agent} · {config.task} · actors {config.precision} x{num_actors}",
                   config.max_actor_steps, config.target_return, config.target_streak, config.learner_device)


class Supervision:
    """One run of a program as the driver sees it: its state (status, error, the signal that stopped it, lost
    nodes and machines, where nodes ran, the workers' futures, their results) and the steps that start, watch and
    stop it. Nothing of it is written until `record_run`."""

    def __init__(self, program: Program, logdir: str, distributed: DistributedConfig):
        self.program, self.logdir = program, logdir
        self.actors = list(actor_names(program))
        self.replay_log = ReplayLog(logdir, distributed.log_every_s)
        self.status, self.error, self.signum = "completed", None, None
        self.lost: dict[str, str] = {}
        self.lost_hosts: set[str] = set()  # Ray nodes (machines) found dead, already reported
        self.placement: dict[str, str] = {}  # node name -> Ray node id (Ray runner)
        self.learner_device: dict[str, Any] | None = None  # where the learner's JAX runs, as its process reports
        self.launch: Launch | None = None
        self.futures: dict[str, CallFuture] = {}
        self.results: dict[str, Any] = {}
        self.stats: dict[str, Any] = {}
        self.solved_version: int | None = None  # the weights version whose evaluations solved the run

    def run(self, runner: Runner, watch: Watch, *, progress: bool,
            on_launch: Callable[[Launch], None] | None) -> None:
        """Starts, watches and stops the program; whatever happens, the nodes are stopped and the runner shut down.
        No exception may land inside ray.init (half-started Ray crashes at exit): signals are only recorded until
        the program is up, then raise in the main thread (ray.init installs its own SIGTERM handler; ours must
        win)."""
        signals = StopSignals().__enter__()
        try:
            try:
                self._start(runner, signals, watch.learner_device, on_launch)
                self._watch(signals, watch, progress)
            except Interrupted as e:
                self.status, self.signum = "interrupted", e.signum
            except NodeLost as e:  # a service the driver polls died
                self.status, self.error = "failed", lost_message(e)
            except Exception as e:  # pylint: disable=broad-except
                if signals.requested():
                    self.status, self.signum = "interrupted", signals.received[-1]
                else:
                    self.status, self.error = "failed", f"{type(e).__name__}: {first_line(e)}"
            signals.ignore()  # the shutdown below is bounded; a second Ctrl-C must not cut it short
            self._stop()
        finally:
            self.replay_log.close()
            if self.launch is not None:
                self.launch.shutdown()
            else:
                runner.close()
            signals.__exit__(None, None, None)

    def _start(self, runner: Runner, signals: StopSignals, learner_device: str,
               on_launch: Callable[[Launch], None] | None) -> None:
        """Launches every node, waits until they are up, checks the learner's device, and starts the workers."""
        self.launch = launch = runner.launch(self.program)
        signals.raise_with(Interrupted)
        if signals.requested():
            raise Interrupted(signals.received[-1])
        launch.wait_ready()
        self.placement = dict(launch.placement())
        self.learner_device = connect(launch.handles["learner"], LearnerClient).device_report()
        device_error = learner_device_error(learner_device, self.learner_device)
        if device_error:
            raise RuntimeError(device_error)
        if on_launch is not None:
            on_launch(launch)
        for name in ("learner", *self.actors, "evaluator"):
            self.futures[name] = launch.run(name)

    def _watch(self, signals: StopSignals, watch: Watch, progress: bool) -> None:
        """Polls until the actors are done, the target is reached (the run stops on the version that reached it), a
        failure ends the run, or a signal stops it."""
        assert self.launch is not None
        launch, actors = self.launch, self.actors
        with ProgressView(progress, watch.title) as view:
            while True:
                if signals.requested():  # a signal whose exception some library code swallowed
                    raise Interrupted(signals.received[-1])
                snap, evals = _poll(launch, watch.max_actor_steps, self.replay_log)
                view.update(snap)
                error = check_hosts(launch, self.logdir, self.lost_hosts) or check_workers(self.futures, actors)
                if error and error.startswith("every actor failed"):
                    # Their machine may be gone: the cluster notices within seconds; name it if so.
                    error = check_hosts(launch, self.logdir, self.lost_hosts, wait_s=HOST_LOSS_WAIT_S) or error
                if error:
                    self.status, self.error = "failed", error
                    return
                if all(self.futures[a].done() for a in actors):
                    return
                hit = solved_at(evals, watch.target_return, watch.target_streak)
                if hit is not None:
                    self.solved_version = hit.get("weights_version")
                    return
                time.sleep(POLL_S)

    def _stop(self) -> None:
        """Stops the nodes (bounded unless the run completed), naming the lost ones of a failed run, and keeps their
        results and the services' final stats."""
        launch = self.launch
        if launch is None:
            return
        if self.status == "failed":
            # Whatever surfaced first (an actor's insert, the learner's sample, the driver's poll), name
            # the node that is gone: that is what the user has to know.
            self.lost = lost_nodes(launch, self.futures)
            if self.lost:
                self.error = "; ".join(self.lost[name] for name in self.lost) + "; the run cannot continue"
        grace = LOST_GRACE_S if self.lost else STOP_GRACE_S
        self.results, self.stats = stop_nodes(launch, self.futures, self.actors, graceful=self.status == "completed",
                                              grace_s=grace, skip=set(self.lost), final_version=self.solved_version)
        if self.stats.get("counts") and self.stats.get("replay"):
            self.replay_log.write(self.stats["counts"], self.stats["replay"], force=True)
        if self.status == "completed" and "failed" in self.results.get("learner", {}):
            self.status, self.error = "failed", self.results["learner"]["failed"]


def record_run(config: ExperimentConfig, run: Supervision, wall_clock_s: float) -> tuple[dict[str, Any], int]:
    """summary.json (with the lost nodes and machines, the placement and the learner's device) and the end in
    events.log; returns (summary, exit code)."""
    summary = make_summary(config, run.status, run.error, run.results, run.stats, wall_clock_s,
                           _agent_config(config), num_actors=len(run.actors))
    summary["lost_nodes"] = sorted(run.lost)
    summary["placement"] = run.placement
    summary["lost_hosts"] = sorted(run.lost_hosts)
    summary["learner_device"] = run.learner_device
    write_json_atomic(Path(run.logdir) / "summary.json", summary)
    code = exit_code(run.status, run.signum)
    if run.status == "interrupted":
        log_event(run.logdir, "driver", f"interrupted by {signal.Signals(run.signum or signal.SIGINT).name}; "
                                        f"nodes stopped, exit code {code}")
    elif run.status == "failed":
        log_event(run.logdir, "driver", f"run failed: {run.error}; nodes stopped, exit code {code}")
    else:
        log_event(run.logdir, "driver", f"run completed: {summary['actor_steps']} actor steps, "
                                        f"{summary['learner_steps']} learner steps")
    return summary, code


def _agent_config(config: ExperimentConfig) -> dict[str, Any] | None:
    """The agent's whole config (defaults + overrides) for summary.json, as the single-process runner writes it."""
    try:
        return jsonable(dataclasses.asdict(config.agent_config))
    except (TypeError, ValueError):
        return None


def _poll(launch: Launch, max_actor_steps: int, replay_log: ReplayLog | None = None) -> tuple[Snapshot, list[dict]]:
    """The progress snapshot and every evaluation so far (the evaluator's rows)."""
    h = launch.handles
    counts = connect(h["counter"], CounterClient).get()
    info = connect(h["replay"], ReplayClient).info() if "replay" in h else None  # on-policy programs have no replay
    if replay_log is not None and info is not None:
        replay_log.write(counts, info)
    evals = connect(h["evaluator"], EvaluatorClient).results()
    last = evals[-1] if evals else None
    return Snapshot(actor_steps=int(counts["actor_steps"]), max_actor_steps=max_actor_steps,
                    learner_steps=int(counts["learner_steps"]), episodes=int(counts["episodes"]),
                    replay_size=None if info is None else int(info["size"]),
                    eval_return=None if last is None else last["return"],
                    eval_at=None if last is None else last["actor_steps"],
                    elapsed_s=float(counts["wall_clock_s"])), list(evals)
