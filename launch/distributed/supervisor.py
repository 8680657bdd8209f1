"""Supervision of an ActorQ program, whatever runs it (the same loop drives Ray and the local runner): start the
workers, poll progress, notice failures and lost nodes, stop every node in dependency order within a bounded time
(also on SIGINT or SIGTERM, as every runner stops: `launch.experiments.stopping`), and write summary.json."""
from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from analysis.schema import solved_at
from launch.distributed.nodes.base import log_event
from launch.distributed.program import NodeClasses, actor_names, build_actorq_program, node_role
from launch.distributed.replay_log import ReplayLog
from launch.experiments.config import ExperimentConfig
from launch.experiments.progress import ProgressView, Snapshot
from launch.experiments.stopping import StopSignals, exit_code
from launch.experiments.summary import make_summary
from launch.program.devices import learner_device_error, pin_driver_to_cpu
from launch.program.graph import CallFuture, Launch, NodeLost, Runner
from launch.program.local_runner import LocalRunner
from launch.program.ray_runner import RayRunner
from quarl.ops.io import jsonable, write_json_atomic

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
POLL_S = 0.5
STOP_GRACE_S = 6.0  # after Ctrl-C: how long nodes get to flush and checkpoint before they are killed
HOST_LOSS_WAIT_S = 20.0  # every actor failed: how long to look for a lost cluster machine that explains it
LOST_GRACE_S = 3.0  # after a node died: no checkpoint is possible without it; flush logs and stop


class _Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


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
    program = build_actorq_program(config, node_classes)
    actors = list(actor_names(program))
    status, error = "completed", None
    signum = None
    lost: dict[str, str] = {}
    lost_hosts: set[str] = set()  # Ray nodes (machines) found dead, already reported
    placement: dict[str, str] = {}  # node name -> Ray node id (Ray runner)
    learner_device: dict[str, Any] | None = None  # where the learner's JAX runs, as its process reports
    replay_log = ReplayLog(config.logdir, config.distributed.log_every_s)
    launch: Launch | None = None
    futures: dict[str, CallFuture] = {}
    results: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    solved_version: int | None = None  # the weights version whose evaluations solved the run
    # No exception may land inside ray.init (half-started Ray crashes at exit): signals are only recorded until
    # the program is up, then raise in the main thread (ray.init installs its own SIGTERM handler; ours must win).
    signals = StopSignals().__enter__()
    try:
        try:
            launch = runner.launch(program)
            signals.raise_with(_Interrupted)
            if signals.requested():
                raise _Interrupted(signals.received[-1])
            launch.wait_ready()
            placement = dict(launch.placement())
            learner_device = launch.handles["learner"].call("device_report")
            device_error = learner_device_error(config.learner_device, learner_device)
            if device_error:
                raise RuntimeError(device_error)
            if on_launch is not None:
                on_launch(launch)
            for name in ("learner", *actors, "evaluator"):
                futures[name] = launch.run(name)
            title = f"ActorQ {config.agent} · {config.task} · actors {config.precision} x{config.distributed.num_actors}"
            with ProgressView(progress, title) as view:
                while True:
                    if signals.requested():  # a signal whose exception some library code swallowed
                        raise _Interrupted(signals.received[-1])
                    snap, evals = _poll(launch, config, replay_log)
                    view.update(snap)
                    error = _check_hosts(launch, config.logdir, lost_hosts) or _check_workers(futures, actors)
                    if error and error.startswith("every actor failed"):
                        # Their machine may be gone: the cluster notices within seconds; name it if so.
                        error = _check_hosts(launch, config.logdir, lost_hosts, wait_s=HOST_LOSS_WAIT_S) or error
                    if error:
                        status = "failed"
                        break
                    if all(futures[a].done() for a in actors):
                        break
                    hit = solved_at(evals, config.target_return, config.target_streak)
                    if hit is not None:  # reached the target: stop early, gracefully, on the version that did
                        solved_version = hit.get("weights_version")
                        break
                    time.sleep(POLL_S)
        except _Interrupted as e:
            status, signum = "interrupted", e.signum
        except NodeLost as e:  # a service the driver polls died
            status, error = "failed", _lost_message(e)
        except Exception as e:  # pylint: disable=broad-except
            if signals.requested():
                status, signum = "interrupted", signals.received[-1]
            else:
                status, error = "failed", f"{type(e).__name__}: {_first_line(e)}"
        signals.ignore()  # the shutdown below is bounded; a second Ctrl-C must not cut it short
        if launch is not None and status == "failed":
            # Whatever surfaced first (an actor's insert, the learner's sample, the driver's poll), name
            # the node that is gone: that is what the user has to know.
            lost = _lost_nodes(launch, futures)
            if lost:
                error = "; ".join(lost[name] for name in lost) + "; the run cannot continue"
        if launch is not None:
            grace = LOST_GRACE_S if lost else STOP_GRACE_S
            results, stats = _stop_nodes(launch, futures, actors, graceful=status == "completed", grace_s=grace,
                                         skip=set(lost), final_version=solved_version)
            if stats.get("counts") and stats.get("replay"):
                replay_log.write(stats["counts"], stats["replay"], force=True)
            if status == "completed" and "failed" in results.get("learner", {}):
                status, error = "failed", results["learner"]["failed"]
    finally:
        replay_log.close()
        if launch is not None:
            launch.shutdown()
        else:
            runner.close()
        signals.__exit__(None, None, None)
    summary = make_summary(config, status, error, results, stats, time.monotonic() - t_start, _agent_config(config))
    summary["lost_nodes"] = sorted(lost)
    summary["placement"] = placement
    summary["lost_hosts"] = sorted(lost_hosts)
    summary["learner_device"] = learner_device
    write_json_atomic(Path(config.logdir) / "summary.json", summary)
    code = exit_code(status, signum)
    if status == "interrupted":
        log_event(config.logdir, "driver", f"interrupted by {signal.Signals(signum or signal.SIGINT).name}; "
                                           f"nodes stopped, exit code {code}")
    elif status == "failed":
        log_event(config.logdir, "driver", f"run failed: {error}; nodes stopped, exit code {code}")
    else:
        log_event(config.logdir, "driver", f"run completed: {summary['actor_steps']} actor steps, "
                                           f"{summary['learner_steps']} learner steps")
    return summary, code


