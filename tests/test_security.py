"""Security properties of what the project reads back and what it exposes (issue #6).

- No read-back path unpickles: payload decoding, checkpoint restore (orbax learner state, npz replay
  snapshot, manifests), replay server resume, run summaries/CSVs, and `quarl.quant.policy_io.load_policy` are run
  with every unpickling entry point replaced by one that fails the test.
- A private local Ray listens on the loopback interface only (slow: starts Ray in a subprocess).
- A run's log directory holds no environment variable values or credentials (slow: runs the CLI).
"""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
TINY_DQN = {"hidden_sizes": (16, 16), "min_replay_size": 100, "batch_size": 32, "samples_per_insert": 8.0}


class Unpickled(AssertionError):
    """Raised by the patched unpickling entry points."""


def _forbid_unpickling(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replaces every unpickling entry point (pickle, _pickle, cloudpickle, numpy's allow_pickle) with one that
    records the call and raises. Returns the record, so a caller that swallows the error still fails."""
    import pickle

    import _pickle

    calls: list[str] = []

    def forbidden(name: str):
        def fail(*args, **kwargs):
            calls.append(name)
            raise Unpickled(f"{name} called: read-back paths must never unpickle")
        return fail

    for module in (pickle, _pickle):
        for name in ("load", "loads", "Unpickler"):
            monkeypatch.setattr(module, name, forbidden(f"{module.__name__}.{name}"))
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - Ray brings it
        cloudpickle = None
    if cloudpickle is not None:
        for name in ("load", "loads"):
            monkeypatch.setattr(cloudpickle, name, forbidden(f"cloudpickle.{name}"), raising=False)

    real_np_load = np.load

    def np_load(*args, **kwargs):
        if kwargs.get("allow_pickle", False):
            calls.append("numpy.load(allow_pickle=True)")
            raise Unpickled("numpy.load with allow_pickle=True")
        return real_np_load(*args, **kwargs)

    monkeypatch.setattr(np, "load", np_load)
    import numpy.lib.format as npformat

    real_read_array = npformat.read_array

    def read_array(fp, allow_pickle=False, *args, **kwargs):
        if allow_pickle:
            calls.append("numpy.lib.format.read_array(allow_pickle=True)")
            raise Unpickled("numpy read_array with allow_pickle=True")
        return real_read_array(fp, False, *args, **kwargs)

    monkeypatch.setattr(npformat, "read_array", read_array)
    return calls


def test_no_read_back_path_unpickles(tmp_path, monkeypatch):
    from launch.experiments import checkpoint as ckpt
    from launch.distributed.nodes.services import Counter, ReplayServer
    from analysis.schema import read_evals
    from launch.experiments.agent_spec import AgentSpec, table_spec
    from analysis.runs import read_evaluator, read_summary
    from quarl.quant.payload import decode_payload, encode_payload
    from quarl.quant.quantization import quantize_params
    from quarl.quant.policy_io import load_policy, save_policy

    # Everything is written first, with pickle intact.
    agent = AgentSpec("dqn", "CartPole-v1", TINY_DQN)
    builder, env_spec = agent.builder(), agent.env_spec()
    spec = builder.policy_spec(env_spec)
    rng = np.random.default_rng(0)
    params, width = {}, spec.input_dim
    for layer in spec.linear_layers:
        params[layer.name] = {"w": rng.normal(size=(width, layer.out)).astype(np.float32),
                              "b": rng.normal(size=layer.out).astype(np.float32)}
        width = layer.out
    payload = encode_payload(quantize_params(params, "int8"), version=5, spec_hash=spec.digest())
    save_policy(tmp_path / "run", spec, params, task="CartPole-v1", agent="dqn", steps=5)

    table = table_spec(builder, env_spec)
    server = ReplayServer(table, seed=0)
    n = TINY_DQN["min_replay_size"]
    server.insert({"observation": rng.normal(size=(n, 4)).astype(np.float32), "action": np.zeros(n, np.int32),
                   "reward": np.ones(n, np.float32), "discount": np.ones(n, np.float32),
                   "next_observation": np.zeros((n, 4), np.float32)})
    learner_state = {"params": {"w": np.ones((4, 3), np.float32)}, "steps": np.asarray(5, np.int64),
                     "opt": [np.zeros(3, np.float32), {"count": np.asarray(1, np.int32)}]}
    manifest = {"run_config": {"agent": "dqn", "task": "CartPole-v1"}, "agent_config": {},
                "counts": {"actor_steps": 100, "learner_steps": 5, "wall_clock_s": 1.0}}
    directory = ckpt.write_checkpoint(tmp_path / "run", step=5, learner_state=learner_state,
                                      save_replay_to=server.save, manifest=manifest)
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"status": "completed", "actor_steps": 100}))
    (tmp_path / "run" / "evaluator.csv").write_text("actor_steps,wall_clock_s,return\n100,1.5,20.0\n")

    calls = _forbid_unpickling(monkeypatch)
    import pickle

    with pytest.raises(Unpickled):  # the guard itself works
        pickle.loads(b"\x80\x04K\x01.")
    calls.clear()

    # Payload decode (what every actor does with bytes from the wire).
    assert decode_payload(payload).version == 5
    # Checkpoint restore: index, manifest (+ every checksum), orbax learner state, npz replay snapshot.
    found = ckpt.find_checkpoint(tmp_path / "run")
    assert found == directory
    ckpt.read_manifest(found)
    restored = ckpt.restore_learner(found / ckpt.LEARNER_DIR, learner_state)
    np.testing.assert_array_equal(np.asarray(restored["params"]["w"]), learner_state["params"]["w"])
    state = ckpt.load_replay(found / ckpt.REPLAY_FILE, ckpt.read_manifest(found)["checksums"][ckpt.REPLAY_FILE])
    assert int(state["inserts"]) == n
    # The nodes' own resume paths (replay server, counter).
    assert ReplayServer(table, seed=0, resume=str(tmp_path / "run")).info()["size"] == n
    assert Counter(resume=str(tmp_path / "run")).get()["actor_steps"] == 100
    # Results and summaries.
    assert read_summary(tmp_path / "run")["status"] == "completed"
    assert list(read_evaluator(tmp_path / "run")["return"]) == [20.0]
    assert read_evals(tmp_path / "run" / "evaluator.csv")[0]["return"] == 20.0
    # A saved policy (what launch.ptq --checkpoint reads).
    loaded = load_policy(tmp_path / "run")
    np.testing.assert_array_equal(loaded.params["linear_0"]["w"], params["linear_0"]["w"])
    assert calls == [], f"unpickling was attempted: {calls}"


# ------------------------------------------------------------------------------------------------ Ray (slow)


_BIND_PROBE = r"""
import json, os, sys
import psutil
from launch.program.ray_runner import init_ray
init_ray(None, num_cpus=1)
import ray

@ray.remote(num_cpus=0)
class Echo:
    def ping(self):
        return os.getpid()

echo = Echo.remote()
ray.get(echo.ping.remote())  # a worker process with its own gRPC server is up
procs = [psutil.Process()] + psutil.Process().children(recursive=True)
sockets = []
for p in procs:
    for c in p.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN or not c.raddr:
            sockets.append({"pid": p.pid, "name": p.name(), "ip": c.laddr.ip, "port": c.laddr.port})
out = {"gcs": ray.get_runtime_context().gcs_address, "node_ips": [n["NodeManagerAddress"] for n in ray.nodes()],
       "sockets": sockets, "processes": len(procs)}
ray.shutdown()
print(json.dumps(out))
"""


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.mark.slow
def test_private_local_ray_listens_on_loopback_only():
    """Every socket any process of a private local Ray listens on (GCS, raylet, object manager, agents, a
    worker) is bound to 127.0.0.1, and Ray advertises 127.0.0.1 as the node and GCS address."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run([sys.executable, "-c", _BIND_PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["gcs"].startswith("127.0.0.1:")
    assert report["node_ips"] == ["127.0.0.1"]
    assert len(report["sockets"]) >= 3 and report["processes"] >= 3  # GCS, raylet, worker at least
    exposed = [s for s in report["sockets"] if not _is_loopback(s["ip"])]
    assert not exposed, f"sockets reachable from other hosts: {exposed}"


@pytest.mark.slow
def test_run_logs_and_summary_hold_no_environment_values_or_credentials(tmp_path):
    """A tiny distributed run with a fake secret and a fake Ray token in its environment: no file the run
    writes (CSV, TensorBoard events, events.log, checkpoints, policy, energy reports, summary.json) contains
    either value, nor the value of any other environment variable that looks like a credential."""
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    token = uuid.uuid4().hex + uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"QUARL_TEST_SECRET": secret, "RAY_AUTH_TOKEN": token, "RAY_AUTH_MODE": "token",
                "AWS_SECRET_ACCESS_KEY": f"aws-{secret}"})
    logdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "launch.actorq", "--agent", "dqn", "--max-actor-steps", "400", "--num-actors", "1",
           "--logdir", str(logdir), "--no-progress", "--backend", "onnx", "--eval-every", "400",
           "--eval-episodes", "1", "--checkpoint-every", "20", "--set", "hidden_sizes=16,16",
           "--set", "min_replay_size=100", "--set", "batch_size=32"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = [p for p in logdir.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"summary.json", "learner.csv", "actor_0.csv", "events.log", "policy_fp32.qrlp"} <= names
    assert any(p.match("checkpoints/step_*/manifest.json") for p in files)
    credential_like = [v for k, v in env.items()
                       if any(w in k.upper() for w in ("SECRET", "TOKEN", "PASSWORD", "KEY", "CREDENTIAL"))
                       and len(v) >= 8]
    needles = {secret, token, f"aws-{secret}", *credential_like}
    for path in files:
        data = path.read_bytes()
        for needle in needles:
            assert needle.encode() not in data, f"{path.relative_to(logdir)} contains an environment value"
    summary = json.loads((logdir / "summary.json").read_text())
    text = json.dumps(summary)
    assert "QUARL_TEST_SECRET" not in text and "RAY_AUTH_TOKEN" not in text
