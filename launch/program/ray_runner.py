"""Runs a `launch.program.graph.Program` on Ray: one Ray actor (one process) per node.

Local by default: the command starts a private single-node Ray bound to 127.0.0.1 (no dashboard, Ray's own
logs kept in its session folder, not the terminal) and tears it down at the end, so no Ray process outlives
the run. With `address` (or RAY_ADDRESS) it joins an existing cluster instead and only removes its own actors.

Ray 2.60 turns token authentication on for new local clusters and, unless told otherwise, writes a token to
~/.ray/auth_token. For a private local cluster we keep authentication on but hand Ray a fresh random token
through the environment (inherited by Ray's processes, written nowhere). A user who configured RAY_AUTH_MODE,
RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH keeps their settings; joining a cluster uses the user's token as is.

Resources: every node asks for its `num_cpus` and runs with its `env_vars` (actors: one compute thread). A
local cluster is sized to the program (logical CPUs = what the nodes ask for), because on a 2-core laptop
the point is to run all nodes, one thread each, not to queue them. A node whose `accelerator` is "auto" gets
one GPU when the cluster has one, "required" always gets one (and a cluster without a GPU is refused before any
node starts); every other node asks for none, and its `env_vars` hide the GPU (`launch.program.devices`).
"""
from __future__ import annotations

import logging
import math
import os
import secrets
import sys
import time
import types
import warnings
from typing import TYPE_CHECKING

from launch.program.graph import (
    CallFuture, CallResult, NodeControl, NodeHandle, NodeLost, Program, WorkerControl, connect, resolve_handles, submit,
)
from launch.program.loopback_cluster import is_loopback

if TYPE_CHECKING:  # Ray loads on first use, not at import (a CLI fails fast on a bad flag)
    import ray
    import ray.actor

_SLICE_S = 0.2  # longest uninterruptible wait in the driver
_AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _ray() -> "types.ModuleType":
    """Ray, imported on first use: the one place this module defers it (a CLI fails fast on a bad flag without
    loading Ray, and `init_ray` sets Ray's environment before Ray reads it at import)."""
    import ray  # pylint: disable=import-outside-toplevel
    import ray.exceptions  # pylint: disable=import-outside-toplevel

    return ray


class RayFuture(CallFuture):
    """An ObjectRef behind the runner-neutral future interface.

    A call to a node whose process died for good raises `launch.program.graph.NodeLost` naming the node (Ray's
    ActorDiedError says "an actor", not which one). A node that is restarting (ActorUnavailableError) is
    not lost: that error passes through unchanged."""

    def __init__(self, ref: ray.ObjectRef, node: str = ""):
        self.ref = ref
        self.node = node

    def done(self) -> bool:
        ray = _ray()
        ready, _ = ray.wait([self.ref], timeout=0)
        return bool(ready)

    def result(self, timeout: float | None = None) -> CallResult:
        ray = _ray()
        GetTimeoutError, ActorUnavailableError = ray.exceptions.GetTimeoutError, ray.exceptions.ActorUnavailableError
        RayActorError = ray.exceptions.RayActorError

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:  # in slices, see _wait_all
            left = _SLICE_S if deadline is None else deadline - time.monotonic()
            try:
                return ray.get(self.ref, timeout=max(0.0, min(_SLICE_S, left)))
            except GetTimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"no result within {timeout} s") from None
            except ActorUnavailableError:
                raise
            except RayActorError as e:
                if not self.node:
                    raise
                raise NodeLost(self.node, type(e).__name__) from None


def _wait_all(refs: list, timeout: float | None) -> None:
    """Waits for `refs` in short slices: a long ray.get/ray.wait blocks in C++, where Python signal handlers
    (Ctrl-C) do not run until it returns. TimeoutError after `timeout` seconds."""
    ray = _ray()
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(refs)
    while pending:
        slice_s = _SLICE_S if deadline is None else min(_SLICE_S, deadline - time.monotonic())
        if slice_s <= 0:
            raise TimeoutError(f"no result within {timeout} s")
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=slice_s)


class RayNodeHandle(NodeHandle):
    """A node on Ray, addressed by its actor name in the launch's namespace.

    Nodes receive these (not Ray actor handles) in their constructor arguments and look the actor up on
    first use: Ray stores constructor arguments that contain actor handles in the object store, and a
    restartable actor (our actors) could then fail to restart once those objects are gone."""

    def __init__(self, name: str, namespace: str, actor: ray.actor.ActorHandle | None = None):
        self.name, self.namespace = name, namespace
        self._actor = actor

    def __reduce__(self) -> tuple:
        return (RayNodeHandle, (self.name, self.namespace))

    @property
    def actor(self) -> ray.actor.ActorHandle:
        if self._actor is None:
            ray = _ray()
            self._actor = ray.get_actor(self.name, namespace=self.namespace)
        return self._actor

    def submit(self, method: str, *args: object, **kwargs: object) -> RayFuture:
        try:
            actor = self.actor
        except ValueError as e:  # ray.get_actor: no live actor of that name (it died and was cleaned up)
            raise NodeLost(self.name, f"no live actor: {e}") from None
        return RayFuture(getattr(actor, method).remote(*args, **kwargs), self.name)


