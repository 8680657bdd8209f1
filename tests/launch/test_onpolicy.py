"""PPO and A2C through `launch.train`: they take the same flags as the replay agents, run at every actor precision,
act through the same loop (`quarl.acting.loop` with the rollout sink), write the same run folder as a DQN run (so
launch.ptq and analysis read it) and end with a table that shows only what applies to them; the rollout sink
restarts finished environments and keeps their final observations."""
from __future__ import annotations

import json

import numpy as np
import pytest

from launch import train
from quarl.acting.loop import RolloutSink, VectorEnvLoop
from quarl.replay.items import Rollout

# The policy keeps its default 64x64: at 8 units the int payloads' per-channel scales outweigh their weights.
PPO_TINY = ["--set", "value_hidden_sizes=8", "--set", "num_envs=2", "--set", "num_steps=16"]


def _train(logdir, *argv: str) -> dict:
    code = train.main([*argv, "--eval-episodes", "1", "--logdir", str(logdir), "--no-progress"])
    assert code in (0, None)
    return json.loads((logdir / "summary.json").read_text())


ALL_PRECISIONS = ("fp32", "bf16", "fp16", "int8", "int4", "int2")


@pytest.mark.parametrize("agent,precisions", [pytest.param("ppo", ALL_PRECISIONS, marks=pytest.mark.slow),
                                              ("a2c", ("fp32", "int8"))])  # the default suite: A2C, PPO's code
def test_on_policy_agents_train_through_the_cli_at_every_precision(tmp_path, agent, precisions):
    """A few rollouts each: the learner updates after every rollout and the actor runs the new payload (A2C is
    PPO's code: two precisions are enough there)."""
    fp32_bytes = None
    for precision in precisions:
        summary = _train(tmp_path / precision, "--agent", agent, "--task", "CartPole-v1", "--precision", precision,
                         "--steps", "96", *PPO_TINY)
        assert summary["agent"] == agent and summary["precision"] == precision, summary
        assert summary["learner_steps"] == 3 == summary["weight_updates"] and summary["actor_steps"] == 96
        assert np.isfinite(summary["final_eval_return"])
        fp32_bytes = fp32_bytes or summary["payload_bytes"]
        if precision.startswith("int"):
            assert summary["payload_bytes"] < fp32_bytes, (precision, summary["payload_bytes"], fp32_bytes)


@pytest.mark.slow  # both runners' one layout: tests/launch/test_program.py
def test_run_folder_is_a_replay_runs_folder(tmp_path):
    """The same files and the same summary.json keys as a DQN run of launch.train; a continuous task too."""
    ppo = _train(tmp_path / "ppo", "--agent", "ppo", "--task", "cartpole:balance", "--precision", "int8",
                 "--steps", "64", *PPO_TINY)
    dqn = _train(tmp_path / "dqn", "--agent", "dqn", "--task", "CartPole-v1", "--precision", "int8", "--steps", "200",
                 "--set", "hidden_sizes=8", "--set", "min_replay_size=50", "--set", "batch_size=16")
    assert sorted(ppo) == sorted(dqn)
    files = {p.name for p in (tmp_path / "dqn").iterdir()}
    assert {p.name for p in (tmp_path / "ppo").iterdir()} == files, files
    assert ppo["policy_file"] == "policy_fp32.qrlp" and ppo["best_policy_file"] == "policy_best_int8.qrlp"
    rows = (tmp_path / "ppo" / "learner.csv").read_text().splitlines()
    assert len(rows) == 1 + ppo["learner_steps"] and "approx_kl" in rows[0] and "std_mean" in rows[0]


class _Step:
    def __init__(self, obs: float, reward: float, last: bool, discount: float = 1.0):
        self.observation, self.reward, self.discount, self._last = np.array([obs], np.float32), reward, discount, last

    def last(self) -> bool:
        return self._last


