"""The JAX/XLA policy runtime.

* fp32, fp16, bf16: the spec's network jitted in that dtype (matmuls, biases and activations). LayerNorm
  statistics and the final TanhToSpec affine map run in fp32: they are a handful of FLOPs, and a variance
  in fp16/bf16 loses the precision the layer exists to provide.
* int2..int8: AQT v2 (`aqt.jax.v2`) in serving mode. The weight codes and per-channel scales from the
  `QTensor`s are handed to AQT as a complete `aqt_tensor.QTensor` rhs, so weights are quantized once (by
  the learner) and never at call time; AQT quantizes each activation row dynamically to int8, runs a real
  `lax.dot_general` s8 x s8 -> s32 and rescales the accumulator by (row scale x column scale). AQT needs a
  float rhs operand for its calibration step; we pass a zeros placeholder that XLA dead-code-eliminates
  (the calibration result is discarded because the rhs QTensor is already full).
  Activations are always 8 bits: an "int4" actor is W4A8, the usual deployment meaning, and it keeps the
  activation error small so the weight bit width is what the experiment varies.
* int9..int16: no int16 matmul kernel exists on CPU, so the dequantized weights run in fp32 (the weight
  rounding is exact, the arithmetic is simulated; `executor.simulated` is True).

Conv2D layers (image policies): fp32/fp16/bf16 through `lax.conv_general_dilated` (NHWC); int2..int8 as an
im2col (the k x k x C_in windows, gathered by k*k strided slices) times the [k*k*C_in, out] codes through the
same AQT s8 x s8 dot, each window quantized on its own (dynamic; the ONNX backend uses the calibrated static
scales instead, so the two int8 graphs round activations differently, both within the int8 tolerance).

Parameters are `jax.device_put` once per load; `jax.jit` compiles once per batch shape (the expected
`batch_size` at construction). `threads` is not applied here: XLA's CPU thread pool is process-wide and is
set through XLA_FLAGS before JAX starts.
"""
from __future__ import annotations

from typing import Callable, Mapping, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from quarl.policy.im2col import conv_windows
from quarl.nets.qat import weight_codes
from quarl.policy.spec import (
    LAYER_NORM_EPS, Activation, Conv2D, Flatten, LayerNorm, Linear, ParamTree, PolicySpec, TanhToSpec,
)
from quarl.quant.precision import Precision
from quarl.quant.quantization import QuantizedParams
from quarl.runtimes.base import LoweredParams, PolicyExecutor

_DN = (((1,), (0,)), ((), ()))  # [B, in] x [in, out] -> [B, out]
_ACTIVATION_BITS = 8
# The lowered weights on the device, by layer name: {"w", "b"} (float layers), {"codes", "scale", "b"} (int
# layers, codes as the [in, out] matrix of the dot) or {"scale", "offset"} (LayerNorm).
DeviceParams: TypeAlias = Mapping[str, Mapping[str, jax.Array]]
# x[B, in] float32, codes[in, out] int8, scale[1, out] -> x @ (codes * scale): the int8 dot of `_aqt_dense`.
IntDense: TypeAlias = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def _aqt_dense(bits: int) -> IntDense:
    """x[B, in] float32, codes[in, out] int8, scale[1, out] -> x @ (codes * scale) via an s8 x s8 dot."""
    from aqt.jax.v2 import aqt_tensor
    from aqt.jax.v2 import config as aqt_config

    dg = aqt_config.dot_general_make(lhs_bits=_ACTIVATION_BITS, rhs_bits=bits).fwd
    dg.dg_quantizer.init_calibration()

    def dense(x: jax.Array, codes: jax.Array, scale: jax.Array) -> jax.Array:
        rhs = aqt_tensor.QTensor(qvalue=codes, scale=[scale], scale_t=None, bias=[], dequant_dtype=jnp.float32)
        out, _ = dg(x, jnp.zeros(codes.shape, jnp.float32), None, rhs, _DN)
        return out

    return dense


def _conv(x: jax.Array, p: Mapping[str, jax.Array], layer: Conv2D, int_dense: IntDense | None,
          compute: DTypeLike) -> jax.Array:
    if "codes" in p:
        win = conv_windows(x.astype(jnp.float32), layer.kernel, layer.stride)
        rows = win.reshape(-1, win.shape[-1])
        y = int_dense(rows, p["codes"], p["scale"]).reshape(*win.shape[:3], -1)
        return y.astype(compute) + p["b"]
    y = jax.lax.conv_general_dilated(x, p["w"], (layer.stride, layer.stride), "VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"), preferred_element_type=compute)
    return y + p["b"]


