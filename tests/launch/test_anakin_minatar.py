"""The jitted trainer on MinAtar (gymnax's ports with MinAtar's 6 actions and sticky actions, `quarl.envs.gymnax_env`),
slow: PPO with int8 conv actors inside the jit learns Breakout beyond random play, and the policy deployed through the
ONNX int8 executor (calibrated static activation scales) on MinAtar 1.0.15 scores what it scores inside the jit; DQN's
in-jit replay holds MinAtar's uint8 frames."""
from __future__ import annotations

import json

import pytest

from launch import anakin
from tests.launch.test_anakin import deployed_and_in_jit_returns, same_within_noise

pytestmark = pytest.mark.slow
RANDOM_BREAKOUT = 0.5  # a uniformly random policy's mean return on MinAtar Breakout (0.4-0.6 over 200 episodes)


def test_ppo_int8_breakout_deployed_through_onnx_on_minatar_scores_as_inside_the_jit(tmp_path):
    out = tmp_path / "breakout"
    assert anakin.main(["--agent", "ppo", "--task", "MinAtar/Breakout", "--seeds", "0", "--steps", "300000",
                        "--eval-every", "100000", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "seed0" / "summary.json").read_text())
    assert summary["final_eval_return"] > 4 * RANDOM_BREAKOUT
    assert summary["executed"] == "int8 weights, integer kernel (aqt_s8s8)"
    deployed, in_jit = deployed_and_in_jit_returns(out / "seed0", 100)
    print(f"\nMinAtar/Breakout: ONNX int8 on MinAtar {deployed.mean():.2f} +- {deployed.std():.2f}, "
          f"inside the jit {in_jit.mean():.2f} +- {in_jit.std():.2f}")
    assert same_within_noise(deployed, in_jit), (deployed.mean(), in_jit.mean())


def test_dqn_replays_minatar_frames_inside_the_jit(tmp_path):
    out = tmp_path / "dqn"
    assert anakin.main(["--agent", "dqn", "--task", "MinAtar/Freeway", "--seeds", "0-1", "--steps", "8000",
                        "--set", "min_replay_size=2000", "--out", str(out), "--no-progress"]) == 0
    for seed in (0, 1):
        summary = json.loads((out / f"seed{seed}" / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["learner_steps"] >= 5_000
        assert summary["replay"]["capacity"] == 100_000 and summary["evaluations"] == 10
