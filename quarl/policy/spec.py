"""Policy network descriptions shared by the learner (haiku) and the actor runtimes (JAX, ONNX).

An actor never receives Python code from the learner: it receives a `PolicySpec` (plain data, JSON-able)
plus a parameter tree. Image policies (MinAtar, ALE) set `PolicySpec.input_shape` (H, W, C): observations
still arrive flat ([B, input_dim], C-order of [H, W, C]), every runtime reshapes them to NHWC, `Conv2D`
layers (VALID padding, haiku's `w` [k, k, C_in, C_out]) run on the image and `Flatten` hands the [H, W, C]
values, in that order, to the Linear layers after it. Every runtime builds the same computation from the
spec, so the haiku network the learner trains and the int8 graph an actor runs cannot drift apart.
Parameter names are the layer names: `hk.transform(lambda x: haiku_forward(spec)(x))` yields `{"linear_0": {"w", "b"}, "layer_norm": {...}}`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Iterable, Mapping, Sequence, TypeAlias, Union, cast

import numpy as np
import numpy.typing as npt

ACTIVATIONS = ("relu", "elu", "tanh")
INITS = ("variance_scaling", "uniform_scaling")
# Acme's LayerNormMLP initialiser (acme/jax/networks/continuous.py: `hk.initializers.UniformScaling(0.333)`),
# used by D4PG's policy torso and critic.
ACME_UNIFORM_SCALE = 0.333

# A policy's parameters in haiku's layout: {layer name: {"w" | "b" | "scale" | "offset": array}} (`Linear` and
# `Conv2D` layers have `w` and `b`, `LayerNorm` `scale` and `offset`). Leaves are NumPy arrays on actors and
# jax.Arrays on the learner; every consumer converts them (np.asarray, jnp.asarray) and checks dtype and shape.
ParamTree: TypeAlias = Mapping[str, Mapping[str, npt.ArrayLike]]


@dataclasses.dataclass(frozen=True)
class Linear:
    """Dense layer `y = x @ w + b`; `w` has shape [in, out] (haiku's layout)."""

    name: str
    out: int
    # Weight init (learner side only; runtimes ignore it). None = haiku's default. With `init` =
    # "variance_scaling": VarianceScaling(init_scale, fan_in, truncated normal), D4PG's near-zero last policy
    # layer (1e-4) so that early actions sit near the middle of the spec; "uniform_scaling":
    # UniformScaling(init_scale), U(+-init_scale * sqrt(3 / fan_in)), Acme's LayerNormMLP layers (0.333).
    init_scale: float | None = None
    init: str = "variance_scaling"


@dataclasses.dataclass(frozen=True)
class LayerNorm:
    """LayerNorm over the last axis with learned scale and offset (haiku defaults, eps=1e-5)."""

    name: str


@dataclasses.dataclass(frozen=True)
class Activation:
    fn: str  # one of ACTIVATIONS


@dataclasses.dataclass(frozen=True)
class TanhToSpec:
    """tanh, then an affine map of [-1, 1] onto [minimum, maximum] (per action dimension)."""

    minimum: tuple[float, ...]
    maximum: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Conv2D:
    """2-D convolution over an NHWC image, VALID padding (the DQN torsos use no padding): `w` has shape
    [kernel, kernel, C_in, out] and `b` [out] (haiku's `hk.Conv2D` layout)."""

    name: str
    out: int
    kernel: int
    stride: int = 1


@dataclasses.dataclass(frozen=True)
class Flatten:
    """[B, H, W, C] -> [B, H * W * C] in C order (haiku's `hk.Flatten`)."""


Layer = Union[Linear, LayerNorm, Activation, TanhToSpec, Conv2D, Flatten]
_KINDS = {"linear": Linear, "layer_norm": LayerNorm, "activation": Activation, "tanh_to_spec": TanhToSpec,
          "conv2d": Conv2D, "flatten": Flatten}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}
