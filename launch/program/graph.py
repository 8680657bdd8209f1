"""Program descriptions: which nodes a run has and how they reference each other, and what a runner of them
offers (`Runner`, `Launch`). Nothing here knows the ActorQ graph (its nodes and their roles:
`launch.distributed.actorq_graph`).

A `Program` is plain data (node classes, constructor arguments, resource requests). It says nothing about
processes, threads or Ray, so the same description runs on Ray (`launch.program.ray_runner`, one process per node,
local or on a cluster) and in one process (`launch.program.local_runner`, threads; for tests and debugging).
Nodes reference each other through `Handle("name")` placeholders in their constructor arguments; a runner
replaces every placeholder by a `NodeHandle` before it builds the node, so node code is written once against
two calls: `handle.call(method, ...)` (blocking) and `handle.submit(method, ...)` (a future). Node code does not
name methods as strings: `connect(handle, SomeClient)` gives a proxy typed by the callee's Protocol
(`client.method(...)` blocks, `submit(client).method(...)` returns a future), over those same two calls.

`launch.distributed.actorq_graph.build_actorq_program(config)` builds the ActorQ graph from these pieces.
"""
from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Callable, Iterator, Mapping, Protocol, TypeAlias, TypeVar, cast, runtime_checkable

from launch.program.devices import CPU_ONLY_ENV

# Environment of every acting process: one compute thread, so N actors on N cores never oversubscribe and
# a policy's latency is that of one core (the paper's setting), and JAX on the CPU with CUDA hidden (acting is
# CPU work; `launch.program.devices`). Applied via Ray's runtime_env.
SINGLE_THREAD_ENV: dict[str, str] = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "MUJOCO_GL": "disable",
    **CPU_ONLY_ENV,
}

NODE_KINDS = ("service", "worker")
# A node's GPU request on Ray: "none" (never; its environment hides the GPU, see launch.program.devices), "auto" (one
# GPU when the cluster has one) or "required" (one GPU; a cluster without one is an error before anything starts).
ACCELERATOR_MODES = ("none", "auto", "required")
# What a call to another node returns: whatever that node's method returns, as the runner carried it across (Ray
# deserializes it; the local runner hands the object itself). Nothing checks it on the way, so it is an `object`
# here: the calling node checks it is what the method it called returns (`result_as`) before it reads it.
CallResult: TypeAlias = object
T = TypeVar("T")
P = TypeVar("P")


def result_as(kind: type[T], value: CallResult, what: str) -> T:
    """`value` (a node call's result) checked to be a `kind`; a TypeError naming the call `what` otherwise (a node
    that answered something else: a version mismatch between processes, never data to go on with)."""
    if not isinstance(value, kind):
        raise TypeError(f"{what} returned a {type(value).__name__}, expected a {kind.__name__}")
    return value


# ------------------------------------------------------------------------------------------------------
# Handles
# ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Handle:
    """Placeholder for "the node called `name`" inside another node's constructor arguments."""

    name: str


class NodeLost(RuntimeError):
    """A call went to a node whose process is gone for good (killed, crashed, out of memory).

    Runners raise it in place of their own "actor died" errors, so node code and the supervisor can say which
    node is gone without knowing about Ray; the local runner never raises it (it has no processes). `role`
    is what the program calls the node in messages (`describe`); a runner knows only its name."""

    def __init__(self, node: str, detail: str = "", role: str = "node"):
        self.node, self.detail, self.role = str(node), str(detail), str(role)
        super().__init__(f"{self.role} ({self.node!r}) died: its process exited or was killed"
                         + (f" ({self.detail})" if self.detail else ""))

    def __reduce__(self) -> tuple:  # crosses process boundaries inside Ray's error wrapper
        return (NodeLost, (self.node, self.detail, self.role))


class CallFuture(abc.ABC):
    """A call in flight (a Ray ObjectRef or a thread's future behind one interface)."""

    @abc.abstractmethod
    def done(self) -> bool:
        """True once the call has finished (successfully or not)."""

    @abc.abstractmethod
    def result(self, timeout: float | None = None) -> CallResult:
        """The call's return value; raises its exception, or TimeoutError after `timeout` seconds."""


