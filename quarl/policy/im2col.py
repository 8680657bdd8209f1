"""VALID-convolution windows (im2col), written once for every array library the project computes convolutions in.

`conv_windows` is the im2col of the JAX int8 runtime and of QAT (`quarl.nets.qat`): the two must agree to the bit,
so they share this one function. It only slices and concatenates, through the array's own namespace, so the same
code runs on NumPy arrays and on JAX arrays and tracers. `image_patches` is NumPy's strided view of the same
windows, used by the float64 reference and the static int8 graph's self-checks.
"""
from __future__ import annotations

from typing import TypeVar

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

ArrayT = TypeVar("ArrayT")


def conv_windows(x: ArrayT, kernel: int, stride: int) -> ArrayT:
    """x [B, H, W, C] -> its VALID conv windows [B, H', W', k * k * C], ordered (i, j, c) as `w.reshape(-1, O)`."""
    xp = x.__array_namespace__()  # numpy or jax.numpy: both implement the array API's `concat`
    h_out = (x.shape[1] - kernel) // stride + 1
    w_out = (x.shape[2] - kernel) // stride + 1
    cols = [x[:, i:i + stride * (h_out - 1) + 1:stride, j:j + stride * (w_out - 1) + 1:stride, :]
            for i in range(kernel) for j in range(kernel)]
    return xp.concat(cols, axis=-1)


def image_patches(x: np.ndarray, kernel: int, stride: int) -> np.ndarray:
    """[B, H, W, C] -> the VALID conv windows [B, H', W', kernel, kernel, C] (a strided view, no copy)."""
    windows = sliding_window_view(x, (kernel, kernel), axis=(1, 2))[:, ::stride, ::stride]  # [B, H', W', C, k, k]
    return windows.transpose(0, 1, 2, 4, 5, 3)
