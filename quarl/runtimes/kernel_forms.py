"""Integer kernel forms for the ONNX runtime: how one int Linear layer is written as ONNX ops, which CPUs
prefer it. `quarl.runtimes.kernel_check` confirms a form is exact on *this* CPU before it is used.

Why forms: ORT's MLAS picks its int8 GEMM by CPUID. With VNNI/AMX its u8 x s8 kernel is exact and fastest;
on AVX2 without VNNI the same graph runs `pmaddubsw`, whose int16 sums of two adjacent u8 x s8 products
saturate once |codes| > 63 (0.05 relative error on a 2048-wide int8 layer). Storing the codes + 128 as uint8
with zero point 128 (u8 x u8) is exact there. Which form is exact is a property of the CPU *and* the ORT
build, so it is measured, not assumed: `kernel_check.select_form` tries the preferred forms in order and keeps the first
whose outputs match an exact NumPy emulation of the same quantized graph.

A form is registered once (`register_form`); the `onnx` backend emits whatever the selected form emits.
Registered here: `u8s8` (codes as int8), `u8u8` (codes + 128 as uint8, zero point 128) and `fp32` (the
dequantized weights through a float MatMul: exact, slow, the last resort).
"""
from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Callable

import numpy as np
import numpy.typing as npt

from quarl.runtimes.base import DenseWeights
from quarl.runtimes.cpu import VNNI_FLAGS, CPUInfo, cpu_info

if TYPE_CHECKING:  # onnx is imported where a graph is built (a runtime that never builds one never loads it)
    from onnx import NodeProto, OperatorSetIdProto

FALLBACK_FORM = "fp32"


class Graph:
    """The small ONNX graph-building surface a form's `emit` sees: `op` adds a node, `const` an initializer."""

    def __init__(self) -> None:
        self.nodes: list[NodeProto] = []
        self.inits: dict[str, np.ndarray] = {}
        # [in, out] of each int layer by name, set before its `emit`: forms whose ops take the sizes as
        # attributes (MatMulNBits' K and N) read them here.
        self.shapes: dict[str, tuple[int, int]] = {}
        # False: the graph only ever sees one row (the executor's batch-1 session), so forms may quantize
        # activations per tensor (one fused DynamicQuantizeLinear, the same result as per row for one row).
        self.per_row = True
        # Known lower bounds of int layers' inputs by layer name, set before `emit` (per-row graphs, forms with
        # `lifted_inputs` only): the tensor the layer receives is u = x - floor >= 0, the true input plus
        # -floor (0 after ReLU; -1 after ELU or tanh, whose ops emit x + 1), and the layer's bias is
        # `lifted_bias_name(name, floor)`, which carries floor x the weights' column sums.
        self.floors: dict[str, float] = {}
        self._n = 0

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs: object) -> list[str]:
        from onnx import helper

        outs = []
        for _ in range(n_out):
            outs.append(f"t{self._n}")
            self._n += 1
        self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
        return outs

    def const(self, name: str, values: npt.ArrayLike) -> str:
        self.inits[name] = np.ascontiguousarray(values)
        return name


def opset_imports(nodes: list[NodeProto], opset: int) -> list[OperatorSetIdProto]:
    """The default-domain opset plus version 1 of every other domain the nodes use (com.microsoft ops)."""
    from onnx import helper

    domains = sorted({n.domain for n in nodes if n.domain not in ("", "ai.onnx")})
    return [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]


@dataclasses.dataclass(frozen=True)
class KernelForm:
    """One way to run `x[B, in] float32 @ (codes[in, out] * scale[out])` in ONNX.

    `initializers(name, dense)` returns the weight-derived arrays (rewritten on every update), named
    `f"{name}.<something>"`; `emit(graph, x, name)` adds the ops and returns the float32 output tensor's name
    (bias not included). `rank(cpu, bits)` orders the forms on a CPU (lower first; None: never chosen
    automatically there). `reference(x, dense)` is the exact float64 result the form must reproduce.
    """

    name: str
    doc: str
    max_bits: int
    initializers: Callable[[str, DenseWeights], dict[str, np.ndarray]]
    emit: Callable[[Graph, str, str], str]
    rank: Callable[[CPUInfo, int], float | None]
    reference: Callable[[np.ndarray, DenseWeights], np.ndarray]
    integer: bool = True  # False: runs in float (the executor reports itself as simulated)
    # True: `emit` honours `Graph.floors` (a layer whose input is known to be >= floor gets it lifted to
    # u = x - floor >= 0 and quantizes it with zero point 0), and `initializers` provides the lifted bias.
    lifted_inputs: bool = False


