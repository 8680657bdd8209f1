"""The integer-kernel check the int-precision learning tests share (tests/agents/executed.py) fails on a fallback."""
from __future__ import annotations

import pytest

from analysis.execution import run_execution
from tests.agents.executed import assert_integer_kernel_ran


def _summary(precision: str, *actors: tuple[str, str | None]) -> dict:
    """summary.json's execution fields as the runners derive them, for actors given as (backend, kernel form)."""
    records = [{"actor_id": i, "backend": backend,
                "kernel": None if form is None else {"form": form, "checks": [{"form": form, "ok": True}]}}
               for i, (backend, form) in enumerate(actors)]
    return {"precision": precision, "actors": records, **run_execution({"precision": precision, "actors": records})}


@pytest.mark.parametrize("actors", [(("onnx", "u8u8"),), (("onnx", "u8s8"), ("onnx", "u8u8")), (("jax", "aqt_s8s8"),)])
def test_passes_whatever_integer_form_each_cpu_class_takes(actors):
    assert_integer_kernel_ran(_summary("int8", *actors))


@pytest.mark.parametrize("precision,actors", [
    ("int8", (("onnx", "fp32"),)),  # the dequantized graph: int8 weights, fp32 compute
    ("int8", (("onnx", "u8u8"), ("onnx", "fp32"))),  # one actor fell back
    ("int8", (("onnx", None),)),  # kernel not recorded
    ("fp32", (("onnx", None),)),
])
def test_fails_on_fp32_compute_or_an_unrecorded_kernel(precision, actors):
    with pytest.raises(AssertionError):
        assert_integer_kernel_ran(_summary(precision, *actors))


def test_fails_when_the_self_check_refused_the_form_in_use():
    summary = _summary("int8", ("onnx", "u8s8"))
    summary["actors"][0]["kernel"]["checks"] = [{"form": "u8s8", "ok": False}]
    with pytest.raises(AssertionError):
        assert_integer_kernel_ran(summary)