class _CountingEnv:
    """Two environments: env i's observation counts its steps; env 0 ends every 2 steps (terminated), env 1
    every 3 (time limit); a restart observes -1."""

    num_envs = 2

    def __init__(self):
        self.t = [0, 0]

    def reset(self):
        self.t = [0, 0]
        return [_Step(0.0, 0.0, False), _Step(0.0, 0.0, False)]

    def reset_one(self, i):
        self.t[i] = 0
        return _Step(-1.0, 0.0, False)

    def step(self, actions):
        out = []
        for i, length in enumerate((2, 3)):
            self.t[i] += 1
            end = self.t[i] == length
            out.append(_Step(float(self.t[i]), 1.0, end, 0.0 if end and i == 0 else 1.0))
        return out


def _first_action(obs):
    return np.zeros(len(obs), np.int32), {"behaviour_logp": np.full(len(obs), -0.5, np.float32)}


def test_rollout_sink_keeps_final_observations_and_restarts():
    loop = VectorEnvLoop(_CountingEnv(), sink=RolloutSink(4, 2))
    loop.reset()
    items, episodes = [], []
    for _ in range(4):
        out = loop.step(_first_action)
        items += out.items
        episodes += [(e.episode_return, e.length) for e in out.episodes]
    assert len(items) == 1  # one rollout, handed out at its last step
    rollout = items[0]
    assert isinstance(rollout, Rollout)
    assert rollout.observation.shape == (4, 2, 1) and rollout.action.shape == (4, 2)
    np.testing.assert_array_equal(rollout.behaviour_logp, np.full((4, 2), -0.5, np.float32))
    np.testing.assert_array_equal(rollout.observation[:, 0, 0], [0, 1, -1, 1])
    np.testing.assert_array_equal(rollout.next_observation[:, 0, 0], [1, 2, 1, 2])  # 2: the final observation
    np.testing.assert_array_equal(rollout.last[:, 0], [0, 1, 0, 1])
    np.testing.assert_array_equal(rollout.discount[:, 0], [1, 0, 1, 0])  # terminated
    np.testing.assert_array_equal(rollout.last[:, 1], [0, 0, 1, 0])
    np.testing.assert_array_equal(rollout.discount[:, 1], [1, 1, 1, 1])  # a time limit keeps bootstrapping
    assert sorted(episodes) == [(2.0, 2), (2.0, 2), (3.0, 3)]
    assert loop.sink.pending == 0


def test_rollout_sink_refuses_a_policy_without_its_log_probs_and_hands_out_whole_rollouts_only():
    loop = VectorEnvLoop(_CountingEnv(), sink=RolloutSink(3, 2))
    loop.reset()
    with pytest.raises(ValueError, match="behaviour_logp"):
        loop.step(lambda obs: np.zeros(len(obs), np.int32))
    loop.reset()
    assert loop.step(_first_action).items == [] and loop.sink.pending == 2
    assert loop.sink.flush() == [] and loop.sink.pending == 0  # a partial rollout is no learner's item


def test_end_of_run_table_shows_no_rate_limiter_without_replay(tmp_path, capsys):
    """PPO has no replay: the table's actor row names its rollout stage and no rate limiter, and shows the time the
    actor stood still for the learner's updates; summary.json says how many environments the actor stepped (the
    config's num_envs: --envs-per-actor is 1)."""
    from launch.experiments.summary_table import print_summary

    summary = _train(tmp_path / "ppo", "--agent", "ppo", "--task", "CartPole-v1", "--steps", "32", *PPO_TINY)
    assert summary["replay"] == {}
    assert summary["envs_per_actor"] == summary["actors"][0]["envs_per_actor"] == 2  # PPO_TINY's num_envs
    wait = summary["actors"][0]["learner_wait_s"]
    assert wait == summary["learner"]["step_s"] > 0  # one process: the actor waits through each update
    capsys.readouterr()
    print_summary(summary)
    out = capsys.readouterr().out
    assert "rollout" in out and "rate limiter" not in out and "in insert" not in out, out
    row = next(line for line in out.splitlines() if line.startswith("│ 0 ("))  # the actor's row of "actor time"
    assert "waiting for the learner ┃" in out and row.split("│")[-2].strip() == f"{wait:.1f}", out