# Activations whose output an int layer right after them can take lifted (u = x - floor >= 0), by their floor
# (ELU's and tanh's outputs are > -1), and the floors a per-row int graph may therefore lift by (`Graph.floors`).
ACTIVATION_FLOORS = {"relu": 0.0, "elu": -1.0, "tanh": -1.0}
LIFT_FLOORS = tuple(sorted(set(ACTIVATION_FLOORS.values()), reverse=True))


def lifted_bias_name(name: str, floor: float) -> str:
    """The bias initializer an int layer with input floor `floor` adds: its own bias at floor 0, else the bias
    plus floor x the dequantized weights' column sums (`{name}.b_lift`, floor -1)."""
    if floor not in LIFT_FLOORS:
        raise ValueError(f"input floor {floor} is not one of {LIFT_FLOORS}")
    return f"{name}.b" if floor == 0.0 else f"{name}.b_lift"


def dynamic_quantize(x: np.ndarray) -> tuple[np.ndarray, np.float32, np.uint8]:
    """ONNX DynamicQuantizeLinear in NumPy: uint8 codes, per-tensor scale and zero point. The forms no longer
    emit it (one scale per batch couples the rows); kept as the per-tensor baseline for tests and benchmarks."""
    x = np.asarray(x, np.float32)
    lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
    scale = np.float32((np.float32(hi) - np.float32(lo)) / np.float32(255))
    if scale == 0:
        return np.zeros(x.shape, np.uint8), scale, np.uint8(0)
    zp = np.uint8(np.clip(np.rint(np.float32(0) - np.float32(lo) / scale), 0, 255))
    q = np.clip(np.rint(x / scale) + np.float64(zp), 0, 255).astype(np.uint8)
    return q, scale, zp


# Floor of a row's activation scale: an all-zero row divides by this instead of 0 (its codes stay 0).
_MIN_ROW_SCALE = np.float32(np.finfo(np.float32).tiny)


def rowwise_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What `emit_row_quantize` computes, bit for bit: DynamicQuantizeLinear's formula applied to each row of
    x [B, K] on its own. Returns uint8 codes [B, K], float32 scales [B, 1] and zero points [B, 1] (as float32
    integers in [0, 255])."""
    x = np.asarray(x, np.float32)
    zero, levels = np.float32(0), np.float32(255)
    lo = np.minimum(x.min(axis=1, keepdims=True), zero)
    hi = np.maximum(x.max(axis=1, keepdims=True), zero)
    scale = np.maximum((hi - lo) / levels, _MIN_ROW_SCALE).astype(np.float32)
    # -lo / scale lies in [0, 255] (lo <= 0, scale >= -lo / 255), and rint is odd: no Neg or Clip needed.
    zp = -np.rint(lo / scale).astype(np.float32)
    q = np.clip(np.rint(x / scale) + zp, zero, levels).astype(np.uint8)
    return q, scale, zp


def exact_int_reference(x: np.ndarray, dense: DenseWeights) -> np.ndarray:
    """Per-row activation quantization (`rowwise_quantize`) -> exact integer GEMM with the codes -> row scale
    x weight scale (float64). Row i depends on row i of x only."""
    q, xs, zp = rowwise_quantize(x)
    acc = (q.astype(np.int64) - zp.astype(np.int64)) @ dense.w.astype(np.int64)
    return acc.astype(np.float64) * (xs.astype(np.float64) * dense.scale.astype(np.float64))


def lifted_row_quantize(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What `emit_lifted_row_quantize` computes, bit for bit: a non-negative x [B, K] (a lifted input) to
    uint8 with zero point 0, each row scaled to its own max. Returns codes [B, K] and scales [B, 1]."""
    u = np.asarray(u, np.float32)
    hi = np.maximum(u.max(axis=1, keepdims=True), np.float32(0))
    scale = np.maximum(hi / np.float32(255), _MIN_ROW_SCALE).astype(np.float32)
    return np.clip(np.rint(u / scale), 0, 255).astype(np.uint8), scale


def lifted_int_reference(u: np.ndarray, dense: DenseWeights, floor: float) -> np.ndarray:
    """The exact float64 result of an int layer on a lifted input u = x - floor (`lifted_row_quantize`, exact
    integer GEMM, row x weight scale) plus floor x the dequantized column sums: an estimate of x @ W."""
    q, us = lifted_row_quantize(u)
    acc = q.astype(np.int64) @ dense.w.astype(np.int64)
    scale = dense.scale.astype(np.float64)
    return acc.astype(np.float64) * (us.astype(np.float64) * scale) + floor * column_sums(dense.w) * scale


def _dequantized(dense: DenseWeights) -> np.ndarray:
    return dense.w.astype(np.float32) * dense.scale.astype(np.float32)


