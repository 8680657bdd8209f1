"""Quantization-aware training (QAT): train a policy through the very arithmetic its int-B actors run.

Post-training quantization rounds a network that never saw the rounding; at 2-4 bits that often breaks
it. With QAT the learner's forward pass of the *deployed* network (the D4PG policy, the DQN online
Q-network) already uses quantized weights, so the optimiser finds weights that work after rounding, and
gradients pass the rounding with a straight-through estimator (STE): d(round(w)) / dw := 1.

What "the arithmetic its actors run" means here, exactly (see `quarl.runtimes.jax_backend`):

* weights: `quarl.quant.quantization.quantize_params(params, "int<B>")`, i.e. symmetric, one scale per output
  channel, `scale = max|w| / (2^(B-1) - 1)` rounded *up* to float32, codes `rint(w / scale)` (ties to
  even) clipped to +-(2^(B-1) - 1);
* activations: AQT v2's dynamic 8-bit quantization of each input row, an s8 x s8 -> s32 `dot_general`,
  and a rescale of the accumulator by (row scale x column scale); the bias is added in float32.

How it is built, and why:

* The matmul is AQT v2 (`aqt.jax.v2`), the same `dot_general_make(lhs_bits=8, rhs_bits=B)` forward the
  jax runtime executes, so the activation quantization and integer dot are the deployed ones, not a
  re-implementation. AQT's `DotGeneral` also provides the STE: its custom VJP passes the cotangent through
  both quantizers unchanged (`IntSymmetric(clip_gradient=False)`), computing dW = x_q^T g from the
  quantized activations and dx = g W_q^T from the quantized weights.
* The weight codes and scales are NOT AQT's calibration: AQT's `AbsMaxCalibration` with its default
  `IntSymmetric(preserve_max_val=False)` maps max|w| to 2^(B-1) - 0.5 (not 2^(B-1) - 1) and rounds the
  scale to nearest in float32, while the deployed grid (`quarl.quant.quantization.quantize`) divides by
  2^(B-1) - 1 in float64 and rounds the scale up. A training grid that differs from the deployed one by
  even one code would make "fake-quant == deploy" false. So `weight_codes` computes quarl's codes and
  scales bit-exactly in float32 jnp (the two float64 steps are reproduced with an exact product split,
  `_sign_of_residual`), and they are handed to AQT as a complete rhs `QTensor`, exactly as the runtime
  hands over the learner's codes; the float weights go in as AQT's rhs operand so that the VJP returns dW.
  AQT's own rhs calibration then runs but its result is discarded (XLA removes it).
* The ONNX runtime uses the same weight codes but quantizes activations asymmetrically to uint8 (per row,
  as AQT does, but with a zero point), so there the trained and deployed networks differ by activation
  rounding only;
  the jax runtime matches exactly.
* Only `Linear` and `Conv2D` weights are quantized (convs as the jax runtime runs them: im2col + the same dot,
  `qat_conv2d`); biases, LayerNorm and activations in between stay float32, as on
  the actors. Critics and target networks never reach an actor, so they stay plain fp32.

Numerical corner (documented, not handled): XLA on CPU flushes subnormal floats to zero, so a weight
column whose max |w| is below ~1e-36 may get a different scale than quarl's float64 computation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, TypeAlias

import numpy as np

from quarl.ops.checks import ConfigError
from quarl.policy.im2col import conv_windows

if TYPE_CHECKING:  # JAX, haiku and AQT load lazily here (only QAT learners need them): types for the checker only
    import haiku as hk
    import jax
    from jax.typing import ArrayLike

# What `make_qat_dense` returns: `dense(x[..., in], w[in, out]) -> x @ w`, computed as an int-B actor computes it.
QATDense: TypeAlias = "Callable[[ArrayLike, ArrayLike], jax.Array]"
# A haiku module class as `quarl.nets.haiku` uses one: constructed with the layer's arguments, then applied to x.
LayerClass: TypeAlias = "Callable[..., Callable[[jax.Array], jax.Array]]"

QAT_MIN_BITS, QAT_MAX_BITS = 2, 8  # the int kernels the runtimes deploy (wider ints are simulated in fp32)
ACTIVATION_BITS = 8  # as `quarl.runtimes.jax_backend`: an int4 actor is W4A8
_DN = (((1,), (0,)), ((), ()))  # [B, in] x [in, out] -> [B, out]
_F32_TINY = float(np.finfo(np.float32).tiny)
_LOW_MANTISSA_MASK = np.uint32(0xFFFFF000)  # keeps 12 significant bits of a float32 (1 implicit + 11)
_SCALE_SEARCH_STEPS = 4  # from 2 ulps below the (+-1 ulp) quotient up to the rounded-up exact one


def check_qat_bits(value: object, field: str = "qat_bits") -> int | None:
    """`value` as an int in [2, 8] or None; anything else is a one-line ValueError naming `field`.

    The range is what the actors can run as integers: int2..int8 (AQT s8 dot, ONNX MatMulInteger)."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or not QAT_MIN_BITS <= int(value) <= QAT_MAX_BITS:
        raise ConfigError(field, f"must be None or an int in [{QAT_MIN_BITS}, {QAT_MAX_BITS}], got {value!r}")
    return int(value)


