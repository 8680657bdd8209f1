"""DQN on ALE: the Nature torso on stacked 84x84 frames, uint8 replay and int8 conv actors, end to end (short)."""
from __future__ import annotations

import numpy as np
import pytest

from agents.dqn import Builder, DQNConfig
from launch.experiments.config import ExperimentConfig
from quarl.envs.factory import make_environment
from quarl.envs.spec import environment_spec
from tests.agents.executed import assert_integer_kernel_ran


def test_atari_frames_get_the_nature_torso_scaled_to_unit_range():
    env_spec = environment_spec(make_environment("ALE/Pong", 0))
    spec = Builder(DQNConfig()).policy_spec(env_spec)
    assert spec.input_shape == (84, 84, 4) and spec.input_scale == 1 / 255 and spec.output_dim == 6
    assert [(c.out, c.kernel, c.stride) for c in spec.conv_layers] == [(32, 8, 4), (64, 4, 2), (64, 3, 1)]
    assert Builder(DQNConfig()).transition_signature(env_spec)["observation"] == ((84, 84, 4), np.dtype(np.uint8))


@pytest.mark.slow
def test_dqn_runs_pong_with_int8_conv_actors(tmp_path):
    """~150 s on the loaded 2-core machine: the Nature update's compile and one full (unclipped) Pong evaluation
    episode of an untrained agent dominate."""
    from launch.experiments.run_experiment import run_experiment

    overrides = {"batch_size": 8, "min_replay_size": 100, "max_replay_size": 1000, "samples_per_insert": 1.0}
    summary = run_experiment(ExperimentConfig(agent="dqn", task="ALE/Pong", precision="int8", backend="onnx",
                                              max_actor_steps=300, seed=0, logdir=tmp_path, eval_episodes=1,
                                              overrides=overrides),
                             progress=False, energy=False)
    assert summary["precision"] == "int8" and summary["actor_steps"] == 300 and summary["learner_steps"] > 0
    assert summary["kernel_form"] and summary["final_eval_return"] is not None
    assert_integer_kernel_ran(summary)  # the int8 conv actors ran int8 arithmetic, not a fallback to fp32 compute
    # The game score of one whole game: Pong ends when a side reaches 21 points (no draw), so the return is a
    # nonzero whole number of points in [-21, 21]; a game cut short before a point, or a scaled reward, is not.
    score = summary["final_eval_return"]
    assert summary["eval_episodes"] == 1 and float(score).is_integer() and 1 <= abs(score) <= 21, score
