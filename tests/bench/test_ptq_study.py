"""bench.learning.ptq_study at tiny size: a real training run per cell, the sweep, the table, and resuming across
sessions."""
from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest

import agents
from bench.learning import ptq_study, ptq_study_report
from quarl.envs.factory import make_environment
from quarl.envs.spec import environment_spec
from quarl.quant.policy_io import save_policy
from tests.quarl.helpers import random_params

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["run", "--quick", "--algos", "dqn", "--tasks", "CartPole-v1", "--bits", "8,2", "--include", "fp16",
        "--episodes", "2", "--allow-busy"]


def _rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_study_trains_sweeps_and_resumes(tmp_path, capsys):
    out, runs = tmp_path / "out", tmp_path / "runs"
    flags = [*TINY, "--out", str(out), "--runs", str(runs)]
    assert ptq_study.main([*flags, "--seeds", "0"]) == 0
    first = _rows(out / "ptq_study.csv")
    assert [(r["seed"], r["precision"]) for r in first] == [("0", "fp32"), ("0", "fp16"), ("0", "int8"),
                                                            ("0", "int8-head16"), ("0", "int2")]
    assert all(r["algo"] == "dqn" and r["task"] == "CartPole-v1" and r["train_steps"] == "600" for r in first)
    assert int(first[0]["policy_bytes"]) > int(first[3]["policy_bytes"]) > int(first[2]["policy_bytes"]) > int(
        first[4]["policy_bytes"])  # fp32 > int8 with a 16-bit head > int8 > int2
    assert {r["execution"] for r in first} == {"native", "int-kernel", "int-kernel, head int16 in fp32"}
    # CartPole-v1 has a gymnax port: launch.anakin trains the cell, one vmapped call per arm and session.
    assert {r["trainer"] for r in first} == {"anakin"}
    summary = runs / "anakin" / "dqn" / "CartPole-v1" / "fp32" / "seed0" / "summary.json"
    stamp = summary.stat().st_mtime_ns
    capsys.readouterr()

    # A second session asks for one more seed: seed 0 is neither retrained nor re-evaluated.
    assert ptq_study.main([*flags, "--seeds", "0,1"]) == 0
    printed = capsys.readouterr().out
    assert "dqn CartPole-v1 seed 0: in" in printed and "launch.anakin training seeds 1 up to 600 env steps" in printed
    assert summary.stat().st_mtime_ns == stamp
    second = _rows(out / "ptq_study.csv")
    assert second[:5] == first and len(second) == 10

    # Seed 0 asked at another episode count: evaluated again from its policy, not retrained.
    more = [f if f != "2" else "3" for f in flags]
    assert ptq_study.main([*more, "--seeds", "0"]) == 0
    assert "seed 0: swept at 2 episodes; evaluating again at 3" in capsys.readouterr().out
    assert summary.stat().st_mtime_ns == stamp
    second = _rows(out / "ptq_study.csv")
    assert [r["episodes"] for r in second] == ["3"] * 5 + ["2"] * 5

    # A third session on another machine (no run folders): the recorded cells are kept (also at another episode
    # count: nothing to evaluate them again with), nothing is run.
    shutil.rmtree(runs)
    assert ptq_study.main([*flags, "--seeds", "0,1"]) == 0
    assert _rows(out / "ptq_study.csv") == second and not runs.exists()
    md = (out / "ptq_study.md").read_text()
    # 600 env steps are far from CartPole's reference (475): both seeds are listed as not converged, no table row.
    assert "- dqn / CartPole-v1 seed 0: fp32" in md and "- dqn / CartPole-v1 seed 1: fp32" in md
    assert "reference 475" in md and "| dqn | CartPole-v1 | int8 |" not in md
    assert (out / "ptq_study.png").read_bytes()[:8] == PNG_MAGIC
    assert len(json.loads((out / "ptq_study_sessions.json").read_text())) == 4


