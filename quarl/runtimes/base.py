"""What every policy runtime shares: the executor interface, input checks, and the "lowering" of a
`QuantizedParams` tree into per-layer arrays a backend can consume directly.

Lowering is done once per `update()` (the actor's load step), on the host, so the per-call path of every
backend is just "check obs, run the compiled network". Both backends read the same lowered form, which is
why the JAX and ONNX networks cannot disagree about what the spec means.
"""
from __future__ import annotations

import abc
import dataclasses
import logging
import threading
from typing import Mapping, NotRequired, TypedDict

import numpy as np
import numpy.typing as npt

from quarl.policy.spec import (
    Activation, Conv2D, Flatten, Layer, LayerNorm, Linear, PolicySpec, TanhToSpec, weight_shape,
)
from quarl.quant.precision import MAX_KERNEL_BITS, Precision, parse_precision
from quarl.quant.quantization import QTensor, QuantizedParams, dequantize

log = logging.getLogger(__name__)


class FormCheck(TypedDict):
    """The record of one kernel form's numerics self-check (`quarl.runtimes.kernel_check.check_form`,
    `quarl.runtimes.onnx_static.check_static_form`): `ok` when its worst relative error against an exact emulation
    (`max_rel_err`) is within `tolerance`; when ONNX Runtime refused the graph, `max_rel_err` is None and `error`
    says why."""

    form: str
    ok: bool
    max_rel_err: float | None
    tolerance: float
    error: NotRequired[str]


class FormChoice(TypedDict, total=False):
    """How an executor's integer kernel form was chosen (`quarl.runtimes.kernel_check.select_form`,
    `quarl.runtimes.onnx_static.select_static_form`): the form in use, the one requested ("auto" when none was), this
    CPU's class, every self-check tried (in order, the last one passed) and whether the requested or most preferred
    form was refused. Those fill every key; an executor that chose no integer form keeps it empty."""

    form: str
    requested: str
    cpu_class: str
    checks: list[FormCheck]
    fallback: bool


@dataclasses.dataclass(frozen=True)
class DenseWeights:
    """One `Linear` (or `Conv2D`) layer in a backend-neutral form.

    Conv2D layers have the same fields with `w` [k, k, C_in, out] (haiku's layout) instead of [in, out].
    kind "float": `w` is [in, out] in the compute dtype (fp32, or fp16/bf16 for a backend that computes in
    them natively). kind "int": `w` holds the int8 codes [in, out] and `scale` the float32 per-output-channel
    step ([out]; a per-tensor scale is broadcast), zero point 0, so `x @ dequant(w) == (x @ codes) * scale`.
    `b` is always float32 [out].
    """

    kind: str
    w: np.ndarray
    b: np.ndarray
    scale: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class LoweredParams:
    """Per-layer arrays keyed by layer name, plus how the precision is realised on this backend."""

    dense: dict[str, DenseWeights]
    norms: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (scale, offset), float32 [width]
    precision: Precision
    # True when the weights were rounded to `precision` but the arithmetic runs in fp32 (no native kernel).
    simulated: bool
    # Calibrated input ranges (lo, hi) of the int layers by name (`quarl.quant.calibration`), for backends that
    # quantize activations with static scales; None when the params carry none.
    activation_ranges: dict[str, tuple[float, float]] | None = None


def layer_widths(spec: PolicySpec) -> list[tuple[Layer, int, int]]:
    """(layer, input width, output width) for every layer, widths as flat value counts per row (a Conv2D's
    are its image sizes H*W*C); also rejects layer kinds no runtime knows."""
    out = []
    for layer, shape_in, shape_out in spec.layer_shapes():
        if isinstance(layer, Activation) and layer.fn not in ("relu", "elu", "tanh"):
            raise ValueError(f"unsupported activation {layer.fn!r} for the policy runtimes")
        if not isinstance(layer, (Linear, LayerNorm, Activation, TanhToSpec, Conv2D, Flatten)):
            raise ValueError(f"unsupported layer {layer!r}: the policy runtimes know Linear, Conv2D, Flatten, "
                             "LayerNorm, Activation and TanhToSpec")
        out.append((layer, int(np.prod(shape_in)), int(np.prod(shape_out))))
    return out


def _float_leaf(leaf: object, shape: tuple[int, ...], what: str) -> np.ndarray:
    arr = np.asarray(leaf)
    if arr.shape != shape:
        raise ValueError(f"{what} has shape {arr.shape}, the spec needs {shape}")
    if not (np.issubdtype(arr.dtype, np.floating) or arr.dtype.name == "bfloat16"):
        raise ValueError(f"{what} has dtype {arr.dtype}; expected floating point")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} contains NaN or inf")
    return arr