_LOCAL_TOKEN: str | None = None


def _prepare_local_auth() -> None:
    """Token auth for a private local Ray without writing ~/.ray/auth_token (see the module docstring).

    Must run before Ray reads its config: Ray caches RAY_AUTH_MODE when it is imported, so if it was
    imported already the cached config is refreshed (what Ray itself does when it enables token auth)."""
    if any(os.environ.get(k) for k in _AUTH_ENV) or os.path.exists(os.path.expanduser("~/.ray/auth_token")):
        return
    global _LOCAL_TOKEN  # pylint: disable=global-statement
    # One token per process: Ray's client keeps the first token it loaded, so a later private cluster started
    # by the same process (tests start one per module) must be given that same token.
    _LOCAL_TOKEN = _LOCAL_TOKEN or secrets.token_hex(32)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = _LOCAL_TOKEN
    if "ray" in sys.modules:
        from ray._raylet import Config  # pylint: disable=import-outside-toplevel,no-name-in-module

        Config.initialize("")


def _bind_to_loopback() -> None:
    """Make every Ray process of a private local cluster listen on 127.0.0.1 only.

    `ray.init(_node_ip_address="127.0.0.1")` alone is not enough: Ray swaps a loopback address for the
    host's routable IP unless single-machine mode is on, which RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 selects
    (it is what Ray does by default on macOS/Windows). Ray reads it at import time."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if "ray" in sys.modules:
        from ray._private import ray_constants  # pylint: disable=import-outside-toplevel

        ray_constants.ENABLE_RAY_CLUSTER = False


def _is_loopback_address(address: str | None) -> bool:
    host = (address or "").removeprefix("ray://").rsplit(":", 1)[0]
    return bool(host) and is_loopback(host)


def init_ray(address: str | None = None, num_cpus: float | None = None, num_gpus: int | None = None) -> bool:
    """Connect to `address` / RAY_ADDRESS, or start a private local Ray; True when this call started it.

    A no-op (False) when Ray is already initialised in this process (tests share one Ray per module).
    `num_gpus`: the GPUs a local cluster offers (None: as many as Ray finds; tests declare one to place a
    GPU learner on a machine without one)."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    local = not address or address == "local"
    if local:
        _prepare_local_auth()
    if local or _is_loopback_address(address):
        # A cluster on 127.0.0.1 (launch.program.loopback_cluster) is reached on 127.0.0.1, not the host's address.
        _bind_to_loopback()
    ray = _ray()
    if ray.is_initialized():
        return False
    common = {"log_to_driver": False, "logging_level": logging.ERROR, "configure_logging": True}
    if not local:
        ray.init(address=address, **common)
        return False
    cpus = max(int(math.ceil(num_cpus or 0)), os.cpu_count() or 1)
    # RAY_ADDRESS would make a plain init() try to connect; the caller asked for a local cluster.
    os.environ.pop("RAY_ADDRESS", None)
    with warnings.catch_warnings():
        # Ray starts its services with fork + exec (subprocess), which is safe with JAX's threads; Python still
        # warns about any fork in a multithreaded process, and the user cannot act on it.
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        ray.init(num_cpus=cpus, num_gpus=num_gpus, include_dashboard=False, _node_ip_address="127.0.0.1", **common)
    return True


def cluster_has_gpu() -> bool:
    ray = _ray()
    return ray.cluster_resources().get("GPU", 0) >= 1


def _check_accelerators(program: Program, gpu: bool) -> None:
    """A node that requires a GPU on a cluster without one: RuntimeError naming it (Ray would queue it forever)."""
    needy = [n.name for n in program.nodes if n.accelerator == "required"]
    if needy and not gpu:
        raise RuntimeError(f"the Ray cluster offers no GPU, and {', '.join(needy)} requires one "
                           f"(--learner-device gpu); use --learner-device auto or cpu, or a cluster with a GPU")


def _check_custom_resources(program: Program) -> None:
    """Every custom resource the nodes ask for exists in the cluster in the amount they ask for together
    (otherwise Ray would queue them forever). RuntimeError naming the resource."""
    ray = _ray()
    wanted: dict[str, float] = {}
    for node in program.nodes:
        for key, amount in node.resources.items():
            wanted[key] = wanted.get(key, 0.0) + float(amount)
    have = ray.cluster_resources()
    for key, amount in sorted(wanted.items()):
        if have.get(key, 0.0) < amount:
            raise RuntimeError(f"the Ray cluster offers {have.get(key, 0.0):g} of resource {key!r}, the nodes "
                               f"ask for {amount:g} (start a node with --resources '{{\"{key}\": {amount:g}}}')")


