"""Stopping an ActorQ program's nodes (`launch.distributed.supervisor`): in dependency order, collecting what each
reports, within a bounded time unless the run ended well."""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from launch.distributed.health import first_line
from launch.distributed.clients import CounterClient, ReplayClient, ServiceClient, WeightServerClient
from launch.program.graph import CallFuture, Launch, WorkerControl, connect, submit

STOP_GRACE_S = 6.0  # after Ctrl-C: how long nodes get to flush and checkpoint before they are killed
LOST_GRACE_S = 3.0  # after a node died: no checkpoint is possible without it; flush logs and stop


def stop_nodes(launch: Launch, futures: Mapping[str, CallFuture], actors: Sequence[str], graceful: bool,
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
            results[name] = {"failed": f"{type(e).__name__}: {first_line(e)}"}

    def tell_stop(name: str, *args: object) -> None:
        """Asks worker `name` to stop (`stop(*args)`: the learner's and the evaluator's take arguments)."""
        if name in skip:
            return
        try:
            submit(connect(h[name], WorkerControl)).stop(*args)
        except Exception:  # pylint: disable=broad-except
            pass

    for name in actors:
        tell_stop(name)
    for name in actors:
        collect(name, 10.0)
    tell_stop("learner", *([] if final_version is None else [final_version]))
    collect("learner", 120.0 if graceful else 4.0)
    kept = (results.get("learner") or {}).get("final_policy") or {}
    if final_version is not None and kept.get("weights_version") == final_version:
        tell_stop("evaluator", graceful, final_version)
    else:
        tell_stop("evaluator", graceful)
    collect("evaluator", 600.0 if graceful else 1.0)
    if not futures:  # stopped before anything ran (e.g. Ctrl-C during start-up): nothing to collect
        return results, {}
    # Services in parallel: energy reports, final counters, table and weight-server statistics.
    wanted: list[tuple[str, str, Callable[[], CallFuture]]] = [
        (name, "energy", lambda name=name: submit(connect(h[name], ServiceClient)).energy())
        for name in ("counter", "replay", "weights")]
    wanted += [("counter", "get", lambda: submit(connect(h["counter"], CounterClient)).get()),
               ("replay", "info", lambda: submit(connect(h["replay"], ReplayClient)).info()),
               ("weights", "stats", lambda: submit(connect(h["weights"], WeightServerClient)).stats())]
    calls: dict[tuple[str, str], CallFuture] = {}
    for name, method, start in wanted:
        if name not in skip and name in h:
            try:
                calls[(name, method)] = start()
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
            submit(connect(h["replay"], ReplayClient)).close().result(timeout=remaining(2.0))
        except Exception:  # pylint: disable=broad-except
            pass
    return results, stats
