"""analysis.upgrade_summaries: earlier single-process summary.json files, rewritten into the one layout."""
from __future__ import annotations

import json

import pytest

from analysis import runs, upgrade_summaries
from analysis.schema import ACTOR_KEYS, LEARNER_KEYS, PAYLOAD_KEYS, PUBLISH_KEYS, SUMMARY_KEYS, sum_energy
from launch.experiments.stages import StageTimes, runtime_section

# The earlier single-process layout, as results/small held it (numbers from one of its runs, trimmed).
ENERGY = {"country": "USA", "cpu_kwh": 1.26e-4, "duration_s": 166.8, "emissions_kg_co2eq": 2.17e-4,
          "energy_kwh": 5.89e-4, "gpu_kwh": 0.0, "grid_intensity_g_per_kwh": 369.473, "method": "test", "name": "run",
          "ram_kwh": 4.62e-4}
OLD = {
    "actor_steps": 50000, "actor_update_period": 100, "agent": "dqn", "backend": "onnx", "best_eval_return": -77.2,
    "config": {"batch_size": 64, "hidden_sizes": [256, 256]}, "energy": ENERGY, "env_steps_per_s": 299.83,
    "episodes": 483, "eval_episodes": 5, "evaluations": 25, "final_eval_return": -95.0, "learner_steps": 49098,
    "payload_bytes": 274071, "payload_bytes_fp32": 274071, "payload_compression": 1.0,
    "policy_file": "policy_fp32.qrlp", "precision": "fp32", "seed": 1, "sync_learner": False,
    "runtime": {"actor_build_s": 0.002, "adder_insert_s": 24.1, "deserialize_ms_per_update": 1.5,
                "deserialize_s": 0.75, "env_step_s": 23.4, "env_step_us_per_step": 467.7, "env_steps": 50000,
                "evaluation_s": 3.3, "inference_s": 16.4, "inference_us_per_step": 328.7, "learner_ms_per_step": 1.5,
                "learner_s": 75.0, "learner_steps": 49098, "load_ms_per_update": 4.6, "load_s": 2.3,
                "pull_ms_per_update": 13.9, "pull_s": 6.96, "sample_s": 10.3, "updates": 500},
    "table": {"inserts": 49998, "samples": 3142272, "sampler": "uniform", "size": 49998},
    "task": "Acrobot-v1", "train_clock_s": 163.4, "wall_clock_s": 166.8, "weight_updates": 500,
}


def _keys(d):
    """Key sets of a nested dict, recursively (what summary.json's layout is)."""
    return {k: _keys(v) if isinstance(v, dict) else None for k, v in d.items()}


def test_an_old_summary_gets_the_one_layout_with_its_values_carried_over():
    new = upgrade_summaries.upgrade(OLD)
    assert list(new) == list(SUMMARY_KEYS)
    assert list(new["actors"][0]) == list(ACTOR_KEYS) and list(new["learner"]) == list(LEARNER_KEYS)
    assert list(new["learner"]["publish"]) == list(PUBLISH_KEYS) and list(new["payload"]) == list(PAYLOAD_KEYS)
    # The runtime section and an actor's times are laid out as the runners lay them out now.
    assert _keys(new["runtime"]) == _keys(runtime_section([StageTimes().summary()], 0.0, 0))
    assert set(new["actors"][0]["times"]) == set(StageTimes().summary())
    assert set(new["energy"]) == set(sum_energy({"run": ENERGY}))

    assert (new["status"], new["runner"], new["num_actors"], new["backend"]) == ("completed", "single", 1, ["onnx"])
    summed = new["runtime"]["summed_s"]
    assert summed["quantize_encode_s"] == 6.96 and summed["pull_s"] is None  # the old pull_s was quantize + encode
    assert summed["policy_s"] == 16.4 and summed["insert_s"] == 24.1 and summed["env_step_s"] == 23.4
    assert new["runtime"]["per_update"]["quantize_encode_ms"] == 13.9
    assert new["runtime"]["per_step"]["policy_us"] == 328.7
    assert new["replay"] == OLD["table"] and new["actor_steps_per_s"] == 299.83
    assert new["payload"]["compression"] == 1.0 and new["payload_bytes"] == 274071
    assert new["learner"]["step_s"] == 75.0 and new["learner"]["sample_wait_s"] == 10.3
    assert new["actors"][0]["build_s"] == 0.002 and new["evaluation_s"] == 3.3 and new["train_clock_s"] == 163.4
    assert new["energy"]["nodes"]["run"] == ENERGY
    assert (new["energy"]["total_kwh"], new["energy"]["total_emissions_kg"]) == (5.89e-4, 2.17e-4)
    # Nothing invented: what the old layout did not record stays None.
    assert new["experiment"] is None and new["learner_steps_per_s"] is None
    # ... but what the run's precision and backend tell is filled: fp32 has no kernel form, ran fp32 compute.
    assert new["kernel_form"] == [] and new["executed"] == "fp32 weights, fp32 compute" and new["executor"] == "onnx"
    assert new["runtime"]["pulls"] is None and new["payload"]["put_s"] is None
    with pytest.raises(ValueError, match="earlier single-process layout"):
        upgrade_summaries.upgrade(new)


