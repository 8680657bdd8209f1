"""analysis.runs reads one evaluator.csv layout (launch.experiments.acting.EVAL_FIELDS) and still reads the layouts written
before it: the single-process one committed under results/small and the distributed one without train_clock_s."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis.runs import read_evaluator
from launch.experiments.acting import EVAL_FIELDS, evaluation_row
from quarl.ops.logs import CSVLogger

REPO = Path(__file__).resolve().parents[2]
OLD_SINGLE = REPO / "results" / "small" / "runs" / "Acrobot" / "fp32" / "seed0"


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


def test_a_committed_single_process_run_from_before_the_one_layout_still_reads():
    if not (OLD_SINGLE / "evaluator.csv").exists():
        pytest.skip("results/small is not in this checkout")
    df = read_evaluator(OLD_SINGLE)
    assert len(df) > 0 and "return_first" not in df.columns  # the old columns, as written
    assert (df["time_s"] == df["train_clock_s"]).all() and (df["time_s"] <= df["wall_clock_s"]).all()
