"""analysis.runs reads one evaluator.csv layout (launch.experiments.acting.EVAL_FIELDS) and still reads the layouts
written before it: the single-process one (results/small's runs until its re-run of 2026-12-07) and the distributed
one without train_clock_s."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis.runs import read_evaluator
from launch.experiments.acting import EVAL_FIELDS, evaluation_row
from quarl.ops.logs import CSVLogger

# The single-process runner's evaluator.csv before the one layout: no return_first, episodes, weights_version or
# return_fp32 (the first rows of one of results/small's earlier Acrobot runs).
OLD_SINGLE = ("actor_steps,learner_steps,wall_clock_s,train_clock_s,return,return_std,return_min,return_max\n"
              "2000,1098,9.991,9.991,-500.0,0.0,-500.0,-500.0\n4000,3098,21.779,21.03,-500.0,0.0,-500.0,-500.0\n")


def test_the_one_layout_reads_with_its_training_clock(tmp_path):
    log = CSVLogger(tmp_path / "evaluator.csv", EVAL_FIELDS)
    for steps, clock, train in ((200, 5.0, 4.0), (400, 9.0, 7.5)):
        log.write(evaluation_row([-100.0, -80.0], actor_steps=steps, learner_steps=steps // 2, wall_clock_s=clock,
                                 train_clock_s=train, weights_version=steps // 2))
    log.close()
    df = read_evaluator(tmp_path)
    assert list(df["time_s"]) == [4.0, 7.5] and list(df["return"]) == [-90.0, -90.0]
    assert list(df["return_first"]) == [-100.0, -100.0] and np.isnan(df["return_fp32"]).all()


def test_a_distributed_evaluator_csv_from_before_the_one_layout_reads_on_its_wall_clock(tmp_path):
    (tmp_path / "evaluator.csv").write_text(
        "actor_steps,wall_clock_s,return,return_std,episodes,learner_steps,weights_version\n"
        "300,12.5,21.0,0.0,1,250,245\n600,20.0,35.0,0.0,1,520,515\n", encoding="utf-8")
    df = read_evaluator(tmp_path)
    assert list(df["time_s"]) == [12.5, 20.0] and list(df["train_clock_s"]) == [12.5, 20.0]


def test_a_single_process_evaluator_csv_from_before_the_one_layout_reads_on_its_training_clock(tmp_path: Path):
    (tmp_path / "evaluator.csv").write_text(OLD_SINGLE, encoding="utf-8")
    df = read_evaluator(tmp_path)
    assert list(df["return"]) == [-500.0, -500.0] and "return_first" not in df.columns  # the old columns, as written
    assert list(df["time_s"]) == [9.991, 21.03] and (df["time_s"] <= df["wall_clock_s"]).all()
