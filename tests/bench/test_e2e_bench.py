"""bench.system.e2e: per-arm figures and time shares from a summary, per-seed ratios, the results folder per machine,
bad flags, and (slow) the whole benchmark at its tiny size on a local Ray."""
from __future__ import annotations

import json

import pytest

from bench.system import e2e


def _summary(steps_per_s: float, to_target: float | None, device: dict | None = None) -> dict:
    actor = {"elapsed_s": 10.0, "times": {"env_step_s": 2.0, "policy_s": 5.0, "insert_s": 2.0, "pull_s": 0.2,
                                          "deserialize_s": 0.1, "load_s": 0.2}}
    return {"status": "completed", "error": None, "time_to_target_s": to_target, "actor_steps_to_target": 1000,
            "best_eval_return": 900.0, "run_wall_clock_s": 20.0, "actor_steps": 2000, "learner_steps": 250,
            "actor_steps_per_s": steps_per_s, "learner_steps_per_s": 25.0, "backend": ["onnx"],
            "learner_device": device, "actors": [actor, {**actor, "elapsed_s": 20.0}],
            "learner": {"training_s": 10.0, "step_s": 6.0, "sample_wait_s": 3.0,
                        "publish": {"quantize_encode_s": 0.5, "put_s": 0.5}},
            "runtime": {"per_step": {"policy_us": 2500.0}, "per_update": {"update_ms": 5.0}}}


def test_arm_result_reports_each_process_time_shares(tmp_path):
    arm = e2e.arm_result(_summary(100.0, 50.0), 0, "int8", 0, str(tmp_path))
    shares = arm["time_shares"]
    assert shares["actors"]["policy"] == pytest.approx((0.5 + 0.25) / 2)  # mean over the two actors
    assert shares["actors"]["weights"] == pytest.approx((0.05 + 0.025) / 2)
    assert sum(shares["actors"].values()) == pytest.approx(1.0)
    assert shares["learner"] == {"sgd": 0.6, "sample_wait": 0.3, "publish": 0.1, "training_s": 10.0}
    # Stage time outside the loop's clock (the learner's first step compiles before its clock starts): the
    # shares are of the larger of the two, never past 1.
    late = _summary(100.0, 50.0)
    late["learner"]["step_s"] = 30.0
    shares = e2e.arm_result(late, 0, "int8", 0, str(tmp_path))["time_shares"]["learner"]
    assert shares["sgd"] == pytest.approx(30.0 / 34.0, abs=1e-4)
    assert shares["sgd"] + shares["sample_wait"] + shares["publish"] == pytest.approx(1.0, abs=1e-3)
    assert arm["env_steps_per_s"] == 100.0 and arm["learner_steps_per_s"] == 25.0 and arm["evaluations"] == []


def test_comparison_divides_fp32_by_int8_per_seed_and_a_missed_target_is_none(tmp_path):
    arms = [e2e.arm_result(_summary(100.0, 90.0), 0, "fp32", 0, str(tmp_path)),
            e2e.arm_result(_summary(250.0, 30.0), 0, "int8", 0, str(tmp_path)),
            e2e.arm_result(_summary(100.0, None), 0, "fp32", 1, str(tmp_path)),
            e2e.arm_result(_summary(250.0, 40.0), 0, "int8", 1, str(tmp_path))]
    (s0, s1) = e2e.compare(arms, (0, 1))
    assert s0["time_to_target_fp32_over_int8"] == 3.0 and s0["env_steps_per_s_int8_over_fp32"] == 2.5
    assert s1["time_to_target_fp32_over_int8"] is None
    result = {"setting": {**e2e.tiny_setting().__dict__, "policy": [16, 16]}, "machine": {"cores": 2},
              "arms": arms, "comparison": [s0, s1], "command": "python -m bench.system.e2e --tiny"}
    text = e2e.markdown(result)
    assert "| 0 | 3.00 | 2.50 | 1.00 |" in text and "| 1 | - | 2.50 | 1.00 |" in text


def test_results_folder_names_the_gpu_the_learner_ran_on_else_the_cpu_class(tmp_path):
    gpu = {"platform": "gpu", "device_kind": "NVIDIA H200"}
    assert e2e.machine_dir([e2e.arm_result(_summary(1.0, None, gpu), 0, "fp32", 0, str(tmp_path))]) == \
        "gpu-nvidia-h200"
    from quarl.runtimes.cpu import cpu_class

    cpu = {"platform": "cpu", "device_kind": "cpu"}
    assert e2e.machine_dir([e2e.arm_result(_summary(1.0, None, cpu), 0, "fp32", 0, str(tmp_path))]) == cpu_class()


@pytest.mark.parametrize("flags, message", [(["--seeds", "a"], "--seeds wants"), (["--policy", ""], "--policy"),
                                            (["--num-actors", "0"], "--num-actors must be"),
                                            (["--learner-device", "tpu"], "invalid choice")])
def test_bad_flags_exit_2_before_anything_runs(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        e2e.main([*flags, "--out", str(tmp_path / "out"), "--allow-busy"])
    assert info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_tiny_benchmark_runs_both_arms_and_writes_its_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert e2e.main(["--tiny", "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert [a["precision"] for a in result["arms"]] == ["fp32", "int8"]
    for arm in result["arms"]:
        assert arm["status"] == "completed" and arm["actor_steps"] >= 600 and arm["learner_steps"] > 0
        assert arm["env_steps_per_s"] > 0 and arm["learner_steps_per_s"] > 0 and arm["evaluations"]
        assert arm["learner_device"]["platform"] == "cpu" and arm["time_shares"]["actors"]["env"] > 0
    assert result["machine"]["load_end"] is not None and result["comparison"][0]["seed"] == 0
    assert "fp32 vs int8 actors" in (tmp_path / "out" / "e2e.md").read_text()
