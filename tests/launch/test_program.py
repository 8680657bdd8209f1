"""The ActorQ program without Ray: graph description, the one-way weight path, checkpoints, the
single-process runner end to end, and CLI validation (bad flags exit 2 before Ray is even imported)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from launch.distributed.actorq_graph import build_actorq_program
from launch.distributed.nodes.learner import LearnerNode
from launch.distributed.nodes.services import Counter, ReplayServer, WeightServer
from launch.distributed.nodes.shared_blob import Blob
from launch.distributed.nodes.weights_client import PolicyClient
from launch.distributed.supervisor import run_program
from launch.experiments import checkpoint as ckpt
from launch.experiments.agent_spec import AgentSpec, derive_seed
from launch.experiments.stages import StageTimes
from launch.program.graph import SINGLE_THREAD_ENV, Handle, Node, Program
from launch.program.local_runner import DaemonPool, LocalLaunch, LocalNodeHandle, LocalRunner
from quarl.policy.spec import layer_norm_mlp_policy
from quarl.quant.payload import decode_payload, encode_payload, fp32_payload_nbytes
from quarl.quant.policy_io import load_policy
from quarl.quant.quantization import quantize_params
from tests.agents.executed import assert_integer_kernel_ran
from tests.launch.tiny import TINY_DQN, assert_cartpole_evaluations, tiny_config, wait_until

REPO = Path(__file__).resolve().parents[2]


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------------------------- program


def test_actorq_graph_has_every_node_with_its_placement(tmp_path):
    program = build_actorq_program(tiny_config(tmp_path, num_actors=3))
    names = [n.name for n in program.nodes]
    assert names == ["counter", "replay", "weights", "learner", "actor_0", "actor_1", "actor_2", "evaluator"]
    for name in ("actor_0", "actor_1", "actor_2", "evaluator"):
        node = program.node(name)
        assert node.num_cpus == 1 and dict(node.env_vars) == SINGLE_THREAD_ENV
        assert node.env_vars["OMP_NUM_THREADS"] == "1"
        assert "intra_op_parallelism_threads=1" in node.env_vars["XLA_FLAGS"]
    assert all(program.node(f"actor_{i}").max_restarts > 0 for i in range(3))
    # Blocked samplers must not block inserters: the replay server answers on several threads.
    assert program.node("replay").max_concurrency >= 3 + 2 + 1
    assert program.node("learner").accelerator == "auto"  # --learner-device auto: a GPU when the cluster has one
    assert set(program.node("actor_0").dependencies()) == {"counter", "replay", "weights"}
    assert program.names(kind="worker") == ["learner", "actor_0", "actor_1", "actor_2", "evaluator"]


def test_program_rejects_dangling_and_duplicate_nodes():
    program = Program("p")
    program.add(Node("a", Counter))
    with pytest.raises(ValueError, match="already has a node"):
        program.add(Node("a", Counter))
    with pytest.raises(ValueError, match="not in the program"):
        program.add(Node("b", Counter, {"other": Handle("missing")}))
    with pytest.raises(ValueError, match="needs run"):
        Node("w", Counter, kind="worker")


def test_derived_seeds_differ_per_node_and_run():
    seeds = {derive_seed(s, stream, i) for s in range(3) for stream in range(3) for i in range(4)}
    assert len(seeds) == 36


# ---------------------------------------------------------------------------------------------- weight path


def _policy_params(hidden=(256, 256, 256), obs_dim=5, seed=0):
    rng = np.random.default_rng(seed)
    spec = layer_norm_mlp_policy(obs_dim, hidden, [-1.0], [1.0])
    params, width = {}, obs_dim
    for layer in spec.linear_layers:
        params[layer.name] = {"w": rng.normal(0, 0.1, (width, layer.out)).astype(np.float32),
                              "b": rng.normal(0, 0.1, layer.out).astype(np.float32)}
        width = layer.out
    params["layer_norm"] = {"scale": np.ones(hidden[0], np.float32), "offset": np.zeros(hidden[0], np.float32)}
    return spec, params


def _blob(spec, params, version, precision="int8"):
    return Blob.put(encode_payload(quantize_params(params, precision), version=version, spec_hash=spec.digest()))


def test_weight_server_hands_out_the_latest_blob_once_per_version_whatever_the_number_of_actors():
    spec, params = _policy_params()
    w = WeightServer("int8")
    assert w.get_payload(-1) is None  # nothing published yet
    w.publish(10, _blob(spec, params, 10))
    payloads: list = []
    barrier = threading.Barrier(4)

    def actor() -> None:
        barrier.wait()
        payloads.append(w.get_payload(-1))

    threads = [threading.Thread(target=actor) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(payloads) == 4 and all(p is payloads[0] for p in payloads)  # one published object, shared
    assert decode_payload(payloads[0].get()).version == 10
    assert w.get_payload(10) is None  # the caller is up to date: no payload
    w.publish(5, _blob(spec, params, 5))  # older than the latest: ignored
    assert w.latest_version() == 10
    w.publish(20, _blob(spec, params, 20))
    assert decode_payload(w.get_payload(10).get()).version == 20
    stats = w.stats()
    assert stats["published"] == 3 and stats["not_modified"] == 2 and stats["payloads_served"] == 5


def test_a_long_poll_returns_the_next_version_as_soon_as_it_is_published_and_gives_up_after_its_wait(monkeypatch):
    """Margins hold on a loaded machine: the wake-up is told from the wait's end by a 30 s wait (the server's cap
    on a wait raised to match), not by a latency."""
    from launch.distributed.nodes import services

    monkeypatch.setattr(services, "MAX_WAIT_S", 30.0)
    spec, params = _policy_params()
    w = WeightServer("int8")
    w.publish(1, _blob(spec, params, 1))
    t0 = time.monotonic()
    assert w.get_payload(1, 0.2) is None and 0.15 <= time.monotonic() - t0 < 10.0  # nothing newer: waited, gave up
    got: list = []
    waiter = threading.Thread(target=lambda: got.append((w.get_payload(1, 30.0), time.monotonic())))
    waiter.start()
    # The waiter counts its request under the lock its wait releases: seen here, the waiter is in its wait.
    assert wait_until(lambda: w.stats()["requests"] == 2) and not got
    published_at = time.monotonic()
    w.publish(2, _blob(spec, params, 2))
    waiter.join(timeout=60)
    assert got and decode_payload(got[0][0].get()).version == 2
    assert got[0][1] - published_at < 10.0  # woken by the publication, not by its 30 s wait running out


def test_int8_payload_is_at_least_3_9x_smaller_than_fp32():
    """The paper's D4PG policy (2048x3): biases, scales and LayerNorm stay fp32, so small nets get less."""
    spec, params = _policy_params(hidden=(2048, 2048, 2048))
    data = _blob(spec, params, 1).get()
    assert fp32_payload_nbytes(params, version=1, spec_hash=spec.digest()) / len(data) >= 3.9


