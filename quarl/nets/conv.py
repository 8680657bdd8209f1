"""A 2-D convolution whose gradient stays on XLA:CPU's fast path inside loops.

Why this exists: XLA's CPU backend runs a convolution through its conv library (Eigen, YNNPACK) only when its
dimensions are in the canonical order (input NHWC, kernel HWIO, output NHWC); any other order gets XLA's own naive
loop. JAX writes the two gradient convolutions of an NHWC conv in other orders (the weight gradient as
`f01b_i01o->01bf`), and XLA:CPU's `ConvCanonicalization` pass, which would insert the transposes that make them
canonical, walks the entry computation only. Inside a `while` body, which is what `lax.scan`, `fori_loop` and
`while_loop` compile to, it never sees them: a conv learner's update ran 2.5-5.5x slower inside a `lax.scan` than it
does now on a 2-core AVX2 EPYC (results/bench/conv_update.md), and 13-20x slower than unrolled on a 2-core Xeon
(../shared/DESIGN.md).

`conv2d` has the same forward as `lax.conv_general_dilated` (VALID, NHWC/HWIO) and a custom VJP that writes the
input gradient as a canonical convolution and the weight gradient as a canonical convolution or, for small windows,
an im2col dot (`_weight_gradient`), so the loop form no longer matters for speed. The gradients equal JAX's own to
float tolerance (tests/quarl/test_conv.py). `Conv2D` is `hk.Conv2D` for the layers `PolicySpec` has (square
kernel, int stride, VALID): same parameter names, shapes and initialisers, so parameter trees, checkpoints and
payloads are unchanged.
"""
from __future__ import annotations

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from quarl.policy.im2col import conv_windows

_CANONICAL = ("NHWC", "HWIO", "NHWC")
# Window values per sample (H' * W' * k * k * C_in) up to which the weight gradient is an im2col dot, not a conv.
IM2COL_MAX_WINDOW_VALUES = 8192


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def conv2d(x: jax.Array, w: jax.Array, stride: int) -> jax.Array:
    """VALID convolution of x [B, H, W, C_in] with w [k, k, C_in, C_out] at `stride`: [B, H', W', C_out]."""
    return lax.conv_general_dilated(x, w, (stride, stride), "VALID", dimension_numbers=_CANONICAL)


def _conv2d_fwd(x: jax.Array, w: jax.Array, stride: int) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return conv2d(x, w, stride), (x, w)


def _conv2d_bwd(stride: int, residuals: tuple[jax.Array, jax.Array],
                dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    x, w = residuals
    k = w.shape[0]
    # Rows/columns of x the strided windows never reach: the input gradient pads them back as zeros.
    rest_h, rest_w = (x.shape[1] - k) % stride, (x.shape[2] - k) % stride
    # dx: dy dilated by the stride, fully padded, against the spatially flipped kernel with C_in and C_out swapped.
    w_flipped = jnp.flip(w, (0, 1)).transpose(0, 1, 3, 2)
    dx = lax.conv_general_dilated(dy, w_flipped, (1, 1), [(k - 1, k - 1 + rest_h), (k - 1, k - 1 + rest_w)],
                                  lhs_dilation=(stride, stride), dimension_numbers=_CANONICAL)
    return dx.astype(x.dtype), _weight_gradient(x, dy, k, stride).astype(w.dtype)


def _weight_gradient(x: jax.Array, dy: jax.Array, k: int, stride: int) -> jax.Array:
    """dL/dw [k, k, C_in, C_out] for the VALID conv of x [B, H, W, C_in] whose output gradient is dy.

    Small windows (MinAtar's 3x3x4 over 10x10): the windows (im2col) times dy, one dot, 1.2-1.6x faster than the
    conv form on the 2-core EPYC (results/bench/conv_update.md). Large windows (the Nature torso: 28k-102k window
    values per sample) would be copied out at several times the input's size; there the conv form is as fast or
    faster: a convolution over the batch, with C_in in the batch slot and the batch in the feature slot, x as
    [C_in, H, W, B] against dy as [H', W', B, C_out] dilated by the stride -> [C_in, k(+rest), k(+rest), C_out]."""
    h_out, w_out = dy.shape[1], dy.shape[2]
    if h_out * w_out * k * k * x.shape[3] <= IM2COL_MAX_WINDOW_VALUES:
        windows = conv_windows(x, k, stride)  # [B, H', W', k * k * C_in], ordered as w.reshape(-1, C_out)
        dw = jnp.dot(windows.reshape(-1, windows.shape[-1]).T, dy.reshape(-1, dy.shape[-1]))
        return dw.reshape(k, k, x.shape[3], dy.shape[3])
    dw = lax.conv_general_dilated(x.transpose(3, 1, 2, 0), dy.transpose(1, 2, 0, 3), (1, 1), "VALID",
                                  rhs_dilation=(stride, stride), dimension_numbers=_CANONICAL)
    return dw[:, :k, :k, :].transpose(1, 2, 0, 3)


conv2d.defvjp(_conv2d_fwd, _conv2d_bwd)


def conv_parameters(output_channels: int, kernel: int, c_in: int, dtype: jnp.dtype) -> tuple[jax.Array, jax.Array]:
    """`w` [k, k, C_in, out] and `b` [out] with `hk.Conv2D`'s names and default initialisers (call inside a module)."""
    w_init = hk.initializers.TruncatedNormal(stddev=1.0 / np.sqrt(kernel * kernel * c_in))
    w = hk.get_parameter("w", [kernel, kernel, c_in, output_channels], dtype, init=w_init)
    b = hk.get_parameter("b", [output_channels], dtype, init=jnp.zeros)
    return w, b


class Conv2D(hk.Module):
    """`hk.Conv2D` (VALID, NHWC, square kernel, int stride) computed with `conv2d`."""

    def __init__(self, output_channels: int, kernel_shape: int, stride: int = 1, padding: str = "VALID",
                 name: str | None = None):
        super().__init__(name=name)
        if padding != "VALID" or not isinstance(kernel_shape, int) or not isinstance(stride, int):
            raise ValueError("Conv2D supports square kernels, int strides and VALID padding only")
        self.output_channels, self.kernel, self.stride = int(output_channels), kernel_shape, stride

    def __call__(self, inputs: jax.Array) -> jax.Array:
        if inputs.ndim != 4:
            raise ValueError(f"Conv2D takes [B, H, W, C] inputs, got shape {inputs.shape}")
        w, b = conv_parameters(self.output_channels, self.kernel, inputs.shape[-1], inputs.dtype)
        return conv2d(inputs, w, self.stride) + b
