"""bench.learning.int8_vs_fp32's D4PG rows: the row module loads, the merge of separate invocations rebuilds the table;
the seed-paired report and a run's training budget (bench.harness.learning_runs)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bench.harness.results_io import write_csv
from bench.learning import d4pg_rows as learning_d4pg


def _run_line(task: str, target: float, precision: str, seed: int) -> dict:
    """One result line in the columns `bench.harness.learning_runs.run_one` gives a run (every run solved)."""
    steps = 20_000 + 2_500 * seed + (5_000 if precision == "int8" else 0)
    return {"agent": "d4pg", "task": task, "precision": precision, "backend": "onnx", "seed": seed, "target": target,
            "solved": True, "steps_to_target": steps, "train_s_to_target": steps / 100, "final_return": target + 10,
            "best_return": target + 20, "actor_steps": steps, "learner_steps": steps // 4, "train_s": steps / 100,
            "env_steps_per_s": 100.0, "learner_device": "cpu", "payload_bytes": 25_000, "payload_bytes_fp32": 100_000,
            "pull_ms_per_update": 1.5, "load_ms_per_update": 0.5, "inference_us_per_step": 40.0,
            "logdir": f"runs/bench/learning/{task}_{precision}_s{seed}"}


def _invocations(dst: Path) -> tuple[list[Path], list[dict]]:
    """One output folder per D4PG row, as separate `bench.learning.int8_vs_fp32 --rows d4pg --tasks T --out DIR` runs
    write them (learning_d4pg.csv and learning_d4pg_curves.csv), three seeds at both precisions; and every line."""
    dirs, lines = [], []
    for row in learning_d4pg.ROWS:
        mine = [_run_line(row.task, row.target, precision, seed) for seed in range(3) for precision in ("fp32", "int8")]
        curves = [{"agent": "d4pg", "task": row.task, "precision": r["precision"], "seed": r["seed"],
                   "actor_steps": step, "train_clock_s": step / 100, "return": row.target * step / r["actor_steps"]}
                  for r in mine for step in range(row.eval_every, r["actor_steps"] + 1, row.eval_every)]
        d = dst / row.task.replace(":", "-")
        d.mkdir(parents=True)
        write_csv(d / "learning_d4pg.csv", mine)
        write_csv(d / "learning_d4pg_curves.csv", curves)
        dirs.append(d)
        lines += mine
    return dirs, lines


def test_d4pg_rows_are_registered_with_the_issue_targets():
    from bench.learning import int8_vs_fp32

    assert int8_vs_fp32.row_set("d4pg") == learning_d4pg.ROWS  # `--rows d4pg` loads bench.learning.d4pg_rows
    with pytest.raises(ValueError, match="unknown row set 'nope'"):
        int8_vs_fp32.row_set("nope")
    rows = {r.task: r for r in learning_d4pg.ROWS}
    assert rows["cartpole:balance"].agent == rows["walker:stand"].agent == "d4pg"
    assert rows["cartpole:balance"].target >= 950 and rows["walker:stand"].target >= 900


def test_merge_of_separate_invocations_rebuilds_the_table(tmp_path):
    dirs, lines = _invocations(tmp_path / "runs")
    # One walker int8 seed made to miss its target: the merged table must count from the rows, not copy text.
    walker = next(d for d in dirs if d.name == "walker-stand") / "learning_d4pg.csv"
    with open(walker, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    miss = next(r for r in rows if r["precision"] == "int8")
    miss.update(solved="False", steps_to_target="", train_s_to_target="")
    with open(walker, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    merged = learning_d4pg.merge(dirs[::-1], tmp_path / "out", ["test"])  # the rows' order, not the folders'
    assert len(merged) == len(lines)
    assert [(r["task"], r["precision"], r["seed"]) for r in merged] == \
        [(row.task, p, s) for row in learning_d4pg.ROWS for p in ("fp32", "int8") for s in range(3)]
    assert merged[0]["steps_to_target"] == 20_000 and merged[0]["solved"] is True  # typed back from the CSV
    table = (tmp_path / "out" / "learning_d4pg.md").read_text(encoding="utf-8")
    assert "| walker:stand | int8 | 900 | 2/3 |" in table and "| walker:stand | fp32 | 900 | 3/3 |" in table
    assert (tmp_path / "out" / "learning_d4pg.png").stat().st_size
    with pytest.raises(ValueError, match="no learning_d4pg.csv"):
        learning_d4pg.merge([tmp_path], tmp_path / "out2", ["test"])
    assert learning_d4pg.main(["merge", str(tmp_path / "nothing_here"), "--out", str(tmp_path / "o")]) == 2


def test_paired_steps_states_direction_per_seed_and_a_paired_test():
    from bench.harness.learning_runs import paired_test
    from bench.harness.rows import LearningRow
    from bench.learning.int8_vs_fp32_report import paired_steps

    row = LearningRow("dqn", "MountainCar-v0", -130.0, 150_000, 2_500)

    def run(precision, seed, steps, solved=True):
        return {"agent": "dqn", "task": row.task, "precision": precision, "seed": seed, "solved": solved,
                "steps_to_target": steps if solved else None}

    results = [run("fp32", 0, 30_000), run("int8", 0, 45_000), run("fp32", 1, 37_500), run("int8", 1, 47_500),
               run("fp32", 2, 40_000), run("int8", 2, 47_500), run("fp32", 3, 20_000), run("int8", 3, 0, False)]
    lines = paired_steps(results, [row])
    line = next(ln for ln in lines if ln.startswith("| MountainCar-v0"))
    # int8 needed more steps on all 3 seeds solved at both precisions: said, with the paired p-value.
    assert "| 3 | 3 / 0 / 0 | +10,833 | 0.04 |" in line and "seed 0: +15,000" in line
    assert "1 seed(s) unsolved at a precision, left out" in line
    assert paired_test([5.0, 5.0]) is None and paired_test([1.0]) is None


def test_a_training_budget_ends_the_run_at_its_first_evaluation_past_it(tmp_path):
    """`run_one(max_train_s=...)`: a run whose target is out of reach still ends, on an evaluation, once the budget
    is spent, long before its step limit (bench.learning.ale_dqn --max-minutes relies on it)."""
    from bench.harness.learning_runs import run_one
    from bench.harness.rows import LearningRow

    row = LearningRow("dqn", "CartPole-v1", 1e9, 1_000_000, 500, 1, overrides={"min_replay_size": 200})
    result, curve = run_one(row, "fp32", 0, logdir=tmp_path / "run", max_train_s=1e-3)
    assert not result["solved"] and result["actor_steps"] < 1_000_000
    assert len(curve) == 1 and curve[0]["train_clock_s"] >= 1e-3 and curve[0]["actor_steps"] == 500
