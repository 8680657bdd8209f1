"""Policy runtimes: how an actor executes a (quantized) policy.

    ex = make_executor(spec, quantize_params(params, "int8"), backend="auto")
    actions = ex(obs)            # obs float32 [B, spec.input_dim] -> float32 [B, spec.output_dim]
    ex.update(new_qparams)       # the actor's load step: same spec and precision, new weights
    ex.backend, ex.precision     # concrete backend ("jax" | "onnx" | "onnx-nbits") and precision name

Backends: `jax` (XLA; fp32/fp16/bf16 native, int2..int8 via AQT v2 with an s8 x s8 dot), `onnx` (ONNX
Runtime; fp32 native, int2..int8 via MatMulInteger), `onnx-nbits` (as `onnx`, but int2..int4 via
MatMulNBits on 4-bit packed weights) and `auto` (the one measured fastest here, see `quarl.runtimes.auto`;
`onnx-nbits` is a candidate only for int2..int4, where it differs from `onnx`; for int2..int8 the int
weights dequantized in fp32 on ONNX are one too, so auto never picks an int kernel slower than fp32).
Precisions without a native kernel on a backend run simulated in fp32 with the precision's rounded weights
(`ex.simulated`); see each backend module for which.
"""
from __future__ import annotations

import functools
from typing import Callable

from quarl.policy.spec import ParamTree, PolicySpec
from quarl.quant.precision import Precision, parse_precision
from quarl.quant.quantization import QuantizedParams, quantize_params
from quarl.runtimes.auto import auto_decisions, cache_path, clear_auto_decisions, make_auto_executor
from quarl.runtimes.base import PolicyExecutor, check_sizes, layer_widths
from quarl.runtimes.jax_backend import JaxExecutor
from quarl.runtimes.kernel_check import kernel_summary, select_form
from quarl.runtimes.kernel_forms import FALLBACK_FORM, KernelForm, candidates, forms, register_form
from quarl.runtimes.onnx_backend import OnnxExecutor, OnnxNBitsExecutor
from quarl.runtimes.onnx_nbits import MAX_NBITS_PRECISION

BACKENDS: dict[str, Callable[..., PolicyExecutor]] = {"jax": JaxExecutor, "onnx": OnnxExecutor,
                                                      "onnx-nbits": OnnxNBitsExecutor}
BACKEND_NAMES = (*BACKENDS, "auto")

__all__ = [
    "BACKENDS", "BACKEND_NAMES", "DEQUANTIZED_CANDIDATE", "PolicyExecutor", "JaxExecutor", "OnnxExecutor",
    "OnnxNBitsExecutor",
    "auto_candidates", "make_executor",
    "make_executor_from_params", "auto_decisions", "clear_auto_decisions", "cache_path", "KernelForm",
    "candidates", "forms", "kernel_summary", "register_form", "select_form",
]


# The `auto` candidate that runs int weights dequantized through fp32 MatMuls (ONNX's `fp32` kernel form).
DEQUANTIZED_CANDIDATE = "onnx-dequantized"


def auto_candidates(precision: str | Precision,
                    kernel_form: str | None = None) -> dict[str, Callable[..., PolicyExecutor]]:
    """The backends `auto` measures for `precision`: all of them, except `onnx-nbits` where it would build
    the very same graph as `onnx` (every precision but int2..int4); plus, for
    precisions with an integer kernel (int2..int8), the int weights dequantized in fp32 on ONNX
    (`DEQUANTIZED_CANDIDATE`, simulated): where no integer kernel beats fp32 here (small layers, no VNNI),
    auto then never makes a quantized actor slower than an fp32 one. The payload stays int; only the compute
    changes, and the executor reports itself as simulated. `kernel_form` is ONNX's forced form, if any."""
    prec = parse_precision(precision)
    nbits = prec.is_int and prec.bits <= MAX_NBITS_PRECISION
    out = {name: make for name, make in BACKENDS.items() if nbits or name != "onnx-nbits"}
    out["onnx"] = functools.partial(OnnxExecutor, kernel_form=kernel_form)
    if prec.has_int_kernel and kernel_form != FALLBACK_FORM:
        out[DEQUANTIZED_CANDIDATE] = functools.partial(OnnxExecutor, kernel_form=FALLBACK_FORM)
    return out


def make_executor(spec: PolicySpec, qparams: QuantizedParams, backend: str = "auto", *, batch_size: int = 1,
                  threads: int = 1, kernel_form: str | None = None) -> PolicyExecutor:
    """An executor of `spec` with `qparams` on `backend` ("jax", "onnx", "onnx-nbits" or "auto").

    `batch_size` is the batch the actor will call with (compiled/warmed at load; other batch sizes still
    work). `threads` is ONNX Runtime's intra-op thread count (XLA's pool is process-wide, see jax_backend).
    `kernel_form` forces the ONNX integer kernel form to try first (see `quarl.runtimes.kernel_forms`; still
    self-checked); None lets the CPU decide. The jax backend ignores it.
    Raises ValueError on an unknown backend, layer or precision, params that do not match the spec, or
    NaN/inf weights.
    """
    if not isinstance(spec, PolicySpec):
        raise ValueError(f"spec must be a quarl.policy.spec.PolicySpec, got {type(spec).__name__}")
    if not isinstance(qparams, QuantizedParams):
        raise ValueError(f"qparams must be quarl.quant.quantization.QuantizedParams, got {type(qparams).__name__}")
    check_sizes(batch_size, threads)
    layer_widths(spec)
    name = str(backend).lower()
    if name == "auto":
        factories = auto_candidates(qparams.precision, kernel_form)
        return make_auto_executor(spec, qparams, factories, batch_size=batch_size, threads=threads,
                                  kernel_form=kernel_form)
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: valid are {', '.join(BACKEND_NAMES)}")
    if name in ("onnx", "onnx-nbits"):
        return BACKENDS[name](spec, qparams, batch_size=batch_size, threads=threads, kernel_form=kernel_form)
    return BACKENDS[name](spec, qparams, batch_size=batch_size, threads=threads)


def make_executor_from_params(spec: PolicySpec, params: ParamTree, precision: str | Precision = "fp32",
                              backend: str = "auto", *, batch_size: int = 1, threads: int = 1,
                              per_channel: bool = True, kernel_form: str | None = None) -> PolicyExecutor:
    """Quantize a plain fp32 haiku tree to `precision` (per-channel by default), then `make_executor`."""
    return make_executor(spec, quantize_params(params, precision, per_channel=per_channel), backend,
                         batch_size=batch_size, threads=threads, kernel_form=kernel_form)
