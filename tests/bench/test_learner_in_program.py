"""bench.system.learner_in_program: its table from synthetic figures, and a tiny real run writing both files."""
from __future__ import annotations

import json

import pytest

from bench.system import learner_in_program as lip


def _config(node: float, off: float, step: float) -> dict:
    run = lambda rate: {"steps_per_s": rate, "publish": {"quantize_encode_ms_per_version": 12.5},  # noqa: E731
                        "publish_handoff": {"ms_per_version": 0.05}}
    return {"policy_layer_sizes": [256] * 3, "steps_per_call": 8, "learner.step": step, "scan": 3 * step,
            "node": run(node), "node_no_publish": run(off), "ratio_node_vs_learner_step": node / step,
            "ratio_publish_on_vs_off": node / off}


def test_the_table_shows_both_ratios_and_the_handoff_cost():
    machine = {"jax_backend": "gpu", "date": "2026-12-04T00:00:00", "cpu": "Xeon", "cores": 16, "jax": "0.11.2",
               "jax_devices": ["gpu:0 NVIDIA H200"], "load_average_start": [0.2], "load_average_end": [0.3]}
    md = lip.markdown({"machine": machine, "configs": [_config(95.0, 100.0, 100.0)]}, "python -m bench.system.learner_in_program")
    row = next(line for line in md.splitlines() if line.startswith("| 256x256x256"))
    assert "| 8 | 100.0 | 300.0 | 95.0 | 100.0 | 0.95 | 0.95 | 0.050 | 12.5 |" in row


@pytest.mark.slow
def test_a_tiny_run_writes_the_results_with_the_machine_record(tmp_path):
    assert lip.main(["--quick", "--allow-busy", "--window-s", "0.5", "--steps-per-call", "2",
                     "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "learner_in_program.json").read_text())
    assert "load_average_end" in result["machine"] and result["machine"]["cores"] >= 1
    (config,) = result["configs"]
    assert config["steps_per_call"] == 2 and config["node"]["steps_per_call"] == 2
    for key in ("node", "node_no_publish"):
        assert config[key]["steps_per_s"] > 0 and config[key]["window_steps"] % 2 == 0
    assert config["node"]["publish"]["versions"] >= 2 and config["node_no_publish"]["publish"]["versions"] == 2
    assert config["ratio_publish_on_vs_off"] == pytest.approx(
        config["node"]["steps_per_s"] / config["node_no_publish"]["steps_per_s"])
    assert "(c)/(a)" in (tmp_path / "learner_in_program.md").read_text()


def test_the_node_runs_the_programs_k_unless_told(monkeypatch, tmp_path):
    """Without --steps-per-call the node gets K = None, which `LearnerNode` resolves to its device's choice
    (what `launch.actorq` runs by default); the table shows the K the node reported."""
    seen = []

    def fake_measure(policy, **kwargs):
        seen.append(kwargs["steps_per_call"])
        return _config(95.0, 100.0, 100.0)

    monkeypatch.setattr(lip, "measure_size", fake_measure)
    assert lip.main(["--quick", "--allow-busy", "--out", str(tmp_path)]) == 0
    assert lip.main(["--quick", "--allow-busy", "--steps-per-call", "3", "--out", str(tmp_path)]) == 0
    assert seen == [None, 3]
