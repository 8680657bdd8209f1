"""Quantization error metrics."""
from __future__ import annotations

import math

import numpy as np
import pytest

from quarl.quant.metrics import layer_errors, sqnr_db, tensor_errors
from quarl.quant.quantization import dequantize, quantize, quantize_params


def test_sqnr_exact_is_inf_and_matches_definition():
    x = np.array([3.0, -4.0], np.float32)
    assert sqnr_db(x, x) == math.inf
    assert sqnr_db(np.zeros(3), np.zeros(3)) == math.inf
    assert sqnr_db(np.zeros(3), np.ones(3)) == -math.inf
    # signal 25, noise 0.25 -> 100x -> 20 dB
    assert sqnr_db(x, x + np.array([0.5, 0.0], np.float32)) == pytest.approx(20.0)


def test_sqnr_grows_about_six_db_per_bit():
    x = np.random.default_rng(0).uniform(-1, 1, 20000).astype(np.float32)
    s6, s8 = (sqnr_db(x, dequantize(quantize(x, b))) for b in (6, 8))
    assert 11.0 < s8 - s6 < 13.0


def test_tensor_errors_values():
    x = np.array([2.0, -1.0, 0.0, 1.0])
    x_hat = np.array([2.5, -1.0, 0.0, 0.5])
    e = tensor_errors(x, x_hat)
    assert e["max_abs"] == pytest.approx(0.5)
    assert e["mean_abs"] == pytest.approx(0.25)
    assert e["max_rel"] == pytest.approx(0.25)  # relative to max|x| = 2
    assert e["mean_rel"] == pytest.approx(0.125)
    assert e["sqnr_db"] == pytest.approx(10 * math.log10(6.0 / 0.5))


def test_tensor_errors_safe_for_zeros_and_accepts_qtensor():
    e = tensor_errors(np.zeros(4), np.full(4, 0.1))
    assert e["max_rel"] == pytest.approx(0.1) and math.isfinite(e["mean_rel"])
    z = tensor_errors(np.zeros((2, 2), np.float32), quantize(np.zeros((2, 2), np.float32), 8))
    assert z["max_abs"] == 0.0 and z["sqnr_db"] == math.inf


def test_metric_input_errors():
    with pytest.raises(ValueError, match="shape"):
        sqnr_db(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="NaN or inf"):
        tensor_errors(np.array([np.nan]), np.array([0.0]))


def test_layer_errors_covers_every_quantized_weight():
    rng = np.random.default_rng(1)
    params = {
        "linear_0": {"w": rng.standard_normal((5, 8)).astype(np.float32), "b": np.zeros(8, np.float32)},
        "layer_norm": {"scale": np.ones(8, np.float32), "offset": np.zeros(8, np.float32)},
        "linear_1": {"w": rng.standard_normal((8, 2)).astype(np.float32), "b": np.zeros(2, np.float32)},
    }
    e8 = layer_errors(params, quantize_params(params, "int8"))
    e4 = layer_errors(params, quantize_params(params, "int4"))
    assert set(e8) == {"linear_0/w", "linear_1/w"}
    for path in e8:
        assert e8[path]["sqnr_db"] > e4[path]["sqnr_db"] + 15  # ~6 dB per bit
        assert e8[path]["max_abs"] <= np.abs(params[path.split("/")[0]]["w"]).max() / 127 / 2 + 1e-7
    assert all(v["sqnr_db"] == math.inf for v in layer_errors(params, quantize_params(params, "fp32")).values())
    assert layer_errors(params, quantize_params(params, "bf16"))["linear_0/w"]["max_rel"] < 2**-8
    with pytest.raises(ValueError, match="QuantizedParams"):
        layer_errors(params, params)
