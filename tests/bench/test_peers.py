"""bench.peers.offpolicy: peers' own log lines are parsed into the figures the report shows, and a missing peer
interpreter stops the benchmark with one line before anything runs."""
from __future__ import annotations

import sys

import pytest

from bench.harness.learning_runs import eval_metrics
from bench.peers import offpolicy as peers, offpolicy_results

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
    assert got["last3_mean"] == pytest.approx((200 + 480 + 500) / 3) and got["stay_fraction"] == 1.0
    assert got["eval_returns"] == [200.0, 480.0, 500.0]  # step 0 (the untrained policy) is not one of ours' either
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


def _evals(returns, every=5000):
    return [{"env_steps": every * (i + 1), "wall_clock_s": 2.0 * (i + 1), "return": r} for i, r in enumerate(returns)]


def test_eval_metrics_tell_a_policy_that_stays_solved_from_one_that_collapses():
    stays = eval_metrics(_evals([100, 480, 500, 500, 490, 500]), 475)
    assert (stays["steps_to_target"], stays["wall_s_to_target"]) == (10_000, 4.0)
    assert stays["last3_mean"] == pytest.approx(496.67, abs=0.01) and stays["stay_fraction"] == 1.0
    collapses = eval_metrics(_evals([100, 480, 500, 127, 160, 188]), 475)  # the seed 0
    assert collapses["steps_to_target"] == 10_000 and collapses["last3_mean"] == pytest.approx(158.33, abs=0.01)
    assert collapses["stay_fraction"] == pytest.approx(0.25) and collapses["final_return"] == 188
    never = eval_metrics(_evals([-500, -300, -200]), -130)
    assert not never["solved"] and never["steps_to_target"] is None and never["stay_fraction"] is None
    assert never["last3_mean"] == pytest.approx(-1000 / 3)
    last_only = eval_metrics(_evals([-200, -120]), -130)
    assert last_only["solved"] and last_only["stay_fraction"] is None  # nothing after the solve to judge
    assert eval_metrics([], 475)["last3_mean"] is None


FAKE_SB3 = """\
import argparse
p = argparse.ArgumentParser()
for flag in ("--env", "--seed", "--steps", "--eval_every", "--eval_episodes", "--threshold", "--max_seconds"):
    p.add_argument(flag)
a = p.parse_args()
print("# sb3 2.9.2 fake for", a.env, "seed", a.seed)
print("env_steps wall_clock_s eval_mean eval_std grad_updates")
every, steps = int(a.eval_every), int(a.steps)
for i, step in enumerate(range(0, steps + 1, every)):
    print(step, 1.5 * i, 9.0 if step == 0 else 20.0 * i, 1.0, step // 2)
print("# done: env_steps", steps, "-> 500 env steps/s, 250 grad updates/s (eval excluded)")
"""


@pytest.mark.slow  # trains our DQN and parses the peers' logs
def test_dqn_comparison_reports_time_to_solve_and_final_returns_at_tiny_size(tmp_path):
    """bench_dqn end to end at a tiny budget: SB3's part from a stand-in script speaking run.py's output format,
    ours a real 1,000-step run per precision; every figure the table shows comes out of the runs' own logs."""
    import argparse
    from bench.harness.rows import LearningRow

    anchors = tmp_path / "anchors"
    (anchors / "sb3_dqn").mkdir(parents=True)
    (anchors / "sb3_dqn" / "run.py").write_text(FAKE_SB3)
    row = LearningRow("dqn", "CartPole-v1", 30.0, 1_000, 250, 2, overrides={"min_replay_size": 200})
    args = argparse.Namespace(sb3_python=sys.executable, anchors=anchors, quick=False, dqn_tasks=[row.task])
    rows = peers.bench_dqn(args, tmp_path / "out", [0], rows=[row])
    assert [r["system"] for r in rows] == ["sb3", "ours int8", "ours fp32"]
    sb3 = rows[0]
    assert sb3["steps_to_target"] == 500 and sb3["last3_mean"] == pytest.approx(60.0)  # evals 40, 60, 80
    assert sb3["stay_fraction"] == 1.0 and sb3["env_steps_per_s"] == 500
    for ours in rows[1:]:
        assert len(ours["eval_returns"]) == 4 and ours["overrides"] == {"min_replay_size": 200}
        assert ours["last3_mean"] == pytest.approx(sum(ours["eval_returns"][-3:]) / 3)
        assert ours["env_steps_per_s"] > 0
    table = "\n".join(offpolicy_results.dqn_markdown(rows))
    assert "| CartPole-v1 | sb3 | 1/1 | 500 | 3.0 | 60.0 / 60.0 | 80.0 / 80.0 | 1.00 |" in table
    assert table.count("| CartPole-v1 | ours ") == 2 and "SB3 run: sb3 2.9.2 fake" in table
    # A second sitting into the same folder reads only its own runs (run logs append: the old run is removed first).
    for ours in peers.bench_dqn(args, tmp_path / "out", [0], rows=[row])[1:]:
        assert len(ours["eval_returns"]) == 4


