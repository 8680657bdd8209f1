"""On-policy ActorQ (`launch.distributed.nodes.rollout_learner`): PPO and A2C with N quantized actors and no replay.

Proves: a synchronous update is single-process PPO's update on the same rollouts; continuous actors sample with the
learner's log-std, which rides in the weight payload; 2-actor runs learn CartPole in both modes (local runner), with
the mode, the correction, the lag and the mismatch in summary.json; on Ray, an actor killed mid-run is restarted and
the run finishes; bad on-policy flags are one line and exit 2."""
from __future__ import annotations

import json
import threading
import time

import jax
import numpy as np
import pytest

from launch import actorq
from launch.distributed.actorq_graph import add_rollout_actors, build_actorq_program
from launch.distributed.nodes.rollout_actor import RolloutActorNode
from launch.distributed.nodes.rollout_learner import RolloutLearnerNode, merge_rollouts
from launch.distributed.nodes.services import Counter, WeightServer
from launch.distributed.nodes.shared_blob import Blob
from launch.distributed.supervisor import make_runner, run_program
from launch.experiments.agent_spec import AgentSpec
from launch.experiments.config import ExperimentConfig
from launch.program.graph import Node, Program
from launch.program.local_runner import LocalRunner
from launch.program.ray_runner import RayRunner
from quarl.quant.calibration import quantize_for_actors
from quarl.quant.payload import decode_payload, encode_payload
from quarl.replay.items import Rollout
from tests.agents.executed import assert_integer_kernel_ran
from tests.launch.tiny import kill_actor_at

T, K = 8, 2
PPO_TINY = {"num_envs": K, "num_steps": T, "policy_hidden_sizes": (16,), "value_hidden_sizes": (8,),
            "update_epochs": 2}


class FakeRolloutActor:
    """Hands out the rollouts it was given, each once, then says it is finished (a scripted actor)."""

    def __init__(self, rollouts: list):
        self._rollouts = list(rollouts)
        self._lock = threading.Lock()

    def ready(self, timeout: float = 0.25) -> bool:
        with self._lock:
            if self._rollouts:
                return True
        time.sleep(min(timeout, 0.05))
        return False

    def take(self, timeout: float = 0.25):
        with self._lock:
            if self._rollouts:
                return self._rollouts.pop(0)
        time.sleep(min(timeout, 0.05))
        return None

    def finished(self) -> bool:
        with self._lock:
            return not self._rollouts


def _rollout(seed: int, obs_dim: int = 4) -> Rollout:
    rng = np.random.default_rng(seed)
    return Rollout(observation=rng.normal(size=(T, K, obs_dim)).astype(np.float32),
                   action=rng.integers(0, 2, size=(T, K)).astype(np.int32),
                   reward=np.ones((T, K), np.float32), discount=np.ones((T, K), np.float32),
                   last=(rng.random((T, K)) < 0.1).astype(np.float32),
                   next_observation=rng.normal(size=(T, K, obs_dim)).astype(np.float32),
                   behaviour_logp=np.full((T, K), np.log(0.5), np.float32))