def test_summary_pairs_each_seed_with_its_own_fp32(tmp_path):
    rows = []
    for seed, fp32, bf16, int8 in ((0, 200.0, 200.0, 190.0), (1, 100.0, 120.0, 110.0), (2, 400.0, 400.0, 400.0)):
        for precision, ret, nbytes in (("fp32", fp32, 4000), ("bf16", bf16, 2000), ("int8", int8, 1100)):
            rows.append({"algo": "dqn", "task": "CartPole-v1", "seed": seed, "train_steps": 1000,
                         "precision": precision, "bits": {"fp32": 32, "bf16": 16}.get(precision, 8),
                         "granularity": "n/a",
                         "execution": "native", "backend": "jax", "episodes": 10, "mean_return": ret,
                         "std_return": 0.0, "policy_bytes": nbytes, "train_final_eval": None, "reference": 50.0,
                         "cpu": "test CPU", "train_eval_episodes": 5, "train_target_streak": 1, "trainer": "train"})
    ptq_study.write_rows(tmp_path / "ptq_study.csv", rows + rows[:2])  # a row given twice is written once
    assert ptq_study.read_rows(tmp_path / "ptq_study.csv") == sorted(
        rows, key=lambda r: (r["seed"], -r["bits"]))
    with pytest.raises(ValueError, match="two different study rows for dqn CartPole-v1 0 fp32"):
        ptq_study.write_rows(tmp_path / "other.csv", rows + [{**rows[0], "mean_return": 1.0}])
    by = {s["precision"]: s for s in ptq_study_report.summarize(rows)}
    changes = [-0.05, 0.10, 0.0]
    assert by["int8"]["change_mean"] == pytest.approx(np.mean(changes))
    assert by["int8"]["change_std"] == pytest.approx(np.std(changes, ddof=1))
    assert by["int8"]["reward_mean"] == pytest.approx(700 / 3) and by["int8"]["policy_bytes"] == 1100
    text = ptq_study.report(tmp_path)
    fp32 = [200.0, 100.0, 400.0]
    se = np.std(changes, ddof=1) / np.sqrt(3)  # |mean| + 2 s.e. > 5% > |mean| - 2 s.e.: not resolved
    line = (f"| dqn | CartPole-v1 | train | 3 | 1,000 | {np.mean(fp32):.1f} ± {np.std(fp32, ddof=1):.1f} | "
            f"{100 * np.mean(changes):+.1f}% ± {100 * np.std(changes, ddof=1):.1f}% | {100 * se:.1f}% | 0.0% | "
            f"not resolved (abs(change) {100 * np.mean(changes):.1f}% ± 2 s.e. {200 * se:.1f}% spans 5%); "
            "seed 1 +10.0% (bf16 +20.0% on the same seed: fp32 policy fragile) |")
    assert line in text


