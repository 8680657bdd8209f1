"""A `PolicySpec` as a haiku network: what the learner trains. The actors' runtimes build the same computation from
the same spec (`quarl.runtimes`), so the trained network and the deployed int8 graph cannot drift apart.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import haiku as hk
import jax
import jax.numpy as jnp

from quarl.nets.conv import Conv2D as FastConv2D
from quarl.policy.spec import LAYER_NORM_EPS, Activation, Conv2D, Flatten, LayerNorm, Linear, PolicySpec, TanhToSpec

if TYPE_CHECKING:
    from quarl.nets.qat import LayerClass


def haiku_forward(spec: PolicySpec, qat_bits: int | None = None) -> Callable[[jax.Array], jax.Array]:
    """The spec as a haiku function; call it inside `hk.transform` (top level, so names are unprefixed).

    `qat_bits` (2..8) makes every Linear and Conv2D compute as an int-`qat_bits` actor does (fake-quantized weights,
    8-bit activations, straight-through gradients; see `quarl.nets.qat`) for quantization-aware training. The
    parameter tree and its initialisation are the same either way."""
    linear_cls: type[hk.Linear] = hk.Linear
    conv_cls: LayerClass = FastConv2D  # hk.Conv2D's parameters; gradients fast inside lax.scan on CPU
    if qat_bits is not None:
        from quarl.nets.qat import qat_conv2d, qat_linear  # pylint: disable=import-outside-toplevel (AQT: QAT only)
        linear_cls, conv_cls = qat_linear(qat_bits), qat_conv2d(qat_bits)

    def forward(x: jax.Array) -> jax.Array:
        if not jnp.issubdtype(x.dtype, jnp.floating):  # uint8 pixels from replay or an env
            x = x.astype(jnp.float32)
        if spec.input_shape is not None:  # flat rows or [B, H, W, C] batches alike
            x = jnp.reshape(x, (x.shape[0], *spec.input_shape))
        if spec.input_scale is not None:
            x = x * spec.input_scale
        if (affine := spec.input_affine()) is not None:  # input_bounds set
            offset, scale = affine
            x = (x - offset) * scale
        for layer in spec.layers:
            if isinstance(layer, Conv2D):
                x = conv_cls(layer.out, layer.kernel, stride=layer.stride, padding="VALID", name=layer.name)(x)
            elif isinstance(layer, Flatten):
                x = jnp.reshape(x, (x.shape[0], -1))
            elif isinstance(layer, Linear):
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