class NodeHandle(abc.ABC):
    """What a node holds to talk to another node. Methods must be safe to call from several threads."""

    @abc.abstractmethod
    def submit(self, method: str, *args: object, **kwargs: object) -> CallFuture:
        """Start `method(*args, **kwargs)` on the node and return at once."""

    def call(self, method: str, *args: object, **kwargs: object) -> CallResult:
        """`method(*args, **kwargs)` on the node, waiting for the result."""
        return self.submit(method, *args, **kwargs).result()


class NodeControl(Protocol):
    """What runners and supervisors call on every node (`launch.distributed.nodes.base.NodeBase` answers it)."""

    def pid(self) -> int: ...

    def ping(self) -> bool: ...


class WorkerControl(NodeControl, Protocol):
    """A worker node's main loop (`Node` kind "worker"): `run()` until `stop()` (nodes may add arguments)."""

    def run(self) -> object: ...

    def stop(self) -> None: ...


def protocol_methods(protocol: type) -> frozenset[str]:
    """The public methods a client Protocol declares (its own and its bases', not `object`'s or `Protocol`'s)."""
    names: set[str] = set()
    for klass in protocol.__mro__:
        if klass in (object, Protocol) or klass.__module__ == "typing":
            continue
        names.update(n for n, v in vars(klass).items() if callable(v) and not n.startswith("_"))
    return frozenset(names)


class _Proxy:
    """Attribute calls on one node, for the names its Protocol declares only: a misspelt method is an
    AttributeError at the caller, not a failed call on the node."""

    def __init__(self, handle: NodeHandle, protocol: type):
        self._handle, self._protocol = handle, protocol
        self._methods = protocol_methods(protocol)

    def _check(self, method: str) -> str:
        if method.startswith("_") or method not in self._methods:
            raise AttributeError(f"{self._protocol.__name__} declares no method {method!r}")
        return method

    def __reduce__(self) -> tuple:  # rebuilt on the far side of a process boundary from its handle
        return (type(self), (self._handle, self._protocol))


class _Calls(_Proxy):
    """`calls.name(*args)` is `handle.call("name", *args)`: waits for the result."""

    def __getattr__(self, method: str) -> Callable[..., CallResult]:
        return functools.partial(self._handle.call, self._check(method))


class _Futures(_Proxy):
    """`futures.name(*args)` is `handle.submit("name", *args)`: returns a `CallFuture` at once."""

    def __getattr__(self, method: str) -> Callable[..., CallFuture]:
        return functools.partial(self._handle.submit, self._check(method))


def connect(handle: NodeHandle, protocol: type[P]) -> P:
    """`handle` as its node's client Protocol: `client.method(*args)` calls the node and waits for the result."""
    return cast(P, _Calls(handle, protocol))


def submit(client: object) -> _Futures:
    """The same node's methods returning a `CallFuture` at once: `submit(client).method(*args)`."""
    if not isinstance(client, _Calls):
        raise TypeError(f"submit() takes a client made by connect(), got a {type(client).__name__}")
    return _Futures(client._handle, client._protocol)  # pylint: disable=protected-access


# ------------------------------------------------------------------------------------------------------
# Nodes and programs
# ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Node:
    """One process-worth of work.

    kind "service" only answers calls; kind "worker" also has `run()` (its main loop, started by the runner)
    and `stop()` (asks `run()` to return soon). `max_concurrency` > 1 lets calls run on several threads, so a
    blocked call (a sampler waiting on the rate limiter) does not block the others, and `stop()` reaches a
    worker while its `run()` is busy. `max_restarts` > 0 asks the runner to rebuild a node whose process
    died and to call `run()` again (actors: resume with the latest weights).
    """

    name: str
    cls: type
    kwargs: Mapping[str, object] = dataclasses.field(default_factory=dict)
    kind: str = "service"
    num_cpus: float = 0.0
    accelerator: str = "none"  # one of ACCELERATOR_MODES (the learner: from --learner-device)
    max_concurrency: int = 1
    max_restarts: int = 0
    env_vars: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Custom resources the node needs (Ray: only cluster nodes offering them host it; pins nodes to machines).
    resources: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"node name must be a non-empty identifier, got {self.name!r}")
        if self.kind not in NODE_KINDS:
            raise ValueError(f"node {self.name!r}: kind must be one of {NODE_KINDS}, got {self.kind!r}")
        if self.kind == "worker" and not (callable(getattr(self.cls, "run", None))
                                          and callable(getattr(self.cls, "stop", None))):
            raise ValueError(f"worker node {self.name!r}: {self.cls.__name__} needs run() and stop()")
        if self.num_cpus < 0 or self.max_concurrency < 1 or self.max_restarts < 0:
            raise ValueError(f"node {self.name!r}: bad resources (num_cpus={self.num_cpus}, "
                             f"max_concurrency={self.max_concurrency}, max_restarts={self.max_restarts})")
        if self.accelerator not in ACCELERATOR_MODES:
            raise ValueError(f"node {self.name!r}: accelerator must be one of {ACCELERATOR_MODES}, "
                             f"got {self.accelerator!r}")
        if any(not k or not v > 0 for k, v in self.resources.items()):
            raise ValueError(f"node {self.name!r}: resources need names and amounts > 0, got {dict(self.resources)}")

    def dependencies(self) -> list[str]:
        """Names of the nodes this node's arguments refer to."""
        return sorted({h.name for h in _handles_in(self.kwargs)})