def test_merge_adds_whole_runs_from_other_folders(tmp_path, capsys):
    def run(algo, seed, ret, precisions=(("fp32", 32), ("int8", 8))):
        return [{"algo": algo, "task": "CartPole-v1", "seed": seed, "train_steps": 100, "precision": p,
                 "bits": b, "granularity": "n/a", "execution": "native", "backend": "jax", "episodes": 2,
                 "mean_return": ret, "std_return": 0.0, "policy_bytes": 10, "train_final_eval": None, "cpu": "c"}
                for p, b in precisions]
    main, other = tmp_path / "main", tmp_path / "other"
    main.mkdir(), other.mkdir()
    ptq_study.write_rows(main / "ptq_study.csv", run("dqn", 0, 100.0))
    # The other folder: OUT's fp32 run again (different numbers), a QAT run of the same cell, a new cell.
    qat = run("dqn", 0, 90.0, (("qat-int8", 8),))
    ptq_study.write_rows(other / "ptq_study.csv", run("dqn", 0, 999.0) + qat + run("ppo", 1, 50.0))
    (other / "ptq_study_sessions.json").write_text(json.dumps([{"cpu": "other CPU"}]))
    assert ptq_study.main(["merge", str(other), "--out", str(main)]) == 0
    rows = ptq_study.read_rows(main / "ptq_study.csv")
    assert [(r["algo"], r["seed"], r["precision"], r["mean_return"]) for r in rows] == [
        ("dqn", 0, "fp32", 100.0), ("dqn", 0, "int8", 100.0),  # OUT's own run wins
        ("dqn", 0, "qat-int8", 90.0),  # a QAT run is a run of its own: added to the cell OUT holds
        ("ppo", 1, "fp32", 50.0), ("ppo", 1, "int8", 50.0)]
    assert f"{other}: 2 run(s) added, 1 already in {main} kept" in capsys.readouterr().out
    assert json.loads((main / "ptq_study_sessions.json").read_text()) == [{"cpu": "other CPU"}]
    # --replace: the folder's run wins, whole; OUT's other runs (the same cell's QAT run too) stay.
    ptq_study.write_rows(other / "ptq_study.csv", run("dqn", 0, 999.0)[:1])
    assert ptq_study.main(["merge", str(other), "--out", str(main), "--replace"]) == 0
    assert [(r["algo"], r["seed"], r["precision"], r["mean_return"])
            for r in ptq_study.read_rows(main / "ptq_study.csv")] == [
        ("dqn", 0, "fp32", 999.0), ("dqn", 0, "qat-int8", 90.0), ("ppo", 1, "fp32", 50.0), ("ppo", 1, "int8", 50.0)]
    assert ptq_study.main(["merge", str(tmp_path / "none"), "--out", str(main)]) == 2


def test_sweep_cell_evaluates_a_continuous_policy(tmp_path):
    env = make_environment("cartpole:balance", 0)
    spec = agents.get_builder("d4pg", policy_layer_sizes=(16, 16)).policy_spec(environment_spec(env))
    env.close()
    save_policy(tmp_path, spec, random_params(spec, 1), task="cartpole:balance", agent="d4pg", steps=7)
    (tmp_path / "summary.json").write_text(json.dumps({"agent": "d4pg", "task": "cartpole:balance",
                                                       "actor_steps": 700, "final_eval_return": 12.5}))
    rows = ptq_study.sweep_cell(tmp_path, 3, ["fp32", "int8"], 1, "jax", "test CPU")
    assert [(r["algo"], r["seed"], r["precision"], r["train_steps"]) for r in rows] == [
        ("d4pg", 3, "fp32", 700), ("d4pg", 3, "int8", 700)]
    assert all(0.0 <= r["mean_return"] <= 1000.0 for r in rows) and rows[1]["execution"] == "int-kernel"