def test_merge_keeps_other_tasks_rows_and_records_each_sitting():
    """Tasks measured in separate sittings (`--merge`) end up in one table; a task measured again replaces its
    earlier rows, and the report names both commands."""
    machine = {"cpu": "test cpu", "cores": 2, "load_start": [0.1], "load_end": [0.2]}
    def row(task: str, system: str, last: float) -> dict:
        return {"task": task, "system": system, "seed": 0, "target": 1.0, "solved": True, "steps_to_target": 10,
                "wall_s_to_target": 1.0, "last3_mean": last, "final_return": last, "stay_fraction": 1.0,
                "env_steps_per_s": 5.0}


    earlier = {"command": "python -m bench.peers.offpolicy --dqn-tasks Acrobot-v1,CartPole-v1", "machine": machine,
               "dqn": [row("Acrobot-v1", "sb3", -90.0), row("CartPole-v1", "sb3", 100.0)], "d4pg": [{"x": 1}]}
    now = {"command": "python -m bench.peers.offpolicy --dqn-tasks CartPole-v1 --skip-acme", "machine": machine,
           "dqn": [row("CartPole-v1", "sb3", 500.0)]}
    merged = peers.merge_results(earlier, now)
    assert [(r["task"], r["last3_mean"]) for r in merged["dqn"]] == [("Acrobot-v1", -90.0), ("CartPole-v1", 500.0)]
    assert merged["d4pg"] == [{"x": 1}] and merged["command"] == now["command"]
    text = peers.markdown({**merged, "d4pg": []})  # (the D4PG part has its own rows; carried over as they were)
    assert earlier["command"] in text and now["command"] in text
    assert "| CartPole-v1 | sb3 | 1/1 |" in text and "100.0" not in text
    assert peers.merge_results({**earlier, "d4pg": []}, {**now, "dqn": [row("Acrobot-v1", "sb3", -80.0),
                                                                    row("CartPole-v1", "sb3", 500.0)]}) == {
        **now, "dqn": [row("Acrobot-v1", "sb3", -80.0), row("CartPole-v1", "sb3", 500.0)]}  # all remeasured


def test_merge_credits_only_the_sittings_whose_rows_survive():
    """A task measured again replaces the earlier sitting's rows; a sitting with no row left is no longer named."""
    machine = {"cpu": "test cpu", "cores": 2, "load_start": [0.1], "load_end": [0.2]}

    def sitting(task: str, ret: float) -> dict:
        return {"command": f"python -m bench.peers.offpolicy --skip-acme --dqn-tasks {task} --merge x{ret}", "machine": machine,
                "dqn": [{"task": task, "system": "sb3", "seed": 0, "target": 1.0, "solved": True,
                         "steps_to_target": 10, "wall_s_to_target": 1.0, "last3_mean": ret, "final_return": ret,
                         "stay_fraction": 1.0, "env_steps_per_s": 5.0}]}

    cart, car_old, car_new, acro = (sitting("CartPole-v1", 1.0), sitting("MountainCar-v0", 2.0),
                                    sitting("MountainCar-v0", 3.0), sitting("Acrobot-v1", 4.0))
    merged = peers.merge_results(peers.merge_results(peers.merge_results(cart, car_old), car_new), acro)
    assert [s["command"] for s in merged["earlier_sittings"]] == [cart["command"], car_new["command"]]
    assert [s["tasks"] for s in merged["earlier_sittings"]] == [["CartPole-v1"], ["MountainCar-v0"]]
    assert sorted(r["last3_mean"] for r in merged["dqn"]) == [1.0, 3.0, 4.0]
    text = peers.markdown({**merged, "d4pg": []})
    assert car_old["command"] not in text and car_new["command"] in text and cart["command"] in text


def test_dqn_stability_records_one_line_per_run_and_rejects_bad_settings(tmp_path, capsys):
    """bench.learning.dqn_stability at a tiny size: a real (untrained) run per seed, one JSON line each with the figures
    bench.peers.offpolicy reports; a bad --set is a one-line error, exit 2."""
    import json
    from bench.learning import dqn_stability
    out = tmp_path / "s.jsonl"
    assert dqn_stability.main(["--seeds", "0,1", "--precisions", "fp32", "--steps", "300", "--set",
                               "hidden_sizes=16,16", "--out", str(out), "--label", "tiny"]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["label"], r["seed"], r["precision"]) for r in lines] == [("tiny", 0, "fp32"), ("tiny", 1, "fp32")]
    for r in lines:
        assert r["overrides"]["hidden_sizes"] == [16, 16] and len(r["eval_returns"]) == 1  # the final evaluation
        assert r["last3_mean"] == r["final_return"] == r["eval_returns"][0] and not r["solved"]
    with pytest.raises(SystemExit) as e:
        dqn_stability.main(["--set", "no_such_key=1", "--out", str(out)])
    assert e.value.code == 2 and "no_such_key" in capsys.readouterr().err