def _sign_of_residual(a: jax.Array, h: jax.Array, s: jax.Array) -> jax.Array:
    """Exact sign(a - h * s) for float32 arrays, without float64 (disabled in JAX by default).

    Preconditions: `h` has at most 12 significant bits (a small integer or half-integer), `s` > 0 is a
    normal float32, and `a` is 0 or has the sign of `h`. `s` is split into s1 (its top 12 significant bits)
    + s2 (the rest), so h*s1 and h*s2 are exact float32 products. When a and h*s1 are within a factor of 2,
    d = a - h*s1 is exact (Sterbenz), and sign(a - h*s) = sign(d - h*s2) is decided by an exact comparison;
    otherwise |a - h*s| is so large relative to h*s2 that the rounded d cannot cross h*s2.
    """
    import jax
    import jax.numpy as jnp

    s1 = jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(s, jnp.uint32) & _LOW_MANTISSA_MASK,
                                      jnp.float32)
    s2 = s - s1
    d = a - h * s1
    p2 = h * s2
    return jnp.where(d > p2, 1, jnp.where(d < p2, -1, 0))


def weight_codes(w: ArrayLike, bits: int) -> tuple[jax.Array, jax.Array]:
    """`quarl.quant.quantization.quantize(w, bits, symmetric=True, axis=-1)` in jnp: (int8 codes [in, out],
    float32 scale [1, out]), bit-identical to the NumPy reference. No gradient (codes are integers)."""
    import jax
    import jax.numpy as jnp

    checked = check_qat_bits(bits, "bits")
    if checked is None:
        raise ValueError("weight_codes needs bits in [2, 8], got None")
    w = jax.lax.stop_gradient(jnp.asarray(w, jnp.float32))
    hi = float(2 ** (checked - 1) - 1)
    amax = jnp.max(jnp.abs(w), axis=tuple(range(w.ndim - 1)), keepdims=True)
    # Scale: the smallest float32 s with s * hi >= amax (quarl divides in float64 and rounds up), at least
    # the smallest normal float32; 1.0 for an all-zero column. XLA's float32 division on CPU is within one
    # ulp of the correctly rounded quotient but not always equal to it, so start two ulps below the
    # quotient and step up while the exact residual says the candidate is too small.
    up, down = jnp.float32(jnp.inf), jnp.float32(0.0)
    s = jnp.maximum(jnp.nextafter(jnp.nextafter(amax / hi, down), down), _F32_TINY)
    for _ in range(_SCALE_SEARCH_STEPS):
        s = jnp.where(_sign_of_residual(amax, jnp.float32(hi), s) > 0, jnp.nextafter(s, up), s)
    scale = jnp.where(amax == 0.0, jnp.float32(1.0), s)
    # Codes: rint(w / scale) with the float64 quotient's rounding. The float32 quotient q is within an ulp
    # (<= 2^-16, as |q| <= 127) of the exact one, so the exact value rounds to floor(q) or floor(q) + 1, decided by the
    # exact sign of w - (floor(q) + 0.5) * scale; an exact tie goes to the even code, as np.rint does.
    q = w / scale
    k = jnp.floor(q)
    half = k + 0.5
    side = _sign_of_residual(w, half, scale)
    k_odd = jnp.mod(k, 2.0) == 1.0
    code = k + jnp.where((side > 0) | ((side == 0) & k_odd), 1.0, 0.0)
    codes = jnp.clip(code, -hi, hi).astype(jnp.int8)
    return codes, scale.astype(jnp.float32)


def fake_quantize_weight(w: ArrayLike, bits: int) -> jax.Array:
    """The float32 weights an int-`bits` actor effectively multiplies by: codes * scale (no gradient)."""
    import jax.numpy as jnp

    codes, scale = weight_codes(w, bits)
    return codes.astype(jnp.float32) * scale