def test_learner_publishes_each_version_once_as_encoded_bytes_and_refuses_non_finite_weights(tmp_path):
    """The one-way weight path: the learner quantizes + encodes in its own process and publishes bytes that
    carry the spec's digest (not the spec, not an fp32 tree); non-finite weights stop it with a clear error."""
    agent = AgentSpec("dqn", "CartPole-v1", dict(TINY_DQN))
    server, pool = WeightServer("int8"), DaemonPool(2)
    learner = LearnerNode(agent, seed=0, replay=None, counter=None, weights=LocalNodeHandle(server, pool),
                                logdir=str(tmp_path), precision="8")
    learner.publish_now()
    blob = server.get_payload(-1)
    assert isinstance(blob.ref, bytes) and blob.nbytes == len(blob.ref)
    payload = decode_payload(blob.get())
    policy_spec = agent.builder().policy_spec(agent.env_spec())
    assert (payload.version, payload.precision, payload.spec) == (0, "int8", None)
    assert payload.spec_hash == policy_spec.digest()
    times = learner.publish_times.summary()
    handoff = learner.publish_times.handoff()
    assert times["versions"] == handoff["offered"] == 1 and times["payload_bytes"] == blob.nbytes
    assert times["quantize_encode_s"] > 0 and handoff["ms_per_version"] < times["quantize_encode_ms_per_version"]
    stats = server.stats()
    assert stats["fp32_payload_bytes"] == len(encode_payload(quantize_params(learner._learner.policy_params(),  # pylint: disable=protected-access
                                                                             "fp32"), version=0,
                                                             spec_hash=policy_spec.digest()))
    poisoned = learner._learner.policy_params()  # pylint: disable=protected-access
    first = next(iter(poisoned))
    poisoned[first]["w"] = np.full_like(poisoned[first]["w"], np.nan)
    learner._learner.policy_snapshot = lambda: poisoned  # pylint: disable=protected-access
    with pytest.raises(ValueError, match="NaN|non-finite"):
        learner.publish_now()
    assert server.latest_version() == 0 and learner.publish_times.versions == 1
    pool.shutdown()


