"""Policy network descriptions shared by the learner (haiku) and the actor runtimes (JAX, ONNX).

An actor never receives Python code from the learner: it receives a `PolicySpec` (plain data, JSON-able)
plus a parameter tree. Every runtime builds the same computation from the spec, so the haiku network the
learner trains and the int8 graph an actor runs cannot drift apart. Parameter names are the layer names:
`hk.transform(lambda x: haiku_forward(spec)(x))` yields `{"linear_0": {"w", "b"}, "layer_norm": {...}}`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Callable, Sequence, Union

import numpy as np

ACTIVATIONS = ("relu", "elu", "tanh")
INITS = ("variance_scaling", "uniform_scaling")
# Acme's LayerNormMLP initialiser (acme/jax/networks/continuous.py: `hk.initializers.UniformScaling(0.333)`),
# used by D4PG's policy torso and critic.
ACME_UNIFORM_SCALE = 0.333


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


Layer = Union[Linear, LayerNorm, Activation, TanhToSpec]
_KINDS = {"linear": Linear, "layer_norm": LayerNorm, "activation": Activation, "tanh_to_spec": TanhToSpec}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}
LAYER_NORM_EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """A feed-forward policy: an input width and an ordered tuple of layers."""

    input_dim: int
    layers: tuple[Layer, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.input_dim, (int, np.integer)) or self.input_dim <= 0:
            raise ValueError(f"PolicySpec.input_dim must be a positive int, got {self.input_dim!r}")
        names = set()
        width = self.input_dim
        for layer in self.layers:
            if type(layer) not in _KIND_OF:
                raise ValueError(f"unsupported layer {layer!r}: supported kinds are {sorted(_KINDS)}")
            if isinstance(layer, (Linear, LayerNorm)):
                if layer.name in names:
                    raise ValueError(f"duplicate layer name {layer.name!r}")
                names.add(layer.name)
            if isinstance(layer, Linear):
                if layer.out <= 0:
                    raise ValueError(f"layer {layer.name!r}: out must be positive, got {layer.out}")
                width = layer.out
                if layer.init not in INITS:
                    raise ValueError(f"layer {layer.name!r}: unsupported init {layer.init!r}: supported are {INITS}")
            if isinstance(layer, Activation) and layer.fn not in ACTIVATIONS:
                raise ValueError(f"unsupported activation {layer.fn!r}: supported are {ACTIVATIONS}")
            if isinstance(layer, TanhToSpec):
                if len(layer.minimum) != width or len(layer.maximum) != width:
                    raise ValueError(f"TanhToSpec bounds have {len(layer.minimum)} dims, layer width is {width}")
                if not all(lo < hi for lo, hi in zip(layer.minimum, layer.maximum)):
                    raise ValueError("TanhToSpec needs minimum < maximum in every dimension")

    @property
    def output_dim(self) -> int:
        width = self.input_dim
        for layer in self.layers:
            if isinstance(layer, Linear):
                width = layer.out
        return width

    @property
    def linear_layers(self) -> list[Linear]:
        return [layer for layer in self.layers if isinstance(layer, Linear)]

    def to_dict(self) -> dict:
        """JSON/msgpack-able form (travels inside weight payloads and checkpoints)."""
        layers = []
        for layer in self.layers:
            d = {"kind": _KIND_OF[type(layer)], **dataclasses.asdict(layer)}
            for key in ("minimum", "maximum"):
                if key in d:
                    d[key] = [float(v) for v in d[key]]
            layers.append(d)
        return {"input_dim": int(self.input_dim), "layers": layers}

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
            return cls(input_dim=int(d["input_dim"]), layers=tuple(layers))
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed policy spec: {e}") from None


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


def mlp_q_network(obs_dim: int, hidden: Sequence[int], num_actions: int) -> PolicySpec:
    """DQN's Q-network: ReLU MLP with a linear head (one Q-value per discrete action)."""
    layers: list[Layer] = []
    for i, h in enumerate(hidden):
        layers += [Linear(f"linear_{i}", h), Activation("relu")]
    layers.append(Linear(f"linear_{len(hidden)}", num_actions))
    return PolicySpec(obs_dim, tuple(layers))


def haiku_forward(spec: PolicySpec, qat_bits: int | None = None) -> Callable:
    """The spec as a haiku function; call it inside `hk.transform` (top level, so names are unprefixed).

    `qat_bits` (2..8) makes every Linear compute as an int-`qat_bits` actor does (fake-quantized weights,
    8-bit activations, straight-through gradients; see `quarl.qat`) for quantization-aware training. The
    parameter tree and its initialisation are the same either way."""
    import haiku as hk
    import jax
    import jax.numpy as jnp

    linear_cls = hk.Linear
    if qat_bits is not None:
        from quarl.qat import qat_linear  # pylint: disable=import-outside-toplevel  (AQT only when used)
        linear_cls = qat_linear(qat_bits)

    def forward(x):
        for layer in spec.layers:
            if isinstance(layer, Linear):
                w_init = None
                if layer.init_scale is not None and layer.init == "uniform_scaling":
                    w_init = hk.initializers.UniformScaling(layer.init_scale)
                elif layer.init_scale is not None:
                    w_init = hk.initializers.VarianceScaling(layer.init_scale, "fan_in", "truncated_normal")
                x = linear_cls(layer.out, w_init=w_init, name=layer.name)(x)
            elif isinstance(layer, LayerNorm):
                x = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, eps=LAYER_NORM_EPS,
                                 name=layer.name)(x)
            elif isinstance(layer, Activation):
                x = {"relu": jax.nn.relu, "elu": jax.nn.elu, "tanh": jnp.tanh}[layer.fn](x)
            elif isinstance(layer, TanhToSpec):
                lo = jnp.asarray(layer.minimum, x.dtype)
                hi = jnp.asarray(layer.maximum, x.dtype)
                x = lo + (jnp.tanh(x) + 1.0) * 0.5 * (hi - lo)
        return x

    return forward


def reference_apply(spec: PolicySpec, params: dict, obs: np.ndarray) -> np.ndarray:
    """Float64 NumPy evaluation of the spec: the ground truth the runtimes are tested against."""
    x = np.asarray(obs, np.float64)
    for layer in spec.layers:
        if isinstance(layer, Linear):
            p = params[layer.name]
            x = x @ np.asarray(p["w"], np.float64) + np.asarray(p["b"], np.float64)
        elif isinstance(layer, LayerNorm):
            p = params[layer.name]
            mean = x.mean(-1, keepdims=True)
            var = x.var(-1, keepdims=True)
            x = (x - mean) / np.sqrt(var + LAYER_NORM_EPS)
            x = x * np.asarray(p["scale"], np.float64) + np.asarray(p["offset"], np.float64)
        elif isinstance(layer, Activation):
            if layer.fn == "relu":
                x = np.maximum(x, 0.0)
            elif layer.fn == "elu":
                x = np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))
            else:
                x = np.tanh(x)
        elif isinstance(layer, TanhToSpec):
            lo, hi = np.asarray(layer.minimum), np.asarray(layer.maximum)
            x = lo + (np.tanh(x) + 1.0) * 0.5 * (hi - lo)
    return x.astype(np.float32)
