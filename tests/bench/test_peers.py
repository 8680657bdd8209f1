"""bench.peers: peers' own log lines are parsed into the figures the report shows, and a missing peer
interpreter stops the benchmark with one line before anything runs."""
from __future__ import annotations

import pytest

from bench import peers

ACME_LOG = """\
\x1b[1;32m[learner/0] I1203 12:54:20.000000 1 courier_utils.py:50] Binding: step\x1b[0;0m
\x1b[1;34m[evaluator/0] I1203 12:54:34.000000 3 terminal.py:91] [Evaluator] Actor Episodes = 1 | Actor Steps = 1000 | Episode Length = 1000 | Episode Return = 696.49 | Evaluator Episodes = 1 | Evaluator Steps = 1000 | Steps Per Second = 85.123\x1b[0;0m
\x1b[1;34m[evaluator/0] I1203 12:54:38.000000 3 terminal.py:91] [Evaluator] Actor Episodes = 1 | Actor Steps = 1000 | Episode Return = 520.22 | Learner Steps = 300 | Learner Walltime = 2.000 | Steps Per Second = 442.4\x1b[0;0m
\x1b[1;34m[evaluator/0] I1203 12:54:44.000000 3 terminal.py:91] [Evaluator] Actor Episodes = 3 | Actor Steps = 3000 | Episode Return = nan-ish | Learner Steps = 950 | Learner Walltime = 12.000 | Steps Per Second = 312.2\x1b[0;0m
\x1b[1;34m[evaluator/0] I1203 12:54:54.000000 3 terminal.py:91] [Evaluator] Actor Episodes = 5 | Actor Steps = 5000 | Episode Return = 174.25 | Evaluator Episodes = 4\x1b[0;0m
some unrelated line [Learner] without pairs
"""

SB3_LOG = """\
# sb3 2.9.2 rl_zoo3 2.9.2 torch 2.13.0+cpu threads 1 env CartPole-v1 steps 10000 seed 0 threshold 475.0
env_steps wall_clock_s eval_mean eval_std grad_updates
0 0.1 9.3 0.5 0
2500 3.0 200.0 10.0 600
5000 7.5 480.0 5.0 1200
7500 11.0 500.0 0.0 1800
# done: env_steps 7500 grad_updates 1800 wall 11.0s (eval 1.0s) -> 750 env steps/s, 180 grad updates/s (eval excluded); first eval >= 475.0: step 5000 at 7.5s
"""


def test_acme_log_lines_become_rates_counts_and_returns():
    got = peers.parse_acme_log(ACME_LOG)
    assert got["learner_steps"] == 950 and got["learner_steps_per_s"] == pytest.approx(65.0)  # (950-300)/(12-2)
    # 4000 actor steps over the 20 s between the first and last counter lines, shared by 2 actors
    assert got["actor_steps"] == 5000 and got["actor_steps_per_s_each"] == pytest.approx(100.0)
    assert got["eval_returns"] == [696.49, 520.22, 174.25] and got["last_eval_return"] == pytest.approx(174.25)
    actor_lines = ACME_LOG + ("I1203 12:55:00.0 1 terminal.py:91] [Actor] Actor Steps = 6000 | Steps Per Second = "
                              "120.0\nI1203 12:55:10.0 1 terminal.py:91] [Actor] Steps Per Second = 130.0\n")
    assert peers.parse_acme_log(actor_lines)["actor_steps_per_s_each"] == pytest.approx(125.0)  # actors' own rates
    empty = peers.parse_acme_log("nothing logged\n")
    assert empty["actor_steps"] == 0 and empty["learner_steps_per_s"] is None and empty["last_eval_return"] is None


def test_sb3_output_gives_first_evaluation_at_the_target_and_throughput():
    got = peers.parse_sb3_log(SB3_LOG, 475.0)
    assert got["solved"] and (got["steps_to_target"], got["wall_s_to_target"]) == (5000, 7.5)
    assert got["env_steps_per_s"] == 750 and got["final_return"] == 500.0 and got["version"].startswith("sb3 2.9.2")
    missed = peers.parse_sb3_log(SB3_LOG, 501.0)
    assert not missed["solved"] and missed["steps_to_target"] is None


def test_first_wall_at_reads_our_evaluator_log(tmp_path):
    csv = tmp_path / "evaluator.csv"
    csv.write_text("actor_steps,wall_clock_s,return\n2500,4.0,100\n5000,9.5,480\n7500,14.0,500\n")
    assert peers.first_wall_at(csv, 475) == 9.5 and peers.first_wall_at(csv, 600) is None


def test_missing_peer_interpreter_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        peers.main(["--quick", "--out", str(tmp_path / "o"), "--skip-sb3", "--acme-python", str(tmp_path / "nope"),
                    "--allow-busy"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "--acme-python" in err
    assert not (tmp_path / "o").exists()
