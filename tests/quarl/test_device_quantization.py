"""The jitted device quantizer gives exactly the host quantizer's codes and scales (and so the same payload bytes)."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from quarl.quant.device import quantize_params_on_device
from quarl.quant.payload import encode_payload
from quarl.quant.quantization import QTensor, quantize_params


def _params(rng: np.random.Generator) -> dict:
    w0 = (rng.standard_normal((7, 33)) * 0.05).astype(np.float32)
    w0[:, 3] = 0.0  # an all-zero channel: scale 1.0
    w0[:, 4] = np.float32(1e-30) * rng.standard_normal(7).astype(np.float32)  # tiny (normal) range
    w1 = rng.standard_normal((33, 5)).astype(np.float32) * np.float32(3e4)
    # Exact rounding ties: amax 127 gives scale 1.0, so k + 0.5 lands on a tie that rint breaks to even.
    w1[:, 0] = np.array([127.0, 0.5, 1.5, -2.5, 126.5] + [3.5] * 28, np.float32)
    return {"linear_0": {"w": w0, "b": rng.standard_normal(33).astype(np.float32)},
            "layer_norm": {"scale": np.ones(33, np.float32), "offset": np.zeros(33, np.float32)},
            "linear_1": {"w": w1, "b": np.zeros(5, np.float32)}}


@pytest.mark.parametrize("precision", ["int8", "int4", "int2", "int16"])
def test_device_codes_and_scales_equal_the_host_quantizer(precision):
    params = _params(np.random.default_rng(0))
    host = quantize_params(params, precision)
    device = quantize_params_on_device(jax.device_put(params), precision)
    assert device.precision == host.precision and device.per_channel
    for module, leaves in host.tree.items():
        for name, want in leaves.items():
            got = device.tree[module][name]
            if isinstance(want, QTensor):
                assert isinstance(got, QTensor) and (got.bits, got.axis, got.symmetric) == (want.bits, want.axis, True)
                assert got.values.dtype == want.values.dtype and np.array_equal(got.values, want.values)
                assert got.scale.dtype == want.scale.dtype and np.array_equal(got.scale, want.scale)
                assert np.array_equal(got.zero_point, want.zero_point)
            else:
                assert got.dtype == want.dtype and np.array_equal(got, want)
    assert encode_payload(device, version=3) == encode_payload(host, version=3)


def test_device_quantizer_names_a_non_finite_leaf_and_refuses_float_precisions():
    params = _params(np.random.default_rng(1))
    params["linear_1"]["b"][2] = np.nan
    with pytest.raises(ValueError, match="linear_1/b.*NaN or inf"):
        quantize_params_on_device(params, "int8")
    with pytest.raises(ValueError, match="integer precisions"):
        quantize_params_on_device(_params(np.random.default_rng(1)), "fp16")
