"""A Ray cluster of several nodes on one machine, every process and port on 127.0.0.1.

For trying and testing the cluster path (`launch.actorq --ray-address`, `launch.reproduce --ray-address`)
without a second machine. Each node is a real `ray start` (its own raylet, object store and ports), so
actors placed on another node get their arguments and weights through Ray's object transfer, as on a cluster.

    python -m launch.program.loopback_cluster start --head --port 6380 --num-cpus 4 --temp-dir /tmp/rc/head
    python -m launch.program.loopback_cluster start --address 127.0.0.1:6380 --num-cpus 2 \
        --resources '{"actor_slot": 2}' --temp-dir /tmp/rc/w1
    python -m launch.actorq --ray-address 127.0.0.1:6380 --actor-resource actor_slot ...

`python -m launch.program.loopback_cluster start ...` is `ray start ...` that keeps 127.0.0.1. Plain
`ray start --node-ip-address 127.0.0.1` does not: Ray replaces a loopback address by the host's routable one
(`services.resolve_ip_for_localhost`) unless "single-machine mode" is on (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0),
and in that mode `ray start --address` refuses to add a node. So the Ray processes run in single-machine mode
(they resolve every address to 127.0.0.1) while this command, which only starts them, keeps loopback
addresses as given. Clients of such a cluster (drivers) resolve loopback the same way: `launch.program.ray_runner`
does it for any 127.x address.

`LoopbackCluster` starts the head and the nodes with free ports and one temp dir each, kills a node (its
raylet and every process under it) to simulate a lost machine, checks that nothing listens beyond loopback, and
stops everything it started by process id (never `ray stop`, which would end every Ray of this user).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

import psutil

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 90.0
OBJECT_STORE_BYTES = 256 * 2**20  # per node; Ray would take 30% of the machine's memory each
_REPO = Path(__file__).resolve().parents[1]
_SINGLE_MACHINE_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def is_loopback(host: str) -> bool:
    """True for "localhost" and any 127.x / ::1 address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def main(argv: Sequence[str] | None = None) -> None:
    """`ray start ARGS` with loopback addresses kept (see the module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    os.environ.update(_SINGLE_MACHINE_ENV)  # inherited by every process `ray start` launches
    from ray._private import ray_constants, services  # pylint: disable=import-outside-toplevel

    # This process only: pass `ray start --address`'s single-machine check, keep 127.0.0.1 as given.
    ray_constants.ENABLE_RAY_CLUSTER = True
    resolve = services.resolve_ip_for_localhost
    services.resolve_ip_for_localhost = lambda host: LOOPBACK if is_loopback(host) else resolve(host)
    from ray.scripts.scripts import main as ray_main  # pylint: disable=import-outside-toplevel

    sys.argv = ["ray", *args]
    ray_main()


# ------------------------------------------------------------------------------------------------------
# A cluster of such nodes, driven from Python (tests)
# ------------------------------------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """`n` distinct ports that were free on 127.0.0.1 a moment ago (held together, so no duplicates)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _free_port_range(size: int, attempts: int = 200) -> tuple[int, int]:
    """A run of `size` consecutive free ports (Ray's worker ports)."""
    rng = secrets.SystemRandom()
    for _ in range(attempts):
        first = rng.randrange(20_000, 32_000 - size)
        socks = []
        try:
            for port in range(first, first + size):
                s = socket.socket()
                socks.append(s)
                s.bind((LOOPBACK, port))
            return first, first + size - 1
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {size} consecutive free ports found")


@dataclasses.dataclass
class RayNodeProcess:
    """One `ray start`ed node: its temp dir (every process of the node names it) and resources."""

    name: str
    temp_dir: Path
    resources: Mapping[str, float]
    pids: set[int] = dataclasses.field(default_factory=set)

    def processes(self) -> list[psutil.Process]:
        """The node's live processes: those whose command line names its temp dir, and their descendants
        (Ray's worker processes rename themselves to `ray::...`, but stay children of the raylet)."""
        found: dict[int, psutil.Process] = {}
        marker = str(self.temp_dir)
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.info["pid"] in self.pids or any(marker in a for a in p.info["cmdline"] or ()):
                    found[p.pid] = p
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        for p in list(found.values()):
            try:
                for c in p.children(recursive=True):
                    found[c.pid] = c
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.pids.update(found)
        return list(found.values())

    def kill(self) -> None:
        """SIGKILL every process of the node at once (a machine that vanished, no goodbye to the GCS)."""
        for _ in range(3):  # a process may fork while we kill: sweep until none is left
            procs = self.processes()
            if not procs:
                return
            for p in procs:
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(procs, timeout=5)