def policy_forward(spec: PolicySpec, precision: Precision, *,
                   simulated: bool = False) -> Callable[[DeviceParams, jax.Array], jax.Array]:
    """The jittable forward(params, obs) of the JAX runtime for `spec` at `precision`: what `JaxExecutor` runs, and
    what the jitted trainer (`agents.anakin`) runs inside its jit on `traced_device_params`, so the actors inside the
    jit compute exactly as a deployed JAX actor does. `simulated`: the weights were rounded but run in fp32."""
    compute = jnp.float32
    if not simulated:
        compute = {"fp16": jnp.float16, "bf16": jnp.bfloat16}.get(precision.name, jnp.float32)
    int_dense = _aqt_dense(precision.bits) if precision.has_int_kernel and not simulated else None
    activations = {"relu": jax.nn.relu, "elu": jax.nn.elu, "tanh": jnp.tanh}

    def forward(params: DeviceParams, obs: jax.Array) -> jax.Array:
        x = obs.astype(compute)
        if spec.input_shape is not None:
            x = x.reshape(x.shape[0], *spec.input_shape)
        if spec.input_scale is not None:
            x = x * jnp.asarray(spec.input_scale, x.dtype)
        if (affine := spec.input_affine()) is not None:  # input_bounds set
            offset, scale = affine
            x = (x - jnp.asarray(offset, x.dtype)) * jnp.asarray(scale, x.dtype)
        for layer in spec.layers:
            if isinstance(layer, Conv2D):
                x = _conv(x, params[layer.name], layer, int_dense, compute)
            elif isinstance(layer, Flatten):
                x = x.reshape(x.shape[0], -1)
            elif isinstance(layer, Linear):
                p = params[layer.name]
                if "codes" in p:
                    x = int_dense(x.astype(jnp.float32), p["codes"], p["scale"]).astype(compute)
                else:
                    x = jnp.dot(x, p["w"], preferred_element_type=compute)
                x = x + p["b"]
            elif isinstance(layer, LayerNorm):
                p = params[layer.name]
                xf = x.astype(jnp.float32)
                mean = xf.mean(-1, keepdims=True)
                var = jnp.square(xf - mean).mean(-1, keepdims=True)
                xf = (xf - mean) * jax.lax.rsqrt(var + LAYER_NORM_EPS) * p["scale"] + p["offset"]
                x = xf.astype(compute)
            elif isinstance(layer, Activation):
                x = activations[layer.fn](x)
            elif isinstance(layer, TanhToSpec):
                lo = jnp.asarray(layer.minimum, jnp.float32)
                hi = jnp.asarray(layer.maximum, jnp.float32)
                x = lo + (jnp.tanh(x.astype(jnp.float32)) + 1.0) * 0.5 * (hi - lo)
        return x.astype(jnp.float32)

    return forward


def traced_device_params(spec: PolicySpec, params: ParamTree, precision: Precision) -> DeviceParams:
    """An fp32 haiku tree as `policy_forward`'s params at `precision`, computed with jnp so it runs inside a jit (and
    under vmap): the weight codes and per-channel scales are `quarl.nets.qat.weight_codes`, bit-identical to
    `quantize_params` (what a payload carries), laid out as `JaxExecutor._load` lays out a payload's. fp32 and
    int2..int8 only: the precisions the JAX runtime computes natively in float32 or on its integer kernel."""
    if not (precision.name == "fp32" or precision.has_int_kernel):
        raise ValueError(f"in-jit weights are fp32 or int2..int8, got {precision.name}")
    out: dict[str, dict[str, jax.Array]] = {}
    for layer in spec.layers:
        if isinstance(layer, LayerNorm):
            out[layer.name] = {"scale": params[layer.name]["scale"], "offset": params[layer.name]["offset"]}
        elif isinstance(layer, (Linear, Conv2D)):
            w, b = params[layer.name]["w"], params[layer.name]["b"]
            if precision.is_int:
                codes, scale = weight_codes(w, precision.bits)  # conv w [k, k, C_in, O]: one scale per O
                out[layer.name] = {"codes": codes.reshape(-1, codes.shape[-1]), "scale": scale.reshape(1, -1), "b": b}
            else:
                out[layer.name] = {"w": w, "b": b}
    return out


class JaxExecutor(PolicyExecutor):
    """Jitted XLA forward; int precisions through AQT v2 with load-time quantized weights."""

    backend = "jax"
    native_floats = ("fp16", "bf16")

    def __init__(self, spec: PolicySpec, qparams: QuantizedParams, *, batch_size: int = 1, threads: int = 1):
        self._jitted: Callable[[DeviceParams, np.ndarray], jax.Array] | None = None
        self._params: DeviceParams | None = None
        super().__init__(spec, qparams, batch_size=batch_size, threads=threads)

    def _load(self, lowered: LoweredParams) -> None:
        compute_bias = np.dtype(np.float32)
        if not lowered.simulated and lowered.precision.name in self.native_floats:
            compute_bias = np.dtype(jnp.float16 if lowered.precision.name == "fp16" else jnp.bfloat16)
        host: dict[str, dict[str, np.ndarray]] = {}
        for name, d in lowered.dense.items():
            if d.kind == "int":  # conv codes [k, k, C_in, O] as the [k*k*C_in, O] matrix of the im2col dot
                host[name] = {"codes": d.w.reshape(-1, d.w.shape[-1]), "scale": d.scale.reshape(1, -1), "b": d.b}
            else:
                host[name] = {"w": d.w, "b": d.b.astype(compute_bias)}
        for name, (scale, offset) in lowered.norms.items():
            host[name] = {"scale": scale, "offset": offset}
        params = jax.device_put(host)
        if self._jitted is None:
            self._jitted = jax.jit(policy_forward(self.spec, lowered.precision, simulated=lowered.simulated))
            if any(d.kind == "int" for d in lowered.dense.values()):
                self.kernel_form = "aqt_s8s8"  # XLA's s8 x s8 -> s32 dot: exact on every CPU
        self._params = params

    def _run(self, obs: np.ndarray) -> np.ndarray:
        return np.array(self._jitted(self._params, obs), dtype=np.float32)
