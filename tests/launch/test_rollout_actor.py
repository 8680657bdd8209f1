"""An on-policy actor in the distributed program: `RolloutActorNode` runs the actor's loop with PPO's rollout sink
in launch.program's local runner and hands out fixed-length rollouts, each with the behaviour log-probs of the
quantized policy it acted with and that policy's weights version; the test plays the learner."""
from __future__ import annotations

import numpy as np
import pytest

from launch.distributed.actorq_graph import add_rollout_actors
from launch.distributed.nodes.rollout_actor import RolloutActorNode
from launch.distributed.nodes.services import Counter, WeightServer
from launch.distributed.nodes.shared_blob import Blob
from launch.experiments.agent_spec import AgentSpec
from launch.experiments.config import ExperimentConfig
from launch.program.graph import Node, Program
from launch.program.local_runner import LocalRunner
from quarl.quant.calibration import quantize_for_actors
from quarl.quant.payload import encode_payload
from quarl.replay.items import Rollout

T, K = 8, 2
PPO_TINY = {"num_envs": K, "num_steps": T, "policy_hidden_sizes": (16,), "value_hidden_sizes": (8,),
            "update_epochs": 1}


def _config(tmp_path, **kw) -> ExperimentConfig:
    base = dict(agent="ppo", task="CartPole-v1", precision="int8", backend="onnx", num_actors=1,
                max_actor_steps=10 * T * K, seed=0, logdir=str(tmp_path), overrides=dict(PPO_TINY))
    return ExperimentConfig.create(**{**base, **kw})


def _log_probs(actor, observations: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """log pi(a | s) of the discrete policy `actor` runs, one env step's batch at a time (as the node acted)."""
    out = []
    for obs, act in zip(observations, actions):
        logits = actor.policy_output(obs)
        logp = logits - logits.max(axis=1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
        out.append(logp[np.arange(len(act)), act])
    return np.asarray(out)


def test_a_rollout_actor_node_hands_out_rollouts_with_their_behaviour_log_probs_and_weights_version(tmp_path):
    config = _config(tmp_path)
    spec = AgentSpec(config.agent, config.task, dict(config.overrides))
    builder, env_spec = spec.builder(), spec.env_spec()
    policy = builder.policy_spec(env_spec)
    learner = builder.make_learner(env_spec, 0)
    program = Program("onpolicy")
    counter = program.add(Node("counter", Counter, {"logdir": str(tmp_path)}, max_concurrency=4))
    weights = program.add(Node("weights", WeightServer, {"precision": "int8", "logdir": str(tmp_path)},
                               max_concurrency=4))
    (handle,) = add_rollout_actors(program, config, counter, weights)
    assert program.node(handle.name).cls is RolloutActorNode and program.node("actor_0").kind == "worker"
    launch = LocalRunner().launch(program)
    try:
        launch.wait_ready()
        published = {}

        def publish(version: int) -> None:
            published[version] = quantize_for_actors(policy, learner.policy_params(), "int8")
            data = encode_payload(published[version], version=version, spec_hash=policy.digest())
            launch.handles["weights"].call("publish", version, Blob.put(data))

        publish(0)
        future = launch.run("actor_0")
        actor = launch.handles["actor_0"]
        first = actor.call("take", 120.0)
        assert first is not None, future.result(timeout=1) if future.done() else "no rollout within 120 s"
        rollout = first["rollout"]
        assert first["weights_version"] == 0 and first["actor_id"] == 0 and first["actor_steps"] == T * K
        assert rollout.observation.shape == (T, K, 4) and rollout.action.shape == (T, K)
        assert isinstance(rollout, Rollout)
        for column in ("reward", "discount", "last", "behaviour_logp"):
            assert getattr(rollout, column).shape == (T, K), column
        # The log-probs are those of the int8 policy of version 0, for the actions it took.
        reference = builder.make_actor(env_spec, published[0], seed=0, backend="onnx", batch_size=K)
        np.testing.assert_allclose(rollout.behaviour_logp, _log_probs(reference, rollout.observation,
                                                                         rollout.action), atol=1e-5)
        # Synchronous on-policy: no second rollout before newer weights; the learner takes the rollout whole.
        assert actor.call("take", 1.0) is None
        assert learner.step(rollout) and learner.steps == 1
        publish(1)
        second = actor.call("take", 120.0)
        assert second is not None and second["weights_version"] == 1 and second["actor_steps"] == 2 * T * K
        assert not np.array_equal(second["rollout"].observation[0], rollout.observation[0])
        actor.call("stop")
        result = future.result(timeout=60)
        assert result["rollouts"] == 2 and result["first_weights_version"] == 0 and result["weights_version"] == 1
        assert result["actor_steps"] == 2 * T * K and result["times"]["env_steps"] == 2 * T * K
        # From its first rollout until version 1 came it stood still for the learner (at least the 1 s `take`
        # waited above): its own figure, not part of pulling the weights or filling the rollout.
        assert result["learner_wait_s"] >= 1.0 > result["times"]["pull_s"] + result["times"]["insert_s"], result
        assert launch.handles["counter"].call("get")["actor_steps"] == 2 * T * K
    finally:
        launch.shutdown()
    assert (tmp_path / "actor_0.csv").exists()


def test_a_replay_agent_has_no_rollout_actors(tmp_path):
    """DQN learns from replay: a rollout actor for it is refused in one line."""
    with pytest.raises(ValueError, match="replay"):
        RolloutActorNode(AgentSpec("dqn", "CartPole-v1", {}), 0, 1, 0, "int8", "onnx", None, None, str(tmp_path), 100)
