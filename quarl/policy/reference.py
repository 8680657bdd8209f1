"""The float64 NumPy forward of a `PolicySpec`: the ground truth every runtime is tested against, and (in float32)
the host forward calibration records activation ranges with. Plain NumPy, so it runs wherever the spec can be read.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from quarl.policy.im2col import image_patches
from quarl.policy.spec import (
    LAYER_NORM_EPS, Activation, Conv2D, Flatten, LayerNorm, Linear, ParamTree, PolicySpec, TanhToSpec,
)


def reference_apply(spec: PolicySpec, params: ParamTree, obs: np.ndarray, *, dtype: type[np.floating] = np.float64,
                    on_input: Callable[[str, np.ndarray], None] | None = None) -> np.ndarray:
    """Float64 NumPy evaluation of the spec: the ground truth the runtimes are tested against.

    `dtype` float32 makes it a fast host forward (calibration); `on_input(name, x)` sees the input of every
    Linear and Conv2D layer (what `quarl.quant.calibration` records ranges of)."""
    x = np.asarray(obs, dtype)
    if spec.input_shape is not None:
        x = x.reshape((x.shape[0], *spec.input_shape))
    if spec.input_scale is not None:
        x = x * dtype(spec.input_scale)
    if (affine := spec.input_affine()) is not None:  # input_bounds set
        offset, scale = affine
        x = (x - offset.astype(dtype)) * scale.astype(dtype)
    for layer in spec.layers:
        if on_input is not None and isinstance(layer, (Conv2D, Linear)):
            on_input(layer.name, x)
        if isinstance(layer, Conv2D):
            p = params[layer.name]
            x = conv2d_nhwc(x, np.asarray(p["w"], dtype), layer.stride) + np.asarray(p["b"], dtype)
        elif isinstance(layer, Flatten):
            x = x.reshape(x.shape[0], -1)
        elif isinstance(layer, Linear):
            p = params[layer.name]
            x = x @ np.asarray(p["w"], dtype) + np.asarray(p["b"], dtype)
        elif isinstance(layer, LayerNorm):
            p = params[layer.name]
            mean = x.mean(-1, keepdims=True)
            var = x.var(-1, keepdims=True)
            x = (x - mean) / np.sqrt(var + LAYER_NORM_EPS)
            x = x * np.asarray(p["scale"], dtype) + np.asarray(p["offset"], dtype)
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


def conv2d_nhwc(x: np.ndarray, w: np.ndarray, stride: int) -> np.ndarray:
    """VALID 2-D convolution of x [B, H, W, C] with w [k, k, C, O] (haiku layout), in x's and w's dtype."""
    return np.einsum("bhwijc,ijco->bhwo", image_patches(x, w.shape[0], stride), w, optimize=True)
