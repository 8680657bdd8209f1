"""The ONNX Runtime policy runtime: the spec built as an in-memory ONNX graph (no files), one CPU session.

* fp32: MatMul + Add, LayerNormalization (opset 17), Relu / Elu / Tanh, TanhToSpec as Tanh -> Mul -> Add.
* int2..int8: per Linear, in the *kernel form* chosen for this CPU (`quarl.runtimes.kernel_forms`): usually
  the activations quantized to uint8 *per row* (each row its own scale and zero point, computed each call,
  so a vectorized actor's environments do not affect each other's actions; one per-axis QuantizeLinear) ->
  MatMulIntegerToFloat with the weight codes and their per-column scales (`u8s8`: int8 codes; `u8u8`: codes
  + 128 as uint8 with zero point 128) -> the row zero point corrected on the scaled sums -> Mul by the row
  scale -> Add the fp32 bias; ELU, which ORT runs as a scalar loop, is written as four vectorized ops there.
  A layer right after ReLU, ELU or tanh takes its input lifted to >= 0 (ELU/tanh + 1), quantized with zero
  point 0: no row minimum, no zero-point correction; the lift times the column sums is folded into its bias.
  Batch-1 calls run a second session whose graph uses DynamicQuantizeLinear + MatMulInteger instead (one row:
  the same quantizer; ORT fuses them into one op, and per-row ops would cost a 256x3 policy 2.4x its batch-1
  call). u8s8 is exact and fastest with VNNI/AMX; on AVX2 without VNNI MLAS's u8 x s8 kernel saturates int16
  pair sums, so u8u8 is preferred there. The choice is confirmed by a self-check at construction (fallback: u8u8, then
  the dequantized weights in fp32, logged).
* int2..int4 on the `onnx-nbits` backend: the `nbits4` form (`quarl.runtimes.onnx_nbits`), MatMulNBits with
  the codes packed 4 bits each and activations quantized to int8 per K-block inside the kernel. The plain
  `onnx` backend runs those precisions through the int8 forms above; `auto` measures both.
* fp16, bf16, int9..int16: simulated — the weights are rounded to that precision by the learner's
  quantizer, then widened and run in fp32 (`executor.simulated` is True). ORT's CPU provider has no fast
  fp16/bf16 GEMM (it would insert casts around fp32 kernels) nor an int16 one; failing instead would make
  those precisions unusable on the ONNX backend, while simulation keeps their weight error exact.

Weights are graph initializers, not graph inputs: ORT pre-packs constant GEMM operands at session creation,
and on this machine that makes the int8 network ~6x faster per call than feeding the same weights through
IOBinding'd inputs (H=2048: 140 us vs 930 us; fp32 1.0 ms vs 1.4 ms). `update()` therefore opens a new
session over the graph serialized once, with the new weights passed as session initializers
(`SessionOptions.add_initializer`, which skips re-serialising the model: ~35-45% less time per update than
rewriting the ModelProto, same per-call speed), and swaps it in only once it is ready; `update(wait=False)`
builds it on a background thread while the actor keeps acting on the old session. Graphs with a float Conv
(fp32 conv policies, and int conv policies' dequantized layers) are the exception: at ORT_ENABLE_ALL ORT lays
Conv weights out for its NCHWc kernels from the serialized model's initializers and ignores the session's
overrides, so an update that only overrode them left a conv actor on its first weights (its outputs 0.98 off
after one update on a MinAtar net; fp32 DQN did not learn MinAtar). Those graphs are serialized anew with each
update's weights.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from quarl.policy.spec import LAYER_NORM_EPS, Activation, Conv2D, Flatten, LayerNorm, Linear, PolicySpec, TanhToSpec
from quarl.quant.quantization import QuantizedParams
from quarl.runtimes.base import FormChoice, LoweredParams, PolicyExecutor
from quarl.runtimes.kernel_check import select_form
from quarl.runtimes.kernel_forms import ACTIVATION_FLOORS, Graph, KernelForm, get_form, lifted_bias_name, opset_imports
from quarl.runtimes.onnx_nbits import FORM_NAME as NBITS_FORM, MAX_NBITS_PRECISION
from quarl.runtimes.onnx_static import (
    STATIC_FORMS, StaticForm, dequantized, emit_static, flatten_nchw, policy_input, select_static_form,
    static_initializers,
)

if TYPE_CHECKING:  # onnx and onnxruntime are imported where they are used
    import onnx
    import onnxruntime as ort

_OPSET = 17  # LayerNormalization
_IR_VERSION = 8
_INPUT, _OUTPUT = "obs", "output"


def _initializers(spec: PolicySpec, lowered: LoweredParams, form: KernelForm | None) -> dict[str, np.ndarray]:
    """Every weight-derived constant of the graph by name (the part `update()` rewrites)."""
    arrays: dict[str, np.ndarray] = {}
    for layer in spec.layers:
        if isinstance(layer, Conv2D):  # float weights here; int conv policies build `onnx_static` graphs
            w = lowered.dense[layer.name].w
            arrays[f"{layer.name}.w"] = np.ascontiguousarray(np.asarray(w, np.float32).transpose(3, 2, 0, 1))
            arrays[f"{layer.name}.b"] = np.ascontiguousarray(lowered.dense[layer.name].b, np.float32)
        elif isinstance(layer, Linear):
            d = lowered.dense[layer.name]
            if d.kind == "int":
                arrays.update(form.initializers(layer.name, d))
            else:
                arrays[f"{layer.name}.w"] = np.ascontiguousarray(d.w, np.float32)
            arrays[f"{layer.name}.b"] = np.ascontiguousarray(d.b, np.float32)
        elif isinstance(layer, LayerNorm):
            scale, offset = lowered.norms[layer.name]
            arrays[f"{layer.name}.scale"] = np.ascontiguousarray(scale, np.float32)
            arrays[f"{layer.name}.offset"] = np.ascontiguousarray(offset, np.float32)
    return arrays


def _emit_elu(graph: Graph, x: str, lifted: bool) -> str:
    """ELU as Max(x, Exp(Min(x, 0)) - 1), or ELU + 1 as Max(x + 1, Exp(Min(x, 0))) when the next int layer
    takes a lifted input (exp(x) >= 1 + x: the Max picks the right branch on both sides of 0). ORT's Elu kernel
    is scalar (~3.6 ns an element here) and, unlike fp32, an int layer's output gets no FusedGemm to hide it
    in; four vectorized ops take half the time on a batch. Batched int graphs only: at one row the ops'
    dispatch costs more than they save."""
    zero = graph.const("elu.zero", np.float32(0))
    one = graph.const("elu.one", np.float32(1))
    (e,) = graph.op("Exp", [graph.op("Min", [x, zero])[0]])
    if lifted:
        return graph.op("Max", [graph.op("Add", [x, one])[0], e])[0]
    return graph.op("Max", [x, graph.op("Sub", [e, one])[0]])[0]


def _lifted_floor(spec: PolicySpec, lowered: LoweredParams, i: int, form: KernelForm | None,
                  per_row: bool) -> float | None:
    """The floor by which activation layer i lifts its output for the int Linear right after it, or None
    (the batch-1 graph, a form without lifted inputs, or not followed by an int Linear)."""
    if not (per_row and form is not None and form.integer and form.lifted_inputs) or i + 1 >= len(spec.layers):
        return None
    nxt = spec.layers[i + 1]
    if not isinstance(nxt, Linear) or lowered.dense[nxt.name].kind != "int":
        return None
    return ACTIVATION_FLOORS.get(spec.layers[i].fn)


def build_model(spec: PolicySpec, lowered: LoweredParams, form: KernelForm | None = None, *,
                per_row: bool = True) -> onnx.ModelProto:
    """The ONNX ModelProto of `spec` with `lowered` weights as initializers; dynamic batch dimension.
    Int layers are emitted by `form` (required when there are any). `per_row=False` lets the form quantize
    activations per tensor: only for a session that is only ever fed one row.

    In per-row graphs an activation followed by an int layer hands it a *lifted* input where the form takes
    one (`KernelForm.lifted_inputs`): ReLU's output as is (>= 0), ELU's and tanh's plus 1. The layer then
    quantizes with zero point 0 and no per-row correction, and its bias carries floor x the weights' column
    sums (`kernel_forms.lifted_bias_name`): four fewer passes over [B, out] a layer. The batch-1 graph does
    not lift: its fused DynamicQuantizeLinear needs no correction anyway, and the extra Adds would only cost
    it time. So after tanh/ELU a row alone is quantized over [min(x, 0), max(x, 0)] and in a batch over
    [-1, max(x, 0)]: the same int8 policy, actions a code apart."""
    if form is None and any(d.kind == "int" for d in lowered.dense.values()):
        raise ValueError("int layers need a kernel form")
    graph = Graph()
    graph.per_row = per_row
    for name, arr in _initializers(spec, lowered, form).items():
        graph.const(name, arr)
    x = _INPUT
    x = policy_input(graph, x, spec)
    for i, layer in enumerate(spec.layers):
        if isinstance(layer, Conv2D):
            (x,) = graph.op("Conv", [x, f"{layer.name}.w", f"{layer.name}.b"], kernel_shape=[layer.kernel] * 2,
                            strides=[layer.stride] * 2)
        elif isinstance(layer, Flatten):
            x = flatten_nchw(graph, x)
        elif isinstance(layer, Linear):
            n = layer.name
            bias = f"{n}.b"
            if lowered.dense[n].kind == "int":
                graph.shapes[n] = tuple(lowered.dense[n].w.shape)
                x = form.emit(graph, x, n)
                if n in graph.floors:
                    bias = lifted_bias_name(n, graph.floors[n])
            else:
                (x,) = graph.op("MatMul", [x, f"{n}.w"])
            (x,) = graph.op("Add", [x, bias])
        elif isinstance(layer, LayerNorm):
            (x,) = graph.op("LayerNormalization", [x, f"{layer.name}.scale", f"{layer.name}.offset"],
                            axis=-1, epsilon=LAYER_NORM_EPS, stash_type=1)
        elif isinstance(layer, Activation):
            floor = _lifted_floor(spec, lowered, i, form, per_row)
            if layer.fn == "elu" and per_row and form is not None and form.integer:
                x = _emit_elu(graph, x, lifted=floor is not None)
            else:
                op = {"relu": "Relu", "elu": "Elu", "tanh": "Tanh"}[layer.fn]
                (x,) = graph.op(op, [x], **({"alpha": 1.0} if op == "Elu" else {}))
                if floor == -1.0:
                    (x,) = graph.op("Add", [x, graph.const("lift.one", np.float32(1))])
            if floor is not None:
                graph.floors[spec.layers[i + 1].name] = floor
        elif isinstance(layer, TanhToSpec):
            lo, hi = np.asarray(layer.minimum, np.float64), np.asarray(layer.maximum, np.float64)
            # lo + (t + 1) * (hi - lo) / 2 == t * half + mid
            (x,) = graph.op("Tanh", [x])
            (x,) = graph.op("Mul", [x, graph.const(f"tanh_to_spec{i}.half", ((hi - lo) / 2).astype(np.float32))])
            (x,) = graph.op("Add", [x, graph.const(f"tanh_to_spec{i}.mid", ((hi + lo) / 2).astype(np.float32))])
    return _to_model(graph, spec)


def build_static_model(spec: PolicySpec, lowered: LoweredParams, form: StaticForm) -> onnx.ModelProto:
    """The static int8 ModelProto of a conv policy (`quarl.runtimes.onnx_static`); dynamic batch dimension."""
    graph = Graph()
    for name, arr in static_initializers(spec, lowered, form).items():
        graph.const(name, arr)
    emit_static(graph, spec, lowered, _INPUT)
    return _to_model(graph, spec)


def _to_model(graph: Graph, spec: PolicySpec) -> onnx.ModelProto:
    """The ModelProto of `graph` (its last node's output renamed to the graph output)."""
    from onnx import TensorProto, helper, numpy_helper

    if graph.nodes:
        graph.nodes[-1].output[0] = _OUTPUT
    else:
        graph.nodes.append(helper.make_node("Identity", [_INPUT], [_OUTPUT]))
    inits = [numpy_helper.from_array(a, name) for name, a in graph.inits.items()]
    onnx_graph = helper.make_graph(
        graph.nodes, "policy",
        [helper.make_tensor_value_info(_INPUT, TensorProto.UINT8 if spec.pixels else TensorProto.FLOAT,
                                       ["batch", spec.input_dim])],
        [helper.make_tensor_value_info(_OUTPUT, TensorProto.FLOAT, ["batch", spec.output_dim])],
        initializer=inits,
    )
    model = helper.make_model(onnx_graph, opset_imports=opset_imports(graph.nodes, _OPSET), producer_name="quarl")
    model.ir_version = _IR_VERSION
    return model


class OnnxExecutor(PolicyExecutor):
    """ONNX Runtime session with `threads` intra-op threads, one inter-op thread, sequential execution.

    Int layers run in the kernel form chosen for this CPU and confirmed by a self-check (`kernel_forms`);
    `kernel_form` forces a form to try first (it is still checked, and refused with a logged fallback when
    it is not exact here). After construction `executor.kernel_form` names the form in use (None for float
    precisions) and `executor.kernel_check` says how it was chosen (checks tried, fallback or not).
    """

    backend = "onnx"
    native_floats = ()

    def __init__(self, spec: PolicySpec, qparams: QuantizedParams, *, batch_size: int = 1, threads: int = 1,
                 kernel_form: str | None = None):
        if kernel_form is not None:
            get_form(kernel_form)  # unknown names fail before any work
        self._requested_form = kernel_form
        self._form: KernelForm | None = None
        # Conv policies with int weights: the static form (None: its fp32 fallback, dequantized weights).
        self._conv_int = False
        self._static: StaticForm | None = None
        self.kernel_form: str | None = None
        self.kernel_check: FormChoice = {}
        # Serialized graphs by kind: "row" (per-row activation quantization, any batch) and, where the form
        # has a cheaper one-row variant, "one" (per tensor; used only for batch-1 calls). Built once, on the
        # first weights; empty until then. Only the bytes are kept (a parsed copy would double the weights'
        # memory, ~33 MB at fp32 2048x3): `model()` parses them for inspection.
        self._models: dict[str, bytes] = {}
        self._rebuild = False  # a float Conv in the graph: updates serialize it anew (see the module docstring)
        self._kinds: set[str] = set()  # kinds whose sessions each update rebuilds (those called so far)
        self._state_lock = threading.Lock()
        # (sessions by kind, OrtValues they read by name, the serialized graphs they run), swapped as one;
        # empty OrtValues: the graphs' own initializers.
        self._state: tuple[dict[str, ort.InferenceSession], dict[str, ort.OrtValue], dict[str, bytes]] = ({}, {}, {})
        super().__init__(spec, qparams, batch_size=batch_size, threads=threads)

    def _session_options(self) -> ort.SessionOptions:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3  # errors only: ORT warns about benign initializer/input overlaps
        return so

    def _choose_form(self, lowered: LoweredParams) -> None:
        shapes = [d.w.shape for d in lowered.dense.values() if d.kind == "int"]
        if not shapes:
            return
        if self.spec.conv_layers:  # static int8 graph (calibrated activation scales), its own forms
            self._conv_int = True
            self.kernel_check = select_static_form(lowered.precision.bits, self._requested_form)
            self.kernel_form = self.kernel_check["form"]
            self._static = STATIC_FORMS.get(self.kernel_form)
            if self._static is None:
                self.simulated = True
            return
        self.kernel_check = select_form(lowered.precision.bits, shapes, self._requested_form)
        self._form = get_form(self.kernel_check["form"])
        self.kernel_form = self._form.name
        if not self._form.integer:
            self.simulated = True

    def _conv_model(self, lowered: LoweredParams) -> onnx.ModelProto:
        if self._static is not None:
            return build_static_model(self.spec, lowered, self._static)
        return build_model(self.spec, dequantized(lowered))

    def _arrays(self, lowered: LoweredParams) -> dict[str, np.ndarray]:
        """The weight-derived initializers of the graph this executor built (what an update rewrites)."""
        if not self._conv_int:
            return _initializers(self.spec, lowered, self._form)
        if self._static is not None:
            return static_initializers(self.spec, lowered, self._static)
        return _initializers(self.spec, dequantized(lowered), None)

    def model(self, kind: str = "row") -> onnx.ModelProto:
        """The ONNX ModelProto of graph `kind` ("row" or "one"), parsed from its serialized bytes: a fresh
        copy (editing it changes nothing here) whose initializers hold the first weights loaded (the latest
        ones for a graph with a float Conv, which each update serializes anew)."""
        from onnx import ModelProto  # pylint: disable=import-outside-toplevel

        if kind not in self._models:
            raise ValueError(f"no {kind!r} graph (built: {', '.join(sorted(self._models)) or 'none yet'})")
        model = ModelProto()
        model.ParseFromString(self._models[kind])
        return model

    def _kind(self, rows: int) -> str:
        return "one" if rows == 1 and "one" in self._models else "row"

    def _session(self, kind: str, values: dict[str, ort.OrtValue],
                 models: dict[str, bytes]) -> ort.InferenceSession:
        import onnxruntime as ort

        so = self._session_options()
        for name, value in values.items():
            so.add_initializer(name, value)
        return ort.InferenceSession(models[kind], so, providers=["CPUExecutionProvider"])

    def _serialize(self, lowered: LoweredParams) -> dict[str, bytes]:
        """The graphs of this executor's form with `lowered` weights, serialized, by kind. The first call also
        notes whether they hold a float Conv (`_rebuild`), read off the graph before it is serialized."""
        row = self._conv_model(lowered) if self._conv_int else build_model(self.spec, lowered, self._form)
        if not self._models:
            self._rebuild = any(node.op_type == "Conv" for node in row.graph.node)
        models = {"row": row.SerializeToString()}
        if self._conv_int:  # one graph for every batch size: static scales never couple rows
            return models
        # Per-row quantization costs ~15 small ops a layer (2.4x a 256x3 policy's batch-1 call); one row needs
        # none of them, so batch-1 calls get their own graph when the form has a cheaper one.
        one = build_model(self.spec, lowered, self._form, per_row=False).SerializeToString()
        if one != models["row"]:
            models["one"] = one
        return models

    def _load(self, lowered: LoweredParams) -> None:
        import onnxruntime as ort

        values: dict[str, ort.OrtValue] = {}
        if not self._models:  # first weights: choose the form, build and serialize the graphs
            self._choose_form(lowered)
            self._models = self._serialize(lowered)  # nothing runs yet: no call can see it half set up
            models = self._models
            self._kinds = {self._kind(self.batch_size)}
        elif self._rebuild:
            models = self._serialize(lowered)
        else:
            # New weights go in as session initializers over the graphs serialized once: no rewriting and
            # re-serialising the model per update (about a third of an update at H=2048). ORT reads the
            # OrtValues' memory, so they live as long as the sessions.
            models = self._models
            values = {name: ort.OrtValue.ortvalue_from_numpy(array)
                      for name, array in self._arrays(lowered).items()}
        with self._state_lock:  # a concurrent first call of a new kind adds to the set
            kinds = sorted(self._kinds)
        sessions = {kind: self._session(kind, values, models) for kind in kinds}
        with self._state_lock:
            self._models = models
            self._state = (sessions, values, models)  # one assignment: a call sees old or new sessions

    def _run(self, obs: np.ndarray) -> np.ndarray:
        # Hold the whole state for the call: the session reads its initializers' OrtValues in place, so they
        # must outlive a call that a background update's swap overlaps.
        state = self._state  # a local reference keeps both alive until the call returns
        kind = self._kind(obs.shape[0])
        session = state[0].get(kind)
        if session is None:  # first call of this batch kind: build it on the weights this call runs on
            session = self._session(kind, state[1], state[2])
            with self._state_lock:
                self._kinds.add(kind)
                if self._state is state:  # an update swapped in meanwhile builds its own on first use
                    self._state = ({**state[0], kind: session}, state[1], state[2])
        return session.run([_OUTPUT], {_INPUT: obs})[0]


class OnnxNBitsExecutor(OnnxExecutor):
    """The `onnx-nbits` backend: int2..int4 weights on the `nbits4` form (MatMulNBits, 4-bit packed), still
    self-checked (a refusal falls back to the int8 forms, logged); every other precision exactly as `onnx`."""

    backend = "onnx-nbits"

    def _choose_form(self, lowered: LoweredParams) -> None:
        prec = lowered.precision
        if self._requested_form is None and prec.is_int and prec.bits <= MAX_NBITS_PRECISION:
            self._requested_form = NBITS_FORM
        super()._choose_form(lowered)
