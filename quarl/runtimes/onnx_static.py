"""Static int8 ONNX graphs for conv policies: calibrated activation scales, per-channel int8 weights.

Why static: an int8 conv only pays on CPU when the activations stay quantized from one layer to the next.
ORT's QLinearConv takes uint8 codes in and gives uint8 codes out (requantized to the next layer's scale);
quantizing each activation tensor per call instead (DynamicQuantizeLinear + ConvInteger) measured 2x *slower*
than fp32 on the Nature torso. The scales come from `quarl.quant.calibration` (the learner's replay observations),
in `LoweredParams.activation_ranges`.

The graph, for the DQN torsos (conv -> ReLU -> ... -> Flatten -> Linear -> ReLU -> Linear):
- obs [B, H*W*C] float -> NCHW -> QuantizeLinear with the first layer's static (scale, zero point) -> uint8;
- each int Conv2D followed by ReLU and then (through Flatten) by another int layer is one QLinearConv whose
  output is requantized to that layer's input scale. That input's calibrated range starts at 0 (a ReLU
  output), so its zero point is 0 and the uint8 saturation at code 0 *is* the ReLU: it is not emitted;
- Flatten moves uint8 codes (Transpose to NHWC, Reshape): haiku's [H, W, C] order for the Linear after it;
- each int Linear is MatMulIntegerToFloat (uint8 activations with their static scale and zero point, int8
  weight codes, per-column scales, fp32 bias) -> float; a following int layer quantizes again;
- an int Conv2D the pattern above does not cover runs its dequantized weights in a float Conv (simulated:
  exact against the dequantized reference, no int8 speed).
Rows never share a scale, so a vectorized actor's environments do not affect each other's actions.

Forms (as `kernel_forms` for the MLP path, same names): `u8s8` (int8 weight codes, zero point 0; exact and
fastest with VNNI/AMX), `u8u8` (codes + 128 as uint8, zero point 128; for AVX2 without VNNI, where MLAS's
u8 x s8 kernels saturate int16 pair sums) and `fp32` (the dequantized weights in a float graph: the last
resort). `select_static_form` self-checks the preferred one on this CPU against an exact NumPy emulation of
the same static graph (`static_reference`) before it is used, falling back in order, logged.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from typing import TYPE_CHECKING, Callable

import numpy as np

from quarl.policy.im2col import image_patches
from quarl.policy.spec import Activation, Conv2D, Flatten, Linear, PolicySpec
from quarl.runtimes.base import DenseWeights, FormCheck, FormChoice, LoweredParams
from quarl.runtimes.cpu import VNNI_FLAGS, CPUInfo, cpu_class, cpu_info
from quarl.runtimes.kernel_check import CHECK_TOLERANCE, relative_error, run_check
from quarl.runtimes.kernel_forms import FALLBACK_FORM, Graph

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

_MIN_SCALE = np.float32(1e-12)  # an all-zero calibrated range: codes stay 0 instead of dividing by 0


def policy_input(graph: Graph, x: str, spec: PolicySpec, codes: bool = False) -> str:
    """The observations as the first layer takes them: uint8 pixels cast to float, times `spec.input_scale` if
    any, `input_bounds` mapped onto [-1, 1] (before the first layer quantizes them), and for image policies flat
    [B, H*W*C] -> NCHW [B, C, H, W] (ONNX's Conv layout). `codes`: the uint8 pixels are the first layer's input
    codes as they are (`pixel_code_layer`): only the layout changes."""
    if spec.pixels and not codes:
        from onnx import TensorProto  # pylint: disable=import-outside-toplevel

        (x,) = graph.op("Cast", [x], to=TensorProto.FLOAT)
    if spec.input_scale is not None and not codes:
        (x,) = graph.op("Mul", [x, graph.const("input.scale", np.float32(spec.input_scale))])
    if spec.input_bounds is not None:
        offset, scale = spec.input_affine()
        (x,) = graph.op("Sub", [x, graph.const("input.offset", offset)])
        (x,) = graph.op("Mul", [x, graph.const("input.bounds_scale", scale)])
    if spec.input_shape is None:
        return x
    (x,) = graph.op("Reshape", [x, graph.const("input.shape", np.array([-1, *spec.input_shape], np.int64))])
    return graph.op("Transpose", [x], perm=[0, 3, 1, 2])[0]


def flatten_nchw(graph: Graph, x: str) -> str:
    """NCHW [B, C, H, W] -> [B, H*W*C] in haiku's NHWC order (so the Linear after it reads its weights as is)."""
    (x,) = graph.op("Transpose", [x], perm=[0, 2, 3, 1])
    return graph.op("Reshape", [x, graph.const("flatten.shape", np.array([0, -1], np.int64))])[0]


def activation_qparams(lo: float, hi: float) -> tuple[np.float32, np.uint8]:
    """uint8 (scale, zero point) of a calibrated range [lo, hi] (lo <= 0 <= hi): 255 steps over the range,
    zero exactly representable (ReLU outputs get zero point 0)."""
    scale = np.float32(max(np.float32((np.float32(hi) - np.float32(lo)) / np.float32(255)), _MIN_SCALE))
    zp = np.uint8(np.clip(np.rint(-np.float32(lo) / scale), 0, 255))
    return scale, zp


@dataclasses.dataclass(frozen=True)
class StaticForm:
    """How weight codes are stored for the integer ops: `codes(int8 codes)` and their zero point."""

    name: str
    doc: str
    weight_dtype: type[np.integer]  # np.int8 or np.uint8
    weight_zero_point: int
    rank: Callable[[CPUInfo], int | None]

    def codes(self, w: np.ndarray) -> np.ndarray:
        return (np.asarray(w, np.int16) + self.weight_zero_point).astype(self.weight_dtype)


def _vnni(cpu: CPUInfo) -> bool:
    return bool(set(cpu["flags"]) & set(VNNI_FLAGS))


STATIC_FORMS = {
    "u8s8": StaticForm("u8s8", "uint8 activations x int8 weight codes; exact with VNNI/AMX", np.int8, 0,
                       lambda cpu: 0 if _vnni(cpu) else 1),
    "u8u8": StaticForm("u8u8", "uint8 activations x (codes + 128) as uint8, zero point 128; exact on AVX2",
                       np.uint8, 128, lambda cpu: 1 if _vnni(cpu) else 0),
}


# ----------------------------------------------------------------------------------------------- the graph


def _next_int_layer(spec: PolicySpec, lowered: LoweredParams, i: int) -> str | None:
    """The int layer fed by layer i's output through exactly one ReLU and any Flattens, or None."""
    layers = spec.layers
    if i + 1 >= len(layers) or not (isinstance(layers[i + 1], Activation) and layers[i + 1].fn == "relu"):
        return None
    j = i + 2
    while j < len(layers) and isinstance(layers[j], Flatten):
        j += 1
    if j < len(layers) and isinstance(layers[j], (Conv2D, Linear)) and lowered.dense[layers[j].name].kind == "int":
        return layers[j].name
    return None


def fused_convs(spec: PolicySpec, lowered: LoweredParams) -> dict[str, str]:
    """int Conv2D name -> the int layer its QLinearConv requantizes to (ReLU folded); other int convs run float.
    A fused output needs zero point 0 (the ReLU), which a calibrated ReLU output range always gives."""
    out: dict[str, str] = {}
    ranges = lowered.activation_ranges or {}
    convs = {layer.name for layer in spec.layers if isinstance(layer, Conv2D)}
    # Last layer first: the layer a conv requantizes to must itself take uint8 codes (an int Linear, or a conv
    # fused in turn); an int conv that runs float (no ReLU after it) takes float input.
    for i in reversed(range(len(spec.layers))):
        layer = spec.layers[i]
        if isinstance(layer, Conv2D) and lowered.dense[layer.name].kind == "int":
            nxt = _next_int_layer(spec, lowered, i)
            if (nxt is not None and (nxt not in convs or nxt in out) and nxt in ranges
                    and activation_qparams(*ranges[nxt])[1] == 0):
                out[layer.name] = nxt
    return out


def pixel_code_layer(spec: PolicySpec, lowered: LoweredParams) -> str | None:
    """The first layer, when it is an int layer that takes uint8 codes (a fused conv or a Linear) of a `pixels`
    policy: its input (scale, zero point) is then (`input_scale` or 1, 0), so the pixels are its codes exactly,
    with no QuantizeLinear over the frame and no rounding (a calibrated scale could only round them)."""
    first = spec.layers[0] if spec.layers else None
    if not spec.pixels or not isinstance(first, (Conv2D, Linear)) or lowered.dense[first.name].kind != "int":
        return None
    if isinstance(first, Conv2D) and first.name not in fused_convs(spec, lowered):
        return None
    return first.name


def static_initializers(spec: PolicySpec, lowered: LoweredParams, form: StaticForm) -> dict[str, np.ndarray]:
    """Every weight- and range-derived constant of the static graph by name (what `update()` rewrites)."""
    fused = fused_convs(spec, lowered)
    pixel_layer = pixel_code_layer(spec, lowered)  # its codes are the pixels: scale `input_scale` (or 1), zp 0
    arrays: dict[str, np.ndarray] = {}
    for layer in spec.layers:
        if not isinstance(layer, (Conv2D, Linear)):
            continue
        n, d = layer.name, lowered.dense[layer.name]
        conv = isinstance(layer, Conv2D)
        if d.kind != "int" or (conv and n not in fused):  # float (or dequantized) weights
            w = d.w.astype(np.float32) * d.scale if d.kind == "int" else np.asarray(d.w, np.float32)
            arrays[f"{n}.w"] = np.ascontiguousarray(w.transpose(3, 2, 0, 1) if conv else w)
            arrays[f"{n}.b"] = np.ascontiguousarray(d.b, np.float32)
            continue
        if n == pixel_layer:
            scale, zp = np.float32(1.0 if spec.input_scale is None else spec.input_scale), np.uint8(0)
        else:
            scale, zp = activation_qparams(*(lowered.activation_ranges or {})[n])
        codes = form.codes(d.w)
        arrays[f"{n}.x_scale"] = np.asarray(scale, np.float32)
        arrays[f"{n}.x_zp"] = np.asarray(zp, np.uint8)
        arrays[f"{n}.w_scale"] = np.ascontiguousarray(d.scale, np.float32)
        arrays[f"{n}.w_zp"] = np.full(d.scale.shape, form.weight_zero_point, form.weight_dtype)
        if conv:
            arrays[f"{n}.wq"] = np.ascontiguousarray(codes.transpose(3, 2, 0, 1))
            bias = np.rint(d.b.astype(np.float64) / (np.float64(scale) * d.scale.astype(np.float64)))
            arrays[f"{n}.bq"] = np.clip(bias, -2**31, 2**31 - 1).astype(np.int32)
        else:
            arrays[f"{n}.wq"] = np.ascontiguousarray(codes)
            arrays[f"{n}.b"] = np.ascontiguousarray(d.b, np.float32)
    return arrays


def emit_static(graph: Graph, spec: PolicySpec, lowered: LoweredParams, x: str) -> str:
    """The static int8 graph of `spec` from input `x` (flat float [B, input_dim]); returns the float output.
    The initializers (`static_initializers`) must already be in `graph`."""
    fused = fused_convs(spec, lowered)
    # the int layer whose input scale x's uint8 codes are in (the first one when the pixels are its codes)
    quantized_for = pixel_code_layer(spec, lowered)
    x = policy_input(graph, x, spec, codes=quantized_for is not None)
    skip_relu = False
    for layer in spec.layers:
        if isinstance(layer, Activation):
            if skip_relu:  # folded into the QLinearConv's saturation at zero point 0
                skip_relu = False
                continue
            if quantized_for is not None:
                raise ValueError("static int8 graph: an activation on quantized codes is not supported")
            op = {"relu": "Relu", "elu": "Elu", "tanh": "Tanh"}[layer.fn]
            (x,) = graph.op(op, [x], **({"alpha": 1.0} if op == "Elu" else {}))
        elif isinstance(layer, Flatten):
            x = flatten_nchw(graph, x)
        elif isinstance(layer, (Conv2D, Linear)):
            n, conv = layer.name, isinstance(layer, Conv2D)
            int_layer = lowered.dense[n].kind == "int" and (not conv or n in fused)
            if not int_layer:
                if conv:
                    (x,) = graph.op("Conv", [x, f"{n}.w", f"{n}.b"], kernel_shape=[layer.kernel] * 2,
                                    strides=[layer.stride] * 2)
                else:
                    (x,) = graph.op("Add", [graph.op("MatMul", [x, f"{n}.w"])[0], f"{n}.b"])
                continue
            if quantized_for != n:
                (x,) = graph.op("QuantizeLinear", [x, f"{n}.x_scale", f"{n}.x_zp"])
            if conv:
                nxt = fused[n]
                (x,) = graph.op("QLinearConv", [x, f"{n}.x_scale", f"{n}.x_zp", f"{n}.wq", f"{n}.w_scale",
                                                f"{n}.w_zp", f"{nxt}.x_scale", f"{nxt}.x_zp", f"{n}.bq"],
                                kernel_shape=[layer.kernel] * 2, strides=[layer.stride] * 2)
                quantized_for, skip_relu = nxt, True
            else:
                (x,) = graph.op("MatMulIntegerToFloat", [x, f"{n}.wq", f"{n}.x_scale", f"{n}.w_scale",
                                                         f"{n}.x_zp", f"{n}.w_zp", f"{n}.b"],
                                domain="com.microsoft")
                quantized_for = None
        else:
            raise ValueError(f"static int8 graphs support Conv2D, Linear, Flatten and activations, not {layer!r}")
    if quantized_for is not None:
        raise ValueError("static int8 graph: the policy must end in a float layer")
    return x


# ------------------------------------------------------------------------------------ the exact emulation


def quantize_static(x: np.ndarray, scale: np.float32, zp: np.uint8) -> np.ndarray:
    """ONNX QuantizeLinear to uint8 (float32 division, round half to even, saturate), as int64 codes."""
    q = np.rint(np.asarray(x, np.float32) / np.float32(scale)) + np.float32(zp)
    return np.clip(q, 0, 255).astype(np.int64)


def qlinear_conv_reference(xq: np.ndarray, x_scale: np.float32, x_zp: int, dense: DenseWeights, stride: int,
                           y_scale: np.float32, y_zp: int) -> np.ndarray:
    """QLinearConv on NHWC int64 codes, exactly as MLAS computes it: integer accumulation with the int32 bias,
    then float32 (acc x (x_scale x w_scale / y_scale)), round half to even, + y_zp, saturate to uint8."""
    w = np.asarray(dense.w, np.int64)
    acc = np.einsum("bhwijc,ijco->bhwo", image_patches(xq - x_zp, w.shape[0], stride), w)
    bias = np.rint(dense.b.astype(np.float64) / (np.float64(x_scale) * dense.scale.astype(np.float64)))
    acc = acc + np.clip(bias, -2**31, 2**31 - 1).astype(np.int64)
    mult = (np.float32(x_scale) * dense.scale.astype(np.float32)) / np.float32(y_scale)
    y = np.rint(acc.astype(np.float32) * mult.astype(np.float32)) + np.float32(y_zp)
    return np.clip(y, 0, 255).astype(np.int64)


def static_reference(x: np.ndarray, conv: DenseWeights, stride: int, linear: DenseWeights,
                     ranges: tuple[tuple[float, float], tuple[float, float]],
                     shape: tuple[int, int, int]) -> np.ndarray:
    """The exact float64 result of the self-check graph: quantize -> QLinearConv (ReLU folded) -> Flatten
    (NHWC) -> MatMulIntegerToFloat with bias."""
    s0, z0 = activation_qparams(*ranges[0])
    s1, z1 = activation_qparams(*ranges[1])
    xq = quantize_static(x, s0, z0).reshape(-1, *shape)
    yq = qlinear_conv_reference(xq, s0, int(z0), conv, stride, s1, int(z1)).reshape(x.shape[0], -1)
    acc = (yq - int(z1)) @ np.asarray(linear.w, np.int64)
    return acc.astype(np.float64) * (np.float64(s1) * linear.scale.astype(np.float64)) + linear.b


# ------------------------------------------------------------------------------------ the self-check

_lock = threading.Lock()
_checks: dict[tuple, FormCheck] = {}
_warned: set[tuple] = set()
_CHECK_SHAPE = (10, 10, 8)  # a small conv (3x3, stride 2, 32 channels) + a 64-wide Linear: every MLAS path


def _check_case(bits: int, rng: np.random.Generator) -> tuple:
    from quarl.runtimes.kernel_check import _random_dense  # pylint: disable=import-outside-toplevel

    k, cin, cout, stride = 3, _CHECK_SHAPE[2], 32, 2
    flat = _random_dense(bits, k * k * cin, cout, rng)  # codes reaching +-max in every channel
    conv = DenseWeights("int", flat.w.reshape(k, k, cin, cout), rng.normal(0, 0.1, cout).astype(np.float32),
                        flat.scale)
    h = (_CHECK_SHAPE[0] - k) // stride + 1
    linear = _random_dense(bits, h * h * cout, 64, rng)
    linear = dataclasses.replace(linear, b=rng.normal(0, 0.1, 64).astype(np.float32))
    x = rng.random((8, int(np.prod(_CHECK_SHAPE))), dtype=np.float32)
    # The conv output's ReLU range, as a calibration would measure it (float conv of the dequantized weights).
    w = conv.w.astype(np.float64) * conv.scale
    pre = np.einsum("bhwijc,ijco->bhwo", image_patches(x.reshape(-1, *_CHECK_SHAPE).astype(np.float64), k, stride),
                    w) + conv.b
    ranges = ((0.0, 1.0), (0.0, float(np.maximum(pre, 0).max())))
    return x, conv, stride, linear, ranges


def _check_model(form: StaticForm, conv: DenseWeights, stride: int, linear: DenseWeights,
                 ranges: tuple[tuple[float, float], tuple[float, float]]) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    from quarl.runtimes.kernel_forms import opset_imports  # pylint: disable=import-outside-toplevel

    spec = PolicySpec(int(np.prod(_CHECK_SHAPE)), (Conv2D("c", conv.w.shape[-1], conv.w.shape[0], stride),
                                                  Activation("relu"), Flatten(), Linear("l", linear.w.shape[1])),
                      _CHECK_SHAPE)
    lowered = LoweredParams({"c": conv, "l": linear}, {}, None, False,  # type: ignore[arg-type]
                            {"c": ranges[0], "l": ranges[1]})
    graph = Graph()
    for name, arr in static_initializers(spec, lowered, form).items():
        graph.const(name, arr)
    emit_static(graph, spec, lowered, "x")
    graph.nodes[-1].output[0] = "y"
    model = helper.make_model(
        helper.make_graph(graph.nodes, "static_check",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", spec.input_dim])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", spec.output_dim])],
                          initializer=[numpy_helper.from_array(a, n) for n, a in graph.inits.items()]),
        opset_imports=opset_imports(graph.nodes, 17), producer_name="quarl")
    model.ir_version = 8
    return model