def emit_row_quantize(graph: Graph, x: str, name: str) -> tuple[str, str, str]:
    """Quantize x [B, K] to uint8 with one scale and zero point per row (ONNX ops; `rowwise_quantize` is the
    NumPy twin, bit for bit). Why not DynamicQuantizeLinear: its single scale for the whole batch makes one
    environment's action depend on what the other environments of a vectorized actor observe.
    The row statistics are a few ops on [B]; the codes come from one QuantizeLinear with per-axis (per-row)
    scale and zero point, a single vectorized pass over x (five elementwise passes before: Div, Round, Sub,
    Clip, Cast). Returns (codes uint8 [B, K], scale [B, 1] float, the *negated* zero point [B, 1] float)."""
    from onnx import TensorProto

    zero = graph.const(f"{name}.rq_zero", np.float32(0))
    levels = graph.const(f"{name}.rq_levels", np.float32(255))
    floor = graph.const(f"{name}.rq_floor", _MIN_ROW_SCALE)
    (mn,) = graph.op("ReduceMin", [x], axes=[1], keepdims=0)
    (mx,) = graph.op("ReduceMax", [x], axes=[1], keepdims=0)
    (lo,) = graph.op("Min", [mn, zero])
    (hi,) = graph.op("Max", [mx, zero])
    (span,) = graph.op("Sub", [hi, lo])
    (scale,) = graph.op("Div", [span, levels])
    (scale,) = graph.op("Max", [scale, floor])
    (zr,) = graph.op("Round", [graph.op("Div", [lo, scale])[0]])  # -zero point (see rowwise_quantize)
    (zp,) = graph.op("Cast", [graph.op("Neg", [zr])[0]], to=TensorProto.UINT8)
    (q,) = graph.op("QuantizeLinear", [x, scale, zp], axis=0)
    axis = graph.const(f"{name}.rq_axis", np.array([1], np.int64))
    return q, graph.op("Unsqueeze", [scale, axis])[0], graph.op("Unsqueeze", [zr, axis])[0]


def emit_lifted_row_quantize(graph: Graph, u: str, name: str) -> tuple[str, str]:
    """Quantize a non-negative u [B, K] to uint8, zero point 0, one scale per row (`lifted_row_quantize` is the
    NumPy twin, bit for bit). Against `emit_row_quantize`: no ReduceMin and no zero point, so the GEMM needs no
    per-row correction afterwards. Returns (codes uint8 [B, K], scale [B, 1] float)."""
    levels = graph.const(f"{name}.rq_levels", np.float32(255))
    floor = graph.const(f"{name}.rq_floor", _MIN_ROW_SCALE)
    (mx,) = graph.op("ReduceMax", [u], axes=[1], keepdims=0)
    # Max with the scale floor also maps a (never expected) negative max to the floor, as the twin does.
    (scale,) = graph.op("Max", [graph.op("Div", [mx, levels])[0], floor])
    (q,) = graph.op("QuantizeLinear", [u, scale], axis=0)  # no zero point: uint8, zero point 0
    axis = graph.const(f"{name}.rq_axis", np.array([1], np.int64))
    return q, graph.op("Unsqueeze", [scale, axis])[0]


def column_sums(codes: np.ndarray) -> np.ndarray:
    """Sum of each column's signed weight codes (int32 [N]): the zero-point correction's factor."""
    return np.asarray(codes, np.int64).sum(axis=0).astype(np.int32)


def _emit_integer(graph: Graph, x: str, codes: str, w_zero_point: str | None, name: str) -> str:
    from onnx import TensorProto

    if not graph.per_row:  # one row: DynamicQuantizeLinear is that row's quantizer, in one fused op
        xq, xs, xz = graph.op("DynamicQuantizeLinear", [x], 3)
        (acc,) = graph.op("MatMulInteger", [xq, codes, xz] + ([w_zero_point] if w_zero_point else []))
        (accf,) = graph.op("Cast", [acc], to=TensorProto.FLOAT)
        (step,) = graph.op("Mul", [xs, f"{name}.scale"])
        return graph.op("Mul", [accf, step])[0]
    # Per row: ORT's integer GEMMs take only a scalar activation zero point, so the codes go in with zero point
    # 0 and zp[B, 1] x colsum[N] is taken off afterwards. MatMulIntegerToFloat applies the weight scale inside
    # the GEMM's output stage, so the correction is done on scaled sums, with colsum x scale precomputed:
    # y = (acc * scale - zp x (colsum * scale)) * row_scale, three passes over [B, N] where the int32 route
    # took five (float rounding only, ~1e-7 relative to an exact int32 correction).
    one = graph.const(f"{name}.one", np.float32(1))
    lifted = name in graph.floors  # input >= 0: zero point 0, nothing to correct; floor x colsum is in the bias
    if lifted:
        xq, xs = emit_lifted_row_quantize(graph, x, name)
    else:
        xq, xs, xz = emit_row_quantize(graph, x, name)
    (acc,) = graph.op("MatMulIntegerToFloat", [xq, codes, one, f"{name}.scale"]
                      + (["", w_zero_point] if w_zero_point else []), domain="com.microsoft")
    if not lifted:
        (acc,) = graph.op("Add", [acc, graph.op("Mul", [xz, f"{name}.colsum_scaled"])[0]])
    return graph.op("Mul", [acc, xs])[0]


