"""bench.system.actorq_minatar returns (bench.learning.actorq_minatar_returns) at its smallest: real launch.actorq runs
of both precisions, the report's structure, and one-line usage errors, also through the system benchmark's mode."""
from __future__ import annotations

import json

import pytest

from bench.system import actorq_minatar
from bench.learning import actorq_minatar_returns


@pytest.mark.slow  # a returns run per seed and precision
def test_tiny_run_reports_every_evaluation_per_seed_and_precision(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(actorq_minatar_returns, "RUNS", tmp_path / "runs")
    argv = ["--seeds", "0", "--frames", "192", "--evals", "1", "--eval-episodes", "1", "--out", str(tmp_path / "out")]
    assert actorq_minatar_returns.main(argv) == 0
    result = json.loads((tmp_path / "out" / "actorq_minatar_returns.json").read_text())
    assert result["command"] == "python -m bench.system.actorq_minatar returns " + " ".join(argv)
    assert result["machine"]["cpu_model"] and result["machine"]["load_end"]
    assert result["config"]["settings"]["samples_per_insert"] == 32.0  # the MinAtar authors' settings
    rows = {r["precision"]: r for r in result["results"]}
    assert set(rows) == {"fp32", "int8"}
    for r in rows.values():
        assert r["seed"] == 0 and r["frames"] >= 192 and r["run"]["status"] == "completed"
        assert len(r["curve"]) >= 2 and r["final_return"] == r["curve"][-1]["return"]  # during + end of run
        assert r["last_k_mean"] == pytest.approx(sum(c["return"] for c in r["curve"][-3:]) / len(r["curve"][-3:]))
    assert rows["int8"]["run"]["executed"].startswith("int8")
    s = result["summary"]
    assert s["paired_seeds"] == [0] and s["within_seed_noise"] is None  # one seed: fp32 has no spread to judge by
    text = (tmp_path / "out" / "actorq_minatar_returns.md").read_text()
    assert "| 0 | int8 |" in text and "not judged" in text and "asynchronous" in text
    assert all(r["run"]["load_start"] and "--runner" in r["run"]["argv"] for r in result["results"])
    # The report again from the run directories: the same rows; one run given twice is refused in one line.
    dirs = [r["logdir"] for r in result["results"]]  # outside the repository: absolute paths
    assert actorq_minatar_returns.main(["--from-runs", *dirs, "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "actorq_minatar_returns.json").read_text())
    assert again["machine"]["from_runs"] and again["summary"] == s and again["config"] == result["config"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        actorq_minatar_returns.main(["--from-runs", dirs[0], dirs[0], "--out", str(tmp_path / "twice")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "share a seed and precision" in err and err.count("\n") == 1


def test_summary_judges_the_gap_against_fp32s_seed_range():
    def run(seed: int, precision: str, returns: list[float]) -> dict:
        return {"seed": seed, "precision": precision, "curve": [{"actor_steps": i, "return": v}
                                                                for i, v in enumerate(returns)]}
    s = actorq_minatar_returns.summarize([run(0, "fp32", [1, 4, 5, 6]), run(0, "int8", [1, 5, 5, 5]),
                                          run(1, "fp32", [1, 6, 7, 8]), run(1, "int8", [1, 6, 8, 7])])
    assert s["fp32"]["range"] == pytest.approx(2.0) and s["mean_difference"] == pytest.approx(0.0)
    assert s["within_seed_noise"] is True and s["not_below_fp32_noise"] is True
    assert s["last_two_evals_abs_change"] == pytest.approx(0.75)
    worse = actorq_minatar_returns.summarize([run(0, "fp32", [5, 5]), run(0, "int8", [1, 1]),
                                              run(1, "fp32", [6, 6]), run(1, "int8", [2, 2])])
    assert worse["mean_difference"] == pytest.approx(-4.0) and worse["within_seed_noise"] is False
    assert worse["int8_lower_on_seeds"] == 2
    assert worse["not_below_fp32_noise"] is False


@pytest.mark.parametrize("argv", [["--game", "Pong"], ["--frames", "0"], ["--seeds", "a"], ["--evals", "-1"],
                                  ["--frames", "x"],
                                  ["--from-runs", "/nonexistent/Breakout_int8_s0"]])
def test_bad_arguments_exit_2_with_one_line(argv, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        actorq_minatar_returns.main([*argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "error" in err and err.count("\n") == 1


def test_the_system_benchmarks_returns_mode_runs_the_learning_benchmark(capfd, tmp_path):
    """`bench.system.actorq_minatar returns ...` runs `bench.learning.actorq_minatar_returns` as a program: its exit
    code and its one-line error come back, and nothing is written."""
    assert actorq_minatar.main(["returns", "--frames", "0", "--out", str(tmp_path / "out")]) == 2
    err = capfd.readouterr().err
    assert "bench.system.actorq_minatar returns: error: --frames" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_gap_of_one_sign_on_every_seed_is_not_seed_noise():
    """A gap inside fp32's range that is significant in the paired test is a real effect (issue 46: MinAtar row)."""
    def run(seed: int, precision: str, value: float) -> dict:
        return {"seed": seed, "precision": precision, "curve": [{"actor_steps": 0, "return": value}]}
    fp32 = [5.4, 5.6, 5.6, 5.9, 5.7]
    gaps = [-0.27, -0.37, -0.43, -0.10, -0.03]
    runs = [run(k, "fp32", v) for k, v in enumerate(fp32)] + [run(k, "int8", v + g)
                                                             for k, (v, g) in enumerate(zip(fp32, gaps))]
    s = actorq_minatar_returns.summarize(runs)
    assert abs(s["mean_difference"]) <= s["fp32"]["range"]  # inside the range ...
    assert s["paired_significant"] and s["int8_lower_on_seeds"] == 5
    assert s["within_seed_noise"] is False  # ... but one sign on every seed, p < 0.05
