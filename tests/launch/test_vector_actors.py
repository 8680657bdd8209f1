"""`--envs-per-actor K`: the single-process runner with a vectorized actor (flag validation, counts, learning)."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from launch import train
from tests.agents.executed import assert_integer_kernel_ran
from tests.launch.tiny import assert_one_line_exit_2

TINY = ["--set", "min_replay_size=300", "--set", "hidden_sizes=32,32", "--set", "epsilon_decay_steps=500"]


@pytest.mark.parametrize("value", ["0", "-2", "four"])
def test_bad_envs_per_actor_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, value):
    logdir = tmp_path / "run"
    assert_one_line_exit_2(capsys, train.main, ["--agent", "dqn", "--task", "CartPole-v1", "--steps", "100",
                                                "--logdir", str(logdir), "--envs-per-actor", value], "--envs-per-actor")
    assert not logdir.exists()


def test_train_cli_with_four_envs_per_actor_counts_env_steps(tmp_path):
    logdir = tmp_path / "run"
    code = train.main(["--agent", "dqn", "--task", "CartPole-v1", "--precision", "int8", "--backend", "onnx",
                       "--steps", "800", "--eval-every", "400", "--eval-episodes", "1", "--actor-update-period", "50",
                       "--envs-per-actor", "4", "--logdir", str(logdir), "--no-progress", *TINY])
    assert code in (0, None)
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["envs_per_actor"] == 4 and summary["actor_steps"] == 800
    assert summary["weight_updates"] == 800 // 50  # periods count env steps, K per loop iteration
    assert summary["learner_steps"] > 0 and summary["replay"]["inserts"] == summary["replay"]["size"]
    with open(logdir / "evaluator.csv", newline="", encoding="utf-8") as f:
        assert [int(r["actor_steps"]) for r in csv.DictReader(f)] == [400, 800]
    with open(logdir / "actor.csv", newline="", encoding="utf-8") as f:
        episodes = list(csv.DictReader(f))
    # Four environments' episodes, each of its own length, together at most the 800 env steps taken.
    assert len(episodes) == summary["episodes"] >= 4
    assert sum(int(r["length"]) for r in episodes) <= 800
    # Transitions in replay: every env step except the <= n-1 still open per environment at the end.
    assert 800 - 4 * 2 <= summary["replay"]["inserts"] <= 800


@pytest.mark.slow  # DQN learning: tests/agents/test_dqn.py
def test_dqn_learns_cartpole_with_four_envs_per_actor_through_launch_train(tmp_path):
    """K=4 int8 actor, default DQN config, 7500 env steps through the CLI: some evaluation (5 greedy episodes)
    averages >= 150, where a random policy scores ~20 (seeds 0, 1, 2 all pass; best 456, 159, 253)."""
    logdir = tmp_path / "run"
    code = train.main(["--agent", "dqn", "--task", "CartPole-v1", "--precision", "int8", "--backend", "onnx",
                       "--steps", "7500", "--eval-every", "2500", "--eval-episodes", "5", "--envs-per-actor", "4",
                       "--seed", "0", "--logdir", str(logdir), "--no-progress"])
    assert code in (0, None)
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["envs_per_actor"] == 4 and summary["actor_steps"] == 7500
    assert np.isfinite(summary["final_eval_return"])
    assert summary["best_eval_return"] >= 150.0, summary["best_eval_return"]
    assert_integer_kernel_ran(summary)  # learned through an integer kernel, not fp32 compute


@pytest.mark.parametrize("agent", ["dqn", pytest.param("d4pg", marks=pytest.mark.slow)])
def test_distributed_actors_step_k_envs_each(tmp_path, agent):
    """The ActorQ program (local runner) with 2 actors x 3 environments (gymnasium for DQN, envpool where
    installed for D4PG's cartpole:balance): every actor reports K, the counts are env steps, each actor's
    episodes come from its own environments, and replay got a transition per env step (the actors flush
    their open n-step windows and partial insert batch when they stop)."""
    from launch.distributed.supervisor import run_program
    from launch.program.local_runner import LocalRunner
    from launch.experiments.agent_spec import AgentSpec
    from tests.launch.tiny import TINY_D4PG, tiny_config

    extra = {} if agent == "dqn" else dict(agent="d4pg", task="cartpole:balance", overrides=dict(TINY_D4PG),
                                           max_actor_steps=1200, eval_every=1200)
    config = tiny_config(tmp_path / "run", envs_per_actor=3, **extra)
    summary, code = run_program(config, LocalRunner())
    assert code == 0 and summary["status"] == "completed", summary["error"]
    assert [a["envs_per_actor"] for a in summary["actors"]] == [3, 3]
    assert all(a["actor_steps"] % 3 == 0 and a["actor_steps"] > 0 for a in summary["actors"])
    assert summary["actor_steps"] >= config.max_actor_steps
    starts = 0  # episodes begun: K per actor, plus one per finished episode
    for i in range(2):
        with open(tmp_path / "run" / f"actor_{i}.csv", newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        assert rows or agent == "d4pg"  # cartpole:balance episodes (1000 steps) outlast this run
        assert sum(int(r["length"]) for r in rows) <= summary["actors"][i]["actor_steps"]
        starts += 3 + len(rows)
    # One transition per env step, plus (D4PG, as Acme) the n-1 short items from each episode's first observation.
    adder = AgentSpec(config.agent, config.task, dict(config.overrides)).builder().make_adder()
    per_start = adder.n_step - 1 if adder.start_transitions else 0
    steps = sum(a["actor_steps"] for a in summary["actors"])
    assert summary["replay"]["inserts"] == steps + per_start * starts


def test_pinned_actors_each_claim_a_core_of_their_own(tmp_path, monkeypatch):
    """--pin-actors: each actor's acting thread claims a distinct core (quarl.ops.affinity) and the summary says
    which; the run is otherwise the same program. `launch.actorq --pin-actors` sets it."""
    import os

    from launch.actorq import build_parser, validate
    from launch.program.local_runner import LocalRunner
    from launch.distributed.supervisor import run_program
    from quarl.ops import affinity
    from tests.launch.tiny import tiny_config

    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs CPU affinity and two CPUs")
    monkeypatch.setenv(affinity.LOCK_DIR_ENV, str(tmp_path / "locks"))
    args = build_parser().parse_args(["--agent", "dqn", "--pin-actors", "--logdir", str(tmp_path / "cli")])
    assert validate(args).config.distributed.pin_actors
    held = len(affinity._held)
    try:
        summary, code = run_program(tiny_config(tmp_path / "run", pin_actors=True), LocalRunner())
        assert code == 0 and summary["status"] == "completed", summary["error"]
        cores = [a["pinned_core"] for a in summary["actors"]]
        assert len(set(cores)) == 2 and set(cores) <= os.sched_getaffinity(0)
        assert summary["experiment"]["distributed"]["pin_actors"] is True
    finally:  # the local runner's actors are threads of this process: give their claims back
        for fd in affinity._held[held:]:
            os.close(fd)
        del affinity._held[held:]
