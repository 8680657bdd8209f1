"""bench.peers.fidelity: paired statistics, the report built from run folders, the run commands and the CLI's errors."""
from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from bench.peers import fidelity, fidelity_report

REPO = Path(__file__).resolve().parents[2]


def test_sign_flip_p_is_the_exact_permutation_probability():
    # All 5 differences positive: only the all-plus and all-minus flips are as extreme -> 2 / 32.
    assert fidelity_report.sign_flip_p([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2 / 32)
    # Symmetric differences: every flip is at least as extreme as mean 0.
    assert fidelity_report.sign_flip_p([1.0, -1.0, 2.0, -2.0]) == 1.0
    # One large difference dominates: flips of the small ones do not change |mean| much.
    p = fidelity_report.sign_flip_p([10.0, 0.1, -0.1, 0.2])
    brute = np.mean([abs(np.mean(np.array(s) * [10.0, 0.1, -0.1, 0.2])) >= abs(np.mean([10.0, 0.1, -0.1, 0.2])) - 1e-9
                     for s in np.array(np.meshgrid(*[[1, -1]] * 4)).T.reshape(-1, 4)])
    assert p == pytest.approx(brute)


def test_paired_t_p_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=6), rng.normal(size=6) + 0.5
    assert fidelity_report.paired_t_p(list(a - b)) == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-9)
    assert fidelity_report.paired_t_p([0.0, 0.0, 0.0]) == 1.0
    assert np.isnan(fidelity_report.paired_t_p([1.0]))


def _fake_run(runs: Path, task: str, arm: str, seed: int, curve: list[tuple[int, float, float, float]]) -> None:
    """A finished run folder as launch.train (ours) or bench/peers/acme_d4pg.py (Acme) leaves it."""
    d = fidelity.run_dir(runs, task, arm, seed)
    d.mkdir(parents=True)
    with open(d / "evaluator.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["actor_steps", "learner_steps", "wall_clock_s", "train_clock_s", "return",
                                          "return_first", "return_std"])
        w.writeheader()
        for steps, train_s, ret, first in curve:
            w.writerow({"actor_steps": steps, "learner_steps": steps // 8, "wall_clock_s": train_s + 1,
                        "train_clock_s": train_s, "return": ret, "return_first": first, "return_std": 1.0})
    (d / ("done.json" if arm == "acme" else "summary.json")).write_text(json.dumps({"seed": seed}))