def _int_leaf(q: QTensor, shape: tuple[int, ...], bits: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """int8 codes and a flat [out] float32 scale from a symmetric per-output-channel or per-tensor QTensor."""
    if q.bits != bits:
        raise ValueError(f"{what} is quantized to {q.bits} bits but the precision is int{bits}")
    if not q.symmetric or np.any(np.asarray(q.zero_point) != 0):
        raise ValueError(f"{what}: the runtimes need symmetric weight quantization (zero point 0)")
    if q.axis not in (None, len(shape) - 1):
        raise ValueError(f"{what}: weight scales must be per-tensor or per output channel (axis -1), "
                         f"got axis {q.axis}")
    values = np.asarray(q.values)
    if values.shape != shape:
        raise ValueError(f"{what} has shape {values.shape}, the spec needs {shape}")
    if not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{what} has non-integer codes (dtype {values.dtype})")
    scale = np.asarray(q.scale, np.float32)
    out = shape[-1]
    try:
        scale = np.broadcast_to(scale, (1,) * (len(shape) - 1) + (out,)).reshape(out)
    except ValueError:
        raise ValueError(f"{what} has scale shape {np.shape(q.scale)}, not broadcastable to one scale per output "
                         f"channel ({out})") from None
    if not (np.isfinite(scale).all() and (scale > 0).all()):
        raise ValueError(f"{what} has a non-finite or non-positive scale")
    limit = 2 ** (bits - 1) - 1
    if values.dtype != np.int8:
        if values.size and np.abs(values.astype(np.int32)).max() > limit:
            raise ValueError(f"{what} has codes outside the int{bits} range")
        values = values.astype(np.int8)
    return values, np.ascontiguousarray(scale)


def lower_params(spec: PolicySpec, qparams: QuantizedParams, native_floats: tuple[str, ...]) -> LoweredParams:
    """Validate `qparams` against `spec` and convert it to the backend-neutral per-layer form.

    `native_floats` lists the low float precisions ("fp16", "bf16") the backend computes in; others are
    widened to fp32 (simulated). int<=8 weights stay as codes + scales; int9..int16 are dequantized to
    fp32 (simulated) because no CPU kernel multiplies int16 matrices faster than fp32.
    """
    if not isinstance(qparams, QuantizedParams):
        raise ValueError(f"expected quarl.quant.quantization.QuantizedParams, got {type(qparams).__name__}")
    prec = parse_precision(qparams.precision)
    tree = qparams.tree
    if not isinstance(tree, Mapping):
        raise ValueError("QuantizedParams.tree must be a nested mapping (haiku layout)")
    simulated = prec.simulated or (
        prec.kind == "float" and prec.name != "fp32" and prec.name not in native_floats)
    dense: dict[str, DenseWeights] = {}
    norms: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    layer_widths(spec)  # unknown layers and activations fail here
    for layer, shape_in, shape_out in spec.layer_shapes():
        if not isinstance(layer, (Linear, LayerNorm, Conv2D)):
            continue
        width_in, width_out = shape_in[-1], shape_out[-1]
        module = tree.get(layer.name)
        if not isinstance(module, Mapping):
            raise ValueError(f"params have no module {layer.name!r} (have {sorted(tree)})")
        if isinstance(layer, LayerNorm):
            for key in ("scale", "offset"):
                if key not in module:
                    raise ValueError(f"params {layer.name!r} lack {key!r}")
            norms[layer.name] = tuple(  # type: ignore[assignment]
                _float_leaf(module[k], (width_in,), f"{layer.name}/{k}").astype(np.float32)
                for k in ("scale", "offset"))
            continue
        if "w" not in module or "b" not in module:
            raise ValueError(f"params {layer.name!r} need 'w' and 'b', have {sorted(module)}")
        b = _float_leaf(module["b"], (width_out,), f"{layer.name}/b").astype(np.float32)
        shape = weight_shape(layer, shape_in)
        leaf = module["w"]
        what = f"{layer.name}/w"
        if prec.is_int:
            if not isinstance(leaf, QTensor):
                raise ValueError(f"{what} must be a QTensor for precision {prec.name}, got {type(leaf).__name__}")
            if prec.has_int_kernel and leaf.bits > MAX_KERNEL_BITS:
                # A layer kept wider than the integer kernels (`quantize_params(layer_bits=...)`: a 16-bit Q head
                # in an int8 policy) runs its rounded weights in fp32, as an int16 policy does.
                dense[layer.name] = DenseWeights("float", _float_leaf(dequantize(leaf), shape, what), b)
            elif prec.has_int_kernel:
                codes, scale = _int_leaf(leaf, shape, prec.bits, what)
                dense[layer.name] = DenseWeights("int", codes, b, scale)
            else:
                if leaf.bits != prec.bits:
                    raise ValueError(f"{what} is quantized to {leaf.bits} bits but the precision is {prec.name}")
                dense[layer.name] = DenseWeights("float", _float_leaf(dequantize(leaf), shape, what), b)
            continue
        if isinstance(leaf, QTensor):
            raise ValueError(f"{what} is a QTensor but the precision is {prec.name}")
        w = _float_leaf(leaf, shape, what)
        if prec.name == "fp32" or simulated:
            w = w.astype(np.float32)
        elif w.dtype.name != {"fp16": "float16", "bf16": "bfloat16"}[prec.name]:
            raise ValueError(f"{what} has dtype {w.dtype}, expected {prec.name} for precision {prec.name}")
        dense[layer.name] = DenseWeights("float", np.ascontiguousarray(w), b)
    return LoweredParams(dense, norms, prec, simulated, _activation_ranges(spec, qparams, dense))


def _activation_ranges(spec: PolicySpec, qparams: QuantizedParams,
                       dense: dict[str, DenseWeights]) -> dict[str, tuple[float, float]] | None:
    """The calibrated input ranges of the int layers, checked: every int layer of a conv policy needs one
    (its ONNX graph quantizes activations with static scales), and each must be finite with lo <= 0 <= hi."""
    ranges = getattr(qparams, "activation_ranges", None)
    int_layers = [n for n, d in dense.items() if d.kind == "int"]
    if ranges is None:
        if spec.conv_layers and int_layers:
            raise ValueError("int conv policies need calibrated activation ranges (quarl.quant.calibration, payload "
                             "format >= 4); these params carry none")
        return None
    if not isinstance(ranges, Mapping):
        raise ValueError(f"activation_ranges must map layer names to (lo, hi), got {type(ranges).__name__}")
    out = {}
    for name in int_layers:
        if name not in ranges:
            raise ValueError(f"activation_ranges lack layer {name!r} (have {sorted(ranges)})")
        lo, hi = (float(v) for v in np.asarray(ranges[name], np.float64).reshape(2))
        if not (np.isfinite(lo) and np.isfinite(hi) and lo <= 0.0 <= hi):
            raise ValueError(f"activation range of {name!r} must be finite with lo <= 0 <= hi, got ({lo}, {hi})")
        out[name] = (lo, hi)
    return out


def check_obs(obs: npt.ArrayLike, input_dim: int, pixels: bool = False) -> np.ndarray:
    """obs as a C-contiguous float32 [B, input_dim] array (uint8 for `pixels` policies); ValueError on bad shape,
    NaN/inf, or pixels that are not integers in [0, 255].

    Non-finite observations are rejected rather than propagated: an int8 kernel would silently turn a NaN
    into garbage codes, and a NaN action sent to the environment fails far from its cause. uint8 (or bool)
    pixels pass without a copy or a scan: every value they can hold is valid.
    """
    arr = np.asarray(obs)
    if pixels and arr.dtype in (np.uint8, np.bool_):
        arr = arr.view(np.uint8)
    elif pixels:
        values = np.asarray(arr, np.float64)
        if not np.isfinite(values).all():
            raise ValueError("observations must be finite: they contain NaN or inf")
        if ((values < 0) | (values > 255) | (values != np.rint(values))).any():
            raise ValueError("pixel observations must be integers in [0, 255]")
        arr = values.astype(np.uint8)
    else:
        arr = np.asarray(arr, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1] != input_dim:
        raise ValueError(f"observations must have shape [B, {input_dim}], got {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError("observations must have at least one row")
    if not pixels and not np.isfinite(arr).all():
        raise ValueError("observations must be finite: they contain NaN or inf")
    return np.ascontiguousarray(arr)


def policy_rows(observations: npt.ArrayLike, spec: PolicySpec) -> np.ndarray:
    """A batch of observations [K, ...] (images [K, H, W, C] flattened) as `spec`'s executors take them:
    `check_obs`'s validated [K, input_dim] float32, or uint8 for `pixels` policies (an env's frames pass uncopied).
    What actors call before exploring, so a bad observation fails the same whether or not the policy runs."""
    obs = np.asarray(observations)
    if obs.ndim > 2:
        obs = obs.reshape(obs.shape[0], -1)
    if obs.ndim != 2 or obs.shape[1] != spec.input_dim:
        raise ValueError(f"observations must be [K, {spec.input_dim}] (K rows), got shape {obs.shape}")
    return check_obs(obs, spec.input_dim, spec.pixels)


def check_sizes(batch_size: int, threads: int) -> None:
    for name, value in (("batch_size", batch_size), ("threads", threads)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


class PolicyExecutor(abc.ABC):
    """Runs one policy spec at one precision: `executor(obs[B, in]) -> out[B, out]` (float32).

    Subclasses implement `_load` (turn lowered params into backend state) and `_run` (one forward on a
    validated batch). The spec and precision are fixed for the executor's lifetime; `update` swaps weights.
    """

    backend: str = ""
    # Low float precisions this backend computes in natively (others are simulated in fp32).
    native_floats: tuple[str, ...] = ()
    # The integer kernel form in use (None for float precisions) and how it was chosen/self-checked.
    kernel_form: str | None = None
    kernel_check: FormChoice = {}

    def __init__(self, spec: PolicySpec, qparams: QuantizedParams, *, batch_size: int = 1, threads: int = 1):
        self._pending: threading.Thread | None = None
        self.update_error: str | None = None  # why the last background update failed (old weights kept)
        check_sizes(batch_size, threads)
        layer_widths(spec)  # reject unknown layers before any backend work
        self.spec = spec
        self.batch_size = int(batch_size)
        self.threads = int(threads)
        lowered = lower_params(spec, qparams, self.native_floats)
        self.precision: str = lowered.precision.name
        self.simulated: bool = lowered.simulated
        self._load(lowered)
        self.warm_up()

    @property
    def input_dim(self) -> int:
        return self.spec.input_dim

    @property
    def output_dim(self) -> int:
        return self.spec.output_dim

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return self._run(check_obs(obs, self.spec.input_dim, self.spec.pixels))

    def update(self, qparams: QuantizedParams, *, wait: bool = True) -> None:
        """Swap in new weights for the same spec and precision (the actor's load step).

        The weights are validated here, on the calling thread, either way (bad params raise ValueError and
        the old weights stay). `wait=False` builds the new backend state on a background thread and swaps it
        in when ready, so the caller keeps acting meanwhile; every call before the swap runs entirely on the
        old weights, every call after it on the new ones. One update is pending at a time: a new one first
        waits for the previous one.
        """
        lowered = lower_params(self.spec, qparams, self.native_floats)
        if lowered.precision.name != self.precision:
            raise ValueError(f"update() got {lowered.precision.name} params for a {self.precision} executor; "
                             "make a new executor to change precision")
        self.wait_for_update()
        if wait:
            self._load(lowered)
            return
        self._pending = threading.Thread(target=self._load_in_background, args=(lowered,),
                                         name=f"{self.backend}-update", daemon=True)
        self._pending.start()

    def _load_in_background(self, lowered: LoweredParams) -> None:
        try:
            self._load(lowered)
            self.update_error = None
        except Exception as e:  # pylint: disable=broad-except  # keep acting on the old weights, say why
            self.update_error = f"{type(e).__name__}: {e}"
            log.warning("background weight update failed, keeping the previous weights: %s", self.update_error)

    @property
    def update_pending(self) -> bool:
        return self._pending is not None and self._pending.is_alive()

    def wait_for_update(self, timeout: float | None = None) -> bool:
        """Block until a pending `update(wait=False)` is in use (True) or `timeout` passes (False)."""
        if self._pending is not None:
            self._pending.join(timeout)
            if self._pending.is_alive():
                return False
            self._pending = None
        return True

    def warm_up(self) -> None:
        """One call at the expected batch size so compilation / allocation happens at load, not in the
        first environment step."""
        self._run(np.zeros((self.batch_size, self.spec.input_dim), np.uint8 if self.spec.pixels else np.float32))

    def __repr__(self) -> str:
        sim = ", simulated in fp32" if self.simulated else ""
        return f"{type(self).__name__}(backend={self.backend!r}, precision={self.precision!r}{sim})"

    @abc.abstractmethod
    def _load(self, lowered: LoweredParams) -> None:
        """Install the lowered weights (replacing any previous ones)."""

    @abc.abstractmethod
    def _run(self, obs: np.ndarray) -> np.ndarray:
        """Forward pass on a validated float32 [B, input_dim] batch -> float32 [B, output_dim]."""
