"""bench.learning.int8_vs_fp32's D4PG rows: the row module loads and the merge of separate invocations rebuilds the table."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bench.learning import d4pg_rows as learning_d4pg

RESULTS = Path(__file__).resolve().parents[2] / "results" / "bench"


def _split_by_task(src: Path, dst: Path) -> list[Path]:
    """The committed results, written back as one invocation folder per task (as separate runs would be)."""
    dirs = []
    for name in ("learning_d4pg.csv", "learning_d4pg_curves.csv"):
        with open(src / name, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        for task in sorted({r["task"] for r in rows}):
            d = dst / task.replace(":", "-")
            d.mkdir(parents=True, exist_ok=True)
            with open(d / name, "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(r for r in rows if r["task"] == task)
            if d not in dirs:
                dirs.append(d)
    return dirs


def test_d4pg_rows_are_registered_with_the_issue_targets():
    rows = {r.task: r for r in learning_d4pg.ROWS}
    assert rows["cartpole:balance"].agent == rows["walker:stand"].agent == "d4pg"
    assert rows["cartpole:balance"].target >= 950 and rows["walker:stand"].target >= 900


def test_merge_of_separate_invocations_rebuilds_the_committed_table(tmp_path):
    dirs = _split_by_task(RESULTS, tmp_path / "runs")
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
    merged = learning_d4pg.merge(dirs, tmp_path / "out", ["test"])
    committed = list(csv.DictReader(open(RESULTS / "learning_d4pg.csv", newline="", encoding="utf-8")))
    assert len(merged) == len(committed)
    assert {(r["task"], r["precision"], int(r["seed"])) for r in committed} == \
        {(r["task"], r["precision"], r["seed"]) for r in merged}
    table = (tmp_path / "out" / "learning_d4pg.md").read_text(encoding="utf-8")
    assert "| walker:stand | int8 | 900 | 2/3 |" in table and "| walker:stand | fp32 | 900 | 3/3 |" in table
    assert (tmp_path / "out" / "learning_d4pg.png").stat().st_size
    with pytest.raises(ValueError, match="no learning_d4pg.csv"):
        learning_d4pg.merge([tmp_path], tmp_path / "out2", ["test"])
    assert learning_d4pg.main(["merge", str(tmp_path / "nothing_here"), "--out", str(tmp_path / "o")]) == 2


def test_paired_steps_states_direction_per_seed_and_a_paired_test():
    from bench.learning import int8_vs_fp32 as learning

    row = learning.LearningRow("dqn", "MountainCar-v0", -130.0, 150_000, 2_500)

    def run(precision, seed, steps, solved=True):
        return {"agent": "dqn", "task": row.task, "precision": precision, "seed": seed, "solved": solved,
                "steps_to_target": steps if solved else None}

    results = [run("fp32", 0, 30_000), run("int8", 0, 45_000), run("fp32", 1, 37_500), run("int8", 1, 47_500),
               run("fp32", 2, 40_000), run("int8", 2, 47_500), run("fp32", 3, 20_000), run("int8", 3, 0, False)]
    lines = learning.paired_steps(results, [row])
    line = next(ln for ln in lines if ln.startswith("| MountainCar-v0"))
    # int8 needed more steps on all 3 seeds solved at both precisions: said, with the paired p-value.
    assert "| 3 | 3 / 0 / 0 | +10,833 | 0.04 |" in line and "seed 0: +15,000" in line
    assert "1 seed(s) unsolved at a precision, left out" in line
    assert learning.paired_test([5.0, 5.0]) is None and learning.paired_test([1.0]) is None


def test_a_training_budget_ends_the_run_at_its_first_evaluation_past_it(tmp_path):
    """`run_one(max_train_s=...)`: a run whose target is out of reach still ends, on an evaluation, once the budget
    is spent, long before its step limit (bench.learning.ale_dqn --max-minutes relies on it)."""
    from bench.learning import int8_vs_fp32 as learning

    row = learning.LearningRow("dqn", "CartPole-v1", 1e9, 1_000_000, 500, 1, overrides={"min_replay_size": 200})
    result, curve = learning.run_one(row, "fp32", 0, logdir=tmp_path / "run", max_train_s=1e-3)
    assert not result["solved"] and result["actor_steps"] < 1_000_000
    assert len(curve) == 1 and curve[0]["train_clock_s"] >= 1e-3 and curve[0]["actor_steps"] == 500
