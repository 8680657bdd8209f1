"""The distributed ActorQ program on Ray: tiny end-to-end runs, a killed actor, and Ctrl-C on the CLI.

One local Ray serves the whole module (a start costs seconds); the Ctrl-C test runs the real CLI in a
subprocess, which starts (and must tear down) its own private Ray.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from launch.distributed.actorq_graph import NodeClasses
from launch.distributed.nodes.learner import LearnerNode
from launch.distributed.supervisor import run_program
from launch.program.ray_runner import RayRunner
from quarl.quant.policy_io import load_policy
from tests.agents.executed import assert_integer_kernel_ran
from tests.launch.tiny import TINY_D4PG, BlockHook, assert_cartpole_evaluations, kill_actor_at, tiny_config

REPO = Path(__file__).resolve().parents[2]


def _csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _check_every_log_and_a_sane_summary(summary: dict, config, logdir) -> None:
    """What every completed distributed DQN run leaves: its logs, a summary consistent with them, both actors acting
    through an integer kernel on published weights, the payload, runtime, replay and energy records, and the final
    fp32 policy."""
    assert summary["actor_steps"] >= 600 and summary["learner_steps"] > 0
    # Where the learner ran, as its own process reports it (auto, no GPU here: the CPU).
    assert summary["learner_device"]["platform"] == "cpu" and summary["learner_device"]["env"]["JAX_PLATFORMS"] == ""
    for name in ("learner.csv", "evaluator.csv", "actor_0.csv", "actor_1.csv", "summary.json"):
        assert (logdir / name).stat().st_size > 0, name
    assert list((logdir / "tb").rglob("events.out.tfevents.*")), "no TensorBoard event files"
    on_disk = json.loads((logdir / "summary.json").read_text())
    assert on_disk["status"] == "completed" and on_disk["actor_steps"] == summary["actor_steps"]
    evals = _csv_rows(logdir / "evaluator.csv")
    assert [k for k in ("actor_steps", "wall_clock_s", "return") if k in evals[0]] == ["actor_steps",
                                                                                   "wall_clock_s", "return"]
    assert_cartpole_evaluations(evals, config.eval_episodes)  # whole episodes, consistently summed up
    assert summary["final_eval_return"] == pytest.approx(float(evals[-1]["return"]))
    episodes = _csv_rows(logdir / "actor_0.csv")
    assert episodes and all(1 <= float(r["return"]) <= 500 for r in episodes)
    # Both actors acted, through ONNX, with weights the learner quantized and published.
    assert [a["actor_id"] for a in summary["actors"]] == [0, 1]
    for actor in summary["actors"]:
        assert actor["actor_steps"] > 0 and actor["backend"] == "onnx" and actor["starts"] == 1
        assert actor["kernel"]["form"] in summary["kernel_form"] and actor["kernel"]["checks"][-1]["ok"]
        times = actor["times"]
        assert times["updates"] >= 1 and times["env_step_s"] > 0 and times["policy_s"] > 0
        assert times["load_s"] > 0 and times["deserialize_s"] > 0 and times["pull_s"] > 0
    assert_integer_kernel_ran(summary)  # both actors, whichever integer form this CPU takes
    payload = summary["payload"]
    assert payload["versions"] == payload["published"] >= 1  # each version encoded once, by the learner
    assert 0 < payload["bytes"] < payload["fp32_bytes"]
    rt = summary["runtime"]
    assert set(rt["per_update"]) == {"quantize_encode_ms", "pull_ms", "deserialize_ms", "load_ms", "update_ms"}
    assert rt["updates"] == sum(a["times"]["updates"] for a in summary["actors"])
    # every step's transition reaches replay (1-step DQN: one per step), but what the actors hold in flight
    assert summary["replay"]["inserts"] >= summary["actor_steps"] - 2 * config.distributed.insert_batch
    energy = summary["energy"]
    assert set(energy["nodes"]) >= {"learner", "actor_0", "actor_1", "evaluator"}
    assert energy["total_kwh"] > 0 and energy["method"]
    assert energy["total_emissions_kg"] > 0  # was always None (read the wrong key)
    assert energy["total_emissions_kg"] == pytest.approx(
        sum(n["emissions_kg_co2eq"] for n in energy["nodes"].values()))
    # The learner's final fp32 policy is in the logdir, as launch.ptq --checkpoint LOGDIR expects it.
    policy = load_policy(logdir)  # the final policy: the solving version for a solved run, else the newest weights
    assert policy.steps == summary["final_policy"]["weights_version"] <= summary["learner_steps"]
    assert int(evals[-1]["weights_version"]) == policy.steps and (policy.agent, policy.task) == ("dqn", "CartPole-v1")
    assert policy.meta["extra"]["actor_precision"] == "int8"
    assert summary["payloads_rejected"] == 0 and summary["lost_nodes"] == []


# A uniformly random policy scores 22.1 on CartPole-v1 (2,000 episodes: best episode 86, best 5-episode mean
# 44.4); an untrained greedy Q-network ~9 (it pushes one way). 150 is reached only by a policy that balances.
LEARNED_CARTPOLE = 150.0


def test_distributed_dqn_with_int8_actors_learns_cartpole_and_writes_every_log(ray_session, tmp_path):
    """The main job learns: launch.actorq's whole program on local Ray (learner, replay, weight server, 2 int8
    ONNX actors on the Ape-X epsilon ladder, evaluator) at a reduced size: 64x64 Q-network, CartPole's settings,
    1-step targets, one learner step per 2 inserted transitions (batch 64, 32 samples per insert: the rate limiter
    ties learning to env steps, whatever the machine's speed). It stops at the first 5-episode evaluation
    averaging >= 150: measured at 2-4k actor steps on seeds 0-3 (~60 s with start-up on the loaded 2-core
    machine); 3-step targets plateaued near 130 on some seeds."""
    from agents import task_defaults

    overrides = {**task_defaults("dqn", "CartPole-v1"), "hidden_sizes": (64, 64), "min_replay_size": 500,
                 "samples_per_insert": 32.0, "n_step": 1}
    config = tiny_config(tmp_path, overrides=overrides, max_actor_steps=20_000, eval_every=1000, eval_episodes=5,
                         target_return=LEARNED_CARTPOLE, publish_period=10, insert_batch=64)
    summary, code = run_program(config, RayRunner())
    assert code == 0 and summary["status"] == "completed", summary["error"]
    evals = _csv_rows(tmp_path / "evaluator.csv")
    returns = [float(r["return"]) for r in evals]
    assert summary["best_eval_return"] >= LEARNED_CARTPOLE, returns
    solved = summary["solved"]
    assert solved is not None and solved["actor_steps"] < config.max_actor_steps, returns  # stopped early at it
    first = next(r for r in evals if float(r["return"]) >= LEARNED_CARTPOLE)
    assert int(first["weights_version"]) > 0 and int(first["episodes"]) == 5  # a trained policy, 5 episodes
    # The final evaluation re-evaluates the solving version on 5 new episodes: far above an untrained ~9 or random ~22.
    assert summary["final_eval_return"] >= LEARNED_CARTPOLE / 2, returns
    assert_integer_kernel_ran(summary)  # both actors learned through an integer kernel, not fp32 compute
    assert [a["actor_id"] for a in summary["actors"]] == [0, 1] and all(a["actor_steps"] > 0 for a in summary["actors"])
    _check_every_log_and_a_sane_summary(summary, config, tmp_path)


def test_killed_actor_is_restarted_and_the_d4pg_run_finishes(ray_session, tmp_path):
    config = tiny_config(tmp_path, agent="d4pg", task="cartpole:balance", overrides=dict(TINY_D4PG),
                     max_actor_steps=3000, eval_every=3000)
    killed: dict[str, int] = {}
    summary, code = run_program(config, RayRunner(), on_launch=kill_actor_at("actor_0", 300, killed, min_version=1))
    assert "pid" in killed, "actor_0 never reached 300 steps with a version out"
    assert code == 0 and summary["status"] == "completed", summary["error"]
    actor_0 = summary["actors"][0]
    assert actor_0["starts"] == 2 and actor_0["attempt"] == 2  # restarted by Ray, run() called again
    assert actor_0["times"]["updates"] >= 1  # the new process pulled weights...
    assert actor_0["first_weights_version"] >= killed["version"] > 0  # ...the latest ones, not version 0
    assert summary["actor_steps"] >= 3000 and summary["final_eval_return"] is not None
    restarts = [line for line in (tmp_path / "events.log").read_text().splitlines() if "actor_0: restarted" in line]
    assert len(restarts) == 1 and f"version {actor_0['first_weights_version']}," in restarts[0]


class FailingLearner(LearnerNode):
    """A learner whose training step fails after a few updates (a bug, NaN weights, an OOM...)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

        def fail_after_20_steps(learner, block):
            if learner.steps >= 20:
                raise RuntimeError("injected learner failure")

        self._learner = BlockHook(self._learner, fail_after_20_steps)


def test_learner_failure_stops_the_run_with_an_error(ray_session, tmp_path):
    node_classes = dataclasses.replace(NodeClasses(), LearnerNode=FailingLearner)
    config = tiny_config(tmp_path, max_actor_steps=10_000_000)
    summary, code = run_program(config, RayRunner(), node_classes=node_classes)
    assert code == 1 and summary["status"] == "failed"
    assert "learner failed" in summary["error"] and "injected learner failure" in summary["error"]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed"
    assert summary["actor_steps"] < config.max_actor_steps


def _processes_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


SIGINT_AGENTS = {
    "dqn": ["--set", "hidden_sizes=16,16", "--set", "min_replay_size=100"],
    "ppo": ["--set", "num_envs=2", "--set", "policy_hidden_sizes=16", "--rollout-mode", "async"],  # no replay
}


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc to find leftover processes")
@pytest.mark.parametrize("agent", ["dqn", pytest.param("ppo", marks=pytest.mark.slow)])  # on-policy: slow
def test_sigint_stops_every_node_flushes_logs_and_exits_130(tmp_path, agent):
    """Ctrl-C on the CLI: exit 130, summary.json written, and no process of that run left behind (every Ray
    process inherits the CLI's environment, so a marker variable finds them all). A replay agent also writes a
    checkpoint; an on-policy one (no checkpoints) trains on the rollouts its actors still held."""
    marker = f"ACTORQ_TEST_MARKER={uuid.uuid4().hex}"
    env = dict(os.environ)
    env[marker.split("=")[0]] = marker.split("=")[1]
    for key in ("RAY_ADDRESS",):
        env.pop(key, None)
    logdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "launch.actorq", "--agent", agent, "--max-actor-steps", "10000000",
           "--logdir", str(logdir), "--no-progress", "--backend", "onnx", *SIGINT_AGENTS[agent]]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        learning = lambda: (logdir / "learner.csv").exists() and _csv_rows(logdir / "learner.csv")  # noqa: E731
        while not learning() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert learning(), "the run never started learning"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    summary = json.loads((logdir / "summary.json").read_text())
    # It was learning when interrupted: the steps it took are counted (not lost in the stop).
    first_row = _csv_rows(logdir / "learner.csv")[0]
    assert summary["status"] == "interrupted" and summary["learner_steps"] >= int(first_row["learner_steps"]) > 0
    assert (logdir / "checkpoints" / "latest.json").exists() == (agent == "dqn")
    assert load_policy(logdir).steps == summary["learner_steps"]  # the final policy was saved on the way out
    assert "driver: interrupted by SIGINT" in (logdir / "events.log").read_text()
    assert "status" in out  # the summary table was printed
    leftover = _processes_with(marker)
    deadline = time.monotonic() + 10
    while leftover and time.monotonic() < deadline:
        time.sleep(0.5)
        leftover = _processes_with(marker)
    assert not leftover, f"processes left behind: {leftover}"