@pytest.mark.slow  # distributed PPO learning stays (sync: KL ~ 0)
def test_a_synchronous_update_is_single_process_ppo_on_the_same_rollouts(tmp_path):
    """Two scripted actors each hand one rollout of version 0: the node joins them along the environment axis and
    its one update gives the same fp32 policy as a single-process PPOLearner stepping the joined rollout."""
    spec = AgentSpec("ppo", "CartPole-v1", dict(PPO_TINY))
    items = [{"rollout": _rollout(i), "weights_version": 0, "actor_id": i, "actor_steps": T * K} for i in range(2)]
    program = Program("onpolicy")
    counter = program.add(Node("counter", Counter, {"logdir": str(tmp_path)}, max_concurrency=4))
    weights = program.add(Node("weights", WeightServer, {"precision": "fp32", "logdir": str(tmp_path)},
                               max_concurrency=4))
    actors = [program.add(Node(f"actor_{i}", FakeRolloutActor, {"rollouts": [items[i]]}, max_concurrency=2))
              for i in range(2)]
    program.add(Node("learner", RolloutLearnerNode,
                     {"spec": spec, "seed": 3, "actors": actors, "counter": counter, "weights": weights,
                      "logdir": str(tmp_path), "precision": "fp32", "mode": "sync"}, kind="worker", max_concurrency=4))
    launch = LocalRunner().launch(program)
    try:
        launch.wait_ready()
        future = launch.run("learner")
        deadline = time.monotonic() + 60
        while launch.handles["weights"].call("latest_version") < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        launch.handles["learner"].call("stop")
        result = future.result(timeout=60)
        payload = decode_payload(launch.handles["weights"].call("get_payload", -1).get())
    finally:
        launch.shutdown()
    assert result["learner_steps"] == 1 and payload.version == 1
    info = result["on_policy"]
    assert info["mode"] == "sync" and info["rollouts_trained"] == 2 and info["stale_dropped"] == 0
    builder = spec.builder()
    reference = builder.make_learner(spec.env_spec(), 3)
    joined = merge_rollouts(items)
    assert isinstance(joined, Rollout) and joined.observation.shape == (T, 2 * K, 4)
    np.testing.assert_array_equal(joined.action[:, K:], items[1]["rollout"].action)
    reference.step(joined)
    expected = jax.tree_util.tree_leaves(reference.policy_params())
    got = jax.tree_util.tree_leaves(payload.params.tree)
    assert len(expected) == len(got)
    for a, b in zip(expected, got):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_continuous_rollout_actors_sample_with_the_learners_log_std_from_the_payload(tmp_path):
    """cartpole:balance: the payload carries a log-std far from the config's initial one; the actor's behaviour
    log-probs are those of a Gaussian with that std around its int8 policy's means."""
    config = ExperimentConfig.create(agent="ppo", task="cartpole:balance", precision="int8", backend="onnx",
                                     num_actors=1, max_actor_steps=10 * T * K, seed=0, logdir=str(tmp_path),
                                     overrides=dict(PPO_TINY))
    spec = AgentSpec(config.agent, config.task, dict(config.overrides))
    builder, env_spec = spec.builder(), spec.env_spec()
    policy = builder.policy_spec(env_spec)
    learner = builder.make_learner(env_spec, 0)
    log_std = np.full(env_spec.action_dim, -1.3, np.float32)
    program = Program("onpolicy")
    counter = program.add(Node("counter", Counter, {"logdir": str(tmp_path)}, max_concurrency=4))
    weights = program.add(Node("weights", WeightServer, {"precision": "int8", "logdir": str(tmp_path)},
                               max_concurrency=4))
    add_rollout_actors(program, config, counter, weights)
    launch = LocalRunner().launch(program)
    try:
        launch.wait_ready()
        qparams = quantize_for_actors(policy, learner.policy_params(), "int8")
        data = encode_payload(qparams, version=0, spec_hash=policy.digest(), extras={"log_std": log_std})
        assert np.array_equal(decode_payload(data).extras["log_std"], log_std)
        launch.handles["weights"].call("publish", 0, Blob.put(data))
        future = launch.run("actor_0")
        handed = launch.handles["actor_0"].call("take", 120.0)
        assert handed is not None, future.result(timeout=1) if future.done() else "no rollout within 120 s"
        launch.handles["actor_0"].call("stop")
        future.result(timeout=60)
    finally:
        launch.shutdown()
    rollout = handed["rollout"]
    reference = builder.make_actor(env_spec, qparams, seed=0, backend="onnx", batch_size=K)
    means = np.stack([reference.policy_output(obs) for obs in rollout.observation])
    z = (rollout.action - means) / np.exp(-1.3)
    expected = np.sum(-0.5 * z * z + 1.3 - 0.5 * np.log(2 * np.pi), axis=-1)
    np.testing.assert_allclose(rollout.behaviour_logp, expected, rtol=1e-4, atol=1e-3)


def _config(tmp_path, **kw) -> ExperimentConfig:
    base = dict(agent="ppo", task="CartPole-v1", precision="int8", backend="onnx", num_actors=2, seed=0,
                max_actor_steps=40_000, logdir=str(tmp_path), overrides={"num_envs": 4}, eval_every=4_000,
                eval_episodes=2, target_return=475.0)
    base.update(kw)
    return ExperimentConfig.create(**base)


