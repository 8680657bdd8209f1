"""Distributed ActorQ: an fp32 learner and N actors acting with a quantized policy, on Ray.

    python -m launch.actorq --agent d4pg --task cartpole:balance --precision int8 --num-actors 2 \
        --actor-update-period 100 --max-actor-steps 20000 --seed 0 --logdir runs/d4pg_int8 \
        [--backend auto --runner ray --ray-address ADDR --resume DIR --checkpoint-every K --set key=value]

With no flags it runs a short D4PG job on cartpole:balance (2 actors, int8, a couple of minutes on a 2-core
laptop) on a private local Ray and ends with a summary table. Every flag is checked before Ray starts: a bad
one prints one line on stderr and exits 2 with nothing written. Ctrl-C stops every node within seconds,
flushes logs, writes summary.json and a checkpoint, and exits 130.

Writes to --logdir: learner.csv, evaluator.csv (actor_steps, wall_clock_s, return), actor_<i>.csv,
replay.csv (the table's insert/sample counters over time), tb/<node>/ (TensorBoard), checkpoints/ (see
launch.checkpoint for what --resume restores), policy_fp32.qrlp + .json (the final fp32 learner policy, what
`launch.ptq --checkpoint LOGDIR` reads), events.log (restarts, rejected payloads, lost nodes, how the run
ended) and summary.json.

Faults: an actor whose process dies is restarted (up to 3 times) and pulls the latest weights; if the
learner, the replay server, the counter, the quantizer or the evaluator dies, the run stops within seconds
with exit code 1 and an error naming the lost node, and every node process is ended. Resume such a run
from its last checkpoint with --resume LOGDIR (use --checkpoint-every to have one).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Mapping, NoReturn, Sequence

from launch.cli import (OneLineArgumentParser, UsageError, add_qat_argument, check_agent, check_backend,
                        check_carbon_country, check_logdir, check_positive, check_precision, check_seed, fail,
                        parse_overrides, qat_overrides)

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
POLL_S = 0.5
STOP_GRACE_S = 6.0  # after Ctrl-C: how long nodes get to flush and checkpoint before they are killed
LOST_GRACE_S = 3.0  # after a node died: no checkpoint is possible without it; flush logs and stop
REPLAY_LOG_FIELDS = ["wall_clock_s", "actor_steps", "learner_steps", "size", "inserts", "samples",
                     "samples_per_insert", "rate_limiter_diff", "insert_blocked_calls", "sample_blocked_calls"]

DEFAULT_TASKS = {"d4pg": "cartpole:balance", "dqn": "CartPole-v1"}
# The default job (`make run`): a couple of minutes at most on 2 cores, and it learns. D4PG: small networks, a
# value support fitted to cartpole's rewards (<= 1 per step, so returns <= 100 discounted), Adam 1e-3 and one
# learner step per 4 env steps (batch 128, 32 samples per insert), the setting agents/d4pg's learning test uses.
# DQN's own defaults are already tuned for classic control (CartPole reaches 500 within ~25k steps).
DEFAULT_STEPS = {"d4pg": 30_000, "dqn": 25_000}
QUICK_OVERRIDES: dict[str, dict[str, Any]] = {
    "d4pg": {"policy_layer_sizes": (64, 64), "critic_layer_sizes": (128, 128), "vmin": -10.0, "vmax": 110.0,
             "batch_size": 128, "learning_rate": 1e-3, "min_replay_size": 1_000, "max_replay_size": 100_000,
             "samples_per_insert": 32.0},
    "dqn": {},
}


# ------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------


def build_parser() -> OneLineArgumentParser:
    p = OneLineArgumentParser(prog="launch.actorq", description=__doc__.split("\n\n")[0])
    p.add_argument("--agent", default="d4pg", help="d4pg (DM Control) or dqn (gym classic control)")
    p.add_argument("--task", default=None, help="'domain:task' or a gym id (default: cartpole:balance for "
                                                "d4pg, CartPole-v1 for dqn)")
    p.add_argument("--precision", default="int8", help="actor precision: fp32, fp16, bf16, int2..int16")
    p.add_argument("--num-actors", type=int, default=2)
    p.add_argument("--actor-update-period", type=int, default=None,
                   help="actor steps between weight pulls (default: the agent config's)")
    p.add_argument("--envs-per-actor", type=int, default=1, metavar="K",
                   help="environments each actor steps together, with one policy call per step on the batch "
                        "of K observations (default 1, the paper's setting)")
    p.add_argument("--max-actor-steps", type=int, default=None,
                   help="environment steps over all actors (with --resume: including the steps before it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logdir", default=None, help="new directory for logs (default: runs/actorq/<run name>)")
    p.add_argument("--backend", default="auto", help="actor policy runtime: auto, jax or onnx")
    p.add_argument("--runner", default="ray", choices=("ray", "local"),
                   help="ray (one process per node) or local (threads in this process, for debugging)")
    p.add_argument("--ray-address", default=None,
                   help="join this Ray cluster (also RAY_ADDRESS); default: a private local Ray")
    p.add_argument("--resume", default=None, help="continue from the latest checkpoint under this run dir")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="learner steps between checkpoints (0: only when the run ends)")
    p.add_argument("--eval-every", type=int, default=None, help="actor steps between evaluations")
    p.add_argument("--eval-episodes", type=int, default=2)
    p.add_argument("--target-return", type=float, default=None,
                   help="end the run at the first evaluation whose mean return reaches this")
    p.add_argument("--publish-period", type=int, default=10, help="learner steps between weight versions")
    p.add_argument("--insert-batch", type=int, default=64, help="transitions per replay insert call")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="agent config override, repeatable (e.g. --set batch_size=128)")
    p.add_argument("--full-size", action="store_true",
                   help="use the agent's full default config instead of the quick laptop preset")
    add_qat_argument(p)
    p.add_argument("--no-progress", action="store_true", help="no live progress view")
    return p


@dataclasses.dataclass(frozen=True)
class Invocation:
    config: Any  # launch.program.RunConfig
    runner: str
    ray_address: str | None
    progress: bool


def validate(args: argparse.Namespace) -> Invocation:
    """Every check that can fail, before anything is started or written (UsageError on a bad flag)."""
    from launch.program import RunConfig  # pylint: disable=import-outside-toplevel

    agent = check_agent(args.agent)
    task = args.task or DEFAULT_TASKS[agent]
    precision = check_precision(args.precision)
    backend = check_backend(args.backend)
    num_actors = check_positive("--num-actors", args.num_actors)
    period = check_positive("--actor-update-period", args.actor_update_period, optional=True)
    envs_per_actor = check_positive("--envs-per-actor", args.envs_per_actor)
    steps = check_positive("--max-actor-steps", args.max_actor_steps, optional=True) or DEFAULT_STEPS[agent]
    seed = check_seed(args.seed)
    eval_every = check_positive("--eval-every", args.eval_every, optional=True) or max(1, steps // 10)
    eval_episodes = check_positive("--eval-episodes", args.eval_episodes)
    publish_period = check_positive("--publish-period", args.publish_period)
    insert_batch = check_positive("--insert-batch", args.insert_batch)
    if args.target_return is not None and not math.isfinite(args.target_return):
        raise UsageError(f"--target-return must be a finite number, got {args.target_return}")
    if args.checkpoint_every < 0:
        raise UsageError(f"--checkpoint-every must be >= 0, got {args.checkpoint_every}")
    check_carbon_country()
    overrides = {} if args.full_size else dict(QUICK_OVERRIDES[agent])
    overrides.update(parse_overrides(agent, args.overrides))
    overrides.update(qat_overrides(args.qat_bits, precision))
    if period is not None:
        overrides["actor_update_period"] = period
    config_obj = _check_agent_task(agent, task, overrides)

    resume = None
    if args.resume is not None:
        resume = _check_resume(args.resume, agent, task, config_obj)
    logdir = _choose_logdir(args.logdir, args.resume, agent, task, precision)
    if args.ray_address is not None and not args.ray_address.strip():
        raise UsageError("--ray-address must not be empty")
    config = RunConfig(agent=agent, task=task, precision=precision, num_actors=num_actors,
                       max_actor_steps=steps, seed=seed, logdir=str(logdir), overrides=overrides, backend=backend,
                       eval_every=eval_every, eval_episodes=eval_episodes, publish_period=publish_period,
                       insert_batch=insert_batch, checkpoint_every=args.checkpoint_every, resume=resume,
                       target_return=args.target_return, envs_per_actor=envs_per_actor)
    return Invocation(config, args.runner, args.ray_address, not args.no_progress)


def _check_agent_task(agent: str, task: str, overrides: Mapping[str, Any]) -> Any:
    """The task exists and suits the agent; returns the agent config (all built in-process, no Ray)."""
    from launch.cli import check_agent_task  # pylint: disable=import-outside-toplevel

    return check_agent_task(agent, task, dict(overrides)).config


def _check_resume(path: str, agent: str, task: str, agent_config: Any) -> str:
    from launch import checkpoint as ckpt  # pylint: disable=import-outside-toplevel

    try:
        directory = ckpt.find_checkpoint(path)
        manifest = ckpt.read_manifest(directory)
        ckpt.check_compatible(manifest, agent=agent, task=task, agent_config=ckpt.agent_config_dict(agent_config))
    except ckpt.CheckpointError as e:
        raise UsageError(f"--resume: {e}") from None
    return str(directory)


def _run_dir_of(resume: str) -> Path:
    """The run directory a --resume path belongs to (resume may name the run, checkpoints/ or a step).
    Only called with a path `_check_resume` accepted, so expanding it cannot fail."""
    p = Path(resume).expanduser().absolute()
    if p.name.startswith("step_"):
        p = p.parent
    if p.name == "checkpoints":
        p = p.parent
    return p


def _choose_logdir(logdir: str | None, resume: str | None, agent: str, task: str, precision: str) -> Path:
    if logdir is None and resume is not None:
        logdir = str(_run_dir_of(resume))
    if logdir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        logdir = os.path.join("runs", "actorq", f"{agent}-{task.replace(':', '-')}-{precision}-{stamp}")
    try:
        p = Path(logdir).expanduser()
    except RuntimeError as e:  # an unknown ~user
        raise UsageError(f"--logdir {logdir!r} is not a usable path: {e}") from None
    if resume is not None and p.absolute() == _run_dir_of(resume):
        if not os.access(p, os.W_OK | os.X_OK):  # continuing a run in its own directory: append to its logs
            raise UsageError(f"--logdir {logdir!r} is not writable")
        return p
    return check_logdir(logdir)


# ------------------------------------------------------------------------------------------------------
# Supervision (runner-agnostic: the same loop drives Ray and the local runner)
# ------------------------------------------------------------------------------------------------------


class _Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_SIGNALS_RECEIVED: list[int] = []


def _defer_signal(signum: int, _frame: Any) -> None:
    _SIGNALS_RECEIVED.append(signum)


def _raise_interrupt(signum: int, _frame: Any) -> None:
    # Recorded as well as raised: raised inside Ray's C extension, the exception can come out wrapped (as a
    # SystemError), and the run must still count as interrupted.
    _SIGNALS_RECEIVED.append(signum)
    raise _Interrupted(signum)


def make_runner(kind: str, ray_address: str | None = None) -> Any:
    if kind == "local":
        from launch.local_runner import LocalRunner  # pylint: disable=import-outside-toplevel

        return LocalRunner()
    from launch.ray_runner import RayRunner  # pylint: disable=import-outside-toplevel

    return RayRunner(ray_address)


def run_program(config: Any, runner: Any, *, progress: bool = False, node_classes: Any = None,
                on_launch: Any = None) -> tuple[dict[str, Any], int]:
    """Builds and runs the ActorQ program; returns (summary, exit code). Writes summary.json.

    `on_launch(launch)` is called once every node is up (tests use it to inject faults)."""
    from launch.nodes import log_event  # pylint: disable=import-outside-toplevel
    from launch.program import NodeLost, actor_names, build_actorq_program  # pylint: disable=import-outside-toplevel
    from launch.progress import ProgressView, Snapshot  # pylint: disable=import-outside-toplevel

    t_start = time.monotonic()
    Path(config.logdir).mkdir(parents=True, exist_ok=True)
    program = build_actorq_program(config, node_classes)
    actors = list(actor_names(program))
    status, error = "completed", None
    signum = None
    lost: dict[str, str] = {}
    replay_log = _ReplayLog(config.logdir, config.log_every_s)
    launch = None
    futures: dict[str, Any] = {}
    results: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    in_main = _in_main_thread()
    _SIGNALS_RECEIVED.clear()
    if in_main:  # no exception may land inside ray.init (half-started Ray crashes at exit): defer
        for s in previous:
            signal.signal(s, _defer_signal)
    try:
        try:
            launch = runner.launch(program)
            if in_main:  # ray.init installs its own SIGTERM handler; ours must win
                for s in previous:
                    signal.signal(s, _raise_interrupt)
            if _SIGNALS_RECEIVED:
                raise _Interrupted(_SIGNALS_RECEIVED[-1])
            launch.wait_ready()
            if on_launch is not None:
                on_launch(launch)
            for name in ("learner", *actors, "evaluator"):
                futures[name] = launch.run(name)
            title = f"ActorQ {config.agent} · {config.task} · actors {config.precision} x{config.num_actors}"
            with ProgressView(progress, title) as view:
                while True:
                    if _SIGNALS_RECEIVED:  # a signal whose exception some library code swallowed
                        raise _Interrupted(_SIGNALS_RECEIVED[-1])
                    snap = _poll(launch, config, replay_log)
                    view.update(snap)
                    error = _check_workers(futures, actors)
                    if error:
                        status = "failed"
                        break
                    if all(futures[a].done() for a in actors):
                        break
                    if config.target_return is not None and snap.eval_return is not None \
                            and snap.eval_return >= config.target_return:
                        break  # reached the target: stop early, still gracefully
                    time.sleep(POLL_S)
        except _Interrupted as e:
            status, signum = "interrupted", e.signum
        except NodeLost as e:  # a service the driver polls died
            status, error = "failed", _lost_message(e)
        except Exception as e:  # pylint: disable=broad-except
            if _SIGNALS_RECEIVED:
                status, signum = "interrupted", _SIGNALS_RECEIVED[-1]
            else:
                status, error = "failed", f"{type(e).__name__}: {_first_line(e)}"
        if in_main:  # the shutdown below is bounded; a second Ctrl-C must not cut it short
            for s in previous:
                signal.signal(s, signal.SIG_IGN)
        if launch is not None and status == "failed":
            # Whatever surfaced first (an actor's insert, the learner's sample, the driver's poll), name
            # the node that is gone: that is what the user has to know.
            lost = _lost_nodes(launch, futures)
            if lost:
                error = "; ".join(lost[name] for name in lost) + "; the run cannot continue"
        if launch is not None:
            grace = LOST_GRACE_S if lost else STOP_GRACE_S
            results, stats = _stop_nodes(launch, futures, actors, graceful=status == "completed", grace_s=grace,
                                         skip=set(lost))
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
        if in_main:
            for s, handler in previous.items():
                signal.signal(s, handler)
    summary = make_summary(config, status, error, results, stats, time.monotonic() - t_start)
    summary["lost_nodes"] = sorted(lost)
    from quarl.logs import write_json_atomic  # pylint: disable=import-outside-toplevel

    write_json_atomic(Path(config.logdir) / "summary.json", summary)
    code = EXIT_OK if status == "completed" else EXIT_FAILED
    if status == "interrupted":
        code = 128 + (signum or signal.SIGINT)
        log_event(config.logdir, "driver", f"interrupted by {signal.Signals(signum or signal.SIGINT).name}; "
                                           f"nodes stopped, exit code {code}")
    elif status == "failed":
        log_event(config.logdir, "driver", f"run failed: {error}; nodes stopped, exit code {code}")
    else:
        log_event(config.logdir, "driver", f"run completed: {summary['actor_steps']} actor steps, "
                                           f"{summary['learner_steps']} learner steps")
    return summary, code


def _in_main_thread() -> bool:
    import threading  # pylint: disable=import-outside-toplevel

    return threading.current_thread() is threading.main_thread()


class _ReplayLog:
    """replay.csv: the table's counters as the driver polls them, every `every_s` seconds, so the rate
    limiter's behaviour over a run (samples per insert, who was held back) can be checked afterwards."""

    def __init__(self, logdir: str, every_s: float):
        self._path = Path(logdir) / "replay.csv"
        self._every_s = float(every_s)
        self._last = -math.inf
        self._log: Any = None

    def write(self, counts: Mapping[str, Any], info: Mapping[str, Any], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._every_s:
            return
        if self._log is None:
            from quarl.logs import CSVLogger  # pylint: disable=import-outside-toplevel

            self._log = CSVLogger(self._path, REPLAY_LOG_FIELDS)
        self._last = now
        row = {"wall_clock_s": float(counts["wall_clock_s"]), "actor_steps": int(counts["actor_steps"]),
               "learner_steps": int(counts["learner_steps"])}
        row.update({k: info[k] for k in REPLAY_LOG_FIELDS if k in info and k not in row})
        self._log.write(row)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()


def _poll(launch: Any, config: Any, replay_log: _ReplayLog | None = None) -> Any:
    from launch.progress import Snapshot  # pylint: disable=import-outside-toplevel

    h = launch.handles
    counts = h["counter"].call("get")
    info = h["replay"].call("info")
    if replay_log is not None:
        replay_log.write(counts, info)
    evals = h["evaluator"].call("results")
    last = evals[-1] if evals else None
    return Snapshot(actor_steps=int(counts["actor_steps"]), max_actor_steps=config.max_actor_steps,
                    learner_steps=int(counts["learner_steps"]), episodes=int(counts["episodes"]),
                    replay_size=int(info["size"]), eval_return=None if last is None else last["return"],
                    eval_at=None if last is None else last["actor_steps"], elapsed_s=float(counts["wall_clock_s"]))


def _check_workers(futures: Mapping[str, Any], actors: Sequence[str]) -> str | None:
    """A failure that ends the run: the learner or evaluator stopped (they only stop when told to), or
    every actor failed. One actor failing for good (restarts exhausted) is reported but not fatal."""
    from launch.program import NodeLost  # pylint: disable=import-outside-toplevel

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


def _lost_nodes(launch: Any, futures: Mapping[str, Any], timeout_s: float = 2.0) -> dict[str, str]:
    """Nodes whose process is gone, with the message that says so: services that do not answer a ping
    (in parallel, `timeout_s` at most) and workers whose `run()` ended in `NodeLost` for themselves."""
    from launch.program import NodeLost  # pylint: disable=import-outside-toplevel

    lost: dict[str, str] = {}
    pings: dict[str, Any] = {}
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
    from launch.program import NodeLost  # pylint: disable=import-outside-toplevel

    return str(NodeLost(getattr(e, "node", "?"), getattr(e, "detail", "")))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    # Ray wraps remote errors in a multi-line traceback; the last line holds the original message.
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__


def _stop_nodes(launch: Any, futures: Mapping[str, Any], actors: Sequence[str], graceful: bool,
                grace_s: float = STOP_GRACE_S, skip: set[str] | frozenset = frozenset()
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stops workers in dependency order and collects their results (bounded in time).

    Actors first (no more data), then the learner (final policy, publish, checkpoint), then the evaluator
    (one last evaluation of the final weights when `graceful`), then the replay table is closed to release
    blocked calls. Unless `graceful`, every wait together is bounded by `grace_s`, so that the whole stop
    takes well under 10 s. Nodes in `skip` (lost ones) are not called."""
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

    def tell(name: str, method: str, *args: Any) -> None:
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
    tell("learner", "stop")
    collect("learner", 120.0 if graceful else 4.0)
    tell("evaluator", "stop", graceful)
    collect("evaluator", 600.0 if graceful else 1.0)
    if not futures:  # stopped before anything ran (e.g. Ctrl-C during start-up): nothing to collect
        return results, {}
    # Services in parallel: energy reports, final counters, table and quantizer statistics.
    wanted = [(name, "energy") for name in ("counter", "replay", "quantizer")]
    wanted += [("counter", "get"), ("replay", "info"), ("quantizer", "stats")]
    calls: dict[tuple[str, str], Any] = {}
    for name, method in wanted:
        if name not in skip:
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
    if "replay" not in skip:
        try:  # releases calls still blocked on the rate limiter (e.g. a prefetch that lost its learner)
            h["replay"].submit("close").result(timeout=remaining(2.0))
        except Exception:  # pylint: disable=broad-except
            pass
    return results, stats


# ------------------------------------------------------------------------------------------------------
# Summary
# ------------------------------------------------------------------------------------------------------


def _sum_energy(parts: Mapping[str, Any]) -> dict[str, Any]:
    """Per-node energy reports (quarl.carbon) and their totals via `quarl.carbon.combine` (attributed parts
    add up; a RAPL package reading is counted once per host, never per node). Totals are None when nothing was
    measured; emissions are None when any node's grid intensity was unavailable."""
    from quarl.carbon import EnergyReport, combine  # pylint: disable=import-outside-toplevel

    nodes = {k: dict(v) for k, v in parts.items() if isinstance(v, Mapping)}
    reports = []
    for value in nodes.values():
        try:
            reports.append(EnergyReport.from_dict(value))
        except TypeError:  # a node report without the fields of an EnergyReport: not summed
            continue
    if not reports:
        return {"nodes": nodes, "total_kwh": None, "total_emissions_kg": None, "method": None}
    total = combine(reports)
    methods = sorted({r.method for r in reports})
    return {"nodes": nodes, "total_kwh": total.energy_kwh, "total_emissions_kg": total.emissions_kg_co2eq,
            "measured_kwh": total.measured_kwh, "modelled_kwh": total.modelled_kwh,
            "ram_model_share": total.ram_model_share, "package_kwh": total.package_kwh,
            "method": "; ".join(methods)}


def make_summary(config: Any, status: str, error: str | None, results: Mapping[str, Any],
                 stats: Mapping[str, Any], wall_clock_s: float) -> dict[str, Any]:
    """summary.json: outcome, throughput, payload sizes, per-actor runtime breakdown, energy."""
    counts = stats.get("counts", {})
    q = stats.get("quantizer", {})
    learner = results.get("learner", {}) or {}
    evaluator = results.get("evaluator", {}) or {}
    actor_results = [results[k] for k in sorted(results) if k.startswith("actor_")]
    actors = []
    for name in sorted(k for k in results if k.startswith("actor_")):
        r = dict(results[name] or {})
        r.setdefault("actor_id", int(name.split("_")[1]))
        r["starts"] = int(counts.get(f"{name}_starts", 0))
        r["total_steps"] = int(counts.get(f"{name}_steps", 0))
        actors.append(r)
    eval_rows = _read_evals(Path(config.logdir) / "evaluator.csv")
    evals = [r["return"] for r in eval_rows]
    target = getattr(config, "target_return", None)
    hit = next((r for r in eval_rows if target is not None and r["return"] >= target), None)
    final = (evaluator.get("final") or {}).get("return") if isinstance(evaluator, Mapping) else None
    if final is None and evals:
        final = evals[-1]
    run_s = float(counts.get("wall_clock_s", wall_clock_s))
    actor_steps = int(counts.get("actor_steps", 0))
    learner_steps = int(counts.get("learner_steps", 0))
    payload_bytes, fp32_bytes = int(q.get("payload_bytes", 0)), int(q.get("fp32_payload_bytes", 0))
    breakdown = _breakdown([a.get("times", {}) for a in actor_results if isinstance(a, Mapping)])
    energy = _sum_energy({name: (r or {}).get("energy") for name, r in results.items() if isinstance(r, Mapping)})
    return {
        "status": status,
        "error": error,
        "agent": config.agent,
        "task": config.task,
        "precision": config.precision,
        "backend": sorted({str(a.get("backend")) for a in actors if a.get("backend")}) or [config.backend],
        "num_actors": config.num_actors,
        "seed": config.seed,
        "run_config": config.to_dict(),
        "logdir": str(Path(config.logdir).absolute()),
        "final_eval_return": final,
        "best_eval_return": max(evals) if evals else None,
        "evaluations": len(evals),
        "target_return": target,
        "time_to_target_s": None if hit is None else hit["wall_clock_s"],
        "actor_steps_to_target": None if hit is None else int(hit["actor_steps"]),
        "wall_clock_s": round(wall_clock_s, 3),
        "run_wall_clock_s": round(run_s, 3),
        "actor_steps": actor_steps,
        "learner_steps": learner_steps,
        "episodes": int(counts.get("episodes", 0)),
        # All actors together, each over its own acting loop (start-up and resumed time excluded).
        "actor_steps_per_s": round(sum(float(a.get("steps_per_s", 0.0)) for a in actors), 2),
        "learner_steps_per_s": round(learner.get("steps_per_s", 0.0), 2) if isinstance(learner, Mapping) else None,
        "payload": {"precision": config.precision, "bytes": payload_bytes, "fp32_bytes": fp32_bytes,
                    "compression": round(fp32_bytes / payload_bytes, 3) if payload_bytes else None,
                    **{k: v for k, v in q.items() if k not in ("payload_bytes", "fp32_payload_bytes")}},
        "payload_bytes": payload_bytes,
        "payload_bytes_fp32": fp32_bytes,
        "runtime": breakdown,
        # Weight payloads actors refused (corrupted, stale, wrong spec/precision) and kept their policy.
        "payloads_rejected": int(sum(int(a.get("payloads_rejected") or 0) for a in actors)),
        "actors": actors,
        "learner": learner,
        "replay": {k: v for k, v in stats.get("replay", {}).items() if isinstance(v, (int, float, str))},
        "energy": energy,
    }


def _breakdown(times: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The paper's runtime breakdown over all actors: seconds summed, and per weight update."""
    keys = ("env_step_s", "policy_s", "pull_s", "deserialize_s", "load_s", "insert_s")
    total = {k: float(sum(t.get(k, 0.0) for t in times)) for k in keys}
    updates = int(sum(t.get("updates", 0) for t in times))
    pulls = int(sum(t.get("pulls", 0) for t in times))
    per_update = {f"{k[:-2]}_ms": (1e3 * total[k] / updates if updates else None)
                  for k in ("pull_s", "deserialize_s", "load_s")}
    per_update["update_ms"] = (sum(v for v in per_update.values() if v is not None) if updates else None)
    return {"summed_s": total, "updates": updates, "pulls": pulls, "per_update": per_update}


def _read_evals(path: Path) -> list[dict[str, float]]:
    """evaluator.csv rows (actor_steps, wall_clock_s, return) with a finite return, in file order."""
    import csv  # pylint: disable=import-outside-toplevel

    if not path.exists():
        return []
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            try:
                parsed = {k: float(row[k]) for k in ("actor_steps", "wall_clock_s", "return")}
            except (KeyError, ValueError):
                continue
            if all(math.isfinite(v) for v in parsed.values()):
                out.append(parsed)
    return out


# ------------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        inv = validate(args)
    except UsageError as e:
        fail(f"launch.actorq: error: {e}")
    runner = make_runner(inv.runner, inv.ray_address)
    summary, code = run_program(inv.config, runner, progress=inv.progress)
    from launch.progress import print_summary  # pylint: disable=import-outside-toplevel

    print_summary(summary)
    if summary.get("error"):
        sys.stderr.write(f"launch.actorq: {summary['error']}\n")
    return code


def _exit_now(code: int) -> NoReturn:
    """Ends the CLI at once, without Python's interpreter teardown.

    Why: by now every file of the run is closed (CSV rows flushed, TensorBoard writers closed, checkpoint and
    summary.json fsynced) and Ray is shut down; what is left is tearing down native thread pools that the
    local runner loads in this very process (tensorstore's, through orbax's checkpointer; XLA's; onnxruntime's)
    and finalising hundreds of modules: seconds on a loaded machine, and a hang when a native pool waits on
    a thread that finalisation has already frozen."""
    import logging  # pylint: disable=import-outside-toplevel

    if "ray" in sys.modules:
        try:
            sys.modules["ray"].shutdown()  # a joined (not owned) cluster: disconnect cleanly
        except Exception:  # pylint: disable=broad-except
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # pylint: disable=broad-except
            pass
    logging.shutdown()
    os._exit(code)  # pylint: disable=protected-access


if __name__ == "__main__":
    _exit_now(main())