def check_static_form(name: str, bits: int, seed: int = 0) -> FormCheck:
    """Run form `name`'s static graph (QuantizeLinear -> QLinearConv -> Flatten -> MatMulIntegerToFloat) on
    random int`bits` weights through ORT at batch 1 and 8 and compare it with `static_reference`.
    Returns {"form", "ok", "max_rel_err", "tolerance"} (+ "error" when ORT refused the graph); cached."""
    import onnxruntime as ort

    key = (name, bits, seed)
    with _lock:
        if key in _checks:
            return _checks[key].copy()
    rng = np.random.default_rng(seed)
    x, conv, stride, linear, ranges = _check_case(bits, rng)

    def measure() -> float:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.log_severity_level = 3
        model = _check_model(STATIC_FORMS[name], conv, stride, linear, ranges)
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        worst = 0.0
        for rows in (1, 8):
            out = session.run(None, {"x": x[:rows]})[0]
            ref = static_reference(x[:rows], conv, stride, linear, ranges, _CHECK_SHAPE)
            worst = max(worst, relative_error(out, ref))
        return worst

    result = run_check(name, measure)
    with _lock:
        _checks[key] = result
    return result.copy()


def static_candidates(cpu: CPUInfo | None = None) -> list[str]:
    """Static forms to try on `cpu`, best first, then the fp32 fallback."""
    cpu = cpu_info() if cpu is None else cpu
    ranked = sorted((form.rank(cpu), name) for name, form in STATIC_FORMS.items() if form.rank(cpu) is not None)
    return [name for _, name in ranked] + [FALLBACK_FORM]


