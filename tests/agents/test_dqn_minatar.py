"""DQN on MinAtar: the conv Q-network chosen by observation shape, uint8 replay, int8 conv actors that learn."""
from __future__ import annotations

import numpy as np
import pytest

from agents.dqn import Builder, DQNConfig
from launch.experiments.config import ExperimentConfig
from quarl.envs.factory import make_environment
from quarl.envs.spec import environment_spec
from quarl.policy.spec import Conv2D, Linear
from tests.agents.executed import assert_integer_kernel_ran

# The reduced-size MinAtar settings of the learning tests: one update per 4 env steps on batches of 32 (the
# MinAtar authors update every step; a quarter of the updates learns Breakout as fast per env step here and
# takes a quarter of the time), a short warm-up and epsilon decay. Measured with int8 ONNX actors (loaded
# 2-core machine): greedy return 3.1 / 3.4 / 4.8 after 8k / 12k / 16k env steps (seed 0).
MINATAR_TEST_OVERRIDES = {"batch_size": 32, "samples_per_insert": 8.0, "min_replay_size": 500,
                          "epsilon_decay_steps": 5000, "target_update_period": 250}
# A uniformly random policy averages 0.49 a Breakout episode (150 episodes, best 2); a constant action
# (what an untrained greedy network plays) 0 or 0.55 (best 1). A 10-episode mean of 2 is beyond both.
BREAKOUT_THRESHOLD = 2.0


def test_image_tasks_get_the_minatar_torso_and_uint8_replay():
    env_spec = environment_spec(make_environment("MinAtar/Breakout", 0))
    builder = Builder(DQNConfig())
    spec = builder.policy_spec(env_spec)
    assert spec.input_shape == (10, 10, 4) and spec.output_dim == 6
    assert [(c.out, c.kernel, c.stride) for c in spec.conv_layers] == [(16, 3, 1)]
    assert [layer.out for layer in spec.layers if isinstance(layer, Linear)] == [128, 6]
    sig = builder.transition_signature(env_spec)
    assert sig["observation"] == ((10, 10, 4), np.dtype(np.uint8)) == sig["next_observation"]
    table = builder.make_table(env_spec, seed=0)
    obs = np.ones((3, 10, 10, 4), np.uint8)
    table.insert({"observation": obs, "action": np.zeros(3, np.int32), "reward": np.zeros(3, np.float32),
                  "discount": np.ones(3, np.float32), "next_observation": obs})
    with pytest.raises(ValueError, match="cannot be stored"):  # float observations would silently cost 4x
        table.insert({"observation": obs.astype(np.float32), "action": np.zeros(3, np.int32),
                      "reward": np.zeros(3, np.float32), "discount": np.ones(3, np.float32),
                      "next_observation": obs})


def test_nature_torso_for_atari_frames():
    from agents.dqn.networks import make_q_spec

    spec = make_q_spec(84 * 84 * 4, 6, (256,), (84, 84, 4))
    assert [(c.out, c.kernel, c.stride) for c in spec.layers if isinstance(c, Conv2D)] == [(32, 8, 4), (64, 4, 2),
                                                                                         (64, 3, 1)]
    with pytest.raises(ValueError, match="image"):
        make_q_spec(8, 6, (256,), (2, 2, 2, 1))


def test_dqn_runs_minatar_with_int8_conv_actors(tmp_path):
    """The whole single-process loop on a conv policy at int8 (calibrated static scales, payload format 4), short."""
    from launch.experiments.run_experiment import run_experiment

    summary = run_experiment(ExperimentConfig(agent="dqn", task="MinAtar/Breakout", precision="int8", backend="onnx",
                                              max_actor_steps=800, seed=0, logdir=tmp_path, eval_episodes=1,
                                              overrides={**MINATAR_TEST_OVERRIDES, "min_replay_size": 200}),
                             progress=False, energy=False)
    assert summary["precision"] == "int8" and summary["actor_steps"] == 800
    assert summary["learner_steps"] >= 100  # one update per 4 env steps after the 200-item warm-up
    assert_integer_kernel_ran(summary)  # the conv actors ran int8 arithmetic, not a fallback to fp32 compute