def test_actor_weight_client_fetches_only_when_the_version_changed():
    spec, params = _policy_params(hidden=(32, 32))
    w = WeightServer("int8")
    times = StageTimes()
    client = PolicyClient(LocalNodeHandle(w, None), times, spec=spec, precision="int8")
    w.publish(3, _blob(spec, params, 3))
    first = client.fetch()
    assert first is not None and first.version == 3 and client.version == 3
    for _ in range(5):
        assert client.fetch() is None
    w.publish(4, _blob(spec, params, 4))
    assert client.fetch().version == 4
    assert (times.pulls, times.updates) == (7, 2)
    assert times.payload_bytes == 2 * w.stats()["payload_bytes"]
    assert w.stats()["payloads_served"] == 2


# ---------------------------------------------------------------------------------------------- checkpoints


def test_replay_snapshot_round_trips_and_detects_corruption(tmp_path):
    state = {"format_version": 1, "inserts": 5, "samples": 7, "deletes": 0,
             "keys": np.arange(5, dtype=np.int64), "priorities": np.ones(5),
             "data": {"observation": np.arange(10, dtype=np.float32).reshape(5, 2),
                      "action": np.arange(5, dtype=np.int32)}}
    meta = ckpt.save_replay(tmp_path / "r.npz", state)
    back = ckpt.load_replay(tmp_path / "r.npz", meta["sha256"])
    assert back["inserts"] == 5 and back["samples"] == 7 and meta["items"] == 5
    np.testing.assert_array_equal(back["data"]["observation"], state["data"]["observation"])
    with open(tmp_path / "r.npz", "r+b") as f:
        f.seek(-10, os.SEEK_END)
        f.write(b"corruption")
    with pytest.raises(ckpt.CheckpointError, match="checksum"):
        ckpt.load_replay(tmp_path / "r.npz", meta["sha256"])


def test_checkpoint_of_another_config_is_rejected_naming_the_field():
    manifest = {"run_config": {"agent": "dqn", "task": "CartPole-v1"},
                "agent_config": {"batch_size": 32, "hidden_sizes": [16, 16]}}
    ckpt.check_compatible(manifest, agent="dqn", task="CartPole-v1",
                          agent_config={"batch_size": 32, "hidden_sizes": (16, 16)})
    with pytest.raises(ckpt.CheckpointError, match="hidden_sizes"):
        ckpt.check_compatible(manifest, agent="dqn", task="CartPole-v1",
                              agent_config={"batch_size": 32, "hidden_sizes": (32, 32)})
    with pytest.raises(ckpt.CheckpointError, match="--task"):
        ckpt.check_compatible(manifest, agent="dqn", task="Acrobot-v1", agent_config={})


# ---------------------------------------------------------------------------------------------- local runner


