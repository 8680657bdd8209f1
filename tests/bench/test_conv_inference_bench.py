"""bench.micro.conv_inference at its smallest: it runs, records the machine, and every variant is numerically sane."""
from __future__ import annotations

import json
import math

import pytest

from bench.micro import conv_inference


def test_quick_conv_bench_writes_results_with_the_machine(tmp_path, monkeypatch):
    monkeypatch.setitem(conv_inference.QUICK, "batches", (1,))
    assert conv_inference.main(["--quick", "--allow-busy", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "conv_inference.json").read_text())
    machine = result["machine"]
    assert machine["cpu_model"] and machine["load_start"] and machine["load_end"] and machine["allow_busy"]
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"onnx fp32", "onnx int8", "onnx int8 dequantized", "jax fp32", "jax int8", "auto int8",
                         "onnx int4", "onnx-nbits int4", "auto int4"}
    assert rows["onnx int8"]["kernel"] in ("u8s8", "u8u8", "fp32") and rows["onnx int8 dequantized"]["simulated"]
    assert all(r["median_us"] > 0 and r["calls"] > 0 for r in rows.values())
    assert rows["onnx fp32"]["max_rel_err"] < 1e-5 and rows["onnx int8"]["max_rel_err"] < 3e-2
    assert rows["onnx int4"]["max_rel_err"] < 3e-2 and rows["onnx-nbits int4"]["max_rel_err"] < 3e-2
    assert rows["onnx int4"]["kernel"] in ("u8s8", "u8u8", "fp32")  # int4 conv runs the static int8 kernels
    (speedup,) = result["speedups"]
    assert speedup["torso"] == "minatar"
    # Each speed-up is the fastest fp32 variant's median over that variant's, both as recorded in the rows.
    fp32 = min(rows["onnx fp32"]["median_us"], rows["jax fp32"]["median_us"])
    assert speedup["fp32_us"] == fp32 and rows[speedup["fp32_variant"]]["median_us"] == fp32
    for key, variant in (("int8_speedup", "onnx int8"), ("auto_speedup", "auto int8"), ("int4_speedup", "onnx int4"),
                         ("auto_int4_speedup", "auto int4")):
        assert math.isfinite(speedup[key]) and speedup[key] == pytest.approx(fp32 / rows[variant]["median_us"]), key


def test_a_busy_machine_is_refused(monkeypatch, capsys):
    import bench.harness.machine as machine

    monkeypatch.setattr(machine, "load_average", lambda: [99.0, 99.0, 99.0])
    with pytest.raises(SystemExit) as exit_info:
        conv_inference.main(["--quick"])
    assert exit_info.value.code == 2
    assert "load average" in capsys.readouterr().err