LAYER_NORM_EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """A feed-forward policy: an input width and an ordered tuple of layers."""

    input_dim: int
    layers: tuple[Layer, ...]
    # (H, W, C) for image policies: the flat [B, input_dim] observations are this image, C-order. None: a vector.
    input_shape: tuple[int, ...] | None = None
    # A factor every observation value is multiplied by first (1/255 for Atari frames), None = 1.
    input_scale: float | None = None
    # Vector policies: per-feature observation bounds ((low, ...), (high, ...)) that every runtime first maps onto
    # [-1, 1] (`input_affine`), so features of very different ranges (MountainCar's position in [-1.2, 0.6] and
    # velocity in [-0.07, 0.07]) get the first layer's int8 weight and activation ranges alike. None: as they come.
    input_bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    # Image policies whose observations are uint8 pixels (MinAtar's 0/1 cells, ALE's 0..255 frames): every runtime
    # takes them as uint8 (no float copy of the frame per step), and the static int8 graph uses the pixel values
    # themselves as its first layer's uint8 codes (scale `input_scale` or 1, zero point 0): exact, and no
    # QuantizeLinear pass over the frame.
    pixels: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.input_dim, (int, np.integer)) or self.input_dim <= 0:
            raise ValueError(f"PolicySpec.input_dim must be a positive int, got {self.input_dim!r}")
        if self.input_shape is not None:
            shape = tuple(self.input_shape)
            if len(shape) != 3 or not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape):
                raise ValueError(f"PolicySpec.input_shape must be three positive ints (H, W, C), got {shape!r}")
            if int(np.prod(shape)) != self.input_dim:
                raise ValueError(f"PolicySpec.input_shape {shape} has {int(np.prod(shape))} values, "
                                 f"input_dim is {self.input_dim}")
            object.__setattr__(self, "input_shape", tuple(int(d) for d in shape))
        if self.input_scale is not None:
            if isinstance(self.input_scale, bool) or not isinstance(self.input_scale, (int, float, np.floating)) \
                    or not np.isfinite(self.input_scale) or self.input_scale <= 0:
                raise ValueError(f"PolicySpec.input_scale must be a positive finite number, got {self.input_scale!r}")
            object.__setattr__(self, "input_scale", float(self.input_scale))
        if self.input_bounds is not None:
            object.__setattr__(self, "input_bounds", _checked_bounds(self.input_bounds, self))
        if not isinstance(self.pixels, (bool, np.bool_)):
            raise ValueError(f"PolicySpec.pixels must be a bool, got {self.pixels!r}")
        object.__setattr__(self, "pixels", bool(self.pixels))
        if self.pixels and (self.input_shape is None or self.input_bounds is not None):
            raise ValueError("PolicySpec.pixels needs an image input_shape and no input_bounds")
        names = set()
        for layer in self.layers:
            if type(layer) not in _KIND_OF:
                raise ValueError(f"unsupported layer {layer!r}: supported kinds are {sorted(_KINDS)}")
            if isinstance(layer, (Linear, LayerNorm, Conv2D)):
                if layer.name in names:
                    raise ValueError(f"duplicate layer name {layer.name!r}")
                names.add(layer.name)
            if isinstance(layer, Linear) and layer.init not in INITS:
                raise ValueError(f"layer {layer.name!r}: unsupported init {layer.init!r}: supported are {INITS}")
            if isinstance(layer, Activation) and layer.fn not in ACTIVATIONS:
                raise ValueError(f"unsupported activation {layer.fn!r}: supported are {ACTIVATIONS}")
        shapes = self.layer_shapes()
        if shapes and len(shapes[-1][2]) != 1:
            raise ValueError("a policy must end in a vector: add Flatten (and a Linear head) after its convolutions")

    def layer_shapes(self) -> list[tuple[Layer, tuple[int, ...], tuple[int, ...]]]:
        """(layer, per-row input shape, per-row output shape) for every layer; ValueError where shapes do not fit
        (a Linear on an image, a Conv2D on a vector, a kernel larger than its input, ...)."""
        shape: tuple[int, ...] = self.input_shape or (int(self.input_dim),)
        out = []
        for layer in self.layers:
            new = shape
            if isinstance(layer, Conv2D):
                for field in ("out", "kernel", "stride"):
                    v = getattr(layer, field)
                    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                        raise ValueError(f"layer {layer.name!r}: {field} must be a positive int, got {v!r}")
                if len(shape) != 3:
                    raise ValueError(f"layer {layer.name!r}: Conv2D needs an image input (H, W, C), got {shape}")
                h, w, _ = shape
                if layer.kernel > h or layer.kernel > w:
                    raise ValueError(f"layer {layer.name!r}: kernel {layer.kernel} is larger than its input {shape}")
                new = ((h - layer.kernel) // layer.stride + 1, (w - layer.kernel) // layer.stride + 1, int(layer.out))
            elif isinstance(layer, Flatten):
                new = (int(np.prod(shape)),)
            elif isinstance(layer, (Linear, LayerNorm, TanhToSpec)):
                what = getattr(layer, "name", "tanh_to_spec")
                if len(shape) != 1:
                    raise ValueError(f"layer {what!r} needs a vector input, got {shape}: Flatten first")
                if isinstance(layer, Linear):
                    if layer.out <= 0:
                        raise ValueError(f"layer {layer.name!r}: out must be positive, got {layer.out}")
                    new = (int(layer.out),)
                if isinstance(layer, TanhToSpec):
                    if len(layer.minimum) != shape[0] or len(layer.maximum) != shape[0]:
                        raise ValueError(f"TanhToSpec bounds have {len(layer.minimum)} dims, layer width is "
                                         f"{shape[0]}")
                    if not all(lo < hi for lo, hi in zip(layer.minimum, layer.maximum)):
                        raise ValueError("TanhToSpec needs minimum < maximum in every dimension")
            out.append((layer, shape, new))
            shape = new
        return out

    def param_shapes(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """The fp32 (haiku) parameter tree this spec runs, as shapes: a Linear's or Conv2D's `w` and `b`, a
        LayerNorm's `scale` and `offset` (what a saved policy's tree is checked against before it is written)."""
        out: dict[str, dict[str, tuple[int, ...]]] = {}
        for layer, shape_in, shape_out in self.layer_shapes():
            if isinstance(layer, (Linear, Conv2D)):
                out[layer.name] = {"w": weight_shape(layer, shape_in), "b": (shape_out[-1],)}
            elif isinstance(layer, LayerNorm):
                out[layer.name] = {"scale": (shape_in[-1],), "offset": (shape_in[-1],)}
        return out

    @property
    def output_dim(self) -> int:
        shapes = self.layer_shapes()
        return int(shapes[-1][2][0]) if shapes else int(self.input_dim)

    @property
    def linear_layers(self) -> list[Linear]:
        return [layer for layer in self.layers if isinstance(layer, Linear)]

    @property
    def conv_layers(self) -> list[Conv2D]:
        return [layer for layer in self.layers if isinstance(layer, Conv2D)]

    def to_dict(self) -> dict:
        """JSON/msgpack-able form (travels inside weight payloads and checkpoints)."""
        layers = []
        for layer in self.layers:
            d = {"kind": _KIND_OF[type(layer)], **dataclasses.asdict(layer)}
            for key in ("minimum", "maximum"):
                if key in d:
                    d[key] = [float(v) for v in d[key]]
            layers.append(d)
        out = {"input_dim": int(self.input_dim), "layers": layers}
        if self.input_shape is not None:  # absent for vector policies: their digests stay as they were
            out["input_shape"] = list(self.input_shape)
        if self.input_scale is not None:
            out["input_scale"] = float(self.input_scale)
        if self.input_bounds is not None:  # absent without bounds: older specs keep their digests
            out["input_bounds"] = [list(side) for side in self.input_bounds]
        if self.pixels:  # absent for float inputs: their digests stay as they were
            out["pixels"] = True
        return out

    def input_affine(self) -> tuple[np.ndarray, np.ndarray] | None:
        """float32 (offset, scale) with `(x - offset) * scale` mapping `input_bounds` onto [-1, 1], or None. Made
        here once, so the learner and every runtime subtract and multiply by the very same float32 constants."""
        if self.input_bounds is None:
            return None
        low, high = (np.asarray(side, np.float64) for side in self.input_bounds)
        return ((low + high) / 2).astype(np.float32), (2.0 / (high - low)).astype(np.float32)

    def digest(self) -> str:
        """SHA-256 (hex) of the canonical JSON of `to_dict()`: what actor payloads carry instead of the spec
        itself, enough for an actor to refuse weights made for another policy."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @classmethod
    def from_dict(cls, d: dict) -> "PolicySpec":
        try:
            layers = []
            for item in d["layers"]:
                item = dict(item)
                kind = item.pop("kind")
                if kind not in _KINDS:
                    raise ValueError(f"unsupported layer kind {kind!r}: supported are {sorted(_KINDS)}")
                if kind == "tanh_to_spec":
                    item = {k: tuple(float(v) for v in item[k]) for k in ("minimum", "maximum")}
                layers.append(_KINDS[kind](**item))
            shape = d.get("input_shape")
            return cls(input_dim=int(d["input_dim"]), layers=tuple(layers),
                       input_shape=None if shape is None else tuple(int(v) for v in shape),
                       input_scale=d.get("input_scale"), input_bounds=d.get("input_bounds"),
                       pixels=d.get("pixels", False))
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed policy spec: {e}") from None


def weight_shape(layer: Linear | Conv2D, shape_in: tuple[int, ...]) -> tuple[int, ...]:
    """The `w` shape a Linear ([in, out]) or Conv2D ([k, k, C_in, out]) layer takes on input `shape_in`."""
    if isinstance(layer, Conv2D):
        return (layer.kernel, layer.kernel, shape_in[-1], layer.out)
    return (shape_in[0], layer.out)


def layer_norm_mlp_policy(
    obs_dim: int, hidden: Sequence[int], action_min: Sequence[float], action_max: Sequence[float]
) -> PolicySpec:
    """D4PG's policy (Acme's control-suite network): Linear -> LayerNorm -> tanh, then ELU MLP layers,
    then a near-zero-initialised Linear to the action size, tanh rescaled to the action spec. Initialised as
    Acme's `LayerNormMLP` + `NearZeroInitializedLinear` (acme/jax/networks/continuous.py)."""
    if not hidden:
        raise ValueError("layer_norm_mlp_policy needs at least one hidden layer")
    torso = {"init_scale": ACME_UNIFORM_SCALE, "init": "uniform_scaling"}
    layers: list[Layer] = [Linear("linear_0", hidden[0], **torso), LayerNorm("layer_norm"), Activation("tanh")]
    for i, h in enumerate(hidden[1:], start=1):
        layers += [Linear(f"linear_{i}", h, **torso), Activation("elu")]
    layers += [
        Linear(f"linear_{len(hidden)}", len(action_min), init_scale=1e-4),
        TanhToSpec(tuple(float(v) for v in action_min), tuple(float(v) for v in action_max)),
    ]
    return PolicySpec(obs_dim, tuple(layers))


def parse_bounds(bounds: object) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-feature bounds ((lows), (highs)) as two tuples of floats (lists arrive from JSON/CLI); ValueError
    (naming no field: callers add theirs) unless as many finite lows as highs, each low < high."""
    try:
        # Untrusted (JSON, flags): whatever is not two iterables of numbers raises TypeError or ValueError here.
        low, high = (tuple(float(v) for v in side) for side in cast(Iterable[Iterable[float]], bounds))
    except (TypeError, ValueError):
        raise ValueError(f"must be (low values, high values), got {bounds!r}") from None
    if len(low) != len(high) or not low:
        raise ValueError(f"needs as many lows as highs, got {bounds!r}")
    if not np.all(np.isfinite(low + high)) or any(h <= lo for lo, h in zip(low, high)):
        raise ValueError(f"must be finite with low < high, got {bounds!r}")
    return low, high


def _checked_bounds(bounds: Iterable[Iterable[float]],
                   spec: "PolicySpec") -> tuple[tuple[float, ...], tuple[float, ...]]:
    """`PolicySpec.input_bounds` parsed (`parse_bounds`), one pair per feature of a vector policy."""
    try:
        low, high = parse_bounds(bounds)
    except ValueError as e:
        raise ValueError(f"PolicySpec.input_bounds {e}") from None
    if spec.input_shape is not None or len(low) != spec.input_dim:
        raise ValueError(f"PolicySpec.input_bounds needs {spec.input_dim} lows and highs of a vector policy")
    return low, high


def mlp_q_network(obs_dim: int, hidden: Sequence[int], num_actions: int,
                  input_bounds: Sequence[Sequence[float]] | None = None, activation: str = "relu") -> PolicySpec:
    """DQN's Q-network: an MLP (ReLU unless `activation` says otherwise), linear head (a Q-value per action);
    `input_bounds` as in `PolicySpec`."""
    layers: list[Layer] = []
    for i, h in enumerate(hidden):
        layers += [Linear(f"linear_{i}", h), Activation(activation)]
    layers.append(Linear(f"linear_{len(hidden)}", num_actions))
    return PolicySpec(obs_dim, tuple(layers), input_bounds=input_bounds)


def minatar_q_network(input_shape: Sequence[int], num_actions: int, channels: int = 16,
                      hidden: int = 128) -> PolicySpec:
    """The MinAtar authors' DQN (Young & Tian, 2019): one 3x3 conv of 16 channels, stride 1, ReLU, a 128-unit
    ReLU layer, then one Q-value per action."""
    layers: tuple[Layer, ...] = (Conv2D("conv_0", channels, 3, 1), Activation("relu"), Flatten(),
                                 Linear("linear_0", hidden), Activation("relu"), Linear("linear_1", num_actions))
    return PolicySpec(int(np.prod(input_shape)), layers, tuple(input_shape), pixels=True)


def nature_q_network(input_shape: Sequence[int], num_actions: int, input_scale: float | None = 1 / 255) -> PolicySpec:
    """The Nature DQN torso (Mnih et al., 2015) on 84x84x4 frames: convs 32 8x8/4, 64 4x4/2, 64 3x3/1 with ReLUs,
    a 512-unit ReLU layer, then one Q-value per action; the uint8 pixels scaled by `input_scale` (to [0, 1])."""
    layers: tuple[Layer, ...] = (
        Conv2D("conv_0", 32, 8, 4), Activation("relu"), Conv2D("conv_1", 64, 4, 2), Activation("relu"),
        Conv2D("conv_2", 64, 3, 1), Activation("relu"), Flatten(),
        Linear("linear_0", 512), Activation("relu"), Linear("linear_1", num_actions))
    return PolicySpec(int(np.prod(input_shape)), layers, tuple(input_shape), input_scale, pixels=True)