def select_static_form(bits: int, requested: str | None = None) -> FormChoice:
    """The static form for int`bits` conv policies on this CPU, self-checked (the `select_form` contract:
    {"form", "requested", "cpu_class", "checks", "fallback"}). A requested name with no static form (e.g.
    `nbits4`) is tried as the ranked order instead."""
    order = static_candidates()
    if requested in order:
        order = [requested] + [n for n in order if n != requested]
    checks: list[FormCheck] = []
    for name in order:
        if name == FALLBACK_FORM:
            checks.append({"form": name, "ok": True, "max_rel_err": 0.0, "tolerance": CHECK_TOLERANCE})
            break
        result = check_static_form(name, bits)
        checks.append(result)
        if result["ok"]:
            break
    chosen = checks[-1]["form"]
    info: FormChoice = {"form": chosen, "requested": requested or "auto", "cpu_class": cpu_class(), "checks": checks,
            "fallback": len(checks) > 1}
    if info["fallback"] and (bits, requested) not in _warned:
        _warned.add((bits, requested))
        log.warning("int%d static conv self-check refused %s on this CPU (%s); using %s", bits,
                    ", ".join(f"{c['form']} ({c.get('error') or c['max_rel_err']})" for c in checks[:-1]),
                    info["cpu_class"], chosen)
    return info


def dequantized(lowered: LoweredParams) -> LoweredParams:
    """`lowered` with every int layer's weights dequantized to fp32 (the fallback form's float graph)."""
    dense = {n: d if d.kind != "int" else DenseWeights("float", d.w.astype(np.float32) * d.scale, d.b)
             for n, d in lowered.dense.items()}
    return dataclasses.replace(lowered, dense=dense)