def _handles_in(value: object) -> Iterator[Handle]:
    if isinstance(value, Handle):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _handles_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _handles_in(v)


def resolve_handles(value: object, handles: Mapping[str, NodeHandle]) -> object:
    """`value` with every `Handle` replaced by the runner's `NodeHandle` (lists, tuples, dicts walked)."""
    if isinstance(value, Handle):
        return handles[value.name]
    if isinstance(value, Mapping):
        return {k: resolve_handles(v, handles) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_handles(v, handles) for v in value]
    if isinstance(value, tuple):
        return tuple(resolve_handles(v, handles) for v in value)
    return value


class Program:
    """An ordered set of nodes; `add` returns the `Handle` other nodes use to reach the new one."""

    def __init__(self, name: str):
        self.name = name
        self._nodes: dict[str, Node] = {}

    def add(self, node: Node) -> Handle:
        if node.name in self._nodes:
            raise ValueError(f"program {self.name!r} already has a node {node.name!r}")
        missing = [d for d in node.dependencies() if d not in self._nodes]
        if missing:  # nodes are added in dependency order, which is also the order runners build them in
            raise ValueError(f"node {node.name!r} refers to {missing}, which are not in the program yet")
        self._nodes[node.name] = node
        return Handle(node.name)

    @property
    def nodes(self) -> list[Node]:
        """Nodes in the order they were added (dependencies first)."""
        return list(self._nodes.values())

    def node(self, name: str) -> Node:
        return self._nodes[name]

    def names(self, kind: str | None = None, prefix: str = "") -> list[str]:
        return [n.name for n in self._nodes.values()
                if (kind is None or n.kind == kind) and n.name.startswith(prefix)]

    @property
    def num_cpus(self) -> float:
        return sum(n.num_cpus for n in self._nodes.values())


# ------------------------------------------------------------------------------------------------------
# Runners
# ------------------------------------------------------------------------------------------------------


@runtime_checkable
class Launch(Protocol):
    """A running program, whatever runs it (`launch.program.local_runner.LocalLaunch`,
    `launch.program.ray_runner.RayLaunch`): what the supervisor drives. A runner with one machine places every node on it and never loses a host."""

    program: Program
    handles: Mapping[str, NodeHandle]

    def wait_ready(self, timeout: float = ...) -> None:
        """Returns once every node is built (raises TimeoutError when they are not up in time)."""

    def run(self, name: str) -> CallFuture:
        """Starts worker `name`'s `run()`."""

    def pid(self, name: str) -> int:
        """The process node `name` runs in."""

    def placement(self) -> dict[str, str]:
        """Node name -> the machine (cluster node id) it runs on; {} with one machine."""

    def lost_hosts(self) -> dict[str, list[str]]:
        """Machines that hosted nodes of this program and are gone -> those node names; {} with one machine."""

    def can_host(self, name: str) -> bool:
        """Whether a live machine still offers what node `name` needs."""

    def shutdown(self) -> None:
        """The hard stop: no node outlives it."""


@runtime_checkable
class Runner(Protocol):
    """Starts programs: `launch(program)` builds every node and returns the running `Launch`."""

    name: str

    def launch(self, program: Program) -> Launch:
        """Builds the program's nodes in dependency order."""

    def close(self) -> None:
        """Releases what the runner started even when `launch` never returned."""