def _int_initializers(name: str, dense: DenseWeights, codes: np.ndarray) -> dict[str, np.ndarray]:
    scale = np.ascontiguousarray(dense.scale, np.float32)
    colsum_scaled = column_sums(dense.w) * scale.astype(np.float64)
    return {f"{name}.codes": np.ascontiguousarray(codes), f"{name}.scale": scale,
            f"{name}.colsum_scaled": colsum_scaled.astype(np.float32),
            lifted_bias_name(name, -1.0): (dense.b.astype(np.float64) - colsum_scaled).astype(np.float32)}


def _vnni(cpu: CPUInfo) -> bool:
    return bool(set(cpu["flags"]) & set(VNNI_FLAGS))


U8S8 = KernelForm(
    name="u8s8",
    doc="uint8 activations x int8 codes (zero point 0); exact with VNNI/AMX, saturates on AVX2 for int8",
    max_bits=8,
    initializers=lambda n, d: _int_initializers(n, d, d.w.astype(np.int8)),
    emit=lambda g, x, n: _emit_integer(g, x, f"{n}.codes", None, n),
    rank=lambda cpu, bits: 0 if _vnni(cpu) else 1,
    reference=exact_int_reference,
    lifted_inputs=True,
)

U8U8 = KernelForm(
    name="u8u8",
    doc="uint8 activations x (codes + 128) as uint8 with zero point 128; exact without VNNI (AVX2, Arm)",
    max_bits=8,
    initializers=lambda n, d: _int_initializers(n, d, (d.w.astype(np.int16) + 128).astype(np.uint8)),
    emit=lambda g, x, n: _emit_integer(g, x, f"{n}.codes", g.const(f"{n}.codes_zp", np.uint8(128)), n),
    rank=lambda cpu, bits: 1 if _vnni(cpu) else 0,
    reference=exact_int_reference,
    lifted_inputs=True,
)

FP32 = KernelForm(
    name=FALLBACK_FORM,
    doc="the dequantized weights through a float32 MatMul (no integer kernel): the last resort",
    max_bits=16,
    initializers=lambda n, d: {f"{n}.w": _dequantized(d)},
    emit=lambda g, x, n: g.op("MatMul", [x, f"{n}.w"])[0],
    rank=lambda cpu, bits: None,
    reference=lambda x, d: np.asarray(x, np.float64) @ _dequantized(d).astype(np.float64),
    integer=False,
)

_forms: dict[str, KernelForm] = {}
_lock = threading.Lock()


def register_form(form: KernelForm, *, replace: bool = False) -> None:
    """Make `form` selectable by name (and automatically, where its `rank` says so)."""
    with _lock:
        if form.name in _forms and not replace:
            raise ValueError(f"kernel form {form.name!r} is already registered")
        _forms[form.name] = form


def unregister_form(name: str) -> None:
    if name == FALLBACK_FORM:
        raise ValueError(f"the fallback form {FALLBACK_FORM!r} cannot be unregistered")
    with _lock:
        _forms.pop(name, None)


def forms() -> dict[str, KernelForm]:
    with _lock:
        return dict(_forms)


def get_form(name: str) -> KernelForm:
    with _lock:
        form = _forms.get(name)
    if form is None:
        raise ValueError(f"unknown kernel form {name!r}: valid are {', '.join(sorted(forms()))}")
    return form


def candidates(bits: int, cpu: CPUInfo | None = None) -> list[str]:
    """Forms to try for int`bits` weights on `cpu`, best first; always ends with the fp32 fallback."""
    cpu = cpu_info() if cpu is None else cpu
    ranked = []
    for form in forms().values():
        r = form.rank(cpu, bits) if form.max_bits >= bits else None
        if r is not None:
            ranked.append((r, form.name))
    return [name for _, name in sorted(ranked)] + [FALLBACK_FORM]


for _form in (U8S8, U8U8, FP32):
    register_form(_form)
