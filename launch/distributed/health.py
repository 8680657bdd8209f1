"""What the driver learns of its nodes while a program runs (`launch.distributed.supervisor`): a worker that failed or
stopped, a cluster machine that was lost with nodes on it, a node whose process is gone; each as the one line the
user reads."""
from __future__ import annotations

import signal
import time
from typing import Mapping, Sequence

from launch.distributed.actorq_graph import node_role
from launch.distributed.nodes.base import log_event
from launch.program.graph import CallFuture, Launch, NodeControl, NodeLost, connect, submit

HOST_LOSS_WAIT_S = 20.0  # every actor failed: how long to look for a lost cluster machine that explains it


class Interrupted(Exception):
    """A stop signal (SIGINT, SIGTERM) raised in the driver's main thread once the program is up."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def check_workers(futures: Mapping[str, CallFuture], actors: Sequence[str]) -> str | None:
    """A failure that ends the run: the learner or evaluator stopped (they only stop when told to), or
    every actor failed. One actor failing for good (restarts exhausted) is reported but not fatal."""
    for name in ("learner", "evaluator"):
        if futures[name].done():
            try:
                futures[name].result(timeout=0)
            except Interrupted:
                raise
            except NodeLost as e:
                return lost_message(e)
            except Exception as e:  # pylint: disable=broad-except
                return f"{name} failed: {type(e).__name__}: {first_line(e)}"
            return f"{name} stopped unexpectedly"
    failed = []
    for name in actors:
        if futures[name].done():
            try:
                futures[name].result(timeout=0)
            except Interrupted:
                raise
            except Exception:  # pylint: disable=broad-except
                failed.append(name)
    if failed and len(failed) == len(actors):
        return f"every actor failed ({', '.join(failed)})"
    return None


def check_hosts(launch: Launch, logdir: str, reported: set[str], wait_s: float = 0.0) -> str | None:
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


def lost_nodes(launch: Launch, futures: Mapping[str, CallFuture], timeout_s: float = 2.0) -> dict[str, str]:
    """Nodes whose process is gone, with the message that says so: services that do not answer a ping
    (in parallel, `timeout_s` at most) and workers whose `run()` ended in `NodeLost` for themselves."""
    lost: dict[str, str] = {}
    pings: dict[str, CallFuture] = {}
    for name in launch.program.names(kind="service"):
        try:
            pings[name] = submit(connect(launch.handles[name], NodeControl)).ping()
        except NodeLost as e:
            lost[name] = lost_message(e)
    deadline = time.monotonic() + timeout_s
    for name, future in pings.items():
        try:
            future.result(timeout=max(0.1, deadline - time.monotonic()))
        except NodeLost as e:
            lost[name] = lost_message(e)
        except Exception:  # pylint: disable=broad-except
            pass  # slow or busy is not gone
    for name, future in futures.items():
        if future.done():
            try:
                future.result(timeout=0)
            except NodeLost as e:
                if getattr(e, "node", None) == name:
                    lost[name] = lost_message(e)
            except Exception:  # pylint: disable=broad-except
                pass
    return lost


def lost_message(e: BaseException) -> str:
    """The one-line message of a `NodeLost`, also when it reached us inside Ray's error wrapper (which is
    an instance of the cause's class, with Ray's traceback as its text)."""
    node = getattr(e, "node", "?")
    return str(NodeLost(node, getattr(e, "detail", ""), node_role(node)))


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    # Ray wraps remote errors in a multi-line traceback; the last line holds the original message.
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__