def _read_csv(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_local_runner_runs_the_program_and_resumes_from_its_checkpoint(tmp_path):
    config = tiny_config(tmp_path / "run")
    summary, code = run_program(config, LocalRunner())
    assert code == 0 and summary["status"] == "completed", summary["error"]
    assert summary["actor_steps"] >= config.max_actor_steps and summary["learner_steps"] > 0
    assert summary["learner_device"]["platform"] == "cpu"  # read back from the learner (local runner: CPU)
    for name in ("learner.csv", "evaluator.csv", "actor_0.csv", "actor_1.csv", "summary.json"):
        assert (tmp_path / "run" / name).is_file(), name
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"
    evals = _read_csv(tmp_path / "run" / "evaluator.csv")
    assert evals and {"actor_steps", "wall_clock_s", "return"} <= set(evals[0])
    # 600 steps of a 16x16 net promise no learning: the evaluations are whole, consistently summed up episodes.
    assert_cartpole_evaluations(evals, config.eval_episodes)
    assert summary["final_eval_return"] == pytest.approx(float(evals[-1]["return"]))
    assert_integer_kernel_ran(summary)  # the int8 actors ran an integer kernel, not fp32 compute
    # One quantization per version, however many actors pulled it; actors only took new versions.
    payload = summary["payload"]
    assert payload["versions"] == payload["published"] >= 1  # each version encoded once, by the learner
    assert summary["runtime"]["updates"] <= payload["payloads_served"] <= payload["requests"]
    assert summary["runtime"]["pulls"] >= summary["runtime"]["updates"] >= 2  # first weights + refreshes

    # Energy: the run's total is the sum of what every node measured (emissions included).
    energy = summary["energy"]
    assert energy["total_kwh"] > 0 and energy["total_emissions_kg"] > 0
    assert energy["total_emissions_kg"] == pytest.approx(
        sum(n["emissions_kg_co2eq"] for n in energy["nodes"].values()))
    # The final learner policy, for launch.ptq --checkpoint RUN_DIR.
    policy = load_policy(tmp_path / "run")
    assert policy.steps == summary["learner_steps"] and (policy.agent, policy.task) == ("dqn", "CartPole-v1")
    assert summary["learner"]["policy_file"] == str(tmp_path / "run" / "policy_fp32.qrlp")
    assert "learner: saved the fp32 policy" in (tmp_path / "run" / "events.log").read_text()
    replay_rows = _read_csv(tmp_path / "run" / "replay.csv")
    assert replay_rows and int(replay_rows[-1]["inserts"]) == summary["replay"]["inserts"]

    steps_before = summary["learner_steps"]
    resumed = tiny_config(tmp_path / "run", max_actor_steps=900, resume=str(tmp_path / "run"))
    summary2, code2 = run_program(resumed, LocalRunner())
    assert code2 == 0, summary2["error"]
    assert summary2["learner"]["resumed_from"] == steps_before
    assert summary2["learner_steps"] > steps_before and summary2["actor_steps"] >= 900
    # The replay came back: the table holds the first run's items plus the new ones.
    assert summary2["replay"]["inserts"] >= summary["replay"]["inserts"] + 300 - 2 * config.distributed.insert_batch
    assert load_policy(tmp_path / "run").steps == summary2["learner_steps"]  # the resumed run's policy


def test_local_runner_cli_exits_once_the_summary_is_out(tmp_path):
    """`python -m launch.actorq --runner local` used to hang after printing its summary (threads left
    behind). The run itself may take long on a loaded machine; the exit after summary.json may not."""
    logdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "launch.actorq", "--runner", "local", "--agent", "dqn", "--max-actor-steps", "300",
           "--num-actors", "1", "--logdir", str(logdir), "--no-progress", "--backend", "onnx", "--eval-every", "300",
           "--eval-episodes", "1", "--set", "hidden_sizes=16,16", "--set", "min_replay_size=100"]
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out_path, "w", encoding="utf-8") as out_f, open(err_path, "w", encoding="utf-8") as err_f:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out_f, stderr=err_f, text=True)
        try:
            deadline = time.monotonic() + 600  # the run: slow on a loaded machine, but finite
            while proc.poll() is None and not (logdir / "summary.json").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert (logdir / "summary.json").exists(), err_path.read_text()[-2000:]
            proc.wait(timeout=120)  # after the summary: printing it and exiting, never an endless wait
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 120 s after writing summary.json; stderr: {err_path.read_text()[-1500:]}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out, err = out_path.read_text(), err_path.read_text()
    assert proc.returncode == 0, err[-2000:]
    assert "run folder:" in out  # the summary table was printed before exiting
    assert json.loads((logdir / "summary.json").read_text())["status"] == "completed"
    assert (logdir / "policy_fp32.qrlp").is_file()


def test_replay_server_round_trips_through_a_checkpoint(tmp_path):
    spec = AgentSpec("dqn", "CartPole-v1", TINY_DQN)
    from launch.experiments.agent_spec import table_spec

    table = table_spec(spec.builder(), spec.env_spec())
    server = ReplayServer(table, seed=0)
    n = TINY_DQN["min_replay_size"]  # more would block: the rate limiter waits for samples
    batch = {"observation": np.random.default_rng(0).normal(size=(n, 4)).astype(np.float32),
             "action": np.zeros(n, np.int32), "reward": np.ones(n, np.float32),
             "discount": np.full(n, 0.99, np.float32),
             "next_observation": np.zeros((n, 4), np.float32)}
    assert server.insert(batch) == n
    assert server.sample(8).data["observation"].shape == (8, 4)
    manifest = {"run_config": {"agent": "dqn", "task": "CartPole-v1"}, "agent_config": {}, "counts": {}}
    directory = ckpt.write_checkpoint(tmp_path, step=3, learner_state={"w": np.ones(2, np.float32)},
                                      save_replay_to=server.save, manifest=manifest)
    assert ckpt.find_checkpoint(tmp_path) == directory
    restored = ReplayServer(table, seed=0, resume=str(tmp_path))
    info = restored.info()
    assert (info["size"], info["inserts"], info["samples"]) == (n, n, 8)
    assert restored.sample(4).data["observation"].shape == (4, 4)