def test_report_pairs_seeds_per_checkpoint_and_over_the_curve(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    rng = np.random.default_rng(1)
    for seed in range(5):
        acme = [(s, s / 100, 100 + s / 10 + rng.normal(), 90 + s / 10) for s in (5000, 10000)]
        _fake_run(runs, "cartpole:balance", "acme", seed, acme)
        # fp32: exactly 50 lower at every checkpoint (a significant deficit); int8: the same as Acme.
        _fake_run(runs, "cartpole:balance", "fp32", seed, [(s, t / 2, r - 50, f - 50) for s, t, r, f in acme])
        _fake_run(runs, "cartpole:balance", "int8", seed, [(s, t / 2, r, f) for s, t, r, f in acme])
    _fake_run(runs, "cartpole:balance", "fp32", 9, [(5000, 1.0, 1.0, 1.0)])  # no Acme partner: left out of tests
    (fidelity.run_dir(runs, "cartpole:balance", "int8", 7)).mkdir(parents=True)  # unfinished: ignored
    (runs / "machine.json").write_text(json.dumps([{"cores": 2, "load_start": [1.5, 1, 1], "load_end": [0.5, 1, 1]}]))
    text = fidelity.report(runs, out, "python -m bench.peers.fidelity report")
    assert "load average 1.5 at the start and 0.5 at the end on 2 cores" in text
    tests = list(csv.DictReader(open(out / "fidelity_tests.csv", encoding="utf-8")))
    assert len(tests) == 2 * 2 * 2  # checkpoints x our arms x protocols
    fp32 = [r for r in tests if r["arm"] == "fp32"]
    assert all(int(r["seeds"]) == 5 and float(r["diff_mean"]) == pytest.approx(-50) for r in fp32)
    assert all(float(r["p_sign_flip"]) == pytest.approx(2 / 32) and float(r["p_t"]) < 1e-6 for r in fp32)
    int8 = [r for r in tests if r["arm"] == "int8"]
    assert all(float(r["diff_mean"]) == 0 and float(r["p_t"]) == 1.0 for r in int8)
    aucs = {(r["arm"], r["protocol"]): r for r in fidelity_report.auc_tests(fidelity_report.load_curves(runs))}
    assert fidelity_report.verdict(aucs[("fp32", "return")]) == "ours lower (significant)"
    assert fidelity_report.verdict(aucs[("int8", "return_first")]) == "ours >= Acme"
    assert aucs[("int8", "return")]["time_ratio"] == pytest.approx(2.0)  # ours took half Acme's train seconds
    noisy = {"diff_mean": -3.0, "p_t": 0.4, "p_sign_flip": 0.5}
    assert fidelity_report.verdict(noisy) == "within seed noise"
    assert "| cartpole:balance | fp32 |" in text and (out / "fidelity.png").stat().st_size > 10_000
    curves = list(csv.DictReader(open(out / "fidelity_curves.csv", encoding="utf-8")))
    assert len(curves) == 5 * 3 * 2 + 1 and statistics.fmean(float(r["return"]) for r in curves) > 0
    # every run's train seconds to its last checkpoint, with the load its run recorded (none here)
    assert "| cartpole:balance | 3 | 10,000 | 50 | 50 | 100 |" in text


def test_run_commands_use_the_same_settings_for_both_agents(tmp_path):
    args = fidelity.parse_args(["run", "--tasks", "walker:stand", "--seeds", "3", "--steps", "walker:stand=7000",
                                "--eval-every", "1000", "--eval-episodes", "4", "--acme-python", sys.executable])
    ours = fidelity.command(args, "walker:stand", "int8", 3, tmp_path / "o")
    acme = fidelity.command(args, "walker:stand", "acme", 3, tmp_path / "a")
    for cmd in (ours, acme):
        for flag, value in (("--steps", "7000"), ("--seed", "3"), ("--eval-every", "1000"),
                            ("--eval-episodes", "4"), ("--task", "walker:stand")):
            assert cmd[cmd.index(flag) + 1] == value
    assert "policy_layer_sizes=256,256,256" in ours and "critic_layer_sizes=512,512,256" in ours
    assert acme[acme.index("--policy") + 1] == "256,256,256" and acme[acme.index("--critic") + 1] == "512,512,256"
    assert ours[ours.index("--precision") + 1] == "int8" and acme[1].endswith("bench/peers/acme_d4pg.py")


@pytest.mark.parametrize("argv, message", [
    (["run", "--arms", "fp32,bogus"], "arms"),
    (["run", "--steps", "cartpole:balance=-3"], "--steps"),
    (["run", "--seeds", "a,b"], "--seeds"),
    (["run", "--arms", "acme", "--acme-python", "/nonexistent/python"], "acme-python"),
    (["report", "--runs", "/nonexistent/fidelity-runs"], "no finished runs"),
    (["frobnicate"], "invalid choice"),
])
def test_cli_errors_are_one_line_with_exit_code_2(argv, message, tmp_path):
    if argv[0] == "report":
        (tmp_path / "empty").mkdir()
        argv = ["report", "--runs", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]
    proc = subprocess.run([sys.executable, "-m", "bench.peers.fidelity", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_runs_in_the_committed_curves_are_merged_and_not_run_again(tmp_path, monkeypatch):
    """A long benchmark split into parts: part 2's report keeps part 1's rows (from OUT/fidelity_curves.csv, with
    their CPU) and part 2's `run` skips the runs part 1 recorded to their last step."""
    out = tmp_path / "out"
    part1, part2 = tmp_path / "runs1", tmp_path / "runs2"
    for seed in (0, 1):
        for arm in ("acme", "fp32"):
            _fake_run(part1, "cartpole:balance", arm, seed, [(5000, 1.0, 100.0 + seed, 90.0), (10000, 2.0, 200.0, 190.0)])
            (fidelity.run_dir(part1, "cartpole:balance", arm, seed) / "machine.json").write_text(
                json.dumps({"cpu": "CPU-A", "load_start": [0.4 + seed, 1, 1], "load_end": [1.5, 1, 1]}))
    fidelity.report(part1, out, "part 1")
    for arm in ("acme", "fp32"):
        _fake_run(part2, "cartpole:balance", arm, 2, [(5000, 1.0, 300.0, 290.0), (10000, 2.0, 400.0, 390.0)])
    (part2 / "machine.json").write_text(json.dumps([{"cpu": "CPU-B", "cores": 2, "load_start": [0.1], "load_end": [0.2]}]))
    text = fidelity.report(part2, out, "part 2")
    curves = list(csv.DictReader(open(out / "fidelity_curves.csv", encoding="utf-8")))
    assert sorted({(r["seed"], r["cpu"]) for r in curves}) == [("0", "CPU-A"), ("1", "CPU-A"), ("2", "CPU-B")]
    # each run's load survives the merge through the committed CSV, and the seconds table shows it
    assert {r["load"] for r in curves if r["seed"] == "1"} == {"1.4-1.5"}
    assert "| cartpole:balance | 1 | 10,000 | 2 (1.4-1.5) |  | 2 (1.4-1.5) |" in text
    assert len(curves) == 3 * 2 * 2
    assert "CPU-A" in text and "CPU-B" in text
    tests = list(csv.DictReader(open(out / "fidelity_tests.csv", encoding="utf-8")))
    assert {int(r["seeds"]) for r in tests} == {3}
    assert json.loads((out / "fidelity_sessions.json").read_text())[0]["cpu"] == "CPU-B"
    assert fidelity.recorded_runs(out / "fidelity_curves.csv")[("cartpole:balance", "fp32", 1)] == 10000

    ran = []
    monkeypatch.setattr(fidelity, "run_subprocess", lambda cmd, *a, **k: ran.append(cmd) or (1, "", 0.0))
    args = fidelity.parse_args(["run", "--tasks", "cartpole:balance", "--seeds", "0,1", "--arms", "fp32",
                                "--steps", "cartpole:balance=10000", "--runs", str(tmp_path / "runs3"),
                                "--out", str(out), "--allow-busy"])
    fidelity.run_all(args)  # both runs are recorded to step 10000: nothing is started
    assert ran == []
    args.steps = {"cartpole:balance": 20000}  # a longer run than recorded: it must run (and here fails)
    with pytest.raises(RuntimeError):
        fidelity.run_all(args)
    assert len(ran) == 1
