"""One CLI habit for launch.train and launch.actorq: defaults and whole texts in --help, plain progress lines
when stdout is not a terminal (no control characters in logs), --config from a run's summary.json with
--logdir/--seed overrides, and the same end-of-run table."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launch import actorq, ptq, train
from launch.experiments.progress import ProgressView, Snapshot, StepProgress
from launch.experiments.summary_table import print_summary
from tests.launch.tiny import tiny_config

REPO = Path(__file__).resolve().parents[2]
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # anything but \t and \n: \r, ESC ...


@pytest.mark.parametrize("module, needles", [
    (train, ["Every flag has a default", "--config runs/dqn/summary.json", "(default: int8)", "(default: 0)",
             "(default: 60000 for d4pg, 25000 for dqn, 100000 for ppo, 100000 for a2c)", "greedy episodes per evaluation (default: 10; ALE: 3",
             "evaluations in a row"]),
    (actorq, ["Faults:", "(default: int8)", "(default: 0)", "(default: 2)", "(default: ray)",
              "learner steps between weight versions (default: 10)", "evaluations in a row",
              # defaults of 0, 0.0 and None are shown too (0 == False once hid them)
              "(0: only when the run ends) (default: 0)", "between weight versions (default: 0.0)",
              "default: 60000 for d4pg, 25000 for dqn, 100000 for ppo, 100000 for a2c)"]),
    (ptq, ["episode i uses environment seed SEED + i (default: 0)"]),
])
def test_help_shows_the_whole_text_and_every_default(module, needles, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        module.main(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for needle in needles:
        assert " ".join(needle.split()) in text, needle
    assert "first evaluation whose" not in text  # --target-return's rule is a streak


def test_progress_lines_when_stdout_is_no_terminal() -> None:
    out = io.StringIO()
    bar = StepProgress(1000, True, tty=False, line_every_s=0.0, stream=out)
    for _ in range(4):
        bar.update(250)
        bar.set_postfix(eval_return="12.5", learner_steps=100)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and not CONTROL.search(out.getvalue())
    assert lines[0].startswith("launch.train: ") and "actor steps 250 / 1,000 (25%" in lines[0]
    assert "actor steps 1,000 / 1,000 (100%" in lines[-1] and "eval return 12.5 at 750 steps" in lines[-1]

    # The learner's count moves with every update, not only at evaluations (launch.train passes it each time).
    out = io.StringIO()
    bar = StepProgress(1000, True, tty=False, line_every_s=0.0, stream=out)
    bar.update(500, learner_steps=130)
    bar.update(500, learner_steps=13_000)
    bar.close()
    assert ["learner steps 130 (" in l for l in out.getvalue().splitlines()] == [True, False]
    assert "learner steps 13,000 (" in out.getvalue().splitlines()[-1]

    # Lines are rate-limited: many updates within the period give one line now and the last state at the end.
    out = io.StringIO()
    bar = StepProgress(1000, True, tty=False, line_every_s=3600.0, stream=out)
    for _ in range(10):
        bar.update(100)
    bar.close()
    assert [("100 /" in l, "1,000 / 1,000" in l) for l in out.getvalue().splitlines()] == [(True, False),
                                                                                         (False, True)]
    out = io.StringIO()
    StepProgress(10, False, tty=False, stream=out).update(5)  # --no-progress: nothing
    assert out.getvalue() == ""


def test_actorq_view_prints_lines_without_a_terminal_and_no_placeholder_frame(capsys) -> None:
    with ProgressView(True, "t", tty=False, line_every_s=0.0) as view:
        view.update(Snapshot(actor_steps=0, max_actor_steps=25_000, elapsed_s=1.0))
        view.update(Snapshot(actor_steps=5_000, max_actor_steps=25_000, learner_steps=40, episodes=3,
                             eval_return=9.5, eval_at=4_000, elapsed_s=6.0))
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 2 and not CONTROL.search(out) and "/ 1 " not in out
    assert lines[0].startswith("launch.actorq: 1 s  actor steps 0 / 25,000 (0%")
    assert "5,000 / 25,000 (20%" in lines[1] and "episodes 3" in lines[1] and "eval return 9.5 at 4,000" in lines[1]


def test_summary_table_names_what_ran_the_run_folder_and_a_missing_target(capsys) -> None:
    summary = {"agent": "dqn", "task": "CartPole-v1", "precision": "int8", "status": "completed",
               "executed": "int8 weights, fp32 compute (dequantized)", "executor": "onnx-dequantized",
               "cpu_class": "x86-avx2", "final_eval_return": 500.0, "target_return": None, "solved": None,
               "logdir": "/x/run", "payload": {}, "actors": []}
    print_summary(summary)
    out = " ".join(capsys.readouterr().out.split())
    assert "actors ran int8 weights, fp32 compute (dequantized)" in out
    assert "onnx-dequantized (x86-avx2)" in out and "no target set (--target-return)" in out
    assert out.endswith("run folder: /x/run")


def test_the_end_table_shows_one_labelled_clock_and_the_first_and_the_stable_evaluation_at_the_target(
        tmp_path: Path, capsys, monkeypatch) -> None:
    """summary.json's three clocks have one meaning each (launch.actorq fills train_clock_s: its evaluator runs
    beside training), the table shows the run clock, evaluator.csv's, under a label that says so, and both the
    first evaluation at the target and the one that ended the streak, with their steps and seconds."""
    from launch.experiments.acting import EVAL_FIELDS
    from launch.experiments.summary import make_summary
    from quarl.ops.logs import CSVLogger

    config = tiny_config(tmp_path, target_return=950.0, target_streak=2)
    log = CSVLogger(tmp_path / "evaluator.csv", EVAL_FIELDS)
    for i, ret in enumerate((100.0, 960.0, 900.0, 955.0, 970.0), start=1):  # first >= 950: #2; the streak ends: #5
        log.write({"actor_steps": 100 * i, "learner_steps": 40 * i, "wall_clock_s": 5.0 * i,
                   "train_clock_s": 5.0 * i, "return": ret})
    log.close()
    summary = make_summary(config, "completed", None, {}, {"counts": {"actor_steps": 500, "wall_clock_s": 26.0}},
                           wall_clock_s=33.0, num_actors=2)
    assert (summary["wall_clock_s"], summary["run_wall_clock_s"], summary["train_clock_s"]) == (33.0, 26.0, 26.0)
    assert summary["first_at_target"] == {"target_return": 950.0, "return": 960.0, "actor_steps": 200,
                                          "learner_steps": 80, "wall_clock_s": 10.0}
    assert summary["solved"] == {"target_return": 950.0, "streak": 2, "return": 970.0, "actor_steps": 500,
                                 "learner_steps": 200, "wall_clock_s": 25.0}
    assert summary["time_to_target_s"] == 25.0 and summary["actor_steps_to_target"] == 500
    monkeypatch.setenv("COLUMNS", "200")  # one line a row
    print_summary(summary)
    out = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines() if line.count("│") == 3}
    caption = " ".join(out.split())
    assert rows["run clock (s)"] == "26.0" and "run clock: the run's own" in caption and "as in evaluator.csv" in caption
    assert rows["first eval >= target"] == "960.0 >= 950 at 200 actor / 80 learner steps, 10.0 s"
    assert rows["solved (2 evals in a row >= target)"] == "970.0 >= 950 at 500 actor / 200 learner steps, 25.0 s"
    assert not any("wall clock" in label or "33.0" in value for label, value in rows.items())  # one clock only


def _summary_file(tmp_path: Path) -> tuple[Path, object]:
    config = tiny_config(tmp_path / "old", num_actors=1)
    (tmp_path / "old").mkdir()
    path = tmp_path / "old" / "summary.json"
    path.write_text(json.dumps({"status": "completed", "runner": "single", "experiment": config.to_dict()}))
    return path, config


def test_config_reads_a_summarys_experiment_with_logdir_and_seed_overrides(tmp_path: Path, capsys) -> None:
    path, config = _summary_file(tmp_path)
    new = str(tmp_path / "new")
    got = train.validate(train.build_parser().parse_args(["--config", str(path), "--logdir", new, "--seed", "7"]))
    assert got == config.replace(logdir=new, seed=7)
    inv = actorq.validate(actorq.build_parser().parse_args(["--config", str(path), "--logdir", new,
                                                            "--runner", "local"]))
    assert inv.config == config.replace(logdir=new)
    # The summary's own folder holds its run: a new --logdir is asked for; other flags are refused.
    for main in (train.main, actorq.main):
        for argv, needle in ((["--config", str(path)], "pass --logdir"),
                             (["--config", str(path), "--logdir", new, "--precision", "fp32"], "drop --precision")):
            with pytest.raises(SystemExit) as exc:
                main(argv)
            err = capsys.readouterr().err
            assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    no_experiment = tmp_path / "older.json"
    no_experiment.write_text(json.dumps({"status": "completed", "runner": "single", "experiment": None}))
    with pytest.raises(SystemExit):
        train.main(["--config", str(no_experiment), "--logdir", new])
    assert "without an `experiment` object" in capsys.readouterr().err
    assert not Path(new).exists()


def test_train_in_a_log_prints_plain_progress_lines_the_table_and_the_run_folder(tmp_path: Path) -> None:
    logdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "launch.train", "--agent", "dqn", "--task", "CartPole-v1", "--steps", "300",
           "--eval-every", "150", "--eval-episodes", "1", "--backend", "onnx", "--logdir", str(logdir),
           "--set", "hidden_sizes=16", "--set", "min_replay_size=64", "--set", "batch_size=16"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not CONTROL.search(proc.stdout), repr(proc.stdout[:300])
    assert "launch.train: " in proc.stdout and "actor steps 300 / 300 (100%" in proc.stdout
    # The first line comes at step 100, before the first evaluation (150), and the learner already trains by then.
    first = next(line for line in proc.stdout.splitlines() if line.startswith("launch.train: "))
    assert "actor steps 100 / 300" in first and int(re.search(r"learner steps ([\d,]+)", first)[1].replace(",", "")) > 0
    summary = json.loads((logdir / "summary.json").read_text())
    assert f"actors ran {summary['executed']}" in " ".join(proc.stdout.split())
    assert proc.stdout.strip().splitlines()[-1] == f"run folder: {logdir.absolute()}"
    # The best policy by evaluation is kept beside the last one, readable by launch.ptq.
    from quarl.quant.policy_io import load_policy
    best = load_policy(logdir / summary["best_policy_file"])
    assert summary["best_policy_file"] == "policy_best_int8.qrlp" and (logdir / "policy_fp32.qrlp").is_file()
    assert best.meta["extra"]["eval_return"] == summary["best_eval_return"]


def test_actor_table_splits_insert_from_time_held_by_the_rate_limiter(capsys) -> None:
    times = {"env_step_s": 10.0, "policy_s": 5.0, "insert_s": 41.5, "updates": 10, "pull_ms_per_update": 1.0,
             "deserialize_ms_per_update": 0.5, "load_ms_per_update": 0.2}
    summary = {"agent": "dqn", "task": "CartPole-v1", "precision": "int8", "payload": {}, "logdir": None,
               "actors": [{"actor_id": 0, "backend": "onnx", "times": times},
                          {"actor_id": 1, "backend": "onnx", "times": times}],
               "replay": {"insert_blocked_s": 61.0}, "runtime": {"summed_s": {"env_step_s": 20.0, "policy_s": 10.0}}}
    from launch.experiments.summary_table import insert_split
    assert insert_split(summary) == (22.0, 61.0)  # 83 s in insert, 61 of them held by the limiter
    print_summary(summary)
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "all actors │" in line)
    assert re.search(r"22\.0\D+61\.0", row), row
    assert "held by the rate limiter" in out