@pytest.mark.slow
def test_dqn_learns_minatar_breakout_with_int8_actors(tmp_path):
    """Reduced size: int8 ONNX conv actors, <= 12k env steps, stops at the first 10-episode evaluation averaging
    >= 2 (random 0.49, untrained greedy <= 0.55). ~100 s on the loaded 2-core machine."""
    from launch.experiments.run_experiment import run_experiment

    summary = run_experiment(ExperimentConfig(agent="dqn", task="MinAtar/Breakout", precision="int8", backend="onnx",
                                              max_actor_steps=12_000, seed=0, logdir=tmp_path, eval_every=2000,
                                              eval_episodes=10, overrides=MINATAR_TEST_OVERRIDES),
                             progress=False, energy=False, on_eval=lambda row: row["return"] >= BREAKOUT_THRESHOLD)
    assert summary["best_eval_return"] >= BREAKOUT_THRESHOLD, summary["best_eval_return"]
    assert_integer_kernel_ran(summary)


@pytest.mark.slow  # conv QAT: tests/quarl/test_qat_conv.py
def test_dqn_qat_trains_a_conv_network_through_the_int8_arithmetic(tmp_path):
    """`qat_bits` on a conv Q-network: the learner's online forward is the int8 conv actor's (im2col + AQT dot),
    the loop runs end to end and the learner's loss differs from the fp32 loss on the same batch."""
    import jax

    from agents.dqn.learning import make_loss
    from agents.dqn.networks import init_params
    from launch.experiments.run_experiment import run_experiment

    summary = run_experiment(ExperimentConfig(agent="dqn", task="MinAtar/Breakout", precision="int8", backend="onnx",
                                              max_actor_steps=600, seed=0, logdir=tmp_path, eval_episodes=1,
                                              overrides={**MINATAR_TEST_OVERRIDES, "min_replay_size": 200,
                                                         "qat_bits": 8}),
                             progress=False, energy=False)
    assert summary["learner_steps"] >= 50
    assert_integer_kernel_ran(summary)
    spec = Builder(DQNConfig()).policy_spec(environment_spec(make_environment("MinAtar/Breakout", 0)))
    params = init_params(spec, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    obs = (rng.random((16, spec.input_dim)) < 0.3).astype(np.float32)
    batch = {"observation": obs, "action": rng.integers(0, 6, 16).astype(np.int32),
             "reward": rng.normal(size=16).astype(np.float32), "discount": np.full(16, 0.99, np.float32),
             "next_observation": obs[::-1].copy()}
    losses = [float(make_loss(spec, 1.0, bits)(params, params, batch, np.ones(16, np.float32))[0])
              for bits in (None, 4)]
    assert np.isfinite(losses).all() and abs(losses[0] - losses[1]) > 1e-6 * abs(losses[0])


@pytest.mark.slow
def test_dqn_learns_minatar_breakout_with_conv_qat_and_int8_actors(tmp_path):
    """Reduced size, quantization-aware: the conv Q-network trains through the int8 arithmetic (qat_bits=8) and
    int8 ONNX actors (static calibrated scales) are evaluated greedily: a 10-episode mean >= 2 (random 0.49)."""
    from launch.experiments.run_experiment import run_experiment

    summary = run_experiment(ExperimentConfig(agent="dqn", task="MinAtar/Breakout", precision="int8", backend="onnx",
                                              max_actor_steps=12_000, seed=0, logdir=tmp_path, eval_every=2000,
                                              eval_episodes=10, overrides={**MINATAR_TEST_OVERRIDES, "qat_bits": 8}),
                             progress=False, energy=False, on_eval=lambda row: row["return"] >= BREAKOUT_THRESHOLD)
    assert summary["precision"] == "int8"
    assert summary["best_eval_return"] >= BREAKOUT_THRESHOLD, summary["best_eval_return"]
    assert_integer_kernel_ran(summary)
