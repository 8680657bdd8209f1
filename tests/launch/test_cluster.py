"""The cluster path on a real multi-node Ray: a head and worker nodes on this machine, loopback only
(`launch.program.loopback_cluster`, what README "On a cluster" shows), one cluster for the module.

Proves: every node, port and connection of the cluster is on 127.0.0.1; `launch.actorq --ray-address` with
`--actor-resource` runs every actor on the worker node and the learner and services on the head; each weight
version crosses to the actors' node at most once, not once per actor; a worker node killed mid-run is named in
events.log and ends the run with one line and exit 1; an on-policy (PPO) run puts its rollout actors on the worker and
trains on their rollouts on the head; `launch.reproduce --ray-address` runs a tiny grid as Ray
tasks into the usual folder and report; no process of the cluster is left afterwards. Every wait is bounded.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis.runs import is_finished
from launch.program.loopback_cluster import LoopbackCluster

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 240
# Tiny DQN with a 384x384 network: its int8 payload (~150 kB) is above Ray's 100 kB inline limit, so it
# travels through the object store, whose transfers the raylet counts.
TINY_ACTORQ = ["--agent", "dqn", "--task", "CartPole-v1", "--precision", "int8", "--num-actors", "2",
               "--set", "hidden_sizes=384,384", "--set", "min_replay_size=100", "--set", "batch_size=32",
               "--set", "samples_per_insert=8", "--backend", "onnx", "--eval-every", "300",
               "--eval-episodes", "1", "--insert-batch", "32", "--no-progress"]


@pytest.fixture(scope="module")
def cluster():
    """Head (3 CPUs, resource learner_slot) + node w1 (2 CPUs, resource actor_slot). On teardown every
    process of the cluster is killed, and none may be left."""
    c = LoopbackCluster()  # a short temp root: Ray's socket paths must stay under 107 bytes
    try:
        c.start_head(3, {"learner_slot": 1})
        c.add_node("w1", 2, {"actor_slot": 2})
        yield c
    finally:
        c.stop()
        left = c.processes()
        assert not left, f"cluster processes left: {[p.pid for p in left]}"


def _env(c: LoopbackCluster) -> dict[str, str]:
    env = {**os.environ, **c.env}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("RAY_ADDRESS", None)
    return env


def _actorq(c: LoopbackCluster, logdir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launch.actorq", "--ray-address", str(c.address),
                             "--logdir", str(logdir), *TINY_ACTORQ, *extra], cwd=REPO, env=_env(c),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _node_ids(c: LoopbackCluster) -> dict[str, str]:
    """Our node name -> Ray node id, from the cluster's node table (via `ray list`-free GCS access)."""
    out = subprocess.run([sys.executable, "-c", (
        "import json, ray; from launch.program.ray_runner import init_ray; init_ray(%r); "
        "print(json.dumps([[n['NodeID'], n['NodeManagerAddress'], n['Alive'], n['Resources']] "
        "for n in ray.nodes()]))") % c.address], cwd=REPO, env=_env(c), capture_output=True, text=True,
        timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_node_and_port_is_on_loopback(cluster: LoopbackCluster) -> None:
    table = _node_ids(cluster)
    assert len(table) == 2 and all(alive for _, _, alive, _ in table)
    assert {addr for _, addr, _, _ in table} == {"127.0.0.1"}
    listening = cluster.listening()
    assert {n for n, _, _ in listening} == {"head", "w1"}
    assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for _, ip, _ in listening), listening


