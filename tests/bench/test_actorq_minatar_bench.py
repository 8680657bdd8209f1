"""bench.system.actorq_minatar at its smallest: fp32 and int8 actors side by side on MinAtar, the machine recorded."""
from __future__ import annotations

import json
import math

import pytest

from bench.system import actorq_minatar


def test_quick_run_measures_both_precisions_and_records_the_machine(tmp_path):
    """One round: the median of per-round speed-ups is that round's, so it must equal the rows' own ratio."""
    argv = ["--quick", "--allow-busy", "--rounds", "1", "--block", "5", "--out", str(tmp_path)]
    assert actorq_minatar.main(argv) == 0
    result = json.loads((tmp_path / "actorq_minatar.json").read_text())
    assert result["machine"]["cpu_model"] and result["machine"]["load_end"]
    rows = {r["precision"]: r for r in result["rows"]}
    assert set(rows) == {"fp32", "int8"}
    assert all(r["env_steps_per_s"] > 0 and r["policy_us"] > 0 and r["env_us"] > 0 for r in rows.values())
    assert rows["int8"]["kernel"] in ("u8s8", "u8u8", "fp32") or rows["int8"]["backend"] == "jax"
    # int8's speed-up over fp32: fp32's time per env step over int8's (policy + env), i.e. int8's steps/s over fp32's.
    speedup = result["speedup_vs_fp32"]["int8"]
    assert math.isfinite(speedup)
    assert speedup == pytest.approx(rows["int8"]["env_steps_per_s"] / rows["fp32"]["env_steps_per_s"])
    step_us = {p: r["policy_us"] + r["env_us"] for p, r in rows.items()}
    assert speedup == pytest.approx(step_us["fp32"] / step_us["int8"])
    assert "int8 vs fp32" in (tmp_path / "actorq_minatar.md").read_text()


def test_a_non_minatar_task_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        actorq_minatar.main(["--task", "CartPole-v1", "--allow-busy"])
    assert exit_info.value.code == 2
    assert "MinAtar" in capsys.readouterr().err
