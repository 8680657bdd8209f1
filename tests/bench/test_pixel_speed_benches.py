"""bench.micro.conv_update and bench.system.pixel_train: the variants build what they name (and leave the process
as it was), the tables say what the rows hold, and bad flags are one line. The timed runs themselves are slow."""
from __future__ import annotations

import json

import haiku as hk
import pytest

from agents.loops import loop_form
from bench.harness.learner_variants import variant
from bench.micro import conv_update
from bench.system import pixel_train
from quarl.nets import haiku as nets
from quarl.nets.conv import Conv2D


@pytest.mark.parametrize("name, form, layer", [("program", "scan", Conv2D), ("unrolled", "unroll", Conv2D),
                                               ("before", "scan", hk.Conv2D)])
def test_each_variant_builds_its_loop_form_and_conv_and_restores_the_process(name, form, layer):
    with variant(name):
        assert loop_form() == form and nets.FastConv2D is layer
    assert loop_form() == "scan" and nets.FastConv2D is Conv2D


def _variant_row(ms: float) -> dict:
    return {"ms_per_update": ms * 4, "ms_per_unit": ms, "spread_ms": [ms, ms], "first_call_s": 2.0,
            "units_per_update": 4}


def test_conv_update_table_gives_each_ratio():
    machine = {"cpu": "CPU", "cpu_flags": "avx2", "cores": 2, "load_start": [0.1], "load_end": [0.2]}
    row = {"learner": "DQN MinAtar torso, K=4", "unit": "SGD step",
           "variants": {"program": _variant_row(2.0), "unrolled": _variant_row(1.6), "before": _variant_row(6.0),
                        "alone": _variant_row(2.5)}}
    text = conv_update.markdown({"command": "python -m bench.micro.conv_update", "rows": [row], "machine": machine})
    assert "| DQN MinAtar torso, K=4 | 2.000 | 1.600 | 1.25x | 6.000 | 3.0x | 2.500 | 0.80x | 2.0 / 2.0 / 2.0 |" in text


@pytest.mark.parametrize("argv, needle", [(["--variants", "fast"], "--variants takes"), (["--steps", "0"], "--steps")])
def test_pixel_train_bad_flags_are_one_line_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as info:
        pixel_train.main([*argv, "--allow-busy"])
    assert info.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.slow  # trains 20k env steps of PPO on MinAtar
def test_pixel_train_quick_run_writes_the_speed_and_its_shares(tmp_path):
    assert pixel_train.main(["--quick", "--allow-busy", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "pixel_train.json").read_text())
    (row,) = result["rows"]
    assert row["variant"] == "program" and row["env_steps"] >= 20_000 and row["env_steps_per_s"] > 0
    assert 0 < row["learner_s"] < row["train_clock_s"] and row["loop_form"]["form"] == "scan"
    assert "Target: >= 8,000 env steps/s" in (tmp_path / "pixel_train.md").read_text()


@pytest.mark.slow  # compiles every variant of three learners
def test_conv_update_quick_run_times_every_variant(tmp_path):
    assert conv_update.main(["--quick", "--repeats", "1", "--rounds", "1", "--allow-busy", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "conv_update.json").read_text())
    assert [r["learner"] for r in result["rows"]] == ["PPO MinAtar Breakout", "A2C MinAtar Breakout",
                                                      "DQN MinAtar torso, K=4"]
    assert set(result["rows"][2]["variants"]) == {"program", "unrolled", "before", "alone"}