def make_qat_dense(bits: int) -> QATDense:
    """`dense(x[..., in], w[in, out]) -> x @ w` as an int-`bits` actor computes it (W`bits`A8 through AQT
    v2, see the module docstring), differentiable in x and w by the straight-through estimator."""
    checked = check_qat_bits(bits, "bits")
    if checked is None:
        raise ValueError("make_qat_dense needs bits in [2, 8], got None")
    import jax.numpy as jnp
    from aqt.jax.v2 import aqt_tensor
    from aqt.jax.v2 import config as aqt_config

    def dense(x: ArrayLike, w: ArrayLike) -> jax.Array:
        x = jnp.asarray(x, jnp.float32)
        w = jnp.asarray(w, jnp.float32)
        if w.ndim != 2 or x.shape[-1] != w.shape[0]:
            raise ValueError(f"qat dense needs x[..., {w.shape[0] if w.ndim else '?'}] and w[in, out], "
                             f"got {x.shape} and {w.shape}")
        lead = x.shape[:-1]
        x2 = x.reshape((-1, x.shape[-1]))
        codes, scale = weight_codes(w, checked)
        rhs_qt = aqt_tensor.QTensor(qvalue=codes, scale=[scale], scale_t=None, bias=[],
                                    dequant_dtype=jnp.float32)
        # A fresh config per call: AQT initialises calibration state inside its custom VJP.
        # allow_dummy_gradients: the rhs QTensor is given (serving style) yet we differentiate; AQT then
        # uses its own quantizer's STE for the rhs cotangent, which is the identity we want.
        dg = aqt_config.dot_general_make(lhs_bits=ACTIVATION_BITS, rhs_bits=checked, allow_dummy_gradients=True)
        out, _ = dg.dg_core(lhs=x2, rhs=w, lhs_qt=None, rhs_qt=rhs_qt, dimension_numbers=_DN)
        return out.reshape((*lead, w.shape[1]))

    return dense


def qat_linear(bits: int) -> type[hk.Linear]:
    """A haiku `Linear` whose matmul is `make_qat_dense(bits)`: same parameter names, shapes and
    initialisers as `hk.Linear`, so QAT and fp32 networks share one parameter tree."""
    import haiku as hk
    import jax.numpy as jnp

    dense = make_qat_dense(bits)

    class QATLinear(hk.Linear):
        """hk.Linear with the deployed int-B matmul (W fake-quantized per output channel, A8, STE)."""

        def __call__(self, inputs: jax.Array, *, precision: jax.lax.Precision | None = None) -> jax.Array:
            del precision  # the arithmetic is fixed by the deployment, not by a matmul precision flag
            inputs = jnp.asarray(inputs)
            if not inputs.shape:
                raise ValueError("Input must not be scalar.")
            input_size = self.input_size = inputs.shape[-1]
            w_init = self.w_init
            if w_init is None:  # hk.Linear's default, so initial params match the fp32 network's
                w_init = hk.initializers.TruncatedNormal(stddev=1.0 / np.sqrt(input_size))
            w = hk.get_parameter("w", [input_size, self.output_size], inputs.dtype, init=w_init)
            out = dense(inputs, w)
            if self.with_bias:
                b = hk.get_parameter("b", [self.output_size], inputs.dtype, init=self.b_init)
                out = out + jnp.broadcast_to(b, out.shape)
            return out

    return QATLinear


def qat_conv2d(bits: int) -> LayerClass:
    """A haiku `Conv2D` (VALID padding, NHWC, the only form `PolicySpec` has) computed as the int-`bits` JAX
    actor computes it: the k x k x C_in windows (`quarl.policy.im2col.conv_windows`, the im2col the JAX runtime runs)
    times the [k*k*C_in, out] weights through `make_qat_dense(bits)`, so each window is quantized to int8 on its
    own and the weights per output channel, with straight-through gradients. Parameter names, shapes and
    initialisers are `hk.Conv2D`'s, so QAT and fp32 networks share one parameter tree. (ONNX actors quantize conv
    inputs with the calibrated static scales instead: they differ from this by activation rounding only.)"""
    import jax.numpy as jnp

    from quarl.nets.conv import Conv2D, conv_parameters  # pylint: disable=import-outside-toplevel (learner side)

    dense = make_qat_dense(bits)

    class QATConv2D(Conv2D):
        """hk.Conv2D's parameters with the deployed int-B conv arithmetic (im2col + W`bits`A8 dot, STE)."""

        def __call__(self, inputs: jax.Array) -> jax.Array:
            inputs = jnp.asarray(inputs)
            if inputs.ndim != 4:
                raise ValueError(f"QAT conv takes [B, H, W, C] inputs, got shape {inputs.shape}")
            k, c_in, out = self.kernel, inputs.shape[-1], self.output_channels
            w, b = conv_parameters(out, k, c_in, inputs.dtype)
            win = conv_windows(inputs.astype(jnp.float32), k, self.stride)
            y = dense(win.reshape(-1, win.shape[-1]), w.reshape(k * k * c_in, out))
            return y.reshape(*win.shape[:3], out) + b

    return QATConv2D