# ---------------------------------------------------------------------------------------------- CLI


_BAD_FLAGS = [
    ["--agent", "nope"],
    ["--agent", "dqn", "--qat-bits", "9"],
    ["--agent", "dqn", "--qat-bits", "4"],  # precision defaults to int8: QAT must train for what is deployed
    ["--agent", "dqn", "--task", "NoSuchTask-v0"],
    ["--agent", "dqn", "--precision", "int99"],
    ["--agent", "dqn", "--num-actors", "0"],
    ["--agent", "dqn", "--num-actors", "-1"],
    ["--agent", "dqn", "--actor-update-period", "0"],
    ["--agent", "dqn", "--backend", "tpu"],
    ["--agent", "dqn", "--set", "no_such_key=1"],
    ["--agent", "dqn", "--resume", "{tmp}/no_checkpoint_here"],
    ["--agent", "dqn", "--logdir", "{tmp}/a_file/sub"],
    ["--agent", "d4pg", "--task", "CartPole-v1"],
    # issue #6: the parts the list above did not cover
    ["--agent", "dqn", "--max-actor-steps", "0"],
    ["--agent", "dqn", "--publish-period", "0"],
    ["--agent", "dqn", "--eval-every", "-5"],
    ["--agent", "dqn", "--checkpoint-every", "-1"],
    ["--agent", "dqn", "--seed", "-1"],
    ["--agent", "dqn", "--target-return", "nan"],
    ["--agent", "dqn", "--num-actors", "two"],
    ["--agent", "dqn", "--no-such-flag"],
    ["--agent", "dqn", "--ray-address", " "],
    ["--agent", "dqn", "--precision", ""],
    ["--agent", "dqn", "--set", "hidden_sizes="],
    ["--agent", "dqn", "--logdir", "/proc/quarl_no_such_dir/run"],  # unwritable even for root
    ["--agent", "dqn", "--logdir", "{tmp}/read_only/run"],
    ["--agent", "dqn", "--resume", "{tmp}/corrupted_run"],
    ["--agent", "dqn", "--envs-per-actor", "0"],
]


