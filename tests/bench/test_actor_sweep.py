"""bench.system.actor_sweep: the ratio arithmetic on hand-made rounds, and its CLI guards (no timing is asserted)."""
from __future__ import annotations

import os

import pytest

from bench.system import actor_sweep


def _round(fp32_policy_s: float, int8_policy_s: float, env_s: float, steps: int = 100) -> dict:
    row = lambda policy_s: {"policy_s": policy_s, "env_s": env_s, "cpu_s": policy_s + env_s,  # noqa: E731
                            "wall_s": policy_s + env_s, "steps": steps}
    return {"fp32": row(fp32_policy_s), "int8": row(int8_policy_s)}


def test_summary_ratios_follow_the_definitions():
    # 100 env steps: fp32 policy 0.3 s, int8 0.1 s, env 0.1 s for both (same state sequence).
    cell = actor_sweep.summarize({"hidden": 2048, "envs": 4, "backends": {"fp32": "onnx", "int8": "onnx"},
                                  "rounds": [_round(0.3, 0.1, 0.1)] * 3})
    assert cell["fp32"]["steps_per_core_s"] == pytest.approx(100 / 0.4)
    assert cell["int8"]["steps_per_core_s"] == pytest.approx(100 / 0.2)
    assert cell["ratio_core_s"] == pytest.approx(2.0)
    assert cell["ratio_policy_only"] == pytest.approx(3.0)
    assert cell["ratio_env_matched"] == pytest.approx(2.0)
    assert cell["int8"]["policy_us"] == pytest.approx(1000.0) and cell["fp32"]["env_us"] == pytest.approx(1000.0)
    assert cell["int8"]["steps_per_core_s_spread"] == 0.0  # identical rounds: no noise


def test_spread_is_half_the_rounds_range_over_their_median():
    rounds = [_round(0.3, 0.1, 0.1), _round(0.3, 0.1, 0.1), _round(0.3, 0.15, 0.1)]  # int8: 500, 500, 400
    cell = actor_sweep.summarize({"hidden": 256, "envs": 16, "backends": {}, "rounds": rounds})
    assert cell["int8"]["steps_per_core_s_spread"] == pytest.approx(0.5 * (500 - 400) / 500)
    best = actor_sweep.best_k([cell])
    assert best["256"]["int8"]["spread"] == pytest.approx(0.1)
    text = "\n".join(actor_sweep.markdown({"task": "cartpole:balance", "env_implementation": "envpool",
                                            "cpu_flags": ["avx2"], "cells": [], "best_k": best}))
    assert "±0.0%; ±10.0%" in text


@pytest.mark.parametrize("backend, form, label", [("onnx", None, "onnx"), ("onnx", "u8s8", "onnx u8s8"),
                                                  ("onnx", "fp32", "onnx (dequantized)"), ("jax", None, "jax")])
def test_backend_label_tells_the_int_graph_from_the_dequantized_one(backend, form, label):
    assert actor_sweep.backend_label(backend, form) == label


def test_env_matched_ratio_charges_both_the_mean_env_time():
    r = _round(0.3, 0.1, 0.1)
    r["int8"]["env_s"] = 0.3  # a load burst during int8's env steps only
    cell = actor_sweep.summarize({"hidden": 256, "envs": 1, "backends": {}, "rounds": [r]})
    assert cell["ratio_env_matched"] == pytest.approx((0.2 + 0.3) / (0.2 + 0.1))  # the burst does not count


def test_best_k_picks_each_precisions_own_best():
    def cell(hidden, k, fp32, int8):
        return {"hidden": hidden, "envs": k, "fp32": {"steps_per_core_s": fp32}, "int8": {"steps_per_core_s": int8}}

    best = actor_sweep.best_k([cell(2048, 1, 500, 2000), cell(2048, 16, 1500, 1800), cell(256, 4, 900, 1000)])
    assert best["2048"]["fp32"] == {"envs": 16, "steps_per_core_s": 1500, "spread": None}
    assert best["2048"]["int8"] == {"envs": 1, "steps_per_core_s": 2000, "spread": None}
    assert best["2048"]["ratio_core_s"] == pytest.approx(2000 / 1500)
    assert "| 2048x3 |" in "\n".join(actor_sweep.markdown({
        "task": "cartpole:balance", "env_implementation": "envpool", "cpu_flags": ["avx2"], "cells": [],
        "best_k": best}))


@pytest.mark.parametrize("flags, needle", [(["--envs", "0"], "--envs"), (["--sizes", "a"], "--sizes")])
def test_bad_flags_exit_2(flags, needle, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        actor_sweep.main(["--quick", "--out", str(tmp_path / "out"), *flags])
    assert info.value.code == 2 and needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_refuses_a_busy_machine_before_it_starts(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(os, "getloadavg", lambda: (1000.0, 1000.0, 1000.0))
    with pytest.raises(SystemExit) as info:
        actor_sweep.main(["--quick", "--out", str(tmp_path / "out")])
    assert info.value.code == 2 and "--allow-busy" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
