"""analysis.report on hand-made run folders (exact time-to-target, speedup, carbon and curve numbers) and
launch.reproduce end to end on a tiny grid (files written, finished runs skipped, interrupted runs redone)."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pytest

from analysis import report
from launch import reproduce
from quarl.runtimes.cpu import cpu_class, cpu_info

# ------------------------------------------------------------------------------------------------ fixtures


def write_run(root: Path, panel: str, precision: str, seed: int, times: Sequence[float],
              returns: Sequence[float], *, steps: int = 1000, kwh: float | None = 1e-3,
              runtime: dict[str, float] | None = None, summary: bool = True, distributed: bool = False,
              status: str = "completed", executed: str | None = None) -> Path:
    """A run folder as a runner leaves it: evaluator.csv and (unless interrupted) summary.json, in the one
    layout both runners write (the fields analysis reads), as one process or as a learner and actors."""
    run_dir = root / "runs" / panel / precision / f"seed{seed}"
    run_dir.mkdir(parents=True)
    n = len(times)
    evals = pd.DataFrame({"actor_steps": np.linspace(steps / n, steps, n).astype(int),
                          "wall_clock_s": times, "return": returns})
    evals.to_csv(run_dir / "evaluator.csv", index=False)
    if not summary:
        return run_dir
    stages = runtime or {"env_step_s": 1.0, "policy_s": 2.0, "pull_s": 0.1, "deserialize_s": 0.01,
                         "load_s": 0.05}
    p = report.PANELS[panel]
    nodes = ["learner", "actor_0"] if distributed else ["run"]
    s: dict[str, Any] = {"status": status, "runner": "actorq" if distributed else "single",
                         "num_actors": 2 if distributed else 1, "agent": p.agent, "task": p.task,
                         "precision": precision, "seed": seed, "actor_steps": steps, "learner_steps": steps // 4,
                         "wall_clock_s": float(times[-1]) + (1.0 if distributed else 0.0),
                         "run_wall_clock_s": float(times[-1]), "final_eval_return": float(returns[-1]),
                         "best_eval_return": float(max(returns)), "payload_bytes": 100, "payload_bytes_fp32": 400,
                         "runtime": {"summed_s": dict(stages), "updates": 10},
                         "energy": {"nodes": {}, "total_kwh": None, "total_emissions_kg": None,
                                    "untracked_nodes": nodes, "method": "unavailable: no energy tracker reported"}}
    if executed is not None:
        s["executed"] = executed
    if kwh is not None:
        share = {"energy_kwh": kwh / len(nodes), "emissions_kg_co2eq": kwh / 2 / len(nodes)}
        s["energy"] = {"nodes": {name: dict(share) for name in nodes}, "total_kwh": kwh,
                       "total_emissions_kg": kwh / 2, "untracked_nodes": [], "method": "cpu=estimated: test"}
    (run_dir / "summary.json").write_text(json.dumps(s), encoding="utf-8")
    return run_dir


def make_synthetic_results(root: Path) -> Path:
    """A results/<name> folder with two panels, fp32 vs int8, two seeds each (used by the notebook tests)."""
    t = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    # CartPole: fp32 final 100 -> target 90, reached at 50 s and 60 s (mean 55); int8 at 20 s and 30 s (mean 25).
    write_run(root, "CartPole", "fp32", 0, t, [0, 10, 20, 50, 95, 100], kwh=4e-3)
    write_run(root, "CartPole", "fp32", 1, t, [0, 10, 20, 50, 80, 100], kwh=4e-3)
    write_run(root, "CartPole", "int8", 0, t, [0, 92, 95, 100, 100, 100], kwh=2e-3,
              runtime={"env_step_s": 1.0, "policy_s": 0.5, "pull_s": 0.05, "deserialize_s": 0.01, "load_s": 0.02})
    write_run(root, "CartPole", "int8", 1, t, [0, 50, 91, 100, 100, 100], kwh=2e-3,
              runtime={"env_step_s": 1.0, "policy_s": 0.5, "pull_s": 0.05, "deserialize_s": 0.01, "load_s": 0.02})
    # Acrobot (negative returns): fp32 final -100 -> target -110.
    write_run(root, "Acrobot", "fp32", 0, t, [-500, -400, -300, -200, -105, -100], distributed=True)
    write_run(root, "Acrobot", "int8", 0, t, [-500, -300, -108, -100, -100, -100], distributed=True)
    return root


# ------------------------------------------------------------------------------------------------ report


def test_target_return_is_fraction_of_final_from_the_top_for_negative_returns() -> None:
    assert report.target_return(100.0, 0.9) == pytest.approx(90.0)
    assert report.target_return(-100.0, 0.9) == pytest.approx(-110.0)
    with pytest.raises(ValueError, match="fraction"):
        report.target_return(1.0, 0.0)


def test_time_to_target_is_the_first_evaluation_at_or_above_target() -> None:
    evals = pd.DataFrame({"actor_steps": [1, 2, 3, 4], "wall_clock_s": [10.0, 20.0, 30.0, 40.0],
                          "return": [0.0, 95.0, 80.0, 100.0]})
    assert report.time_to_target(evals, 90.0, x="wall_clock_s") == 20.0
    assert report.time_to_target(evals, 95.0, x="wall_clock_s") == 20.0
    assert report.time_to_target(evals, 96.0, x="wall_clock_s") == 40.0
    assert report.time_to_target(evals, 96.0, x="actor_steps") == 4
    assert math.isnan(report.time_to_target(evals, 101.0, x="wall_clock_s"))


def test_training_clock_is_used_when_logged(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, "CartPole", "fp32", 0, [10.0, 20.0, 30.0], [0.0, 50.0, 100.0])
    evals = pd.read_csv(run_dir / "evaluator.csv")
    evals["train_clock_s"] = [8.0, 15.0, 21.0]  # the same evaluations, minus the time spent evaluating
    evals.to_csv(run_dir / "evaluator.csv", index=False)
    assert report.read_evaluator(run_dir)["time_s"].tolist() == [8.0, 15.0, 21.0]
    ttt = report.with_time_to_target(report.load_runs(tmp_path), 0.9)
    assert ttt["time_to_target"].item() == 21.0 and ttt["wall_to_target"].item() == 30.0


def test_speedup_table_on_hand_made_runs(tmp_path: Path) -> None:
    runs = report.load_runs(make_synthetic_results(tmp_path) / "runs")
    table = report.speedup_table(runs, 0.9).set_index(["panel", "precision"])
    fp32, int8 = table.loc[("CartPole", "fp32")], table.loc[("CartPole", "int8")]
    assert fp32["target_return"] == pytest.approx(90.0)
    assert fp32["time_to_target_s"] == pytest.approx(55.0) and fp32["seeds_reached"] == 2
    assert int8["time_to_target_s"] == pytest.approx(25.0)
    assert int8["speedup_vs_fp32"] == pytest.approx(55.0 / 25.0)
    assert fp32["speedup_vs_fp32"] == pytest.approx(1.0)
    acro = table.loc[("Acrobot", "int8")]
    assert acro["target_return"] == pytest.approx(-110.0)
    assert acro["time_to_target_s"] == pytest.approx(30.0)  # -108 >= -110 at 30 s
    assert acro["speedup_vs_fp32"] == pytest.approx(50.0 / 30.0)
    # A run that never reaches the target counts in `seeds` but not in the mean.
    write_run(tmp_path, "CartPole", "int8", 2, [10.0, 20.0], [0.0, 10.0])
    table = report.speedup_table(report.load_runs(tmp_path / "runs"), 0.9).set_index(["panel", "precision"])
    assert table.loc[("CartPole", "int8"), "seeds"] == 3
    assert table.loc[("CartPole", "int8"), "seeds_reached"] == 2
    assert table.loc[("CartPole", "int8"), "time_to_target_s"] == pytest.approx(25.0)
    # ... and the table says over which seeds each speedup is taken (this precision's vs fp32's).
    assert table.loc[("CartPole", "int8"), "speedup_over_seeds"] == "2/3 vs fp32 2/2"


def test_speedup_rows_say_what_ran_and_fp32_compute_is_no_int8_claim(tmp_path: Path) -> None:
    t = [10.0, 20.0, 30.0]
    write_run(tmp_path, "CartPole", "fp32", 0, t, [0, 50, 100], executed="fp32 weights, fp32 compute")
    write_run(tmp_path, "CartPole", "int8", 0, t, [0, 95, 100], executed="int8 weights, fp32 compute (dequantized)")
    write_run(tmp_path, "Acrobot", "fp32", 0, t, [-300, -200, -100], executed="fp32 weights, fp32 compute")
    write_run(tmp_path, "Acrobot", "int8", 0, t, [-300, -100, -100], executed="int8 weights, integer kernel (u8s8)")
    write_run(tmp_path, "Acrobot", "fp16", 0, t, [-300, -100, -100])  # a summary without the words
    table = report.speedup_table(report.load_runs(tmp_path / "runs"), 0.9).set_index(["panel", "precision"])
    dq, kernel = table.loc[("CartPole", "int8")], table.loc[("Acrobot", "int8")]
    assert dq["executed"] == "int8 weights, fp32 compute (dequantized)"
    assert dq["speedup_note"] == "ran fp32 compute: not an int8-kernel speedup" and dq["speedup_vs_fp32"] == 1.5
    assert kernel["executed"] == "int8 weights, integer kernel (u8s8)" and kernel["speedup_note"] == ""
    assert table.loc[("Acrobot", "fp16"), "speedup_note"] == "compute unknown: not a fp16-compute speedup"
    assert table.loc[("CartPole", "fp32"), "speedup_note"] == ""
    files = report.write_report(tmp_path)
    text = files.report.read_text()
    assert "| CartPole | int8 | int8 weights, fp32 compute (dequantized) |" in text
    assert "not an int8-kernel speedup" in text


def test_recorded_energy_methods_name_codecarbons_default_tdp_as_a_default() -> None:
    old = ("codecarbon offline, process mode: cpu=estimated: CPU TDP power model (8.0 W) x process CPU time share; "
           "ram=estimated: codecarbon RAM power model (process memory)")
    said = report.describe_method(old, 2)  # 2 threads x codecarbon's 4 W default
    assert "8.0 W = codecarbon's default of 4 W per thread" in said and "not this CPU's TDP" in said
    assert "estimated" not in said and "ram=modelled" in said
    assert "default" not in report.describe_method(old, 16)  # 8 W is not the default on 16 threads
    assert report.describe_method(None, 2) is None


def test_carbon_table_scales_energy_to_time_to_target_and_gives_ratios(tmp_path: Path) -> None:
    runs = report.load_runs(make_synthetic_results(tmp_path) / "runs")
    carbon = report.carbon_table(runs, 0.9)
    row = carbon[(carbon["panel"] == "CartPole") & (carbon["precision"] == "int8") & (carbon["seed"] == 0)].iloc[0]
    assert row["energy_kwh"] == pytest.approx(2e-3)
    assert row["kwh_to_target"] == pytest.approx(2e-3 * 20.0 / 60.0)  # reached at 20 s of a 60 s run
    assert row["method"] == "cpu=estimated: test"
    ratios = report.carbon_ratio_table(carbon).set_index(["panel", "precision"])
    assert ratios.loc[("CartPole", "int8"), "kwh_ratio_same_work"] == pytest.approx(2.0)
    fp32_to_target = np.mean([4e-3 * 50 / 60, 4e-3 * 60 / 60])
    int8_to_target = np.mean([2e-3 * 20 / 60, 2e-3 * 30 / 60])
    assert ratios.loc[("CartPole", "int8"), "kwh_ratio_same_outcome"] == pytest.approx(fp32_to_target / int8_to_target)
    # Runs measured the same way show one method, not one per run's own RAM share (issue 46: "\|"-joined repeats).
    shares = carbon.copy()
    shares["method"] = [f"codecarbon; RAM model share of the energy: {60 + i}%; grid" for i in range(len(shares))]
    assert set(report.carbon_ratio_table(shares)["method"]) == {"codecarbon; grid"}
    # Distributed summaries: CO2 summed over nodes when the total is missing.
    acro = carbon[(carbon["panel"] == "Acrobot")].set_index("precision")
    assert acro.loc["int8", "emissions_kg"] == pytest.approx(5e-4)


def test_load_runs_reads_both_runners_and_flags_unfinished_runs(tmp_path: Path) -> None:
    make_synthetic_results(tmp_path)
    write_run(tmp_path, "CartPole", "fp16", 0, [10.0], [5.0], summary=False)
    write_run(tmp_path, "Acrobot", "fp16", 0, [10.0], [-400.0], distributed=True, status="interrupted")
    runs = report.load_runs(tmp_path)
    assert len(runs) == 8
    by = runs.set_index(["panel", "precision", "seed"])
    assert not by.loc[("CartPole", "fp16", 0), "finished"]
    assert not by.loc[("Acrobot", "fp16", 0), "finished"]
    assert by.loc[("Acrobot", "int8", 0), "runner"] == "actorq"
    assert by.loc[("Acrobot", "int8", 0), "policy_s"] == pytest.approx(2.0)
    assert by.loc[("CartPole", "int8", 1), "policy_s"] == pytest.approx(0.5)
    assert by.loc[("CartPole", "int8", 1), "runner"] == "single"
    assert list(runs["precision"][runs["panel"] == "CartPole"]) == ["fp32", "fp32", "fp16", "int8", "int8"]
    grid = report.grid_table(runs)
    assert set(grid["state"]) == {"finished", "failed", "incomplete"}


def test_curves_resample_seeds_on_a_common_grid(tmp_path: Path) -> None:
    write_run(tmp_path, "CartPole", "fp32", 0, [10.0, 30.0], [0.0, 100.0])
    write_run(tmp_path, "CartPole", "fp32", 1, [10.0, 20.0], [20.0, 40.0])
    c = report.curves(report.load_runs(tmp_path), points=31)  # grid 0, 1, ..., 30 s
    c = c.set_index("x")
    assert c.index.min() == pytest.approx(10.0)  # nothing before the seeds' first evaluation
    assert c.loc[15.0, "mean"] == pytest.approx((25.0 + 30.0) / 2)
    assert c.loc[15.0, "min"] == pytest.approx(25.0) and c.loc[15.0, "max"] == pytest.approx(30.0)
    # Seed 1 ended at 20 s: it holds its final 40 until the slower seed ends.
    assert c.loc[30.0, "mean"] == pytest.approx((100.0 + 40.0) / 2)
    assert (c["seeds"] == 2).all()


def test_runtime_breakdown_table_per_1k_steps(tmp_path: Path) -> None:
    runs = report.load_runs(make_synthetic_results(tmp_path) / "runs")
    table = report.runtime_breakdown_table(runs).set_index(["panel", "precision"])
    assert table.loc[("CartPole", "int8"), "policy_s"] == pytest.approx(0.5)
    assert table.loc[("CartPole", "int8"), "policy_ms_per_1k_steps"] == pytest.approx(500.0)
    assert table.loc[("CartPole", "fp32"), "total_s"] == pytest.approx(3.16)


def test_write_report_writes_every_file(tmp_path: Path) -> None:
    files = report.write_report(make_synthetic_results(tmp_path))
    for path in (files.figure, files.runtime_figure, files.speedup, files.carbon, files.grid, files.report):
        assert path.stat().st_size > 0
    text = files.report.read_text()
    # "cpu=modelled": the older "estimated" wording, said as today
    assert "figure.png" in text and "| CartPole | int8 |" in text and "cpu=modelled: test" in text
    speed = pd.read_csv(files.speedup)
    assert speed.loc[(speed["panel"] == "CartPole") & (speed["precision"] == "int8"),
                     "speedup_vs_fp32"].item() == pytest.approx(2.2)


# ------------------------------------------------------------------------------------------------ CLI


@pytest.mark.parametrize("argv, message", [
    (["--panels", "nope"], "unknown panel"),
    (["--panels", "CartPole,"], "empty"),
    (["--precisions", "int1"], "int1"),
    (["--seeds", "-1"], "non-negative"),
    (["--budget", "huge"], "unknown budget"),
    (["--runner", "mpi"], "unknown runner"),
    (["--name", "../x"], "--name"),
    (["--fraction", "1.5"], "--fraction"),
    (["--bogus"], "unrecognized"),
])
def test_bad_flags_exit_2_with_one_line_and_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        reproduce.main([*argv, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "out").exists()


def test_report_only_without_runs_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        reproduce.main(["--report-only", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "no runs" in capsys.readouterr().err


def test_a_grid_with_summaries_of_the_earlier_layout_is_refused_not_redone(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    from tests.analysis.test_upgrade_summaries import OLD
    run_dir = tmp_path / "small" / "runs" / "Acrobot" / "fp32" / "seed1"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps(OLD))
    for flags in (["--report-only"], ["--panels", "Acrobot", "--precisions", "32", "--seeds", "1"]):
        with pytest.raises(SystemExit) as exc:
            reproduce.main([*flags, "--out", str(tmp_path), "--no-progress"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "analysis.upgrade_summaries" in err and len(err.strip().splitlines()) == 1
    assert json.loads((run_dir / "summary.json").read_text()) == OLD  # nothing cleared


def test_budget_table_covers_every_panel_and_builds_valid_configs() -> None:
    import agents
    for budget, panels in reproduce.BUDGETS.items():
        assert set(panels) == set(report.PANELS), budget
        for name, b in panels.items():
            agents.make_config(report.PANELS[name].agent, **dict(b.overrides))  # raises on a bad field
            assert 0 < b.eval_every <= b.max_actor_steps and b.eval_episodes > 0 and b.num_actors > 0
    paper = reproduce.BUDGETS["paper"]["walker_stand"]
    assert paper.overrides["policy_layer_sizes"] == (2048, 2048, 2048) and paper.num_actors == 4


def test_actorq_command_passes_the_budget_config(tmp_path: Path) -> None:
    run = reproduce.PlannedRun("cartpole_balance", "int8", 3, reproduce.BUDGETS["paper"]["cartpole_balance"])
    run_dir = tmp_path / "run"
    cmd = reproduce.actorq_command(run, run_dir, "onnx")
    path = run_dir / "experiment.json"
    assert cmd[1:] == ["-m", "launch.actorq", "--config", str(path), "--no-progress"]  # no argv round trip
    from launch.experiments.config import ExperimentConfig
    written = ExperimentConfig.from_dict(json.loads(path.read_text()))
    assert written == run.config(run_dir, "onnx")  # the file round-trips to the planned run's config
    assert written.task == "cartpole:balance" and written.distributed.num_actors == 4 and written.seed == 3
    assert written.backend == "onnx" and written.logdir == str(run_dir)
    from launch.actorq import build_parser, validate
    inv = validate(build_parser().parse_args(cmd[3:]))  # the real CLI accepts it, and runs it unchanged
    assert inv.config.overrides["policy_layer_sizes"] == (2048, 2048, 2048)
    assert inv.config.overrides["batch_size"] == 256
    assert inv.config.max_actor_steps == run.budget.max_actor_steps
    assert inv.config.replace(logdir=str(run_dir)) == written


def test_tiny_grid_end_to_end_resumes_and_redraws(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["--panels", "CartPole", "--precisions", "32,8", "--seeds", "0", "--budget", "tiny", "--runner", "single",
            "--out", str(tmp_path), "--name", "t", "--no-progress"]
    assert reproduce.main(argv) == 0
    root = tmp_path / "t"
    for name in ("figure.png", "speedup.csv", "carbon.csv", "runtime.csv", "grid.csv", "report.md", "machine.json"):
        assert (root / name).stat().st_size > 0, name
    summaries = {q: root / "runs" / "CartPole" / q / "seed0" / "summary.json" for q in ("fp32", "int8")}
    grid = pd.read_csv(root / "grid.csv")
    assert sorted(grid["precision"]) == ["fp32", "int8"] and set(grid["state"]) == {"finished"}
    speed = pd.read_csv(root / "speedup.csv")
    assert set(speed["precision"]) == {"fp32", "int8"}
    carbon = pd.read_csv(root / "carbon.csv")
    assert len(carbon) == 2 and carbon["method"].notna().all()
    assert json.loads(summaries["int8"].read_text())["precision"] == "int8"
    machine = json.loads((root / "machine.json").read_text())  # what the wall clocks were measured on, and at what load
    assert machine["cpu_class"] == cpu_class() and machine["cpu_flags"] == cpu_info()["flags"]
    assert len(machine["load_start"]) == 3 and len(machine["load_end"]) == 3
    assert "- load_end: [" in (root / "report.md").read_text()

    # Second call: nothing runs again.
    mtimes = {q: p.stat().st_mtime_ns for q, p in summaries.items()}
    capsys.readouterr()
    assert reproduce.main(argv) == 0
    assert "0 run(s) ran, 2 were already done" in capsys.readouterr().err
    assert {q: p.stat().st_mtime_ns for q, p in summaries.items()} == mtimes

    # An interrupted run (no summary, partial logs) is redone; the finished one is not touched.
    summaries["int8"].unlink()
    assert reproduce.main(argv) == 0
    assert "1 run(s) ran" in capsys.readouterr().err
    assert summaries["int8"].exists() and summaries["fp32"].stat().st_mtime_ns == mtimes["fp32"]

    # Report only: redraws without running.
    (root / "figure.png").unlink()
    assert reproduce.main(["--report-only", "--out", str(tmp_path), "--name", "t"]) == 0
    assert (root / "figure.png").exists()
    assert summaries["fp32"].stat().st_mtime_ns == mtimes["fp32"]

    # The results folder belongs to its budget and runner.
    for other in (["--budget", "small", "--runner", "single"], ["--budget", "tiny", "--runner", "actorq"]):
        with pytest.raises(SystemExit) as exc:
            reproduce.main(["--panels", "CartPole", *other, "--out", str(tmp_path), "--name", "t"])
        assert exc.value.code == 2
        assert "holds a grid made with" in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_grid_on_the_distributed_runner(tmp_path: Path) -> None:
    argv = ["--panels", "CartPole", "--precisions", "int8", "--seeds", "0", "--budget", "tiny", "--runner", "actorq",
            "--out", str(tmp_path), "--name", "aq", "--no-progress"]
    assert reproduce.main(argv) == 0
    run_dir = tmp_path / "aq" / "runs" / "CartPole" / "int8" / "seed0"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["num_actors"] == 1
    assert (run_dir / "runner.log").exists() and (run_dir / "actor_0.csv").exists()
    runs = report.load_runs(tmp_path / "aq")
    assert runs["runner"].tolist() == ["actorq"] and runs["finished"].all()
    assert (tmp_path / "aq" / "figure.png").exists()


# ------------------------------------------------------------------------------------------------ nothing lost


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


EXECUTED = {"fp32": "fp32 weights, fp32 compute", "fp16": "fp16 weights, fp32 compute (simulated)",
            "int8": "int8 weights, integer kernel (u8u8)"}


def make_finished_small_grid(out: Path, name: str = "small") -> set[tuple[str, str, int]]:
    """OUT/NAME as a finished `--budget small` grid leaves it: the README example's runs (cartpole_balance and
    CartPole x fp32, fp16, int8 x seeds 0-2) plus two Acrobot runs outside that selection, grid.json as the grid
    writes it, and the report drawn over them. Returns the runs it made."""
    from quarl.ops.io import jsonable, write_json_atomic

    root = out / name
    made = set()
    t = [10.0, 20.0, 30.0, 40.0]
    for panel, scale in (("cartpole_balance", 900.0), ("CartPole", 500.0)):
        for i, precision in enumerate(("fp32", "fp16", "int8")):
            for seed in range(3):
                returns = [scale * f for f in (0.1, 0.5 + 0.05 * (i + seed), 0.9, 1.0)]
                write_run(root, panel, precision, seed, t, returns, executed=EXECUTED[precision])
                made.add((panel, precision, seed))
    for precision in ("fp32", "int8"):
        write_run(root, "Acrobot", precision, 0, t, [-500.0, -300.0, -120.0, -100.0], executed=EXECUTED[precision])
        made.add(("Acrobot", precision, 0))
    budgets = reproduce.BUDGETS["small"]
    write_json_atomic(root / "grid.json", {
        "budget": "small", "runner": "single", "backend": "auto",
        "budgets": {panel: jsonable(dataclasses.asdict(budgets[panel])) for panel, _, _ in sorted(made)},
        "cluster": False, "cpus_per_run": None})
    assert reproduce.main(["--report-only", "--out", str(out), "--name", name]) == 0
    return made


@pytest.mark.parametrize("argv", [
    # The README's example, and the subset of it that once redrew results/small from 2 runs.
    ["--panels", "cartpole_balance,CartPole", "--precisions", "32,16,8", "--seeds", "0,1,2", "--budget", "small"],
    ["--panels", "CartPole", "--precisions", "32,8", "--seeds", "0", "--budget", "small"],
])
def test_readme_reproduce_example_on_a_finished_grid_loses_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str]) -> None:
    """On a finished grid (made here, so re-running results/small changes nothing in this test), the README's
    command runs nothing and rewrites nothing, and a narrowed redraw leaves the grid's report whole."""
    made = make_finished_small_grid(tmp_path)
    root = tmp_path / "small"
    before = _snapshot(root)
    capsys.readouterr()
    assert reproduce.main([*argv, "--out", str(tmp_path), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "0 run(s) ran" in err and "left as it is" in err
    assert _snapshot(root) == before  # every file, byte for byte (grid.json's format too)

    # A narrowed redraw goes to its own folder; the grid's report keeps all its runs.
    assert reproduce.main(["--report-only", "--panels", "CartPole", "--precisions", "32,8", "--seeds", "0",
                           "--out", str(tmp_path), "--name", "small"]) == 0
    sub = root / "subsets" / "CartPole_fp32-int8_seed0"
    assert sorted(pd.read_csv(sub / "grid.csv")["precision"]) == ["fp32", "int8"]
    assert (sub / "figure.png").stat().st_size > 0 and "figure.png" in (sub / "report.md").read_text()
    assert {k: v for k, v in _snapshot(root).items() if not k.startswith("subsets")} == before
    grid = pd.read_csv(root / "grid.csv")
    assert len(grid) == len(made) == 20 and set(grid["state"]) == {"finished"}
    assert {(r.panel, r.precision, int(r.seed)) for r in grid.itertuples()} == made


def test_a_grid_merges_into_the_folder_and_only_force_drops_runs(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    common = ["--budget", "tiny", "--runner", "single", "--out", str(tmp_path), "--name", "m", "--no-progress"]
    assert reproduce.main(["--panels", "CartPole", "--precisions", "32", "--seeds", "0", *common]) == 0
    assert reproduce.main(["--panels", "CartPole", "--precisions", "8", "--seeds", "0", *common]) == 0
    root = tmp_path / "m"
    grid = pd.read_csv(root / "grid.csv")
    assert sorted(grid["precision"]) == ["fp32", "int8"] and set(grid["state"]) == {"finished"}  # merged
    assert set(pd.read_csv(root / "speedup.csv")["precision"]) == {"fp32", "int8"}
    assert set(json.loads((root / "grid.json").read_text())["budgets"]) == {"CartPole"}

    # A run folder gone: redrawing would drop it from the report; refused (exit 2, one line) without --force.
    import shutil
    shutil.rmtree(root / "runs" / "CartPole" / "int8")
    report_md = (root / "report.md").read_bytes()
    capsys.readouterr()
    for argv in (["--report-only", "--out", str(tmp_path), "--name", "m"],
                 ["--panels", "CartPole", "--precisions", "32", "--seeds", "0", *common]):
        with pytest.raises(SystemExit) as exc:
            reproduce.main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "--force" in err and "CartPole int8 seed0" in err and err.count("\n") == 1
    assert (root / "report.md").read_bytes() == report_md
    assert reproduce.main(["--report-only", "--force", "--out", str(tmp_path), "--name", "m"]) == 0
    assert pd.read_csv(root / "grid.csv")["precision"].tolist() == ["fp32"]