def test_bad_flags_exit_2_with_one_line_before_ray_starts(tmp_path):
    """All cases in one subprocess (imports are the slow part); it reports each exit code and stderr, and
    whether `ray` was ever imported, which is a timing-independent proof that Ray was not started."""
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "no_checkpoint_here").mkdir()
    (tmp_path / "read_only").mkdir(mode=0o500)  # not writable (for root, only /proc above is)
    corrupted = ckpt.write_checkpoint(
        tmp_path / "corrupted_run", step=3, learner_state={"w": np.ones(4, np.float32)},
        save_replay_to=lambda p: ckpt.save_replay(p, {"format_version": 1, "inserts": 0, "samples": 0,
                                                      "deletes": 0, "keys": np.zeros(0, np.int64),
                                                      "priorities": np.zeros(0), "data": {}}),
        manifest={"run_config": {"agent": "dqn", "task": "CartPole-v1"}, "agent_config": {}, "counts": {}})
    victim = sorted(p for p in (corrupted / ckpt.LEARNER_DIR).rglob("*") if p.is_file())[-1]
    victim.write_bytes(victim.read_bytes()[:-1] + bytes([victim.read_bytes()[-1] ^ 0x01]))
    # Root may write into a 0o500 directory (only /proc-like places stop it): that case would start a run.
    flags = [f for f in _BAD_FLAGS if not (os.geteuid() == 0 and "{tmp}/read_only/run" in f)]
    cases = [[a.replace("{tmp}", str(tmp_path)) for a in argv] for argv in flags]
    cases = [c if "--logdir" in c else c + ["--logdir", str(tmp_path / f"never_{i}")] for i, c in enumerate(cases)]
    script = """
import contextlib, io, json, sys
from launch.actorq import main
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    out.append({"code": code, "stderr": err.getvalue()})
print(json.dumps({"results": out, "ray_imported": "ray" in sys.modules}))
"""
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ray_imported"] is False
    for argv, result in zip(cases, report["results"]):
        assert result["code"] == 2, (argv, result)
        lines = result["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("launch.actorq: error:"), (argv, result["stderr"])
    assert not any(p.name.startswith("never_") for p in tmp_path.iterdir())  # nothing written
    assert not list((tmp_path / "read_only").iterdir()) and not Path("/proc/quarl_no_such_dir").exists()
    messages = dict(zip((" ".join(c) for c in flags), (r["stderr"] for r in report["results"])))
    message = {" ".join(c[2:4]): messages[" ".join(c)] for c in flags if len(c) >= 4}
    assert "nope" in messages["--agent nope"] and "--num-actors" in message["--num-actors 0"]
    assert "--actor-update-period" in message["--actor-update-period 0"]
    assert "no checkpoint" in message["--resume {tmp}/no_checkpoint_here"]
    assert "--max-actor-steps" in message["--max-actor-steps 0"] and "--seed" in message["--seed -1"]
    assert "cannot be created" in message["--logdir /proc/quarl_no_such_dir/run"]
    if "--logdir {tmp}/read_only/run" in message:
        assert "cannot be created" in message["--logdir {tmp}/read_only/run"]
    assert "does not match its checksum" in message["--resume {tmp}/corrupted_run"]
    assert victim.name in message["--resume {tmp}/corrupted_run"]  # names the corrupted file


def test_unknown_carbon_country_is_a_usage_error_before_ray_starts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launch.actorq", "--no-progress", "--logdir", str(tmp_path / "run")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "QUARL_CARBON_COUNTRY": "ZZZ"})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "QUARL_CARBON_COUNTRY" in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()


def test_qat_bits_reaches_the_agent_config(tmp_path):
    from launch.actorq import build_parser, validate
    inv = validate(build_parser().parse_args(["--agent", "dqn", "--precision", "int4", "--qat-bits", "4",
                                              "--logdir", str(tmp_path / "run")]))
    assert inv.config.overrides["qat_bits"] == 4


@pytest.mark.parametrize("stop_path", ["budget", "stopped"])
def test_every_step_an_actor_takes_reaches_replay_at_a_stop(tmp_path, stop_path):
    """Transitions inserted == steps taken, whether the actors end at the budget or are told to stop mid-run
    (what Ctrl-C and a lost node do; here with 2 environments per actor): neither the insert buffer nor the open
    n-step windows of any environment are dropped."""
    config = tiny_config(tmp_path, max_actor_steps=10_000_000 if stop_path == "stopped" else 450,
                         insert_batch=50, eval_every=10_000_000, envs_per_actor=2 if stop_path == "stopped" else 1)

    def stop_actors_mid_run(launch):
        def stop_later():
            while launch.handles["counter"].call("get")["actor_steps"] < 400:
                time.sleep(0.05)
            for name in ("actor_0", "actor_1"):
                launch.handles[name].call("stop")
        threading.Thread(target=stop_later, daemon=True).start()

    summary, code = run_program(config, LocalRunner(),
                                on_launch=stop_actors_mid_run if stop_path == "stopped" else None)
    assert code == 0, summary["error"]
    inserted = [summary["actors"][i]["transitions_inserted"] for i in range(2)]
    assert summary["actor_steps"] >= 400
    assert summary["replay"]["inserts"] == sum(inserted) == summary["actor_steps"]


def test_a_run_is_solved_by_a_streak_of_evaluations_at_the_target():
    from analysis.schema import solved_at

    evals = [{"return": r, "actor_steps": 1000 * (i + 1)} for i, r in enumerate([100, 977, 630, 955, 990, 400])]
    assert solved_at(evals, 950.0, 1)["actor_steps"] == 2000
    assert solved_at(evals, 950.0, 2)["actor_steps"] == 5000  # 977 then 630 is not a streak
    assert solved_at(evals, 950.0, 3) is None and solved_at(evals, None, 1) is None


def test_the_default_job_is_d4pg_on_cartpole_balance_with_a_950_twice_stopping_rule(tmp_path):
    """launch.actorq's defaults, as parsed: D4PG on cartpole:balance for at most 60k actor steps, evaluated every
    2,500 and stopping at two evaluations in a row at 950 or more; another task has no default target. Only the
    configuration is checked here, not that the job reaches the target."""
    from launch.actorq import build_parser, validate

    config = validate(build_parser().parse_args(["--logdir", str(tmp_path / "run")])).config
    assert (config.agent, config.task, config.max_actor_steps) == ("d4pg", "cartpole:balance", 60_000)
    assert (config.target_return, config.target_streak, config.eval_every) == (950.0, 2, 2_500)
    other = validate(build_parser().parse_args(["--task", "walker:stand", "--logdir", str(tmp_path / "w")])).config
    assert other.target_return is None and other.target_streak == 1


RUNTIME_STAGES = {"env_step_s", "policy_s", "insert_s", "pull_s", "deserialize_s", "load_s", "quantize_encode_s"}
# Sections whose keys name things rather than fields (nodes, agent config fields, CPU checks): not compared.
FREE_FORM = {"energy.nodes", "experiment.overrides", "config", "placement", "actors[].kernel", "actors[].energy",
             "learner.energy"}


def _layout_differences(a, b, path=""):
    """Where two summaries differ in layout: key sets (recursively, `actors` entries alike) and value kinds
    (number vs text vs section), a None on either side standing for "this runner has no value"."""
    if path in FREE_FORM or a is None or b is None:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}: keys {sorted(set(a) ^ set(b))}"] if set(a) != set(b) else []
        for k in sorted(set(a) & set(b)):
            out += _layout_differences(a[k], b[k], f"{path}.{k}".lstrip("."))
        return out
    if isinstance(a, list) and isinstance(b, list):
        return [d for x in a for y in b for d in _layout_differences(x, y, f"{path}[]")]
    kinds = ["number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__
             for v in (a, b)]
    return [] if kinds[0] == kinds[1] else [f"{path}: {kinds[0]} vs {kinds[1]}"]


