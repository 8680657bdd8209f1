"""Uniform integer quantization and low-precision casts of policy weights (host-side NumPy).

The learner trains in fp32; actors run the policy at a lower precision. This module is the single place
that decides how an fp32 haiku parameter tree becomes the tree an actor receives:

* integer precisions: each weight matrix becomes a `QTensor` (integers + float32 scale + int32 zero point),
  symmetric and per-output-channel by default, as in QuaRL/ActorQ and standard int8 deployment;
* fp16 / bf16: weight matrices are cast;
* everything else (biases, LayerNorm scale/offset) stays fp32.

Everything here is plain NumPy on purpose: quantization runs once per broadcast on the learner's host, the
result is serialised (`quarl.quant.payload`), and the runtimes consume the integers directly.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Mapping, TypeAlias

import jax
import ml_dtypes
import numpy as np
import numpy.typing as npt

from quarl.policy.spec import ParamTree
from quarl.quant.precision import MAX_BITS, MIN_BITS, Precision, parse_precision

_F32 = np.float32
_F32_MAX = float(np.finfo(_F32).max)
_F32_TINY = float(np.finfo(_F32).tiny)  # smallest normal float32: scales never go below it


# --------------------------------------------------------------------------------------------------------
# QTensor
# --------------------------------------------------------------------------------------------------------

# A QTensor's arrays: NumPy on the host (`quantize`, payloads, the ONNX runtime), jax.Arrays once a pytree
# transform has moved or traced them (`jax.device_put`, `jax.jit`).
TensorData: TypeAlias = np.ndarray | jax.Array


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)  # array fields: `==` would be ambiguous, so identity equality
class QTensor:
    """A uniformly quantized tensor: `x ~= (values - zero_point) * scale`.

    `values` use the narrowest integer dtype for `bits` (int8/int16 symmetric, uint8/uint16 affine) so the
    payload and the integer kernels see the real storage size. `scale` (float32) and `zero_point` (int32)
    keep the tensor's rank (size 1 on every axis except `axis`), so they broadcast against `values` without
    reshaping. `bits`, `axis` (None = per-tensor) and `symmetric` are static pytree metadata: `jax.tree.map`
    visits only the three arrays. No validation here on purpose: pytree transforms rebuild QTensors with
    arbitrary leaves (tracers, ShapeDtypeStructs); `quantize` is where inputs are checked.
    """

    values: TensorData
    scale: TensorData
    zero_point: TensorData
    bits: int
    axis: int | None
    symmetric: bool

    def tree_flatten(self) -> tuple[tuple[TensorData, TensorData, TensorData], tuple[int, int | None, bool]]:
        return (self.values, self.scale, self.zero_point), (self.bits, self.axis, self.symmetric)

    @classmethod
    def tree_unflatten(cls, aux: tuple[int, int | None, bool],
                       children: tuple[TensorData, TensorData, TensorData]) -> "QTensor":
        return cls(*children, *aux)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(np.shape(self.values))

    @property
    def nbytes(self) -> int:
        """Bytes of values + scale + zero point (what a payload carries for this tensor)."""
        return int(sum(np.asarray(a).nbytes for a in (self.values, self.scale, self.zero_point)))


# One leaf of a parameter tree at an actor precision: a QTensor (a weight matrix at an int precision) or an
# array (fp16/bf16 weight matrices, fp32 biases and LayerNorm parameters, whole fp32 trees).
ParamLeaf: TypeAlias = QTensor | npt.ArrayLike


def storage_dtype(bits: int, symmetric: bool) -> np.dtype:
    """Narrowest integer dtype holding a `bits`-bit code (signed for symmetric, unsigned for affine)."""
    _check_bits(bits)
    if symmetric:
        return np.dtype(np.int8 if bits <= 8 else np.int16)
    return np.dtype(np.uint8 if bits <= 8 else np.uint16)


def qrange(bits: int, symmetric: bool) -> tuple[int, int]:
    """Integer code range. Symmetric drops -2^(b-1) so the grid is symmetric around 0 (no bias towards
    negative values, and int8 x int8 products never hit the -128 * -128 corner)."""
    _check_bits(bits)
    if symmetric:
        m = 2 ** (bits - 1) - 1
        return -m, m
    return 0, 2**bits - 1


def _check_bits(bits: object) -> None:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        raise ValueError(f"bits must be an int in [{MIN_BITS}, {MAX_BITS}], got {bits!r}")
    if not MIN_BITS <= int(bits) <= MAX_BITS:
        raise ValueError(f"bits must be in [{MIN_BITS}, {MAX_BITS}], got {bits}")


def _is_float_dtype(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or dtype in (np.dtype(ml_dtypes.bfloat16),)


def _as_float_array(x: npt.ArrayLike, what: str = "x") -> np.ndarray:
    """Host float64 copy of `x`, rejecting non-float, NaN/inf and beyond-float32 inputs."""
    arr = np.asarray(x)
    if not _is_float_dtype(arr.dtype):
        raise ValueError(f"{what} must be a floating-point array, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} contains NaN or inf")
    if arr.size and np.max(np.abs(arr)) > _F32_MAX:
        raise ValueError(f"{what} has values beyond the float32 range")
    return arr


def _normalize_axis(axis: object, ndim: int) -> int | None:
    if axis is None:
        return None
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ValueError(f"axis must be an int or None, got {axis!r}")
    if not -ndim <= int(axis) < ndim:
        raise ValueError(f"axis {axis} is out of range for a {ndim}-d tensor")
    return int(axis) % ndim


def _scale_to_f32(scale64: np.ndarray) -> np.ndarray:
    """float32 scale that is >= the exact one (so max|x| / scale never exceeds the code range) and a
    normal number (so a subnormal or zero range never yields a zero or imprecise step)."""
    s = scale64.astype(_F32)
    with np.errstate(over="ignore"):  # nextafter(f32 max) is evaluated but never selected: scale64 <= max
        s = np.where(s.astype(np.float64) < scale64, np.nextafter(s, _F32(np.inf)), s)
    return np.maximum(s, _F32(_F32_TINY)).astype(_F32)


def quantize(x: npt.ArrayLike, bits: int, *, symmetric: bool = True, axis: int | None = None) -> QTensor:
    """Uniformly quantize a float tensor to `bits` bits, rounding to nearest-even (`np.rint`).

    symmetric: zero point 0, `scale = max|x| / (2^(b-1) - 1)`, codes in `[-(2^(b-1)-1), 2^(b-1)-1]`;
    elementwise error <= scale / 2.
    affine: the range [min, max] is widened to include 0 (so 0 -- ReLU outputs, padding -- is exact),
    `scale = (max - min) / (2^b - 1)`, integer zero point; error within one step.
    axis: None = one scale for the tensor; otherwise the channel axis that keeps one scale per index
    (negative allowed; stored normalised). All-zero ranges get scale 1.0 so nothing divides by zero.
    """
    _check_bits(bits)
    bits = int(bits)
    symmetric = bool(symmetric)
    arr = _as_float_array(x)
    ax = _normalize_axis(axis, arr.ndim)
    reduce_axes = tuple(i for i in range(arr.ndim) if i != ax)
    lo_code, hi_code = qrange(bits, symmetric)
    # `initial=0` makes empty tensors well defined and, for affine, widens the range to include 0.
    if symmetric:
        amax = np.max(np.abs(arr), axis=reduce_axes, keepdims=True, initial=0.0)
        scale = _scale_to_f32(amax / hi_code)
        scale = np.where(amax == 0.0, _F32(1.0), scale).astype(_F32)
        zero_point = np.zeros(scale.shape, np.int32)
        codes = np.clip(np.rint(arr / scale.astype(np.float64)), lo_code, hi_code)
    else:
        lo = np.min(arr, axis=reduce_axes, keepdims=True, initial=0.0)
        hi = np.max(arr, axis=reduce_axes, keepdims=True, initial=0.0)
        span = hi - lo
        scale = _scale_to_f32(span / hi_code)
        scale = np.where(span == 0.0, _F32(1.0), scale).astype(_F32)
        zero_point = np.clip(np.rint(-lo / scale.astype(np.float64)), lo_code, hi_code).astype(np.int32)
        codes = np.clip(np.rint(arr / scale.astype(np.float64)) + zero_point, lo_code, hi_code)
    values = np.asarray(codes).astype(storage_dtype(bits, symmetric))
    return QTensor(values, scale, zero_point, bits, ax, symmetric)


def dequantize(q: QTensor) -> np.ndarray:
    """`(values - zero_point) * scale` as float32 (computed in float64, then rounded once)."""
    if not isinstance(q, QTensor):
        raise ValueError(f"dequantize expects a QTensor, got {type(q).__name__}")
    values = np.asarray(q.values).astype(np.float64)
    out = (values - np.asarray(q.zero_point, np.float64)) * np.asarray(q.scale, np.float64)
    # Rounding the scale up may push the extreme code a hair past float32's max; keep the result finite.
    return np.clip(out, -_F32_MAX, _F32_MAX).astype(_F32)


def fake_quantize(x: npt.ArrayLike, bits: int, *, symmetric: bool = True, axis: int | None = None) -> np.ndarray:
    """`dequantize(quantize(x, ...))`: the fp32 tensor an integer kernel effectively computes with."""
    return dequantize(quantize(x, bits, symmetric=symmetric, axis=axis))


# --------------------------------------------------------------------------------------------------------
# Parameter trees
# --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)  # holds arrays: identity equality, like QTensor
class QuantizedParams:
    """A policy parameter tree at an actor precision.

    `tree` has the haiku layout (module -> name -> leaf); weight matrices are `QTensor`s (int precisions) or
    fp16/bf16 arrays, all other leaves fp32. `precision` is the canonical name (see `ALL_PRECISIONS`).
    """

    tree: dict
    precision: str
    per_channel: bool
    # Calibrated input ranges {layer name: float32 [lo, hi]} of the int layers of conv policies
    # (`quarl.quant.calibration`): their actors quantize activations with static scales. None for MLP policies.
    activation_ranges: dict | None = None


def tree_items(tree: Mapping, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], ParamLeaf]]:
    """(key path, leaf) for every leaf of a nested mapping, in sorted-key order (deterministic payloads).
    QTensors are leaves here: they are one quantized weight, not three."""
    for key in sorted(tree):
        value = tree[key]
        path = (*prefix, str(key))
        if isinstance(value, Mapping):
            yield from tree_items(value, path)
        else:
            yield path, value


def path_str(path: tuple[str, ...]) -> str:
    return "/".join(path)


def is_quantized_leaf(path: tuple[str, ...], leaf: npt.ArrayLike) -> bool:
    """Which leaves get the actor precision: weight matrices (`w`, ndim >= 2). The rest stays fp32."""
    return bool(path) and path[-1] == "w" and np.ndim(leaf) >= 2


def _map_tree(tree: Mapping, fn: Callable[[tuple[str, ...], ParamLeaf], object], prefix: tuple[str, ...] = ()) -> dict:
    out = {}
    for key in sorted(tree):
        value = tree[key]
        path = (*prefix, str(key))
        out[key] = _map_tree(value, fn, path) if isinstance(value, Mapping) else fn(path, value)
    return out


def _checked_leaf(path: tuple[str, ...], leaf: object) -> np.ndarray:
    arr = np.asarray(leaf)
    if not _is_float_dtype(arr.dtype):
        raise ValueError(f"param {path_str(path)!r} has dtype {arr.dtype}; expected floating point")
    if not np.all(np.isfinite(arr.astype(np.float64))):
        raise ValueError(f"param {path_str(path)!r} contains NaN or inf")
    return arr


def quantize_params(params: ParamTree, precision: str | Precision, per_channel: bool = True,
                    layer_bits: Mapping[str, int] | None = None) -> QuantizedParams:
    """Convert an fp32 haiku params tree to `precision` for actors.

    `layer_bits` {module: bits} keeps the weights of those modules at a wider integer width than an int
    `precision`'s (mixed precision per layer, e.g. a DQN's Q head at 16 bits in an int8 policy: its QTensor says
    16 bits, the tree's precision stays int8; the runtimes run a layer wider than the integer kernels dequantized).

    Only weight matrices (`w`, ndim >= 2) change. int<b>: symmetric `QTensor`, one scale per output column
    (last axis, haiku's `[in, out]` layout) when `per_channel`, else one per tensor. fp16/bf16: a cast.
    Biases and LayerNorm scale/offset stay fp32 because (1) they are a tiny fraction of the bytes and
    FLOPs, so quantizing them buys nothing; (2) a bias is added to the dequantized int32 accumulator
    (scale_x * scale_w * acc), i.e. in float, so a float bias costs nothing extra; and (3) LayerNorm
    statistics are precision-sensitive. This matches QuaRL and standard int8 deployment.
    Raises ValueError (naming the leaf) on NaN/inf, non-float leaves, or fp16 overflow.
    """
    prec = parse_precision(precision)
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a nested mapping (haiku tree), got {type(params).__name__}")
    checked = _map_tree(params, _checked_leaf)  # validate everything before converting anything
    wider = _check_layer_bits(layer_bits, prec, checked)

    def convert(path: tuple[str, ...], arr: np.ndarray) -> np.ndarray | QTensor:
        if not is_quantized_leaf(path, arr) or prec.name == "fp32":
            return arr.astype(_F32)  # astype copies: the caller's arrays are never aliased
        if prec.is_int:
            bits = wider.get(path[0], prec.bits)
            return quantize(arr, bits, symmetric=True, axis=-1 if per_channel else None)
        with np.errstate(over="ignore"):  # overflow is reported below, naming the leaf
            cast = arr.astype(np.float16 if prec.name == "fp16" else ml_dtypes.bfloat16)
        if not np.all(np.isfinite(cast.astype(_F32))):
            raise ValueError(f"param {path_str(path)!r} overflows {prec.name}")
        return cast

    return QuantizedParams(_map_tree(checked, convert), prec.name, bool(per_channel))


def _check_layer_bits(layer_bits: Mapping[str, int] | None, prec: Precision, tree: Mapping) -> dict[str, int]:
    """`layer_bits` checked: modules of the tree, an int precision, widths above it up to MAX_BITS."""
    if not layer_bits:
        return {}
    if not prec.is_int:
        raise ValueError(f"layer_bits keep layers at a wider integer width; precision {prec.name} is not an integer")
    out = {}
    for name, bits in layer_bits.items():
        if name not in tree:
            raise ValueError(f"layer_bits: no module {name!r} in the params (have {sorted(tree)})")
        _check_bits(bits)
        if int(bits) <= prec.bits:
            raise ValueError(f"layer_bits: {name!r} at {bits} bits is not wider than {prec.name}")
        out[name] = int(bits)
    return out


def dequantize_params(qp: QuantizedParams) -> dict:
    """The fp32 tree an actor's low-precision weights stand for (QTensors dequantized, casts widened)."""
    if not isinstance(qp, QuantizedParams):
        raise ValueError(f"dequantize_params expects QuantizedParams, got {type(qp).__name__}")

    def widen(path: tuple[str, ...], leaf: ParamLeaf) -> np.ndarray:
        if isinstance(leaf, QTensor):
            if not np.all(np.isfinite(np.asarray(leaf.scale, np.float64))):
                raise ValueError(f"param {path_str(path)!r} has a NaN or inf scale")
            return dequantize(leaf)
        return _checked_leaf(path, leaf).astype(_F32)

    return _map_tree(qp.tree, widen)


def fake_quantize_params(params: ParamTree, precision: str | Precision, per_channel: bool = True) -> dict:
    """fp32 tree with the weights rounded as `precision` would round them (post-training-quant evaluation)."""
    return dequantize_params(quantize_params(params, precision, per_channel))
