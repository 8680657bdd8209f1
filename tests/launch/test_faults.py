"""Fault tolerance of the ActorQ program (issue #6).

Default suite (no Ray, seconds): bad weight payloads reaching an actor node, corrupted checkpoints.
Slow (`-m slow`, one local Ray for the module): the replay server or the learner SIGKILLed mid-run (the run
stops with an error naming the node, every node process ends, and a checkpoint taken before the fault
resumes the run), and the samples-per-insert rate limiter holding with a slow actor or a slow learner.

Elsewhere: a killed actor is restarted (tests/launch/test_actorq.py), Ctrl-C (same file), bad CLI flags
(tests/launch/test_program.py), payload decoding fuzz (tests/quarl/test_payload.py).
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import signal
import struct
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest

from agents import make_config, task_defaults
from launch.distributed.actorq_graph import NodeClasses
from launch.distributed.nodes.actor import ActorNode
from launch.distributed.nodes.base import NodeBase
from launch.distributed.nodes.learner import LearnerNode
from launch.distributed.nodes.services import Counter
from launch.distributed.nodes.shared_blob import Blob
from launch.distributed.nodes.weights_client import PolicyClient
from launch.experiments import checkpoint as ckpt
from launch.experiments.agent_spec import AgentSpec
from launch.experiments.config import ExperimentConfig
from launch.experiments.stages import StageTimes
from launch.program.local_runner import DaemonPool, LocalNodeHandle, LocalRunner
from quarl.quant.payload import FORMAT_VERSION, HEADER_SIZE, MAGIC, encode_payload
from quarl.quant.quantization import quantize_params
from tests.launch.tiny import TINY_DQN, BlockHook, tiny_config



def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------ bad payloads at an actor


def _random_params(spec, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    params, width = {}, spec.input_dim
    for layer in spec.linear_layers:
        params[layer.name] = {"w": rng.normal(0, 0.3, (width, layer.out)).astype(np.float32),
                              "b": rng.normal(0, 0.1, layer.out).astype(np.float32)}
        width = layer.out
    return params


def _payload(spec, version: int, precision: str = "int8") -> bytes:
    """A genuine payload, produced the way the learner produces them (quantize + encode with the spec's digest)."""
    return encode_payload(quantize_params(_random_params(spec, seed=version), precision), version=version,
                          spec_hash=spec.digest())


def _frame(body: bytes, fmt: int = FORMAT_VERSION) -> bytes:
    """The documented header around `body`, with a valid checksum (so only the content is wrong)."""
    return struct.pack("<4sHQ32s", MAGIC, fmt, len(body), hashlib.sha256(body).digest()) + body


def _edit(data: bytes, mutate) -> bytes:
    body = msgpack.unpackb(data[HEADER_SIZE:], raw=False)
    mutate(body)
    return _frame(msgpack.packb(body, use_bin_type=True))


def _leaf(body: dict, path: list[str]) -> dict:
    return next(e for e in body["leaves"] if e["path"] == path)


def _set_scale(value: float):
    def mutate(body: dict) -> None:
        scale = _leaf(body, ["linear_0", "w"])["qtensor"]["scale"]
        scale["data"] = np.full(scale["shape"], value, np.float32).tobytes()
    return mutate


class ScriptedWeights(NodeBase):
    """Serves a fixed sequence of published payloads, one per request, whatever version the actor has."""

    def __init__(self, script: list[bytes]):
        self.script = list(script)
        self.served = 0

    def get_payload(self, have_version: int = -1) -> Blob | None:  # pylint: disable=unused-argument
        if self.served >= len(self.script):
            return None
        self.served += 1
        return Blob.put(self.script[self.served - 1])


class SinkReplay(NodeBase):
    """Accepts every insert (no rate limiter): the actor is never held back."""

    def __init__(self):
        self.items = 0

    def insert(self, batch, priorities=None, timeout=None, force=False) -> int:  # pylint: disable=unused-argument
        n = len(batch.reward)  # a batch of the actor's Transitions
        self.items += n
        return n


def test_actor_rejects_bad_payloads_counts_them_and_keeps_its_last_good_policy(tmp_path):
    """Truncated, bit-flipped, wrong format version, stale, wrong tree, NaN/inf scale, wrong precision and
    wrong spec payloads: each is refused with a reason, counted and logged; the actor acts on throughout
    with its last good weights and takes the next good version."""
    agent = AgentSpec("dqn", "CartPole-v1", {**TINY_DQN, "actor_update_period": 10})
    spec = agent.builder().policy_spec(agent.env_spec())
    other_spec = AgentSpec("dqn", "CartPole-v1", {**TINY_DQN, "hidden_sizes": (8, 8)})
    good1, good9 = _payload(spec, 1), _payload(spec, 9)
    flipped = bytearray(_payload(spec, 2))
    flipped[HEADER_SIZE + len(flipped) // 3] ^= 0x10
    script = [
        (good1[:-7], "truncated"),  # before any good policy: the actor waits for a valid one
        (good1, None),
        (bytes(flipped), "checksum mismatch"),
        (_frame(_payload(spec, 3)[HEADER_SIZE:], fmt=FORMAT_VERSION + 1), "format version"),
        (_payload(spec, 1), "stale payload"),
        (_edit(_payload(spec, 4), lambda b: b["leaves"].remove(_leaf(b, ["linear_1", "b"]))),
         "does not fit the policy"),
        (_edit(_payload(spec, 5), _set_scale(np.nan)), "NaN or inf"),
        (_edit(_payload(spec, 6), _set_scale(np.inf)), "NaN or inf"),
        (_payload(spec, 7, precision="fp32"), "holds fp32 weights"),
        (_payload(other_spec.builder().policy_spec(other_spec.env_spec()), 8), "another policy spec"),
        (good9, None),
    ]
    pool = DaemonPool(8)
    weights, replay, counter = ScriptedWeights([p for p, _ in script]), SinkReplay(), Counter()
    actor = ActorNode(agent, actor_id=0, num_actors=1, seed=0, precision="int8", backend="onnx",
                            replay=LocalNodeHandle(replay, pool), counter=LocalNodeHandle(counter, pool),
                            weights=LocalNodeHandle(weights, pool), logdir=str(tmp_path),
                            max_actor_steps=300, insert_batch=16)
    try:
        result = actor.run()
    finally:
        pool.shutdown()
    expected = [reason for _, reason in script if reason]
    assert weights.served == len(script)  # every scripted payload reached the actor
    assert result["payloads_rejected"] == len(expected)
    assert result["weights_version"] == 9 and result["first_weights_version"] == 1
    assert result["times"]["updates"] == 2  # only the two good payloads were loaded
    assert result["actor_steps"] >= 300 and replay.items == result["actor_steps"]  # it kept acting throughout
    events = (tmp_path / "events.log").read_text().splitlines()
    rejections = [line for line in events if "actor_0: rejected a weight payload" in line]
    assert len(rejections) == len(expected)
    for line, reason in zip(rejections, expected):
        assert reason in line, (reason, line)
    # Between the two good versions every logged episode ran with version 1, never with a rejected one.
    versions = {int(r["weights_version"]) for r in _read_csv(tmp_path / "actor_0.csv")}
    assert versions <= {1, 9} and 1 in versions


def test_policy_client_refuses_a_payload_the_executor_cannot_load_without_changing_version():
    agent = AgentSpec("dqn", "CartPole-v1", TINY_DQN)
    spec = agent.builder().policy_spec(agent.env_spec())
    weights = ScriptedWeights([_payload(spec, 3)])
    client_cls = PolicyClient
    client = client_cls(LocalNodeHandle(weights, None), StageTimes(), spec=spec, precision="int8")

    def refuse(payload) -> None:
        raise ValueError("linear_1/w has shape (16, 2), expected (16, 16)")

    assert client.fetch(apply=refuse) is None
    assert (client.version, client.rejected) == (-1, 1)
    assert "does not fit the policy" in client.last_rejection and "linear_1/w" in client.last_rejection


@pytest.mark.parametrize("backend", ["onnx", "jax"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_observation_reaching_an_int8_actor_is_a_clear_error(backend, bad):
    """What an actor node's policy call does with a NaN/inf observation from a broken environment: a
    ValueError saying so (the check lives in quarl.runtimes' executor base class), never an action computed
    from garbage int8 codes."""
    from quarl.quant.payload import decode_payload

    agent = AgentSpec("dqn", "CartPole-v1", TINY_DQN)
    builder, env_spec = agent.builder(), agent.env_spec()
    qparams = decode_payload(_payload(builder.policy_spec(env_spec), 1)).params
    assert qparams.precision == "int8"
    actor = builder.make_actor(env_spec, qparams, seed=0, actor_id=0, evaluation=True, backend=backend)
    obs = np.array([0.01, -0.02, 0.03, bad], np.float32)
    with pytest.raises(ValueError, match="NaN or inf"):  # the int8 executor itself
        actor._executor(obs[None])  # pylint: disable=protected-access
    with pytest.raises(ValueError, match="NaN or inf|finite"):  # greedy or exploring, never an action
        actor.act(obs[None])
    assert actor.act(np.zeros((1, 4), np.float32))[0][0] in (0, 1)  # finite input still acts


# ------------------------------------------------------------------------------------ corrupted checkpoints


def _checkpoint(tmp_path: Path) -> Path:
    """A real checkpoint (orbax learner state, npz replay, manifest) of a small state."""
    state = {"params": {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.float32)},
             "opt": {"mu": np.zeros((3, 4), np.float32)}, "steps": np.asarray(7, np.int64)}
    replay = {"format_version": 1, "inserts": 3, "samples": 2, "deletes": 0, "keys": np.arange(3),
              "priorities": np.ones(3), "data": {"observation": np.ones((3, 2), np.float32)}}
    manifest = {"run_config": {"agent": "dqn", "task": "CartPole-v1"}, "agent_config": {"batch_size": 32},
                "counts": {"actor_steps": 100, "learner_steps": 7}}
    return ckpt.write_checkpoint(tmp_path, step=7, learner_state=state,
                                 save_replay_to=lambda p: ckpt.save_replay(p, replay), manifest=manifest)


def test_intact_checkpoint_verifies(tmp_path):
    directory = _checkpoint(tmp_path)
    assert ckpt.find_checkpoint(tmp_path) == directory
    manifest = ckpt.read_manifest(directory)
    assert manifest["learner_steps"] == 7 and manifest["checksums"][ckpt.LEARNER_FILES]


def test_a_flipped_byte_in_any_learner_file_is_rejected_naming_the_file(tmp_path):
    directory = _checkpoint(tmp_path)
    files = sorted(p for p in (directory / ckpt.LEARNER_DIR).rglob("*") if p.is_file())
    assert len(files) >= 2  # orbax writes data and metadata files
    for path in files:
        original = path.read_bytes()
        corrupted = bytearray(original)
        corrupted[len(corrupted) // 2] ^= 0x01
        path.write_bytes(bytes(corrupted))
        with pytest.raises(ckpt.CheckpointError, match="does not match its checksum") as info:
            ckpt.read_manifest(directory)
        assert str(path.relative_to(directory / ckpt.LEARNER_DIR)) in str(info.value)
        path.write_bytes(original)
    ckpt.read_manifest(directory)  # restored: accepted again


def test_missing_or_extra_learner_files_and_a_corrupted_replay_snapshot_are_rejected(tmp_path):
    directory = _checkpoint(tmp_path)
    learner = directory / ckpt.LEARNER_DIR
    victim = sorted(p for p in learner.rglob("*") if p.is_file())[0]
    saved = victim.read_bytes()
    victim.unlink()
    with pytest.raises(ckpt.CheckpointError, match="is missing"):
        ckpt.read_manifest(directory)
    victim.write_bytes(saved)
    (learner / "extra.bin").write_bytes(b"x")
    with pytest.raises(ckpt.CheckpointError, match="not listed in the manifest"):
        ckpt.read_manifest(directory)
    (learner / "extra.bin").unlink()
    replay = directory / ckpt.REPLAY_FILE
    data = bytearray(replay.read_bytes())
    data[-20] ^= 0x04
    replay.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="replay snapshot .* does not match its checksum"):
        ckpt.read_manifest(directory)


def test_every_single_bit_flip_in_the_manifest_is_rejected(tmp_path):
    """Flipping any one bit of manifest.json either breaks the JSON or changes its content; both are refused
    (the manifest carries a checksum of itself), so no edited manifest is ever trusted."""
    directory = _checkpoint(tmp_path)
    path = directory / ckpt.MANIFEST
    original = path.read_bytes()
    rng = np.random.default_rng(0)
    for position in range(len(original)):
        corrupted = bytearray(original)
        corrupted[position] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(corrupted))
        with pytest.raises(ckpt.CheckpointError):
            ckpt.read_manifest(directory, verify=False)
    path.write_bytes(original)
    ckpt.read_manifest(directory)
    # A plausible edit (another learner step) with valid JSON is named as such.
    manifest = json.loads(original)
    manifest["learner_steps"] = 8
    path.write_text(json.dumps(manifest))
    with pytest.raises(ckpt.CheckpointError, match="does not match its own checksum"):
        ckpt.read_manifest(directory, verify=False)


def test_a_corrupted_checkpoint_index_is_rejected(tmp_path):
    _checkpoint(tmp_path)
    latest = tmp_path / ckpt.CHECKPOINT_DIR / ckpt.LATEST
    latest.write_text('{"step": 8}')
    with pytest.raises(ckpt.CheckpointError, match="step 8"):
        ckpt.find_checkpoint(tmp_path)
    latest.write_text('{"step": 7')
    with pytest.raises(ckpt.CheckpointError, match="cannot read checkpoint index"):
        ckpt.find_checkpoint(tmp_path)


def test_a_checkpoint_that_fails_half_way_leaves_nothing_and_the_previous_one_stays_latest(tmp_path):
    directory = _checkpoint(tmp_path)

    def replay_gone(path: str) -> dict:
        raise RuntimeError("replay server ('replay') died")

    with pytest.raises(RuntimeError, match="replay server"):
        ckpt.write_checkpoint(tmp_path, step=9, learner_state={"w": np.ones(2, np.float32)},
                              save_replay_to=replay_gone, manifest={"run_config": {}, "agent_config": {},
                                                                    "counts": {}})
    root = tmp_path / ckpt.CHECKPOINT_DIR
    assert sorted(p.name for p in root.iterdir()) == [ckpt.LATEST, directory.name]
    assert ckpt.find_checkpoint(tmp_path) == directory


# ------------------------------------------------------------------------------------ lost nodes on Ray (slow)


def _config(logdir: Path, **kw) -> ExperimentConfig:
    """A run that goes on until a fault ends it: no step budget, no evaluations."""
    return tiny_config(logdir, **{"max_actor_steps": 10_000_000, "eval_every": 1_000_000, **kw})


def _kill_when(launch, node: str, ready, record: dict) -> None:
    """From a side thread: note every node's pid, then SIGKILL `node`'s process once `ready(launch)`."""
    def killer() -> None:
        import psutil

        record["pids"] = {name: launch.pid(name) for name in launch.handles}
        record["children"] = [c.pid for pid in record["pids"].values()
                              for c in psutil.Process(pid).children(recursive=True)]
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if ready(launch):
                os.kill(record["pids"][node], signal.SIGKILL)
                record["t_kill"] = time.monotonic()
                return
            time.sleep(0.2)

    threading.Thread(target=killer, daemon=True).start()


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _assert_all_gone(pids, deadline: float) -> None:
    """No node process of the run is left (polling until `deadline`, a monotonic time)."""
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if _alive(p)]
    assert not left, f"node processes left behind: {left}"


STOP_WITHIN_S = 10.0  # issue #6: every other node exits within 10 s of the fault


def _assert_run_failed_naming(summary: dict, code: int, record: dict, returned: float, logdir: Path, node: str,
                              message: str) -> None:
    """After killing `node`: exit 1 naming it, within STOP_WITHIN_S of the kill, no node process left, and the
    failure in summary.json and events.log."""
    assert code == 1 and summary["status"] == "failed"
    assert message in summary["error"], summary["error"]
    assert summary["lost_nodes"] == [node]
    print(f"run returned {returned - record['t_kill']:.1f} s after the kill")
    assert returned - record["t_kill"] <= STOP_WITHIN_S, returned - record["t_kill"]
    _assert_all_gone([*record["pids"].values(), *record["children"]], record["t_kill"] + STOP_WITHIN_S)
    assert json.loads((logdir / "summary.json").read_text())["status"] == "failed"
    assert f"driver: run failed: {message}" in (logdir / "events.log").read_text()


@pytest.mark.slow
def test_killed_replay_server_stops_the_run_naming_it_and_its_checkpoint_resumes_the_run(ray_session, tmp_path):
    from launch.distributed.supervisor import run_program
    from launch.program.ray_runner import RayRunner

    config = _config(tmp_path, checkpoint_every=50)
    record: dict = {}

    def ready(launch) -> bool:
        return (tmp_path / "checkpoints" / "latest.json").exists() and \
            launch.handles["counter"].call("get")["learner_steps"] >= 80

    summary, code = run_program(config, RayRunner(), on_launch=lambda launch: _kill_when(launch, "replay", ready,
                                                                                          record))
    returned = time.monotonic()
    assert "t_kill" in record, "the run never reached its first checkpoint"
    _assert_run_failed_naming(summary, code, record, returned, tmp_path, "replay", "replay server ('replay') died")
    # The fault left no half-written checkpoint; the last complete one resumes the run.
    root = tmp_path / "checkpoints"
    assert not list(root.glob("*.partial"))
    directory = ckpt.find_checkpoint(tmp_path)
    manifest = ckpt.read_manifest(directory)
    # `--resume RUN_DIR`, through the CLI's own validation (same agent config, same run directory).
    from launch.actorq import build_parser, validate

    # The CLI starts from the task's tuned settings (agents.task_defaults); the killed run was built without
    # them, so its values for those keys are passed too, as a user resuming a differently-built run would.
    original = make_config("dqn", **config.overrides)
    keys = dict.fromkeys([*TINY_DQN, *task_defaults("dqn", "CartPole-v1")])
    sets = [f"{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}"
            for k, v in ((k, getattr(original, k)) for k in keys)]
    argv = ["--agent", "dqn", "--task", "CartPole-v1", "--num-actors", "2", "--backend", "onnx",
            "--max-actor-steps", str(int(manifest["counts"]["actor_steps"]) + 600), "--eval-every", "1000000",
            "--eval-episodes", "1", "--publish-period", "5", "--insert-batch", "32", "--resume", str(tmp_path),
            *[a for item in sets for a in ("--set", item)]]
    resumed = validate(build_parser().parse_args(argv)).config
    assert resumed.distributed.resume == str(directory) and Path(resumed.logdir).absolute() == tmp_path.absolute()
    summary2, code2 = run_program(resumed, RayRunner())
    assert code2 == 0 and summary2["status"] == "completed", summary2["error"]
    assert summary2["learner"]["resumed_from"] == manifest["learner_steps"]
    assert summary2["learner_steps"] > manifest["learner_steps"]
    assert summary2["replay"]["inserts"] >= manifest["replay"]["items"] + 600 - 2 * config.distributed.insert_batch


@pytest.mark.slow
def test_killed_learner_stops_the_run_naming_it_with_no_process_left(ray_session, tmp_path):
    from launch.distributed.supervisor import run_program
    from launch.program.ray_runner import RayRunner

    record: dict = {}

    def ready(launch) -> bool:
        return launch.handles["counter"].call("get")["learner_steps"] >= 30

    summary, code = run_program(_config(tmp_path), RayRunner(),
                                on_launch=lambda launch: _kill_when(launch, "learner", ready, record))
    returned = time.monotonic()
    assert "t_kill" in record, "the learner never reached 30 steps"
    _assert_run_failed_naming(summary, code, record, returned, tmp_path, "learner", "learner ('learner') died")
    # The actors (held back by the rate limiter once nothing samples) stopped when told and reported.
    assert len(summary["actors"]) == 2 and all("failed" not in a for a in summary["actors"]), summary["actors"]


# ------------------------------------------------------------------------------------ rate limiter (slow)


class _SlowEnv:
    """An environment whose every step takes `sleep_s` longer (a slow simulator)."""

    def __init__(self, env, sleep_s: float):
        self._env, self._sleep_s = env, sleep_s

    def step(self, action):
        time.sleep(self._sleep_s)
        return self._env.step(action)

    def __getattr__(self, name):
        return getattr(self._env, name)


class SlowActor(ActorNode):
    def _make_environment(self, seed: int):
        return _SlowEnv(super()._make_environment(seed), 0.004)


class SlowLearner(LearnerNode):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._learner = BlockHook(self._learner, lambda learner, block: time.sleep(0.02 * block.size))


def _node_classes(**replace):
    return dataclasses.replace(NodeClasses(), **replace)


@pytest.mark.slow
@pytest.mark.parametrize("slow_side", ["actor", "learner"])
def test_rate_limiter_keeps_samples_per_insert_within_its_error_buffer(tmp_path, slow_side):
    """A slow actor with a fast learner, and a fast actor with a slow learner: at every logged point after the
    warm-up (replay.csv) and at the end (summary.json), inserts x samples_per_insert - samples stays within
    samples_per_insert x min_size +- error_buffer, and the limiter really held back the faster side."""
    from launch.distributed.supervisor import run_program

    replace = {"ActorNode": SlowActor} if slow_side == "actor" else {"LearnerNode": SlowLearner}
    config = _config(tmp_path, num_actors=1 if slow_side == "actor" else 2, max_actor_steps=1500,
                     log_every_s=0.2)
    summary, code = run_program(config, LocalRunner(), node_classes=_node_classes(**replace))
    assert code == 0, summary["error"]
    table = AgentSpec("dqn", "CartPole-v1", TINY_DQN).builder().table_config()
    spi, min_size, buffer = table["samples_per_insert"], table["min_size_to_sample"], table["error_buffer"]
    low, high = spi * min_size - buffer, spi * min_size + buffer
    rows = [r for r in _read_csv(tmp_path / "replay.csv") if int(r["inserts"]) >= min_size]
    assert len(rows) >= 5
    for row in rows:
        assert low <= float(row["rate_limiter_diff"]) <= high, row
        assert float(row["rate_limiter_diff"]) == int(row["inserts"]) * spi - int(row["samples"])
    final = summary["replay"]
    assert low <= final["rate_limiter_diff"] <= high
    assert final["inserts"] >= 1500 - 2 * config.distributed.insert_batch
    assert abs(final["samples_per_insert"] - spi) <= (spi * min_size + buffer) / final["inserts"]
    first, last = rows[0], rows[-1]
    if slow_side == "actor":  # the learner waited for data, again and again after the warm-up
        assert int(last["sample_blocked_calls"]) > int(first["sample_blocked_calls"])
    else:  # the actors waited for the learner
        assert int(last["insert_blocked_calls"]) > int(first["insert_blocked_calls"])