def test_both_runners_write_one_summary_layout_with_the_same_stages_units_and_versions(tmp_path):
    """One schema, one vocabulary: the single-process and the distributed runner write summary.json with the same
    keys (every section, every actors[] entry), the same stage names with the same meaning and units (seconds
    over the run, ms per update, µs per env step), and a weights version is the learner step it was published at."""
    from launch.experiments.acting import EPISODE_FIELDS, EVAL_FIELDS
    from launch.experiments.run_experiment import run_experiment
    from analysis.schema import SUMMARY_KEYS

    distributed, code = run_program(tiny_config(tmp_path / "ray", num_actors=1, max_actor_steps=400), LocalRunner())
    assert code == 0, distributed["error"]
    single = run_experiment(tiny_config(tmp_path / "single", num_actors=1, max_actor_steps=400, eval_every=200),
                            progress=False, energy=True)
    on_disk = [json.loads((tmp_path / name / "summary.json").read_text()) for name in ("ray", "single")]
    assert on_disk == json.loads(json.dumps([distributed, single]))  # what the runners return is what they wrote
    assert list(single) == list(distributed) == list(SUMMARY_KEYS)
    assert _layout_differences(*on_disk) == []
    # evaluator.csv and the per-episode actor log: one header each, written by the actor's loop in both runners.
    evaluator = [_csv_rows(tmp_path / name / "evaluator.csv") for name in ("ray", "single")]
    episodes = [_csv_rows(tmp_path / "ray" / "actor_0.csv"), _csv_rows(tmp_path / "single" / "actor.csv")]
    for rows in (*evaluator, *episodes):
        assert rows  # at least one evaluation / one finished episode in each run
    assert list(evaluator[0][0]) == list(evaluator[1][0]) == list(EVAL_FIELDS)
    assert list(episodes[0][0]) == list(episodes[1][0]) == list(EPISODE_FIELDS)
    for rows, run in zip(evaluator, (distributed, single)):  # each row's return is the mean of its episodes
        assert len(rows) == run["evaluations"] and float(rows[-1]["return"]) == pytest.approx(run["final_eval_return"])
        assert all(float(r["return_min"]) <= float(r["return"]) <= float(r["return_max"]) for r in rows)
        assert all(int(r["episodes"]) == 1 and r["weights_version"] != "" for r in rows)
    assert evaluator[0][-1]["train_clock_s"] == evaluator[0][-1]["wall_clock_s"]  # the evaluator is on the side
    assert all(r["return_fp32"] == "" for r in evaluator[0] + evaluator[1])  # no --eval-fp32 in either run
    assert (single["runner"], distributed["runner"]) == ("single", "actorq")
    # One meaning per clock in both: the launcher's around the run > the run's own >= its training clock.
    for run in (distributed, single):
        assert run["wall_clock_s"] > run["run_wall_clock_s"] >= run["train_clock_s"] > 0, run["runner"]
    assert distributed["train_clock_s"] == distributed["run_wall_clock_s"]  # its evaluator runs beside training
    assert single["train_clock_s"] == pytest.approx(single["run_wall_clock_s"] - single["evaluation_s"], abs=2e-3)
    assert single["status"] == "completed" and single["num_actors"] == len(single["actors"]) == 1
    assert single["experiment"]["distributed"]["num_actors"] == 1 and single["experiment"]["max_actor_steps"] == 400
    assert single["config"] == distributed["config"]  # the same agent config, written whole by both
    for s in on_disk:  # energy: per-node reports and totals, in both
        assert s["energy"]["nodes"] and s["energy"]["total_kwh"] > 0

    d, s = distributed["runtime"], single["runtime"]
    assert RUNTIME_STAGES == set(d["summed_s"]) == set(s["summed_s"])
    for stage in RUNTIME_STAGES - {"pull_s"}:  # every stage ran and took time, in both
        assert d["summed_s"][stage] > 0 and s["summed_s"][stage] > 0, stage
        assert d["summed_s"][stage] < distributed["wall_clock_s"] and s["summed_s"][stage] < single["wall_clock_s"]
    assert d["summed_s"]["pull_s"] > 0 and s["summed_s"]["pull_s"] == 0.0  # a weight server round trip vs nothing
    for run, rt in ((distributed, d), (single, s)):  # ms per update and µs per env step, from the summed seconds
        assert rt["env_steps"] == run["actor_steps"] and rt["updates"] == run["weight_updates"] > 0
        assert rt["per_update"]["load_ms"] == pytest.approx(1e3 * rt["summed_s"]["load_s"] / rt["updates"])
        assert rt["per_step"]["policy_us"] == pytest.approx(1e6 * rt["summed_s"]["policy_s"] / rt["env_steps"])
        assert rt["per_update"]["quantize_encode_ms"] == pytest.approx(
            1e3 * rt["summed_s"]["quantize_encode_s"] / rt["versions"])
        times = run["actors"][0]["times"]  # one actor: its own entry says the same in the same units
        assert times["env_steps"] == rt["env_steps"] and times["load_ms_per_update"] == pytest.approx(
            rt["per_update"]["load_ms"])
    assert distributed["weights_version"] == distributed["learner"]["weights_version"] == distributed["learner_steps"]
    assert single["weights_version"] == single["learner"]["weights_version"] == single["learner_steps"] > 0