def test_the_cli_upgrades_a_tree_once_and_analysis_reads_the_same_numbers(tmp_path, capsys):
    old_dir = tmp_path / "runs" / "Acrobot" / "fp32" / "seed1"
    old_dir.mkdir(parents=True)
    (old_dir / "summary.json").write_text(json.dumps(OLD))
    current = upgrade_summaries.upgrade(OLD)
    (tmp_path / "runs" / "current").mkdir()
    (tmp_path / "runs" / "current" / "summary.json").write_text(json.dumps(current))
    (tmp_path / "runs" / "broken").mkdir()
    (tmp_path / "runs" / "broken" / "summary.json").write_text("{not json")

    assert upgrade_summaries.main([str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "1 upgraded, 0 given their execution record, 1 already current, 1 skipped" in out.out
    assert "broken" in out.err
    assert json.loads((old_dir / "summary.json").read_text()) == json.loads(json.dumps(current))
    assert upgrade_summaries.main([str(tmp_path)]) == 0  # a second pass changes nothing
    assert "0 upgraded, 0 given their execution record, 2 already current" in capsys.readouterr().out

    row = runs.load_runs(tmp_path / "runs").set_index("run_dir").loc[str(old_dir)]
    assert row["finished"] and row["runner"] == "single" and row["num_actors"] == 1
    assert row["policy_s"] == 16.4 and row["energy_kwh"] == 5.89e-4 and row["emissions_kg"] == 2.17e-4
    assert row["run_time_s"] == row["wall_clock_s"] == 166.8 and row["ram_kwh"] == 4.62e-4


def test_a_missing_folder_is_one_line_exit_2(tmp_path, capsys):
    assert upgrade_summaries.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is not a folder" in err


def _current_without_execution(precision: str, kernel: dict | None, backend: str = "onnx") -> dict:
    s = upgrade_summaries.upgrade({**OLD, "precision": precision, "backend": backend})
    s["actors"][0]["kernel"] = kernel
    for key in ("kernel_form", "executed", "executor", "cpu_class"):
        s[key] = None
    return s


@pytest.mark.parametrize("precision, kernel, backend, form, executed, executor", [
    # int8 whose kernel nobody recorded (results/small's runs): unknown, never claimed as an integer kernel
    ("int8", None, "onnx", ["unknown"], "int8 weights, kernel unknown", "onnx"),
    ("int8", {"form": "fp32", "cpu_class": "x86-avx2"}, "onnx", ["fp32"],
     "int8 weights, fp32 compute (dequantized)", "onnx-dequantized"),
    ("int8", {"form": "u8s8", "cpu_class": "x86-vnni"}, "onnx", ["u8s8"], "int8 weights, integer kernel (u8s8)",
     "onnx"),
    ("fp16", None, "onnx", [], "fp16 weights, fp32 compute (simulated)", "onnx"),
])
def test_current_summaries_get_their_execution_record(tmp_path, capsys, precision, kernel, backend, form,
                                                      executed, executor):
    path = tmp_path / "runs" / "x" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_current_without_execution(precision, kernel, backend)))
    assert upgrade_summaries.main([str(tmp_path)]) == 0
    assert "1 given their execution record" in capsys.readouterr().out
    s = json.loads(path.read_text())
    assert set(s) == set(SUMMARY_KEYS)
    assert (s["kernel_form"], s["executed"], s["executor"]) == (form, executed, executor)
    assert s["cpu_class"] == (kernel or {}).get("cpu_class")
    assert upgrade_summaries.main([str(tmp_path)]) == 0 and "1 already current" in capsys.readouterr().out