@pytest.mark.slow  # the default suite keeps the loopback and lost-node tests
def test_actors_run_on_the_worker_node_and_each_version_crosses_once(cluster: LoopbackCluster,
                                                                     tmp_path: Path) -> None:
    worker = next(i for i, _, _, res in _node_ids(cluster) if res.get("actor_slot"))
    before = cluster.chunks_received("w1")
    # Weights change rarely (every 40 learner steps) and actors ask often (every 10 steps): both actors
    # fetch most versions, so per-actor transfers would be about twice the versions they fetch.
    proc = _actorq(cluster, tmp_path / "run", "--actor-resource", "actor_slot", "--learner-resource",
                   "learner_slot", "--max-actor-steps", "800", "--publish-period", "40",
                   "--actor-update-period", "10")
    out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, err[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    placement = summary["placement"]
    assert {placement[f"actor_{i}"] for i in range(2)} == {worker}
    assert worker not in {placement[n] for n in ("learner", "replay", "counter", "weights", "evaluator")}
    assert all(a["total_steps"] > 0 for a in summary["actors"])
    time.sleep(2.5)  # the raylet's counters are dumped every second
    crossed = cluster.chunks_received("w1") - before
    fetched = sum(int(a["times"]["updates"]) for a in summary["actors"])
    versions = int(summary["payload"]["published"])  # each encoded once and put once by the learner
    # The learner may publish its last versions after the actors have stopped, so `fetched` is compared with
    # what crossed, not with what was published: a version fetched by both actors crosses once, so fewer
    # transfers than fetches shows the actors shared it, and no more transfers than versions shows none
    # crossed twice.
    assert versions >= 2 and fetched >= 2, (fetched, versions)
    assert 1 <= crossed < fetched, (crossed, versions, fetched)
    assert crossed <= versions, (crossed, versions, fetched)


@pytest.mark.slow  # as above
def test_on_policy_actors_run_on_the_worker_node_and_hand_rollouts_to_the_head(cluster: LoopbackCluster,
                                                                              tmp_path: Path) -> None:
    """`launch.actorq --agent ppo` on the cluster: 2 int8 rollout actors on the worker node, the synchronous learner
    and the services on the head; every update takes one rollout from each actor across the nodes."""
    worker = next(i for i, _, _, res in _node_ids(cluster) if res.get("actor_slot"))
    argv = ["--agent", "ppo", "--task", "CartPole-v1", "--precision", "int8", "--num-actors", "2", "--backend", "onnx",
            "--set", "num_envs=2", "--max-actor-steps", "2048", "--eval-every", "1024", "--eval-episodes", "1",
            "--actor-resource", "actor_slot", "--learner-resource", "learner_slot", "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-m", "launch.actorq", "--ray-address", str(cluster.address),
                             "--logdir", str(tmp_path / "run"), *argv], cwd=REPO, env=_env(cluster),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, err[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    placement = summary["placement"]
    assert {placement[f"actor_{i}"] for i in range(2)} == {worker} and "replay" not in placement
    assert worker not in {placement[n] for n in ("learner", "counter", "weights", "evaluator")}
    info = summary["learner"]["on_policy"]
    assert summary["learner_steps"] >= 2 and info["rollouts_trained"] >= 2 * summary["learner_steps"] - 1
    assert all(a["rollouts"] >= 2 for a in summary["actors"]), summary["actors"]


@pytest.mark.slow  # as above
def test_reproduce_grid_runs_as_tasks_on_the_cluster(cluster: LoopbackCluster, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "launch.reproduce", "--panels", "CartPole", "--precisions", "32,8",
            "--seeds", "0", "--budget", "tiny", "--runner", "single", "--out", str(tmp_path), "--name", "g",
            "--ray-address", str(cluster.address), "--no-progress"]
    done = subprocess.run(argv, cwd=REPO, env=_env(cluster), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    root = tmp_path / "g"
    for precision in ("fp32", "int8"):
        summary = json.loads((root / "runs" / "CartPole" / precision / "seed0" / "summary.json").read_text())
        assert is_finished(summary) and summary["actor_steps"] >= 300
    assert (root / "figure.png").stat().st_size > 0 and (root / "report.md").exists()
    assert json.loads((root / "grid.json").read_text())["cluster"] is True
    assert not list(root.rglob(".unpack-*"))
    # Resumable as on one machine: nothing left to run.
    again = subprocess.run(argv, cwd=REPO, env=_env(cluster), capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)
    assert again.returncode == 0 and "0 run(s) ran, 2 were already done" in again.stderr


# Each node of an ActorQ program (EnvProbe stand-ins, launch.program.devices' environments) placed as a cluster run
# places them, reporting where its JAX runs: prints {"reports": {node: report}, "placement": {node: ray node}}.
_PROBE_PROGRAM = """
import json, sys
from launch.distributed.actorq_graph import build_actorq_program
from launch.program.ray_runner import RayRunner
from tests.launch.test_devices import PROBES
from tests.launch.tiny import tiny_config
config = tiny_config(sys.argv[2], num_actors=1, actor_resources={"actor_slot": 1},
                     learner_resources={"learner_slot": 0.01}, learner_device="cpu")
program = build_actorq_program(config, PROBES)
launch = RayRunner(sys.argv[1]).launch(program)
try:
    launch.wait_ready(timeout=200)
    out = {"reports": {n: launch.handles[n].call("probe") for n in program.names()}, "placement": launch.placement()}
finally:
    launch.shutdown()
print(json.dumps(out))
"""


@pytest.mark.slow  # the default suite: tests/launch/test_devices.py
def test_nodes_on_every_cluster_machine_run_jax_on_the_cpu_with_cuda_hidden(cluster: LoopbackCluster,
                                                                          tmp_path: Path) -> None:
    """The environments travel with the nodes (Ray's runtime_env): the actor on the worker node and the
    services on the head see no GPU, whatever their node's raylet was started with."""
    done = subprocess.run([sys.executable, "-c", _PROBE_PROGRAM, str(cluster.address), str(tmp_path)], cwd=REPO,
                          env=_env(cluster), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    worker = next(i for i, _, _, res in _node_ids(cluster) if res.get("actor_slot"))
    assert out["placement"]["actor_0"] == worker != out["placement"]["replay"]
    for name, report in out["reports"].items():
        assert report["env"]["JAX_PLATFORMS"] == "cpu" and report["env"]["CUDA_VISIBLE_DEVICES"] == "", name
        assert report["platform"] == "cpu", (name, report)


def _rows(path: Path) -> int:
    return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0


def test_a_lost_worker_node_is_named_and_ends_the_run(cluster: LoopbackCluster, tmp_path: Path) -> None:
    """Kills w1, the only node offering actor_slot: the last test of the module that uses the cluster."""
    logdir = tmp_path / "run"
    proc = _actorq(cluster, logdir, "--actor-resource", "actor_slot", "--learner-resource", "learner_slot",
                   "--max-actor-steps", "1000000")
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not all(_rows(logdir / f"actor_{i}.csv") for i in range(2)) and time.monotonic() < deadline \
                and proc.poll() is None:
            time.sleep(0.2)
        assert all(_rows(logdir / f"actor_{i}.csv") for i in range(2)), "actors never acted"
        cluster.kill_node("w1")
        t_kill = time.monotonic()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-2000:]
    assert time.monotonic() - t_kill < 60
    last = err.strip().splitlines()[-1]
    assert last.startswith("launch.actorq: cluster node ") and "actor_0, actor_1" in last, last
    events = (logdir / "events.log").read_text()
    assert "lost; it hosted actor_0, actor_1" in events
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["status"] == "failed" and len(summary["lost_hosts"]) == 1


@pytest.mark.parametrize("module, argv, message", [
    ("actorq", ["--actor-resource", "=2"], "--actor-resource wants NAME"),
    ("actorq", ["--actor-resource", "slot=0"], "must be finite and > 0"),
    ("actorq", ["--actor-resource", "slot=nan"], "must be finite and > 0"),
    ("actorq", ["--learner-resource", "head=2"], "--learner-resource takes a resource NAME"),
    ("actorq", ["--actor-resource", "slot", "--runner", "local"], "need --runner ray"),
    ("reproduce", ["--ray-address", "127.0.0.1:1", "--runner", "actorq"], "use --runner single"),
    ("reproduce", ["--ray-address", " "], "--ray-address must not be empty"),
    ("reproduce", ["--cpus-per-run", "0"], "--cpus-per-run must be a positive number"),
])
def test_bad_cluster_flags_are_one_line_and_exit_2(module: str, argv: list[str], message: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    from launch import actorq, reproduce  # pylint: disable=import-outside-toplevel

    main = {"actorq": actorq.main, "reproduce": reproduce.main}[module]
    extra = ["--logdir", str(tmp_path / "run")] if module == "actorq" else ["--out", str(tmp_path)]
    with pytest.raises(SystemExit) as e:
        main([*argv, *extra])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not any(tmp_path.iterdir())


def test_unpack_refuses_paths_outside_the_run_folder(tmp_path: Path) -> None:
    import io  # pylint: disable=import-outside-toplevel
    import tarfile  # pylint: disable=import-outside-toplevel

    from launch.grid.cluster import unpack  # pylint: disable=import-outside-toplevel

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(tarfile.TarError):
        unpack(buf.getvalue(), tmp_path / "runs" / "r")
    assert not (tmp_path / "runs" / "escape.txt").exists() and not (tmp_path / "runs" / "r").exists()
    assert not list((tmp_path / "runs").iterdir())



@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1:6379", True), ("localhost:6379", True), ("127.0.0.2:1", True), ("[::1]:6379", True),
    ("10.0.0.5:6379", False), ("head.example:6379", False), ("ray://127.0.0.1:10001", True), ("", False)])
def test_a_loopback_address_is_joined_on_loopback(address: str, loopback: bool) -> None:
    from launch.program.ray_runner import _is_loopback_address  # pylint: disable=import-outside-toplevel

    assert _is_loopback_address(address) is loopback