class RayLaunch:
    """A running program on Ray: handles by node name, `run()` futures for workers, and teardown."""

    def __init__(self, program: Program, *, owns_cluster: bool):
        ray = _ray()
        self.program = program
        self._owns_cluster = owns_cluster
        self._actors: dict[str, ray.actor.ActorHandle] = {}
        # A fresh namespace per launch: node names never clash with another run on a shared cluster.
        self.namespace = f"{program.name}-{secrets.token_hex(4)}"
        self.handles: dict[str, RayNodeHandle] = {}
        gpu = cluster_has_gpu()
        self._placement: dict[str, str] = {}  # node name -> Ray node id, once every node is up
        _check_accelerators(program, gpu)
        _check_custom_resources(program)
        try:
            for node in program.nodes:
                options: dict[str, object] = {
                    "num_cpus": node.num_cpus,
                    "max_concurrency": node.max_concurrency,
                    "max_restarts": node.max_restarts,
                    # Retrying tasks on a restarted actor is what makes a crashed actor's run() resume.
                    "max_task_retries": node.max_restarts,
                }
                if node.accelerator == "required" or (node.accelerator == "auto" and gpu):
                    options["num_gpus"] = 1
                if node.env_vars:
                    options["runtime_env"] = {"env_vars": dict(node.env_vars)}
                if node.resources:
                    options["resources"] = dict(node.resources)

                cls = ray.remote(node.cls).options(name=node.name, namespace=self.namespace, **options)
                actor = cls.remote(**resolve_handles(dict(node.kwargs), self.handles))
                self._actors[node.name] = actor
                self.handles[node.name] = RayNodeHandle(node.name, self.namespace, actor)
        except BaseException:
            self.shutdown()
            raise

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until every node's constructor ran (constructor errors surface here)."""
        ray = _ray()
        refs = [a.__ray_ready__.remote() for a in self._actors.values()]
        try:
            _wait_all(refs, timeout)
        except TimeoutError:
            raise TimeoutError(f"nodes not up after {timeout:.0f} s: does the cluster have "
                               f"{self.program.num_cpus:g} CPUs free?") from None
        ray.get(refs)
        self._placement = self.placement()

    def placement(self) -> dict[str, str]:
        """Node name -> id of the Ray node (machine) its process runs on, as the cluster's GCS says now."""
        from ray._private import state  # pylint: disable=import-outside-toplevel

        out = {}
        for name, actor in self._actors.items():
            info = state.actors(actor._actor_id.hex())  # pylint: disable=protected-access
            out[name] = str(((info or {}).get("Address") or {}).get("NodeID") or "")
        return out

    def lost_hosts(self) -> dict[str, list[str]]:
        """Ray nodes (machines) that hosted some of this program's nodes when it started and are dead now:
        Ray node id -> the program's node names that were on it."""
        ray = _ray()
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        lost: dict[str, list[str]] = {}
        for name, host in self._placement.items():
            if host and host not in alive:
                lost.setdefault(host, []).append(name)
        return lost

    def can_host(self, name: str) -> bool:
        """Whether a live Ray node still offers what node `name` asks for (its custom resources)."""
        ray = _ray()
        wanted = self.program.node(name).resources
        for n in ray.nodes():
            if n.get("Alive") and all(n.get("Resources", {}).get(k, 0) >= v for k, v in wanted.items()):
                return True
        return False

    def run(self, name: str) -> RayFuture:
        return submit(connect(self.handles[name], WorkerControl)).run()

    def pid(self, name: str) -> int:
        return int(connect(self.handles[name], NodeControl).pid())

    def shutdown(self) -> None:
        """Kill every node, then stop the private Ray (or just leave a shared cluster).

        Callers ask workers to stop and wait for them first; this is the hard stop that guarantees no node
        process outlives the run."""
        ray = _ray()
        if not ray.is_initialized():
            return
        for actor in self._actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # pylint: disable=broad-except
                pass  # already dead
        self._actors.clear()
        if self._owns_cluster:
            ray.shutdown()


class RayRunner:
    """`launch(program)` on Ray. `address` None/"local" starts (and later stops) a private local Ray."""

    name = "ray"

    def __init__(self, address: str | None = None):
        self.address = address
        self._started = False

    def launch(self, program: Program) -> RayLaunch:
        self._started = init_ray(self.address, num_cpus=program.num_cpus)
        return RayLaunch(program, owns_cluster=self._started)

    def close(self) -> None:
        """Stops a Ray this runner started even if `launch` never returned (e.g. Ctrl-C during start-up)."""
        ray = _ray()
        if self._started and ray.is_initialized():
            ray.shutdown()
        self._started = False
