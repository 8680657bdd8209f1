"""What a run's actors executed, in words every table uses: "int8 weights, integer kernel (u8s8)", "int8 weights,
fp32 compute (dequantized)" ... An "int8" run whose actors ran the dequantized fp32 graph (what `auto` picks where
no integer kernel beats fp32) must never read as an int8-kernel run: its speed is not an integer kernel's.

Derived from what summary.json records per actor (precision, backend, kernel form), so it also reads runs made
before summaries carried the words. Pure functions: launch.experiments.summary writes them, analysis tables read them.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from quarl.quant.precision import find_precision, is_int_name

DEQUANTIZED = "dequantized"  # int weights expanded to fp32 in the graph, fp32 matmuls
UNKNOWN = "unknown"
_NATIVE_FLOATS = {"jax": ("fp16", "bf16")}  # backends that compute fp16/bf16 natively; others simulate in fp32


def executor_name(precision: str, backend: str | None, form: str | None) -> str:
    """The executor that ran, as `auto` names its candidates: jax, onnx, onnx-nbits or onnx-dequantized."""
    if backend is None:
        return UNKNOWN
    if backend == "onnx" and form == "fp32" and is_int_name(precision):
        return "onnx-dequantized"
    return str(backend)


def describe(precision: str, backend: str | None, form: str | None) -> str:
    """One actor's execution in words (`form` is the integer kernel form summary.json records; None on floats,
    or when the run did not record it)."""
    prec = find_precision(precision)
    if prec is not None and prec.is_int:
        if prec.simulated:
            return f"{precision} weights, fp32 compute (simulated)"
        if form in (None, UNKNOWN) or backend is None:
            return f"{precision} weights, kernel {UNKNOWN}"
        if form == "fp32":
            return f"{precision} weights, fp32 compute ({DEQUANTIZED})"
        return f"{precision} weights, integer kernel ({form})"
    if precision == "fp32":
        return "fp32 weights, fp32 compute"
    if backend is None:
        return f"{precision} weights, compute {UNKNOWN}"
    if precision in _NATIVE_FLOATS.get(backend, ()):
        return f"{precision} weights, {precision} compute"
    return f"{precision} weights, fp32 compute (simulated)"


def integer_kernel(executed: str | None) -> bool:
    """Whether an execution description says an integer kernel ran (the only case an int speedup is int's)."""
    return "integer kernel (" in str(executed or "")


def run_execution(summary: Mapping[str, Any]) -> dict[str, Any]:
    """{"executed", "executor", "cpu_class"} of a summary, from its actors (several actors that ran differently
    are joined with ' / '). Kernel form not recorded (`kernel_form` None, no actor kernel): 'unknown'."""
    precision = str(summary.get("precision"))
    actors = [a for a in summary.get("actors") or [] if isinstance(a, Mapping)]
    forms_top = summary.get("kernel_form")
    rows = []
    for a in actors:
        kernel = a.get("kernel") if isinstance(a.get("kernel"), Mapping) else None
        form = kernel.get("form") if kernel else None
        if kernel is None and isinstance(forms_top, list) and len(forms_top) == 1:
            form = forms_top[0]
        rows.append((a.get("backend"), form, (kernel or {}).get("cpu_class")))
    if not rows:
        backends = summary.get("backend")
        backend = backends[0] if isinstance(backends, list) and len(backends) == 1 else None
        form = forms_top[0] if isinstance(forms_top, list) and len(forms_top) == 1 else None
        rows = [(backend, form, None)]
    if not is_int_name(precision):  # floats: no kernel form; the backend alone tells
        rows = [(b, None, c) for b, _, c in rows]
    return {"executed": _join(describe(precision, b, f) for b, f, _ in rows),
            "executor": _join(executor_name(precision, b, f) for b, f, _ in rows),
            "cpu_class": _join(c for _, _, c in rows if c) or None}


def _join(values: Iterable[str]) -> str:
    return " / ".join(dict.fromkeys(values))