def test_a_failed_run_whose_nodes_reported_nothing_still_gets_the_whole_layout(tmp_path, capsys):
    """Lost actors and learner leave None results: summary.json keeps every key (None where nothing is known) and
    the final table prints instead of failing on the missing sections."""
    from launch.experiments.summary_table import print_summary
    from analysis.schema import ACTOR_KEYS, LEARNER_KEYS, SUMMARY_KEYS
    from launch.experiments.summary import make_summary

    config = tiny_config(tmp_path)
    results = {"actor_0": None, "actor_1": None, "learner": None, "evaluator": None}
    summary = make_summary(config, "failed", "cluster node lost", results, {"counts": None, "replay": None}, 3.0,
                           num_actors=2)
    assert list(summary) == list(SUMMARY_KEYS) and summary["runner"] == "actorq"
    assert [list(a)[:len(ACTOR_KEYS)] for a in summary["actors"]] == [list(ACTOR_KEYS)] * 2
    assert all(a["times"] is None for a in summary["actors"]) and list(summary["learner"]) == list(LEARNER_KEYS)
    assert summary["runtime"]["updates"] == 0 and summary["runtime"]["per_update"]["load_ms"] is None
    assert summary["energy"]["total_kwh"] is None and summary["energy"]["nodes"] == {}
    print_summary(summary)
    assert "failed" in capsys.readouterr().out


def test_both_runners_offer_the_whole_runner_and_launch_interface(tmp_path):
    """The supervisor drives any runner through `launch.program.graph.Runner`/`Launch` (no hasattr checks): the local
    runner has one machine, so every node is placed there and no host is ever lost."""
    from launch.program.graph import Launch, Runner
    from launch.program.ray_runner import RayLaunch, RayRunner

    members = {Runner: ("launch", "close"),
               Launch: ("wait_ready", "run", "pid", "placement", "lost_hosts", "can_host", "shutdown")}
    for cls, protocol in ((RayLaunch, Launch), (RayRunner, Runner), (LocalLaunch, Launch), (LocalRunner, Runner)):
        assert [m for m in members[protocol] if not callable(getattr(cls, m, None))] == [], cls.__name__
    runner = LocalRunner()
    launch = runner.launch(build_actorq_program(tiny_config(tmp_path, num_actors=1)))
    try:
        assert isinstance(runner, Runner) and isinstance(launch, Launch)
        assert launch.placement() == {} and launch.lost_hosts() == {}
        assert launch.can_host("actor_0") and not launch.can_host("actor_9")
    finally:
        launch.shutdown()
