"""launch.ptq loads the policy of every agent the build knows, by the agent name its run recorded, and refuses
unknown agents and mismatched run folders with one line."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

import agents
from launch import ptq
from launch.cli import DEFAULT_TASKS
from launch.ptq_policy import load_trained_policy
from quarl.envs.factory import make_environment
from quarl.envs.spec import environment_spec
from quarl.quant.policy_io import save_policy
from tests.quarl.helpers import random_params
from tests.quarl.test_evaluation import cartpole_q_network


def _save_agent_policy(run, agent: str, task: str) -> None:
    """A policy of `agent`'s own network for `task` (random weights), saved as its runners save one."""
    env = make_environment(task, 0)
    try:
        spec = agents.get_builder(agent).policy_spec(environment_spec(env))
    finally:
        env.close()
    save_policy(run, spec, random_params(spec, 0), task=task, agent=agent, steps=10)
    (run / "summary.json").write_text(json.dumps({"agent": agent, "task": task}), encoding="utf-8")


@pytest.mark.parametrize("agent", agents.AGENT_NAMES)
def test_every_agents_policy_sweeps(agent, tmp_path):
    task = DEFAULT_TASKS[agent]
    _save_agent_policy(tmp_path, agent, task)
    policy = load_trained_policy(tmp_path)
    assert (policy.agent, policy.task) == (agent, task)
    assert ptq.main(["--checkpoint", str(tmp_path), "--bits", "8,2", "--include", "fp16", "--episodes", "1",
                     "--no-progress"]) == 0
    with open(tmp_path / "ptq" / "ptq.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["precision"] for r in rows] == ["fp32", "fp16", "int8", "int8", "int2", "int2"]
    assert all(np.isfinite(float(r["mean_return"])) for r in rows)
    assert {r["execution"] for r in rows if r["precision"].startswith("int")} == {"int-kernel"}
    assert f"# Post-training quantization: {agent} on {task}" in (tmp_path / "ptq" / "ptq.md").read_text()


def test_unknown_agent_is_one_line_exit_2(tmp_path, capsys):
    spec, params = cartpole_q_network()
    save_policy(tmp_path, spec, params, task="CartPole-v1", agent="sarsa")
    with pytest.raises(SystemExit) as exc:
        ptq.main(["--checkpoint", str(tmp_path), "--episodes", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert "trained by agent 'sarsa', which this build does not know" in err
    assert not (tmp_path / "ptq").exists()


def test_summary_naming_another_agent_is_refused(tmp_path, capsys):
    spec, params = cartpole_q_network()
    save_policy(tmp_path, spec, params, task="CartPole-v1", agent="dqn")
    (tmp_path / "summary.json").write_text(json.dumps({"agent": "d4pg", "task": "CartPole-v1"}), encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        ptq.main(["--checkpoint", str(tmp_path), "--episodes", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "says agent 'd4pg' but the policy's sidecar says 'dqn'" in err