def _agent_config(config: ExperimentConfig) -> dict[str, Any] | None:
    """The agent's whole config (defaults + overrides) for summary.json, as the single-process runner writes it."""
    try:
        return jsonable(dataclasses.asdict(config.builder().config))
    except (TypeError, ValueError):
        return None


def _poll(launch: Launch, config: ExperimentConfig, replay_log: ReplayLog | None = None) -> tuple[Snapshot, list[dict]]:
    """The progress snapshot and every evaluation so far (the evaluator's rows)."""
    h = launch.handles
    counts = h["counter"].call("get")
    info = h["replay"].call("info") if "replay" in h else None  # on-policy programs have no replay
    if replay_log is not None and info is not None:
        replay_log.write(counts, info)
    evals = h["evaluator"].call("results")
    last = evals[-1] if evals else None
    return Snapshot(actor_steps=int(counts["actor_steps"]), max_actor_steps=config.max_actor_steps,
                    learner_steps=int(counts["learner_steps"]), episodes=int(counts["episodes"]),
                    replay_size=None if info is None else int(info["size"]),
                    eval_return=None if last is None else last["return"],
                    eval_at=None if last is None else last["actor_steps"],
                    elapsed_s=float(counts["wall_clock_s"])), list(evals)


def _check_workers(futures: Mapping[str, CallFuture], actors: Sequence[str]) -> str | None:
    """A failure that ends the run: the learner or evaluator stopped (they only stop when told to), or
    every actor failed. One actor failing for good (restarts exhausted) is reported but not fatal."""
    for name in ("learner", "evaluator"):
        if futures[name].done():
            try:
                futures[name].result(timeout=0)
            except _Interrupted:
                raise
            except NodeLost as e:
                return _lost_message(e)
            except Exception as e:  # pylint: disable=broad-except
                return f"{name} failed: {type(e).__name__}: {_first_line(e)}"
            return f"{name} stopped unexpectedly"
    failed = []
    for name in actors:
        if futures[name].done():
            try:
                futures[name].result(timeout=0)
            except _Interrupted:
                raise
            except Exception:  # pylint: disable=broad-except
                failed.append(name)
    if failed and len(failed) == len(actors):
        return f"every actor failed ({', '.join(failed)})"
    return None


def _check_hosts(launch: Launch, logdir: str, reported: set[str], wait_s: float = 0.0) -> str | None:
    """A cluster machine (Ray node) that hosted some of our nodes died: named in events.log once. Services
    on it surface as `NodeLost`; actors are restarted by Ray where a live machine offers what they need
    (their custom resources), and when none does the run cannot go on: the returned error ends it.
    `wait_s` > 0: keep looking that long for a lost machine (its death reaches the node table late)."""
    deadline = time.monotonic() + wait_s
    lost = launch.lost_hosts()
    while not set(lost) - reported and time.monotonic() < deadline:
        time.sleep(0.5)
        lost = launch.lost_hosts()
    for host, names in sorted(lost.items()):
        if host in reported:
            continue
        reported.add(host)
        stranded = [n for n in names if n.startswith("actor_") and not launch.can_host(n)]
        log_event(logdir, "driver", f"cluster node {host[:16]} lost; it hosted {', '.join(sorted(names))}"
                                    + (f"; no live node can host {', '.join(stranded)}" if stranded else
                                       "; Ray may restart its actors on the remaining nodes"))
        if stranded:
            return (f"cluster node {host[:16]} was lost with {', '.join(stranded)} on it, and no live node "
                    f"offers the resources they need; the run cannot continue")
    return None