def test_summary_energy_counts_a_rapl_package_once_and_keeps_unavailable_emissions_unavailable():
    from analysis.schema import sum_energy
    from quarl.ops.carbon import EnergyReport

    def node(name, cpu, package, intensity=400.0):
        kwh = cpu + 0.002
        return EnergyReport(name, 10.0, kwh, cpu, 0.0, 0.002, None if intensity is None else kwh * intensity / 1e3,
                            intensity, "USA", "m", measured_kwh=cpu, modelled_kwh=0.002, package_kwh=package,
                            host="h").to_dict()

    total = sum_energy({"learner": node("learner", 0.006, 0.01), "actor_0": node("actor_0", 0.003, 0.01),
                         "counter": None})
    assert total["total_kwh"] == pytest.approx(0.013) and total["package_kwh"] == pytest.approx(0.01)
    assert total["measured_kwh"] == pytest.approx(0.009) and total["ram_model_share"] == pytest.approx(0.004 / 0.013)
    assert total["total_emissions_kg"] == pytest.approx(0.013 * 0.4)
    partial = sum_energy({"learner": node("learner", 0.006, None), "actor_0": node("actor_0", 0.003, None, None)})
    assert partial["total_emissions_kg"] is None and partial["package_kwh"] is None
    assert total["untracked_nodes"] == ["counter"]  # a node whose tracker did not run is named, not hidden
    nothing = sum_energy({"learner": None})
    assert nothing["total_kwh"] is None and nothing["method"].startswith("unavailable")
