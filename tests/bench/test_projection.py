"""bench.system.projection's arithmetic on synthetic inputs (no committed result file is read)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.system import projection


def _inputs(learner_256: float, learner_2048: float) -> tuple[dict, dict, dict]:
    learner = {"machine": {"jax_backend": "gpu", "jax_devices": ["cuda:0 H200"]}, "configs": [
        {"policy_layer_sizes": [256] * 3, "modes": {"learner.step": {"median_steps_per_s": learner_256},
                                                    "scan": {"median_steps_per_s": 999.0}}},
        {"policy_layer_sizes": [2048] * 3, "modes": {"scan": {"median_steps_per_s": learner_2048}}}]}
    # One actor at 2048x3 measured: fp32 500 env steps/s, int8 2000; env step 200 us in both runs.
    actorq = {"actor": {"policy": [2048] * 3, "throughput": {
        "fp32": {"steps_per_s": 500.0, "env_us": 150.0, "policy_us": 1850.0},
        "int8": {"steps_per_s": 2000.0, "env_us": 250.0, "policy_us": 250.0}}}}
    inference = {"rows": [
        {"backend": "auto", "precision": "fp32", "hidden": 256, "batch": 1, "us_per_call": 50.0},
        {"backend": "onnx", "precision": "fp32", "hidden": 256, "batch": 1, "us_per_call": 10.0},
        {"backend": "auto", "precision": "int8", "hidden": 256, "batch": 1, "us_per_call": 300.0},
        {"backend": "onnx", "precision": "int4", "hidden": 256, "batch": 1, "us_per_call": 800.0},
        {"backend": "onnx", "precision": "int4", "hidden": 256, "batch": 16, "us_per_call": 1.0},
        {"backend": "auto", "precision": "int8", "hidden": 2048, "batch": 1, "us_per_call": 1.0}]}
    return learner, actorq, inference


def test_rates_cores_and_ratios_follow_the_stated_arithmetic() -> None:
    proj = projection.project(*_inputs(learner_256=100.0, learner_2048=1000.0))
    assert proj["device"] == "gpu (cuda:0 H200)"
    r256, r2048 = proj["rows"]
    # learner.step preferred over scan; 8 env steps per SGD step (256 / 32).
    assert r256["learner_steps_per_s"] == 100.0 and r256["env_steps_to_saturate"] == 800.0
    # 256x3 derived: 1e6 / (mean env 200 us + the auto runtime's call); int4 has no auto row: fastest backend.
    a = r256["actors"]
    assert a["fp32"]["steps_per_s"] == pytest.approx(1e6 / 250) and a["int8"]["steps_per_s"] == pytest.approx(2000)
    assert a["int4"]["steps_per_s"] == pytest.approx(1000)
    assert a["fp32"]["cores_to_saturate"] == pytest.approx(800 / 4000)
    # 4 actors of 4000 steps/s outrun the learner (800): capped, so int8 (4 x 2000 = 8000) gains nothing.
    assert a["fp32"]["paper_fleet_env_steps_per_s"] == 800 and r256["e2e_ratio_vs_fp32"]["int8"] == 1.0
    # 2048x3 measured rows (not the inference row); learner 1000 steps/s needs 8000 env steps/s:
    # fp32 fleet 2000, int8 fleet 8000 -> 4x, int4 not measured at this width.
    b = r2048["actors"]
    assert b["fp32"]["how"].startswith("measured") and b["int8"]["steps_per_s"] == 2000.0 and "int4" not in b
    assert b["int8"]["cores_to_saturate"] == pytest.approx(4.0)
    assert r2048["e2e_ratio_vs_fp32"]["int8"] == pytest.approx(4.0)
    assert r2048["learner_steps_per_s_fleet_limit"]["fp32"] == pytest.approx(4 * 500 / 8)


def test_a_partly_saturated_fleet_gives_the_partial_ratio() -> None:
    proj = projection.project(*_inputs(learner_256=100.0, learner_2048=500.0))  # needs 4000 env steps/s
    assert proj["rows"][1]["e2e_ratio_vs_fp32"]["int8"] == pytest.approx(4000 / 2000)


def test_cli_writes_the_table_and_refuses_bad_inputs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for name, data in zip(projection.INPUTS, _inputs(100.0, 1000.0)):
        (tmp_path / name).write_text(json.dumps(data))
    assert projection.main(["--results", str(tmp_path)]) == 0
    text = (tmp_path / "projection.md").read_text()
    assert "A projection, not a measurement" in text and "| 2048x3 | 1000.0 | 8000 | int8 | 2000 |" in text
    assert "4.00x" in text and "1.5-5.41x" in text and "(learner_throughput.json)" in text
    # A committed GPU learner run adds its own table, from its own file.
    (tmp_path / "gpu").mkdir()
    gpu = _inputs(100.0, 4000.0)[0]
    (tmp_path / projection.GPU_LEARNER).write_text(json.dumps(gpu))
    assert projection.main(["--results", str(tmp_path)]) == 0
    text = (tmp_path / "projection.md").read_text()
    assert "## Learner on gpu (cuda:0 H200)" in text and "(gpu/learner_throughput.json)" in text
    assert "| 2048x3 | 4000.0 | 32000 | int8 | 2000 |" in text
    (tmp_path / "actorq.json").write_text(json.dumps({"actor": {}}))
    with pytest.raises(SystemExit) as e:
        projection.main(["--results", str(tmp_path)])
    assert e.value.code == 2 and "lacks a field" in capsys.readouterr().err


def test_inputs_from_different_cpus_are_refused_unless_allowed(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    """Issue 46: a projection once mixed a Xeon actor run with EPYC figures without saying so."""
    learner, actorq, inference = _inputs(100.0, 1000.0)
    learner["machine"]["cpu"] = "Intel(R) Xeon(R) Processor"
    actorq["machine"] = {"cpu": "AMD EPYC"}
    inference["cpu_model"] = "AMD EPYC"
    (tmp_path / "epyc").mkdir()
    for name, data in zip(projection.INPUTS, (learner, actorq, inference)):
        (tmp_path / name).write_text(json.dumps(data))
    with pytest.raises(SystemExit) as e:
        projection.main(["--results", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "different CPUs" in err and "Xeon" in err and err.count("\n") == 1
    assert projection.main(["--results", str(tmp_path), "--allow-mixed"]) == 0
    assert "learner_throughput.json), Intel(R) Xeon(R) Processor" in (tmp_path / "projection.md").read_text()
    # The same learner measured on the EPYC, passed by name: accepted, and each input names its CPU.
    learner["machine"]["cpu"] = "AMD EPYC"
    (tmp_path / "epyc" / "learner_throughput.json").write_text(json.dumps(learner))
    assert projection.main(["--results", str(tmp_path), "--learner", "epyc/learner_throughput.json"]) == 0
    assert "(epyc/learner_throughput.json), AMD EPYC" in (tmp_path / "projection.md").read_text()
