"""The check every int-precision learning test makes on its summary.json: the actors ran an integer kernel.

Precision and backend alone would pass a run whose actors silently fell back to fp32 compute (the dequantized
ONNX graph, or a simulated precision): its returns say nothing about int8 arithmetic. Which integer form runs is
the CPU's (u8u8 on AVX2, u8s8 with VNNI, whatever passes the self-check on Arm), so only "an integer kernel ran"
is asserted, never a form.
"""
from __future__ import annotations

from typing import Any, Mapping

from analysis.execution import describe, integer_kernel


def assert_integer_kernel_ran(summary: Mapping[str, Any]) -> None:
    """Every actor of the run executed an integer kernel, as summary.json records it (per actor and overall)."""
    precision = summary["precision"]
    actors = summary["actors"]
    assert actors, "summary.json records no actor"
    for actor in actors:
        kernel = actor.get("kernel") or {}
        executed = describe(precision, actor.get("backend"), kernel.get("form"))
        assert integer_kernel(executed), (actor.get("actor_id"), executed, kernel)
        checks = kernel.get("checks")
        if checks is not None:  # ONNX: the form in use is the one the CPU's self-check confirmed exact
            assert checks[-1]["ok"] and checks[-1]["form"] == kernel["form"], checks
    assert integer_kernel(summary["executed"]) and "fp32 compute" not in summary["executed"], summary["executed"]
    assert "dequantized" not in summary["executor"], summary["executor"]
