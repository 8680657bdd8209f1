"""What each ActorQ node offers the nodes that call it, one Protocol per node role.

Nodes hold `connect(handle, XClient)` proxies (`launch.program.graph`), so a call is `weights.get_payload(v, s)`
(blocking) or `submit(replay).sample_stacked(b, k)` (a future), never a method named in a string. Every method
declared here (and `RolloutActorClient`, beside its node in `launch.distributed.nodes.rollout_actor`) exists on
its node class with the same parameters (`tests/launch/test_clients.py`), so renaming a node's method breaks a
test, not a run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol

from launch.program.graph import NodeControl, WorkerControl

if TYPE_CHECKING:
    import numpy as np

    from launch.distributed.nodes.shared_blob import Blob
    from launch.experiments.acting import EvalRow
    from launch.experiments.checkpoint import ReplaySnapshot
    from launch.program.devices import DeviceReport
    from quarl.ops.io import JSONValue
    from quarl.replay.items import StackedSample, TableInfo, Transition


class ServiceClient(NodeControl, Protocol):
    """Every node: its process, liveness, where JAX runs in it, and its energy report."""

    def device_report(self) -> DeviceReport: ...

    def energy(self) -> dict[str, JSONValue] | None: ...


class CounterClient(ServiceClient, Protocol):
    """`launch.distributed.nodes.services.Counter`: the run-wide counts."""

    def increment(self, **deltas: int) -> dict[str, float]: ...

    def get(self) -> dict[str, float]: ...


class ReplayClient(ServiceClient, Protocol):
    """`launch.distributed.nodes.services.ReplayServer`: the replay table."""

    def insert(self, batch: Transition | Mapping[str, np.ndarray], priorities: np.ndarray | None = None,
               timeout: float | None = None, force: bool = False) -> int: ...

    def sample_stacked(self, batch_size: int, num_batches: int) -> StackedSample: ...

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int: ...

    def info(self) -> TableInfo: ...

    def save(self, path: str) -> ReplaySnapshot: ...

    def close(self) -> None: ...


class WeightServerClient(ServiceClient, Protocol):
    """`launch.distributed.nodes.services.WeightServer`: the newest policy payload."""

    def publish(self, version: int, blob: Blob, fp32_nbytes: int = 0) -> int: ...

    def latest_version(self) -> int: ...

    def get_payload(self, have_version: int = -1, wait_s: float = 0.0) -> Blob | None: ...

    def stats(self) -> dict[str, str | int]: ...


class LearnerClient(ServiceClient, WorkerControl, Protocol):
    """`launch.distributed.nodes.learner.LearnerNode` (and `RolloutLearnerNode`)."""

    def stop(self, final_version: int | None = None) -> None: ...

    def pin(self, version: int) -> bool: ...


class EvaluatorClient(ServiceClient, WorkerControl, Protocol):
    """`launch.distributed.nodes.evaluator.Evaluator`."""

    def stop(self, final_eval: bool = False, version: int | None = None) -> None: ...

    def results(self) -> list[EvalRow]: ...