@pytest.mark.parametrize("mode,correction", [("sync", "none"), pytest.param("async", "tis", marks=pytest.mark.slow)])
def test_two_int8_actors_learn_cartpole_and_the_summary_records_the_on_policy_run(tmp_path, mode, correction):
    """PPO with 2 int8 ONNX actors (local runner) scores >= 300 within 40k env steps, where a uniform random policy
    scores ~22 (sync runs reach 475 there; the async schedule depends on thread timing, so the bar is lower);
    summary.json says how rollouts were taken and corrected, and how far the int8 behaviour was from fp32."""
    config = _config(tmp_path, rollout_mode=mode, overrides={"num_envs": 4, "correction": correction})
    summary, code = run_program(config, make_runner("local"))
    assert code == 0 and summary["status"] == "completed", summary["error"]
    assert summary["best_eval_return"] >= 300.0, summary["best_eval_return"]
    info = summary["learner"]["on_policy"]
    assert info["mode"] == mode and info["correction"] == correction == summary["config"]["correction"]
    # Sync: two rollouts per update, but the last (at the stop) may train on the one rollout that came.
    per_update = 2 if mode == "sync" else 1
    assert info["rollouts_trained"] >= per_update * (summary["learner_steps"] - 1) + 1 > 1
    assert info["max_staleness"] == (0 if mode == "sync" else 6) and info["lag_max"] <= info["max_staleness"]
    kl = info["mismatch"]["kl_learner_behaviour"]
    if mode == "sync":  # the behaviour is the learner's own weights in int8: quantization is the only mismatch
        assert info["lag_mean"] == 0 and abs(kl) < 0.01 and info["mismatch"]["is_truncated_frac"] < 0.01, info
    else:  # lagging weights too
        assert info["lag_mean"] > 0 and np.isfinite(kl), info
    assert summary["replay"] == {} and summary["policy_file"].endswith("policy_fp32.qrlp")
    assert summary["kernel_form"], summary["kernel_form"]
    assert_integer_kernel_ran(summary)  # both actors learned through an integer kernel, not fp32 compute
    header = (tmp_path / "learner.csv").read_text().splitlines()[0].split(",")
    assert {"lag_mean", "stale_dropped", "is_ratio_std", "kl_learner_behaviour", "approx_kl"} <= set(header)


def test_a_killed_rollout_actor_is_restarted_and_the_run_finishes(ray_session, tmp_path):
    """Ray: actor_0 is killed once it has acted 2,000 steps; Ray restarts it, it acts again with the latest weights,
    the synchronous learner goes on with it, and the run completes with no node process left."""
    config = _config(tmp_path, max_actor_steps=12_000, target_return=None, eval_every=6_000)
    killed: dict[str, int] = {}
    summary, code = run_program(config, RayRunner(), on_launch=kill_actor_at("actor_0", 2_000, killed))
    assert "pid" in killed, "actor_0 never reached 2,000 steps"
    assert code == 0 and summary["status"] == "completed", summary["error"]
    actor_0 = summary["actors"][0]
    assert actor_0["starts"] == 2 and actor_0["first_weights_version"] >= killed["version"] > 0
    assert summary["learner_steps"] > killed["version"] and summary["actor_steps"] >= 12_000
    assert summary["learner"]["on_policy"]["actors_lost"] == []
    events = (tmp_path / "events.log").read_text()
    assert "actor_0: restarted" in events


@pytest.mark.parametrize("argv,message", [
    (["--agent", "dqn", "--rollout-mode", "async"], "--rollout-mode: only for on-policy agents"),
    (["--agent", "ppo", "--correction", "retrace"], "--correction must be one of none, tis, vtrace"),
    (["--agent", "a2c", "--checkpoint-every", "10"], "keeps no checkpoints"),
    (["--agent", "ppo", "--max-staleness", "-1"], "--max-staleness must be a non-negative integer"),
    (["--agent", "ppo", "--rollout-mode", "later"], "--rollout-mode"),
])
def test_bad_on_policy_flags_are_one_line_and_exit_2(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        actorq.main([*argv, "--logdir", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_the_on_policy_graph_has_no_replay_and_its_learner_takes_from_every_actor(tmp_path):
    program = build_actorq_program(_config(tmp_path, num_actors=3, rollout_mode="async", max_staleness=2))
    assert "replay" not in program.names()
    learner = program.node("learner")
    assert learner.cls is RolloutLearnerNode and learner.kwargs["max_staleness"] == 2
    assert [h.name for h in learner.kwargs["actors"]] == ["actor_0", "actor_1", "actor_2"]
    assert all(program.node(f"actor_{i}").cls is RolloutActorNode and program.node(f"actor_{i}").kwargs["sync"] is False
               for i in range(3))
    summary = json.dumps(_config(tmp_path, rollout_mode="async").to_dict())
    assert '"rollout_mode": "async"' in summary
