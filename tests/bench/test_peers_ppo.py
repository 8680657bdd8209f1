"""bench.peers.onpolicy: SB3's PPO log becomes the same figures as ours, bad set-ups stop with one line, and a tiny side by
side run (when the SB3 venv and this build's PPO exist) writes its report."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import agents
from bench.peers import onpolicy as peers_ppo

SB3_PPO_LOG = """\
# sb3 2.9.2 rl_zoo3 2.9.2 torch 2.13.0+cpu threads 1 gymnasium 1.4.0 algo ppo env CartPole-v1 n_envs 8 steps 20000
env_steps wall_clock_s eval_mean eval_std
0 0.2 9.4 0.7
5000 2.1 180.0 30.0
10000 4.4 490.0 10.0
15000 6.6 420.0 40.0
20000 8.9 500.0 0.0
# done: env_steps 20000 wall 8.9s (eval 1.5s) -> 2703 env steps/s (eval excluded); first eval >= 475.0: step 10000 at 4.4s
"""
SB3_PYTHON = os.environ.get("QUARL_SB3_PYTHON", "/work/venvs/sb3/bin/python")
ANCHORS = Path(os.environ.get("QUARL_ANCHORS", str(peers_ppo.REPO.parent / "shared" / "anchors")))


def test_sb3_ppo_log_becomes_time_to_solve_and_final_return():
    got = peers_ppo.parse_sb3_ppo_log(SB3_PPO_LOG, 475.0)
    assert got["solved"] and got["steps_to_target"] == 10_000 and got["wall_s_to_target"] == pytest.approx(4.4)
    assert got["final_return"] == 500.0 and got["last3_mean"] == pytest.approx((490 + 420 + 500) / 3)
    assert got["stay_fraction"] == pytest.approx(0.5)  # 15k fell below, 20k back at 500
    assert got["eval_returns"] == [180.0, 490.0, 420.0, 500.0]  # step 0 (untrained) left out
    assert got["env_steps_per_s"] == 2703.0 and got["version"].startswith("sb3 2.9.2")
    never = peers_ppo.parse_sb3_ppo_log(SB3_PPO_LOG, 600.0)
    assert not never["solved"] and never["wall_s_to_target"] is None


def test_a_missing_sb3_interpreter_is_one_line_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        peers_ppo.main(["--sb3-python", str(tmp_path / "none"), "--out", str(tmp_path / "o"), "--allow-busy"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--sb3-python must name" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif("ppo" not in agents.AGENT_NAMES or not os.access(SB3_PYTHON, os.X_OK)
                    or not (ANCHORS / "sb3_ppo" / "run.py").is_file(),
                    reason="needs this build's PPO, the SB3 venv and ../shared/anchors/sb3_ppo")
def test_tiny_side_by_side_run_writes_the_report(tmp_path):
    assert peers_ppo.main(["--seeds", "0", "--steps", "1024", "--eval-every", "512", "--eval-episodes", "2",
                           "--precisions", "int8", "--sb3-python", SB3_PYTHON, "--anchors", str(ANCHORS),
                           "--out", str(tmp_path), "--allow-busy"]) == 0
    result = json.loads((tmp_path / "peers_ppo.json").read_text())
    assert [r["system"] for r in result["rows"]] == ["sb3 ppo", "ours int8"]
    for row in result["rows"]:
        assert row["exit_code"] == 0 and len(row["eval_returns"]) >= 1 and row["final_return"] is not None
    md = (tmp_path / "peers_ppo.md").read_text()
    assert "## PPO on CartPole-v1: time to solve and final return" in md and "| CartPole-v1 | ours int8 |" in md