@pytest.mark.parametrize("flags, message", [
    (["--algos", "sarsa"], "has no row in the study"),
    (["--tasks", "Pong"], "no selected algorithm has a row for Pong"),
    (["--steps", "dqn/Pong=5"], "--steps expects ALGO/TASK=N"),
    (["--steps", "dqn/CartPole-v1=x"], "--steps expects ALGO/TASK=N"),
    (["--seeds", "a"], "--seeds takes comma-separated ints"),
    (["--bits", "16"], "the study covers the integer kernels"),
    (["--episodes", "0"], "--episodes must be positive"),
])
def test_bad_flags_exit_2_with_one_line(tmp_path, capsys, flags, message):
    assert ptq_study.main(["run", "--out", str(tmp_path / "o"), "--allow-busy", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and not (tmp_path / "o").exists()


def test_agents_missing_from_the_build_are_left_out_of_the_default_grid():
    rows, notes = ptq_study.select_rows(None, None, "", False)
    assert {r.algo for r in rows} == {r.algo for r in ptq_study.GRID} & set(agents.AGENT_NAMES)
    assert notes == [f"{a}: not in this build, left out" for a in dict.fromkeys(r.algo for r in ptq_study.GRID)
                     if a not in agents.AGENT_NAMES]


def test_study_plot_draws_each_seed_within_the_tasks_returns_and_keeps_the_legend_off_the_panels(tmp_path):
    rows = [{"algo": "a2c", "task": "CartPole-v1", "seed": seed, "train_steps": 1000, "precision": precision,
             "bits": bits, "granularity": "n/a", "execution": "native", "backend": "jax", "episodes": 10,
             "mean_return": ret, "std_return": 0.0, "policy_bytes": 1, "train_final_eval": None, "cpu": "test CPU"}
            for seed, ret in ((0, 500.0), (1, 60.0), (2, 470.0)) for precision, bits in (("fp32", 32), ("int8", 8))]
    fig = ptq_study_report.plot(rows, tmp_path / "study.png")
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    assert -15.0 <= low and high <= 515.0  # mean 343 ± std 243 would have drawn a bar to 586
    points = sorted(y for line in ax.lines if line.get_linestyle() == "None" for y in line.get_ydata())
    assert points == sorted([500.0, 60.0, 470.0] * 2)  # every seed's return, not a bar
    assert ax.get_legend() is None and fig.legends  # one legend for the figure, below the panels
    assert (tmp_path / "study.png").read_bytes().startswith(PNG_MAGIC)
    # Returns a point apart (500 against 498.8) on a 0..500 task: the axis spans a tenth of that, not the point.
    close = [{**r, "algo": "ppo", "mean_return": 500.0 if r["precision"] == "fp32" else 498.8} for r in rows]
    fig = ptq_study_report.plot(rows + close, tmp_path / "close.png")
    low, high = fig.axes[1].get_ylim()
    assert high - low >= 50.0 and -15.0 <= low and high <= 515.0, (low, high)
    # The figure's title sits above the first row's panel titles, not over them, also on the study's 5 x 3 panels.
    fig = ptq_study_report.plot([{**r, "algo": f"algo{k}"} for k in range(15) for r in rows], tmp_path / "many.png")
    fig.canvas.draw()
    title = fig._suptitle.get_window_extent()  # pylint: disable=protected-access
    assert all(title.y0 >= ax.title.get_window_extent().y1 for ax in fig.axes[:3])


def test_only_converged_seeds_enter_the_tables_and_qat_sits_beside_ptq(tmp_path):
    """A seed whose fp32 policy is below the cell's reference is listed as not converged and kept out of every
    table; QAT rows are compared with PTQ at the same width, each as a change from the seed's fp32 reward."""
    rows = []
    for seed, fp32, int4, qat4 in ((0, 500.0, 400.0, 490.0), (1, 480.0, 432.0, 480.0), (2, 150.0, 10.0, 20.0)):
        for precision, bits, ret in (("fp32", 32, fp32), ("int4", 4, int4), ("qat-int4", 4, qat4)):
            rows.append({"algo": "dqn", "task": "CartPole-v1", "seed": seed, "train_steps": 5000,
                         "precision": precision, "bits": bits, "granularity": "n/a", "execution": "int-kernel",
                         "backend": "jax", "episodes": 10, "mean_return": ret, "std_return": 0.0, "policy_bytes": 10,
                         "train_final_eval": None, "reference": 475.0, "cpu": "test CPU"})
    kept, missed = ptq_study_report.converged(rows)
    assert {r["seed"] for r in kept} == {0, 1} and [r["seed"] for r in missed] == [2]
    md = ptq_study_report.markdown(rows, [], ptq_study.GRID)
    assert "- dqn / CartPole-v1 seed 2: fp32 150.0 after 5,000 env steps, reference 475\n" in md  # no int8 row
    rows.append(dict(rows[-3], precision="int8", bits=8, mean_return=120.0))
    md = ptq_study_report.markdown(rows, [], ptq_study.GRID)  # shown beside it, kept out of the tables
    assert "- dqn / CartPole-v1 seed 2: fp32 150.0 after 5,000 env steps, reference 475; int8 120.0 (-20.0%)" in md
    assert "| dqn | CartPole-v1 | int8 |" not in md
    assert "| dqn | CartPole-v1 | 4 | -15.0% ± 7.1% | -1.0% ± 1.4% | 2 |" in md  # (-20%, -10%) vs (-2%, 0%)
    # A QAT run for seed 1 only: PTQ is taken on seed 1 as well (-10%), not over both seeds (-15%).
    one = [r for r in rows if not (r["precision"] == "qat-int4" and r["seed"] == 0)]
    assert "| dqn | CartPole-v1 | 4 | -10.0% ± 0.0% | +0.0% ± 0.0% | 1 |" in ptq_study_report.markdown(
        one, [], ptq_study.GRID)
    assert "| dqn | CartPole-v1 | fp32 | 2 |" in md and "| dqn | CartPole-v1 | fp32 | 3 |" not in md
    assert "reference 475 (gymnasium's reward_threshold)" in md


def test_an_int8_miss_points_to_the_margin_analysis():
    def rows(int8_seed1: float, std: float = 0.0, int8_seed0: float = 500.0) -> list[dict]:
        out = []
        for seed, int8 in ((0, int8_seed0), (1, int8_seed1)):
            for precision, bits, ret in (("fp32", 32, 500.0), ("int8", 8, int8)):
                out.append({"algo": "dqn", "task": "CartPole-v1", "seed": seed, "train_steps": 5000,
                            "precision": precision, "bits": bits, "granularity": "n/a", "execution": "int-kernel",
                            "backend": "jax", "episodes": 10, "mean_return": ret, "std_return": std,
                            "policy_bytes": 10, "train_final_eval": None, "reference": 475.0, "cpu": "test CPU"})
        return out

    missed = ptq_study_report.markdown(rows(450.0), [], ptq_study.GRID)  # seed 1 -10%: outside 5%
    # -5% +- 2 s.e. (5% over the 2 seeds) spans the bound: not resolved, and seed 1 is outside it
    assert "not resolved (abs(change) 5.0% ± 2 s.e. 10.0% spans 5%); seed 1 -10.0%" in missed
    assert "bench.learning.ptq_margins" in missed
    assert "bench.learning.ptq_margins" not in ptq_study_report.markdown(rows(495.0), [], ptq_study.GRID)
    # The cell at -10% on the mean: a miss where the episodes agree; not resolved where they vary so much that the
    # mean's standard error (sqrt(2 x 100^2 / 10) / 500 per seed = 8.9%; over 2 seeds 6.3%) spans the bound.
    assert "| -10.0% ± 0.0% | 0.0% | 0.0% | no; seed 0 -10.0%; seed 1 -10.0% |" in ptq_study_report.markdown(
        rows(450.0, int8_seed0=450.0), [], ptq_study.GRID)
    # Two seeds that agree have no spread, but their episodes do: the evaluation's s.e. is the larger one.
    assert ("| -10.0% ± 0.0% | 0.0% | 6.3% | not resolved (abs(change) 10.0% ± 2 s.e. 12.6% spans 5%); seed 0 "
            "-10.0%; seed 1 -10.0% |") in ptq_study_report.markdown(rows(450.0, 100.0, int8_seed0=450.0), [],
                                                                 ptq_study.GRID)


@pytest.mark.slow  # trains a tiny cell with QAT arms
def test_qat_runs_train_beside_the_fp32_run_and_are_evaluated_at_their_width(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    assert ptq_study.main([*TINY, "--seeds", "0", "--qat-bits", "4", "--out", str(out), "--runs", str(runs)]) == 0
    rows = _rows(out / "ptq_study.csv")
    assert [r["precision"] for r in rows] == ["fp32", "fp16", "int8", "int8-head16", "qat-int4", "int2"]
    qat_run = json.loads((runs / "anakin" / "dqn" / "CartPole-v1" / "qat4" / "seed0" / "summary.json").read_text())
    assert qat_run["precision"] == "int4" and qat_run["experiment"]["overrides"]["qat_bits"] == 4
    row = ptq_study.GRID[0]
    command = ptq_study.train_command(row, 0, tmp_path / "x", quick=False, qat_bits=4)
    assert command[command.index("--precision") + 1] == "int4" and command[command.index("--qat-bits") + 1] == "4"
    assert command[command.index("--target-return") + 1] == str(row.reference)  # stops once it reaches it


def test_a_run_stopped_part_way_is_trained_again(tmp_path):
    """A stopped or failed run writes summary.json too: only a completed one is the cell's policy (the study asks
    analysis.runs, as launch.reproduce does)."""
    assert not ptq_study.is_finished(ptq_study.read_summary(tmp_path))
    for status, done in (("interrupted", False), ("failed", False), ("completed", True)):
        (tmp_path / "summary.json").write_text(json.dumps({"status": status}))
        assert ptq_study.is_finished(ptq_study.read_summary(tmp_path)) is done


def test_cells_stop_on_two_ten_episode_evaluations_and_the_report_says_which(tmp_path):
    """One evaluation at the reference often stops a policy the study's own 10 episodes put below it: the discrete rows
    (and D4PG walker:stand) stop on 2 evaluations of 10 episodes in a row, D4PG cartpole:balance keeps one of 5,
    each swept row carries the rule its run stopped by (files from before the columns read as one of 5, what every
    run then used) and the report's settings name it."""
    by_cell = {(r.algo, r.task): r for r in ptq_study.GRID}
    for (algo, task), row in by_cell.items():
        command = ptq_study.train_command(row, 0, tmp_path / "x", quick=False)
        d4pg = task == "cartpole:balance" and algo == "d4pg"
        assert command[command.index("--eval-episodes") + 1] == ("5" if d4pg else "10")
        # Trained to the budget: MountainCar-v0 (its preset decays the learning rate over it) and the on-policy
        # MinAtar Breakout rows (10-episode evaluations at the reference's edge stopped them early).
        if row.target_streak == 0:
            assert (algo, task) in {("dqn", "MountainCar-v0"), ("ppo", "MinAtar/Breakout"), ("a2c", "MinAtar/Breakout"),
                                    ("ppo", "MountainCar-v0"), ("a2c", "MountainCar-v0")}
            assert "--target-return" not in command and "--target-streak" not in command
            continue
        assert command[command.index("--target-streak") + 1] == ("1" if d4pg else "2")
        # Discrete returns vary more per episode; the noisiest DQN rows take 200 (at 50, 2 s.e. spanned 5%).
        noisiest = {("dqn", "Acrobot-v1"), ("dqn", "MinAtar/SpaceInvaders")}
        assert row.sweep_episodes == (10 if algo == "d4pg" else 200 if (algo, row.task) in noisiest else 50)
    out = tmp_path / "out"
    assert ptq_study.main([*TINY, "--seeds", "0", "--qat-bits", "none", "--out", str(out),
                           "--runs", str(tmp_path / "runs")]) == 0
    rows = ptq_study.read_rows(out / "ptq_study.csv")
    assert rows and all((r["train_eval_episodes"], r["train_target_streak"]) == (5, 0) for r in rows)  # quick: no stop
    with open(out / "ptq_study.csv", newline="", encoding="utf-8") as f:
        old = [{k: v for k, v in r.items() if not k.startswith("train_eval") and not k.startswith("train_target")}
               for r in csv.DictReader(f)]
    old_file = tmp_path / "old.csv"
    with open(old_file, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(old[0]))
        writer.writeheader()
        writer.writerows(old)
    assert {(r["train_eval_episodes"], r["train_target_streak"]) for r in ptq_study.read_rows(old_file)} == {(5, 1)}
    minatar = [dict(r, algo="dqn", task="MinAtar/Breakout", train_eval_episodes=10, train_target_streak=2)
               for r in rows]
    text = ptq_study_report.markdown(minatar, [], ptq_study.GRID)
    assert "- dqn / MinAtar/Breakout: trained" in text and "stopped by 2 evaluations of 10 episodes in a row" in text
    # A row trained to its budget (0: no target) beside one stopped by one evaluation.
    mixed = [dict(r, task="MountainCar-v0", seed=seed, train_target_streak=seed) for r in minatar for seed in (0, 1)]
    assert "stopped by none (trained to the budget) / 1 evaluation of 10 episodes" in \
        ptq_study_report.markdown(mixed, [], ptq_study.GRID)


@pytest.mark.slow  # trains a tiny cell twice
def test_retrain_stale_trains_again_only_the_runs_recorded_under_another_rule(tmp_path, monkeypatch, capsys):
    """After a row's stopping rule changes, `--retrain-stale` trains again the selected cells' runs recorded under
    the old rule (the fp32 run and the QAT widths asked for), keeps the old run folder beside, and leaves runs it
    does not retrain (a QAT width not asked for) in the table."""
    out, runs = tmp_path / "out", tmp_path / "runs"
    flags = [*TINY, "--qat-bits", "4", "--out", str(out), "--runs", str(runs)]
    assert ptq_study.main([*flags, "--seeds", "0"]) == 0  # recorded under the quick rule: one evaluation of 5
    before = ptq_study.read_rows(out / "ptq_study.csv")
    assert {(r["train_eval_episodes"], r["train_target_streak"]) for r in before} == {(5, 0)}
    capsys.readouterr()

    # Without the flag a changed rule retrains nothing; with it, seed 0's fp32 run (and only that) trains again.
    real = ptq_study.select_rows

    def three_episodes(*args):
        rows, notes = real(*args)
        return [ptq_study.dataclasses.replace(r, eval_episodes=3) for r in rows], notes
    monkeypatch.setattr(ptq_study, "select_rows", three_episodes)
    assert ptq_study.main([*flags, "--seeds", "0"]) == 0
    assert "up to 600 env steps" not in capsys.readouterr().out
    assert ptq_study.main([*flags, "--seeds", "0", "--qat-bits", "none", "--retrain-stale"]) == 0
    printed = capsys.readouterr().out
    assert "dqn CartPole-v1 seed 0: recorded under another stopping rule" in printed
    assert "QAT int4: recorded" not in printed
    after = ptq_study.read_rows(out / "ptq_study.csv")
    rule = {(r["seed"], r["precision"]): (r["train_eval_episodes"], r["train_target_streak"]) for r in after}
    assert len(after) == len(before)
    assert rule[(0, "fp32")] == rule[(0, "int8")] == (3, 0)  # retrained: its summary names the new rule
    assert rule[(0, "qat-int4")] == (5, 0)  # not asked for: kept
    arm = runs / "anakin" / "dqn" / "CartPole-v1" / "fp32"
    assert (arm / "seed0.stale" / "summary.json").is_file() and (arm / "seed0" / "policy_fp32.qrlp").is_file()



def test_a_cell_that_did_not_converge_within_a_since_raised_budget_is_stale(tmp_path, capsys):
    """`drop_stale` without training: a seed below the reference after fewer env steps than its row's budget now is
    trained again; a converged seed, and one that missed within today's budget, are kept."""
    row = ptq_study.dataclasses.replace(next(r for r in ptq_study.GRID if r.task == "MinAtar/Breakout"),
                                        steps=2_000_000, target_streak=2, eval_episodes=10)
    base = {"algo": row.algo, "task": row.task, "bits": 32, "precision": "fp32", "train_eval_episodes": 10,
            "train_target_streak": 2, "trainer": row.trainer}
    rows = [dict(base, seed=0, mean_return=5.3, train_steps=500_000),  # missed, budget since raised: stale
            dict(base, seed=1, mean_return=6.4, train_steps=500_000),  # converged: kept
            dict(base, seed=2, mean_return=5.0, train_steps=2_000_000)]  # missed within today's budget: kept
    kept = ptq_study.drop_stale(rows, [(row, 0), (row, 1), (row, 2)], tmp_path, None)
    assert [r["seed"] for r in kept] == [1, 2]
    assert "seed 0: did not converge in 500,000 env steps; its budget is now 2,000,000" in capsys.readouterr().out


def test_jitted_cells_replace_the_3_seed_rows_and_the_int8_claim_needs_2_se(tmp_path):
    """launch.anakin rows: one call per arm for 10 seeds; once they cover every seed of a launch.train arm, that
    arm's rows leave the CSV, and the tables use the jitted rows only. int8 holds when |change| + 2 s.e. < 5%."""
    from bench.learning.ptq_study_anakin import anakin_command, seed_spec
    from bench.learning.ptq_study_rows import replace_train_rows

    row = next(r for r in ptq_study.GRID if (r.algo, r.task) == ("dqn", "Acrobot-v1"))
    assert row.trainer == "anakin" and row.seeds == tuple(range(10))
    assert next(r for r in ptq_study.GRID if r.algo == "d4pg").trainer == "train"
    command = anakin_command(row, range(10), tmp_path, quick=False, qat_bits=4)
    text = " ".join(command[1:])
    assert "-m launch.anakin --agent dqn --task Acrobot-v1 --seeds 0-9 --precision int4 --qat-bits 4" in text
    assert "--target-return -100.0 --target-streak 2" in text and seed_spec([0, 3, 5]) == "0,3,5"

    def cell(trainer, seeds, int8):
        return [{"algo": "dqn", "task": "Acrobot-v1", "seed": seed, "train_steps": 100, "precision": p, "bits": b,
                 "granularity": "n/a", "execution": "native", "backend": "jax", "episodes": 50,
                 "mean_return": ret + 0.001 * seed, "std_return": 1.0, "policy_bytes": 10, "train_final_eval": None,
                 "reference": -100.0, "cpu": "c", "trainer": trainer}
                for seed in seeds for p, b, ret in (("fp32", 32, -80.0), ("int8", 8, int8))]
    old, new = cell("train", range(3), -80.0), cell("anakin", range(10), -83.0)
    heads = [{**r, "precision": "int8-head16", "mean_return": r["mean_return"] + 2.2} for r in new
             if r["precision"] == "int8"]  # the Q head at 16 bits: -1% instead of -3.75%
    assert replace_train_rows(old + new[:4], "dqn", "Acrobot-v1") == old + new[:4]  # seeds 0-1 only: kept
    kept = replace_train_rows(old + new, "dqn", "Acrobot-v1")
    assert kept == new
    ptq_study.write_rows(tmp_path / "ptq_study.csv", old + new)  # both trainers' rows, told apart by trainer
    assert len(ptq_study.read_rows(tmp_path / "ptq_study.csv")) == len(old + new)
    text = ptq_study.report(tmp_path)
    assert "| dqn | Acrobot-v1 | anakin | 10 |" in text and "| dqn | Acrobot-v1 | train |" not in text
    line = next(t for t in text.splitlines() if t.startswith("| dqn | Acrobot-v1 | anakin | 10 |"))
    assert line.endswith("| yes |")  # -3.75% on every seed, s.e. ~0: |change| + 2 s.e. < 5%
    ptq_study.write_rows(tmp_path / "ptq_study.csv", new + heads)
    text = ptq_study.report(tmp_path)
    head = text.split("## The Q head at 16 bits")[1].split("##")[0]
    assert "| dqn | Acrobot-v1 | 10 | -3." in head and "| -1.0% ± 0.0% |" in head and head.rstrip().endswith("| yes |")
