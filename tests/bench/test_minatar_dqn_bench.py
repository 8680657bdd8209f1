"""bench.learning.minatar_dqn's report: the authors' reference points, rows rebuilt from run logs, frames and seeds shown."""
from __future__ import annotations

import json

import pytest

from bench.learning import minatar_dqn


def test_authors_reference_is_the_last_point_at_or_below_our_frames():
    assert minatar_dqn.authors_at("Breakout", 150_000) == (100_000, 4.5)
    assert minatar_dqn.authors_at("SpaceInvaders", 5_000_000)[1] == 43.0
    assert minatar_dqn.authors_at("Breakout", 10)[0] == 100_000  # below every point: the first one


def test_report_from_run_logs_records_frames_seeds_and_the_shortfall(tmp_path):
    run = tmp_path / "SpaceInvaders_int8_s3"
    run.mkdir()
    (run / "evaluator.csv").write_text("actor_steps,learner_steps,wall_clock_s,train_clock_s,return\n"
                                       "20000,1,1,1,12.0\n40000,2,2,2,15.0\n")
    out = tmp_path / "out"
    assert minatar_dqn.main(["--from-runs", str(run), "--out", str(out)]) == 0
    (row,) = json.loads((out / "minatar_dqn.json").read_text())["results"]
    assert (row["game"], row["seed"], row["frames"], row["final_return"]) == ("SpaceInvaders", 3, 40_000, 15.0)
    text = (out / "minatar_dqn.md").read_text()
    assert "| SpaceInvaders | 3 | 40,000 | 15.0 | 15.0 | 20.0 (at 100,000) | 43.0 | 5.0 (25%) |" in text
    assert "Young & Tian (2019)" in text and "report written from the run logs" in text


@pytest.mark.parametrize("argv", [["--games", "Pong"], ["--frames", "0"], ["--from-runs", "/nonexistent/x_int8_s0"]])
def test_bad_arguments_exit_2(argv, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        minatar_dqn.main([*argv, "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and "error" in capsys.readouterr().err