def _lost_nodes(launch: Launch, futures: Mapping[str, CallFuture], timeout_s: float = 2.0) -> dict[str, str]:
    """Nodes whose process is gone, with the message that says so: services that do not answer a ping
    (in parallel, `timeout_s` at most) and workers whose `run()` ended in `NodeLost` for themselves."""
    lost: dict[str, str] = {}
    pings: dict[str, CallFuture] = {}
    for name in launch.program.names(kind="service"):
        try:
            pings[name] = launch.handles[name].submit("ping")
        except NodeLost as e:
            lost[name] = _lost_message(e)
    deadline = time.monotonic() + timeout_s
    for name, future in pings.items():
        try:
            future.result(timeout=max(0.1, deadline - time.monotonic()))
        except NodeLost as e:
            lost[name] = _lost_message(e)
        except Exception:  # pylint: disable=broad-except
            pass  # slow or busy is not gone
    for name, future in futures.items():
        if future.done():
            try:
                future.result(timeout=0)
            except NodeLost as e:
                if getattr(e, "node", None) == name:
                    lost[name] = _lost_message(e)
            except Exception:  # pylint: disable=broad-except
                pass
    return lost


def _lost_message(e: BaseException) -> str:
    """The one-line message of a `NodeLost`, also when it reached us inside Ray's error wrapper (which is
    an instance of the cause's class, with Ray's traceback as its text)."""
    node = getattr(e, "node", "?")
    return str(NodeLost(node, getattr(e, "detail", ""), node_role(node)))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    # Ray wraps remote errors in a multi-line traceback; the last line holds the original message.
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__


def _stop_nodes(launch: Launch, futures: Mapping[str, CallFuture], actors: Sequence[str], graceful: bool,
                grace_s: float = STOP_GRACE_S, skip: set[str] | frozenset = frozenset(),
                final_version: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stops workers in dependency order and collects their results (bounded in time).

    Actors first (no more data), then the learner (final policy, publish, checkpoint), then the evaluator
    (one last evaluation of the final weights when `graceful`), then the replay table is closed to release
    blocked calls. Unless `graceful`, every wait together is bounded by `grace_s`, so that the whole stop
    takes well under 10 s. Nodes in `skip` (lost ones) are not called. `final_version` (a run its evaluations
    solved): the learner's final policy and the final evaluation are that weights version where the learner
    still holds it (`LearnerNode.stop`), so the final figure is the policy that solved the run."""
    h = launch.handles
    deadline = time.monotonic() + (3600.0 if graceful else grace_s)
    results: dict[str, Any] = {}

    def remaining(cap: float) -> float:
        return max(0.1, min(cap, deadline - time.monotonic()))

    def collect(name: str, cap: float) -> None:
        if name not in futures:
            return
        try:
            results[name] = futures[name].result(timeout=remaining(cap))
        except TimeoutError:
            results[name] = {"failed": "did not stop in time"}
        except Exception as e:  # pylint: disable=broad-except
            results[name] = {"failed": f"{type(e).__name__}: {_first_line(e)}"}

    def tell(name: str, method: str, *args: object) -> None:
        if name in skip:
            return
        try:
            h[name].submit(method, *args)
        except Exception:  # pylint: disable=broad-except
            pass

    for name in actors:
        tell(name, "stop")
    for name in actors:
        collect(name, 10.0)
    tell("learner", "stop", *([] if final_version is None else [final_version]))
    collect("learner", 120.0 if graceful else 4.0)
    kept = (results.get("learner") or {}).get("final_policy") or {}
    if final_version is not None and kept.get("weights_version") == final_version:
        tell("evaluator", "stop", graceful, final_version)
    else:
        tell("evaluator", "stop", graceful)
    collect("evaluator", 600.0 if graceful else 1.0)
    if not futures:  # stopped before anything ran (e.g. Ctrl-C during start-up): nothing to collect
        return results, {}
    # Services in parallel: energy reports, final counters, table and weight-server statistics.
    wanted = [(name, "energy") for name in ("counter", "replay", "weights")]
    wanted += [("counter", "get"), ("replay", "info"), ("weights", "stats")]
    calls: dict[tuple[str, str], CallFuture] = {}
    for name, method in wanted:
        if name not in skip and name in h:
            try:
                calls[(name, method)] = h[name].submit(method)
            except Exception:  # pylint: disable=broad-except
                pass
    stats: dict[str, Any] = {}
    for (name, method), future in calls.items():
        try:
            value = future.result(timeout=remaining(3.0))
        except Exception:  # pylint: disable=broad-except
            value = None
        if (name, method) == ("counter", "get"):
            name = "counts"
        if method == "energy":
            results[name] = {"energy": value}
        else:
            stats[name] = value or {}
    if "replay" not in skip and "replay" in h:
        try:  # releases calls still blocked on the rate limiter (e.g. a prefetch that lost its learner)
            h["replay"].submit("close").result(timeout=remaining(2.0))
        except Exception:  # pylint: disable=broad-except
            pass
    return results, stats
