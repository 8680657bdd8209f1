"""The ONNX Runtime policy runtime: the spec built as an in-memory ONNX graph (no files), one CPU session.

* fp32: MatMul + Add, LayerNormalization (opset 17), Relu / Elu / Tanh, TanhToSpec as Tanh -> Mul -> Add.
* int2..int8: per Linear, DynamicQuantizeLinear on the activations (uint8, per-tensor scale and zero
  point, computed each call) -> MatMulInteger with the int8 weight codes (per-output-channel, zero point 0)
  -> Cast to float -> Mul by (activation scale x weight scale[out]) -> Add the fp32 bias. MLAS runs this as
  a u8 x s8 -> s32 GEMM (VNNI where the CPU has it). Caveat from ORT's own docs: on AVX2 CPUs *without*
  VNNI the u8 x s8 kernel can saturate int16 intermediate sums; this machine class has avx512_vnni.
* fp16, bf16, int9..int16: simulated — the weights are rounded to that precision by the learner's
  quantizer, then widened and run in fp32 (`executor.simulated` is True). ORT's CPU provider has no fast
  fp16/bf16 GEMM (it would insert casts around fp32 kernels) nor an int16 one; failing instead would make
  those precisions unusable on the ONNX backend, while simulation keeps their weight error exact.

Weights are graph initializers, not graph inputs: ORT pre-packs constant GEMM operands at session creation,
and on this machine that makes the int8 network ~6x faster per call than feeding the same weights through
IOBinding'd inputs (H=2048: 140 us vs 930 us; fp32 1.0 ms vs 1.4 ms). `update()` therefore rewrites the
initializers' raw bytes in the kept ModelProto and opens a new session (H=2048 int8: ~2 ms serialise +
~7 ms session), swapping it in only once it is ready.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from quarl.policy import LAYER_NORM_EPS, Activation, LayerNorm, Linear, PolicySpec, TanhToSpec
from quarl.runtimes.base import LoweredParams, PolicyExecutor

_OPSET = 17  # LayerNormalization
_IR_VERSION = 8
_INPUT, _OUTPUT = "obs", "output"


def _initializers(spec: PolicySpec, lowered: LoweredParams) -> dict[str, np.ndarray]:
    """Every weight-derived constant of the graph by name (the part `update()` rewrites)."""
    arrays: dict[str, np.ndarray] = {}
    for layer in spec.layers:
        if isinstance(layer, Linear):
            d = lowered.dense[layer.name]
            if d.kind == "int":
                arrays[f"{layer.name}.codes"] = np.ascontiguousarray(d.w, np.int8)
                arrays[f"{layer.name}.scale"] = np.ascontiguousarray(d.scale, np.float32)
            else:
                arrays[f"{layer.name}.w"] = np.ascontiguousarray(d.w, np.float32)
            arrays[f"{layer.name}.b"] = np.ascontiguousarray(d.b, np.float32)
        elif isinstance(layer, LayerNorm):
            scale, offset = lowered.norms[layer.name]
            arrays[f"{layer.name}.scale"] = np.ascontiguousarray(scale, np.float32)
            arrays[f"{layer.name}.offset"] = np.ascontiguousarray(offset, np.float32)
    return arrays


def build_model(spec: PolicySpec, lowered: LoweredParams) -> Any:
    """The ONNX ModelProto of `spec` with `lowered` weights as initializers; dynamic batch dimension."""
    from onnx import TensorProto, helper, numpy_helper

    arrays = _initializers(spec, lowered)
    inits = [numpy_helper.from_array(a, name) for name, a in arrays.items()]
    nodes = []
    counter = iter(range(1 << 30))

    def emit(op: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> list[str]:
        outs = [f"t{next(counter)}" for _ in range(n_out)]
        nodes.append(helper.make_node(op, inputs, outs, **attrs))
        return outs

    def const(name: str, values: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(values, np.float32), name))
        return name

    x = _INPUT
    for i, layer in enumerate(spec.layers):
        if isinstance(layer, Linear):
            n = layer.name
            if lowered.dense[n].kind == "int":
                xq, xs, xz = emit("DynamicQuantizeLinear", [x], 3)
                (acc,) = emit("MatMulInteger", [xq, f"{n}.codes", xz])
                (accf,) = emit("Cast", [acc], to=TensorProto.FLOAT)
                (step,) = emit("Mul", [xs, f"{n}.scale"])
                (x,) = emit("Mul", [accf, step])
            else:
                (x,) = emit("MatMul", [x, f"{n}.w"])
            (x,) = emit("Add", [x, f"{n}.b"])
        elif isinstance(layer, LayerNorm):
            (x,) = emit("LayerNormalization", [x, f"{layer.name}.scale", f"{layer.name}.offset"],
                        axis=-1, epsilon=LAYER_NORM_EPS, stash_type=1)
        elif isinstance(layer, Activation):
            op = {"relu": "Relu", "elu": "Elu", "tanh": "Tanh"}[layer.fn]
            (x,) = emit(op, [x], **({"alpha": 1.0} if op == "Elu" else {}))
        elif isinstance(layer, TanhToSpec):
            lo, hi = np.asarray(layer.minimum, np.float64), np.asarray(layer.maximum, np.float64)
            # lo + (t + 1) * (hi - lo) / 2 == t * half + mid
            (x,) = emit("Tanh", [x])
            (x,) = emit("Mul", [x, const(f"tanh_to_spec{i}.half", (hi - lo) / 2)])
            (x,) = emit("Add", [x, const(f"tanh_to_spec{i}.mid", (hi + lo) / 2)])
    if nodes:
        nodes[-1].output[0] = _OUTPUT
    else:
        nodes.append(helper.make_node("Identity", [_INPUT], [_OUTPUT]))
    graph = helper.make_graph(
        nodes, "policy",
        [helper.make_tensor_value_info(_INPUT, TensorProto.FLOAT, ["batch", spec.input_dim])],
        [helper.make_tensor_value_info(_OUTPUT, TensorProto.FLOAT, ["batch", spec.output_dim])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="quarl")
    model.ir_version = _IR_VERSION
    return model


class OnnxExecutor(PolicyExecutor):
    """ONNX Runtime session with `threads` intra-op threads, one inter-op thread, sequential execution."""

    backend = "onnx"
    native_floats = ()

    def __init__(self, spec: PolicySpec, qparams: Any, *, batch_size: int = 1, threads: int = 1):
        self._model: Any = None
        self._session: Any = None
        super().__init__(spec, qparams, batch_size=batch_size, threads=threads)

    def _session_options(self) -> Any:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3  # errors only: ORT warns about benign initializer/input overlaps
        return so

    def _load(self, lowered: LoweredParams) -> None:
        import onnxruntime as ort

        if self._model is None:
            self._model = build_model(self.spec, lowered)
        else:
            arrays = _initializers(self.spec, lowered)
            for tensor in self._model.graph.initializer:
                if tensor.name in arrays:
                    tensor.raw_data = arrays[tensor.name].tobytes()
        session = ort.InferenceSession(self._model.SerializeToString(), self._session_options(),
                                       providers=["CPUExecutionProvider"])
        self._session = session

    def _run(self, obs: np.ndarray) -> np.ndarray:
        return self._session.run([_OUTPUT], {_INPUT: obs})[0]