class LoopbackCluster:
    """A head plus worker nodes on 127.0.0.1, with token authentication and free ports.

    Use as a context manager; `env` is what a client process (a driver) needs in its environment."""

    def __init__(self, root: str | os.PathLike | None = None):
        # Ray's sockets live under each node's temp dir, and a Unix socket path has at most 107 bytes:
        # the default root is short (/tmp/quarl-rc-XXXX), and removed again by stop().
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="quarl-rc-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.env: dict[str, str] = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
                                    **_SINGLE_MACHINE_ENV}
        # The raylets write their object-manager counters (debug_state.txt) every second, not every 10.
        # A dead node is noticed within ~3 s (health check every second, 3 misses) instead of ~15 s.
        self._node_env = {"RAY_debug_dump_period_milliseconds": "1000", "RAY_health_check_period_ms": "1000",
                          "RAY_health_check_failure_threshold": "3"}
        self.address: str | None = None
        self.nodes: dict[str, RayNodeProcess] = {}

    def __enter__(self) -> "LoopbackCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start_head(self, num_cpus: int, resources: Mapping[str, float] | None = None) -> str:
        """Starts the head node (no dashboard); returns the cluster address."""
        port, dashboard = free_ports(2)
        self._start("head", num_cpus, resources or {}, ["--head", "--node-ip-address", LOOPBACK,
                                                      "--port", str(port), "--include-dashboard", "false",
                                                      "--dashboard-port", str(dashboard)])
        self.address = f"{LOOPBACK}:{port}"
        return self.address

    def add_node(self, name: str, num_cpus: int, resources: Mapping[str, float] | None = None) -> RayNodeProcess:
        """Starts a worker node that joins the head, offering `num_cpus` CPUs and custom `resources`."""
        if self.address is None:
            raise RuntimeError("start_head first")
        return self._start(name, num_cpus, resources or {}, ["--address", self.address])

    def _start(self, name: str, num_cpus: int, resources: Mapping[str, float], role: list[str]) -> RayNodeProcess:
        if name in self.nodes:
            raise ValueError(f"node {name!r} exists")
        temp_dir = self.root / name
        temp_dir.mkdir(parents=True, exist_ok=True)
        node = RayNodeProcess(name, temp_dir, dict(resources))
        self.nodes[name] = node
        ports = free_ports(6)
        low, high = _free_port_range(40)
        args = [*role, "--node-manager-port", str(ports[0]), "--object-manager-port", str(ports[1]),
                "--runtime-env-agent-port", str(ports[2]), "--dashboard-agent-grpc-port", str(ports[3]),
                "--dashboard-agent-listen-port", str(ports[4]), "--metrics-export-port", str(ports[5]),
                "--min-worker-port", str(low), "--max-worker-port", str(high), "--num-cpus", str(num_cpus),
                "--resources", json.dumps(dict(resources)), "--temp-dir", str(temp_dir),
                "--object-store-memory", str(OBJECT_STORE_BYTES), "--disable-usage-stats", "--log-style", "record"]
        env = {**os.environ, **self.env, **self._node_env}
        # Every process of the node imports this project (Ray workers run its nodes and tasks).
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH", "")) if p)
        env.pop("RAY_ADDRESS", None)
        log = open(temp_dir / "ray_start.log", "wb")  # pylint: disable=consider-using-with
        try:
            proc = subprocess.run([sys.executable, "-m", "launch.program.loopback_cluster", "start", *args],
                                  stdout=log, stderr=subprocess.STDOUT, env=env, timeout=START_TIMEOUT_S,
                                  start_new_session=True, check=False, cwd=_REPO)
        except subprocess.TimeoutExpired:
            node.kill()
            raise RuntimeError(f"ray start of node {name!r} took over {START_TIMEOUT_S:.0f} s "
                               f"(log: {temp_dir / 'ray_start.log'})") from None
        finally:
            log.close()
        node.processes()  # remember the pids while the tree is intact
        if proc.returncode != 0:
            node.kill()
            tail = (temp_dir / "ray_start.log").read_text(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"ray start of node {name!r} failed: {' '.join(tail)}")
        return node

    def chunks_received(self, name: str) -> int:
        """Object chunks node `name`'s object manager received from other nodes so far (Ray's raylet
        debug dump, refreshed every second): objects up to 5 MiB are one chunk, so this counts the objects
        that crossed to the node."""
        path = self.nodes[name].temp_dir / "session_latest" / "logs" / "debug_state.txt"
        for line in path.read_text(errors="replace").splitlines():
            if line.strip().startswith("- num chunks received total:"):
                return int(line.rsplit(":", 1)[1])
        raise RuntimeError(f"no chunk counter in {path}")

    def kill_node(self, name: str) -> None:
        self.nodes[name].kill()

    def listening(self) -> list[tuple[str, str, int]]:
        """(node, ip, port) of every listening TCP socket of the cluster's processes."""
        out = []
        for name, node in self.nodes.items():
            for p in node.processes():
                try:
                    conns = p.net_connections(kind="tcp")
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                out += [(name, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
        return out

    def processes(self) -> list[psutil.Process]:
        return [p for node in self.nodes.values() for p in node.processes()]

    def stop(self) -> None:
        """Kill every process of every node (workers first, then the head)."""
        for name in sorted(self.nodes, key=lambda n: n == "head"):
            self.nodes[name].kill()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)


def wait_for_nodes(count: int, timeout_s: float = 60.0) -> list[dict[str, object]]:
    """The alive nodes of the cluster this process is connected to, once there are `count` of them."""
    import ray  # pylint: disable=import-outside-toplevel

    deadline = time.monotonic() + timeout_s
    while True:
        alive = [n for n in ray.nodes() if n["Alive"]]
        if len(alive) >= count or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


if __name__ == "__main__":
    main()
