"""Quantization error metrics: how far an actor's low-precision weights are from the learner's fp32 ones.

Used by post-training-quantization reports and benchmarks to relate policy quality to weight error.
All metrics are computed in float64 so the metric itself adds no rounding noise.
"""
from __future__ import annotations

import numpy as np

from quarl.policy.spec import ParamTree
from quarl.quant.quantization import (
    ParamLeaf, QTensor, QuantizedParams, dequantize, is_quantized_leaf, path_str, tree_items,
)


def _pair(x: ParamLeaf, x_hat: ParamLeaf) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(dequantize(x) if isinstance(x, QTensor) else x).astype(np.float64)
    b = np.asarray(dequantize(x_hat) if isinstance(x_hat, QTensor) else x_hat).astype(np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {a.shape} vs {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("metric inputs contain NaN or inf")
    return a, b


def sqnr_db(x: ParamLeaf, x_hat: ParamLeaf) -> float:
    """Signal-to-quantization-noise ratio `10 log10(sum x^2 / sum (x - x_hat)^2)` in dB.

    +inf when `x_hat` is exact (including all-zero x == x_hat); -inf when x is all zero but x_hat is not.
    Each extra bit of a uniform quantizer adds about 6 dB, which makes it the natural cross-precision scale.
    """
    a, b = _pair(x, x_hat)
    noise = float(np.sum((a - b) ** 2))
    if noise == 0.0:
        return float("inf")
    signal = float(np.sum(a**2))
    if signal == 0.0:
        return float("-inf")
    return float(10.0 * np.log10(signal / noise))


def tensor_errors(x: ParamLeaf, x_hat: ParamLeaf) -> dict[str, float]:
    """max/mean absolute error, the same relative to max|x|, and SQNR.

    Relative errors divide by the tensor's max|x| rather than elementwise |x| (elementwise would blow up
    on near-zero weights, which quantization legitimately rounds to 0). For an all-zero x the denominator
    is 1, i.e. relative == absolute.
    """
    a, b = _pair(x, x_hat)
    err = np.abs(a - b)
    max_abs = float(err.max(initial=0.0))
    mean_abs = float(err.mean()) if err.size else 0.0
    denom = float(np.abs(a).max(initial=0.0)) or 1.0
    return {
        "max_abs": max_abs,
        "mean_abs": mean_abs,
        "max_rel": max_abs / denom,
        "mean_rel": mean_abs / denom,
        "sqnr_db": sqnr_db(a, b),
    }


def layer_errors(params: ParamTree, qparams: QuantizedParams) -> dict[str, dict[str, float]]:
    """`{leaf path: tensor_errors}` for every weight matrix the precision touched (`module/w`)."""
    if not isinstance(qparams, QuantizedParams):
        raise ValueError(f"layer_errors expects QuantizedParams, got {type(qparams).__name__}")
    quantized = dict(tree_items(qparams.tree))
    out = {}
    for path, leaf in tree_items(params):
        if not is_quantized_leaf(path, leaf):
            continue
        if path not in quantized:
            raise ValueError(f"param {path_str(path)!r} is missing from the quantized tree")
        out[path_str(path)] = tensor_errors(leaf, quantized[path])
    return out
