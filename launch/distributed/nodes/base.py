"""What every ActorQ node shares: the stop-poll interval, the run's events.log, the energy tracker and CSV logger
each worker opens, and a future wait that honours a stop flag."""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Callable, TypeAlias, cast

from launch.program.devices import DeviceReport, device_report
from launch.program.graph import CallFuture, CallResult, result_as
from quarl.ops.carbon import EnergyTracker, start_tracking, stop_tracking
from quarl.ops.io import JSONValue
from quarl.ops.logs import Logger

if TYPE_CHECKING:
    from launch.distributed.clients import CounterClient, ReplayClient
    from launch.experiments.checkpoint import ReplaySnapshot

POLL_S = 0.25  # how long a blocked wait lasts before a node re-checks its stop flag
ACTOR_ENV_STREAM, EVAL_ENV_STREAM = 10, 11
EVENTS_FILE = "events.log"
_log = logging.getLogger("launch.distributed.nodes")
# What a worker node's `run()` returns: its record of the run, which the supervisor keys into summary.json's
# sections (`launch.experiments.summary.make_summary`, which checks what it reads).
NodeRecord: TypeAlias = dict[str, object]


def log_event(logdir: str | os.PathLike | None, node: str, message: str, level: int = logging.INFO) -> None:
    """Appends `<UTC time> <node>: <message>` to the run's events.log, and to Python logging at `level`
    (WARNING for faults, which then also reach the node's stderr: Ray's worker log, or the terminal with the
    local runner). One O_APPEND write per line, so lines from several processes never interleave. Never
    raises: losing an event line must not take a node down."""
    line = " ".join(f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime())}Z {node}: {message}".split())
    _log.log(level, "%s", line)
    if not logdir:
        return
    try:
        os.makedirs(logdir, exist_ok=True)
        fd = os.open(os.path.join(logdir, EVENTS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass


class NodeBase:
    """What every node answers, whatever its job."""

    def pid(self) -> int:
        """The process the node runs in (tests kill actors by pid)."""
        return os.getpid()

    def ping(self) -> bool:
        return True

    def device_report(self) -> DeviceReport:
        """Where JAX runs in this node's process, read there (`launch.program.devices.device_report`)."""
        return device_report()

    def _track_energy(self, logdir: str | None, name: str) -> None:
        """Service nodes (no run()) measure from construction until `energy()` is called."""
        self._energy_tracker = energy_tracker(logdir, name) if logdir else None

    def energy(self) -> dict[str, JSONValue] | None:
        """Stops this node's energy tracker and returns its report (None when nothing was measured)."""
        tracker, self._energy_tracker = getattr(self, "_energy_tracker", None), None
        return stop_tracking(tracker)


def counter_totals(counter: CounterClient, **deltas: int) -> dict[str, float]:
    """The run-wide counts (`launch.distributed.nodes.services.Counter`): with `deltas`, after adding them."""
    totals = counter.increment(**deltas) if deltas else counter.get()
    return result_as(dict, totals, "counter.increment" if deltas else "counter.get")


def replay_saver(replay: ReplayClient) -> Callable[[str], ReplaySnapshot]:
    """Writes the replay server's table to a path, in the server's process (a checkpoint's replay part)."""
    def save(path: str) -> ReplaySnapshot:
        return cast("ReplaySnapshot", result_as(dict, replay.save(path), "replay.save"))
    return save


def wait_or_stop(future: CallFuture, stop: threading.Event, poll_s: float = POLL_S) -> tuple[bool, CallResult]:
    """Waits for `future` until it finishes or `stop` is set: (finished, result). Errors propagate."""
    while True:
        try:
            return True, future.result(timeout=poll_s)
        except TimeoutError:
            if stop.is_set():
                return False, None


def energy_tracker(logdir: str, node: str) -> EnergyTracker | None:
    """The node's energy tracker, reports under LOGDIR/energy (None where tracking cannot run)."""
    return start_tracking(os.path.join(logdir, "energy"), node)


def csv_logger(logdir: str, name: str, fieldnames: list[str], step_key: str) -> Logger:
    """`<logdir>/<name>.csv` plus TensorBoard events under `<logdir>/tb`."""
    return Logger(os.path.join(logdir, f"{name}.csv"), os.path.join(logdir, "tb"), name=name,
                  fieldnames=fieldnames, step_key=step_key)
