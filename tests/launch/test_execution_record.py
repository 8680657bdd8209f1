"""What a run's actors executed is recorded and shown in words, and a seed plus a pinned executor reproduce a
run: launch.experiments.summary's `executed`/`executor`/`cpu_class`, --kernel-form, analysis.execution."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis import execution
from launch.experiments.run_experiment import run_experiment
from quarl.ops.checks import ConfigError
from tests.launch.tiny import TINY_DQN, tiny_config


@pytest.mark.parametrize("precision, backend, form, words, executor", [
    ("int8", "onnx", "fp32", "int8 weights, fp32 compute (dequantized)", "onnx-dequantized"),
    ("int8", "onnx", "u8s8", "int8 weights, integer kernel (u8s8)", "onnx"),
    ("int4", "onnx-nbits", "nbits4", "int4 weights, integer kernel (nbits4)", "onnx-nbits"),
    ("int8", "jax", "aqt_s8s8", "int8 weights, integer kernel (aqt_s8s8)", "jax"),
    ("int8", "onnx", None, "int8 weights, kernel unknown", "onnx"),
    ("int8", "onnx", "unknown", "int8 weights, kernel unknown", "onnx"),
    ("int16", "jax", None, "int16 weights, fp32 compute (simulated)", "jax"),
    ("fp16", "jax", None, "fp16 weights, fp16 compute", "jax"),
    ("fp16", "onnx", None, "fp16 weights, fp32 compute (simulated)", "onnx"),
    ("fp32", "onnx", None, "fp32 weights, fp32 compute", "onnx"),
])
def test_execution_in_words(precision, backend, form, words, executor) -> None:
    assert execution.describe(precision, backend, form) == words
    assert execution.executor_name(precision, backend, form) == executor
    assert execution.integer_kernel(words) == ("integer kernel (" in words)


def test_kernel_form_is_checked_by_the_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kernel_form.*unknown kernel form"):
        tiny_config(tmp_path / "r", kernel_form="s4s4")
    with pytest.raises(ConfigError, match="kernel_form applies to the onnx backends"):
        tiny_config(tmp_path / "r", kernel_form="u8s8", backend="jax")


def _run(logdir: Path) -> dict:
    config = tiny_config(logdir, num_actors=1, max_actor_steps=400, eval_every=200, eval_episodes=2,
                         overrides={**TINY_DQN, "min_replay_size": 64}, kernel_form="fp32")
    return run_experiment(config, progress=False)


def test_a_pinned_executor_is_recorded_and_the_same_seed_gives_the_same_run(tmp_path: Path) -> None:
    """--backend onnx --kernel-form fp32 pins the dequantized graph: the summary says so in words, and two runs
    of one seed on one machine (one CPU class) give the same returns, evaluation by evaluation."""
    first, second = _run(tmp_path / "a"), _run(tmp_path / "b")
    for s in (first, second):
        assert s["executed"] == "int8 weights, fp32 compute (dequantized)"
        assert s["executor"] == "onnx-dequantized" and s["kernel_form"] == ["fp32"]
        assert s["cpu_class"] and s["cpu_class"] == s["actors"][0]["kernel"]["cpu_class"]
        assert s["experiment"]["kernel_form"] == "fp32" and s["experiment"]["backend"] == "onnx"
    on_disk = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert on_disk["executed"] == first["executed"] and on_disk["executor"] == "onnx-dequantized"
    a, b = (pd.read_csv(tmp_path / d / "evaluator.csv") for d in ("a", "b"))
    assert len(a) >= 2 and a["return"].tolist() == b["return"].tolist()
    assert a["actor_steps"].tolist() == b["actor_steps"].tolist()
