"""Properties of the uniform quantizers, precision parsing and parameter-tree quantization."""
from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from quarl.nets.haiku import haiku_forward
from quarl.policy.spec import layer_norm_mlp_policy, mlp_q_network
from quarl.quant.precision import ALL_PRECISIONS, Precision, parse_precision
from quarl.quant.quantization import (
    QTensor, QuantizedParams, dequantize, dequantize_params, fake_quantize_params, qrange, quantize, quantize_params,
)

SETTINGS = settings(max_examples=100, deadline=None)

finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)  # includes subnormals and f32 max


@st.composite
def tensor_and_axis(draw, min_dims: int = 1):
    shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=3, min_side=1, max_side=6))
    x = draw(hnp.arrays(np.float32, shape, elements=finite_f32))
    axis = draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    return x, axis


def _error_bound(x: np.ndarray, q: QTensor, steps: float) -> np.ndarray:
    """`steps` quantization steps plus the final float32 rounding of the dequantized value."""
    deq = dequantize(q)
    rounding = np.abs(deq).astype(np.float64) * 2.0**-23 + 2.0**-149  # float32 ulp, normal or subnormal
    return steps * q.scale.astype(np.float64) * (1 + 1e-9) + rounding


def _policy_params(spec) -> dict:
    net = hk.without_apply_rng(hk.transform(lambda x: haiku_forward(spec)(x)))
    return net.init(jax.random.PRNGKey(0), jnp.zeros((1, spec.input_dim), jnp.float32))


@pytest.fixture(scope="module")
def d4pg_params() -> dict:
    return _policy_params(layer_norm_mlp_policy(11, [32, 16], [-1.0] * 3, [1.0] * 3))


# ---------------------------------------------------------------------------------------------- quantize


@SETTINGS
@given(tensor_and_axis(), st.integers(2, 16))
def test_symmetric_round_trip_within_half_step(xa, bits):
    x, axis = xa
    q = quantize(x, bits, axis=axis)
    lo, hi = qrange(bits, True)
    assert q.values.dtype == (np.int8 if bits <= 8 else np.int16)
    assert q.values.min() >= lo and q.values.max() <= hi
    assert np.all(q.zero_point == 0) and q.zero_point.dtype == np.int32 and q.scale.dtype == np.float32
    assert q.scale.ndim == x.ndim and np.all(q.scale > 0)
    err = np.abs(x.astype(np.float64) - dequantize(q))
    assert np.all(err <= _error_bound(x, q, 0.5))


@SETTINGS
@given(tensor_and_axis(), st.integers(2, 16))
def test_affine_round_trip_within_one_step_and_zero_exact(xa, bits):
    x, axis = xa
    x = x.copy()
    x.flat[0] = 0.0
    q = quantize(x, bits, symmetric=False, axis=axis)
    assert q.values.dtype == (np.uint8 if bits <= 8 else np.uint16)
    assert q.values.max() <= 2**bits - 1
    assert np.all((q.zero_point >= 0) & (q.zero_point <= 2**bits - 1))
    deq = dequantize(q)
    assert np.all(np.abs(x.astype(np.float64) - deq) <= _error_bound(x, q, 1.0))
    assert deq.flat[0] == 0.0  # zero is exactly representable


@SETTINGS
@given(tensor_and_axis(), st.integers(2, 16), st.booleans())
def test_scale_keeps_dims_for_broadcasting(xa, bits, symmetric):
    x, axis = xa
    q = quantize(x, bits, symmetric=symmetric, axis=axis)
    expected = [1] * x.ndim
    if axis is not None:
        expected[axis] = x.shape[axis]
        assert q.axis == axis % x.ndim  # stored normalised
    else:
        assert q.axis is None
    assert q.scale.shape == tuple(expected) == q.zero_point.shape
    assert q.values.shape == x.shape


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [2, 8, 16])
def test_all_zero_tensor_is_exact_with_unit_scale(bits, symmetric):
    q = quantize(np.zeros((3, 4), np.float32), bits, symmetric=symmetric, axis=1)
    np.testing.assert_array_equal(q.scale, np.ones((1, 4), np.float32))
    np.testing.assert_array_equal(dequantize(q), np.zeros((3, 4), np.float32))


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("value", [-2.5, 1e-30, 7.0, 1e30])
def test_constant_tensor_round_trips(value, symmetric):
    x = np.full((4, 5), value, np.float32)
    q = quantize(x, 8, symmetric=symmetric)
    assert np.all(np.isfinite(q.scale)) and np.all(q.scale > 0)
    np.testing.assert_allclose(dequantize(q), x, rtol=1e-6)


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_one_element_tensor(shape):
    x = np.full(shape, -0.75, np.float32)
    for symmetric in (True, False):
        q = quantize(x, 4, symmetric=symmetric)
        assert q.values.shape == shape
        np.testing.assert_allclose(dequantize(q), x, rtol=1e-6)


@pytest.mark.parametrize("magnitude", [1e-30, 1e30])
def test_huge_and_tiny_magnitudes_keep_relative_error(magnitude):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 6)) * magnitude).astype(np.float32)
    for symmetric in (True, False):
        deq = dequantize(quantize(x, 8, symmetric=symmetric, axis=-1))
        assert np.all(np.isfinite(deq))
        # 8 bits over the range: error <= one step of 255 levels of max|x| (2 * max|x| for affine).
        assert np.max(np.abs(deq - x)) <= 2 * np.max(np.abs(x)) / 254 * 1.0001


def test_subnormal_inputs_do_not_produce_zero_scale():
    x = np.array([1e-45, -3e-44, 0.0], np.float32)
    q = quantize(x, 8)
    assert q.scale.item() >= np.finfo(np.float32).tiny
    assert np.all(np.abs(dequantize(q) - x) <= q.scale / 2)


def test_per_channel_with_zero_channel():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    w[:, 2] = 0.0
    q = quantize(w, 8, axis=-1)
    deq = dequantize(q)
    np.testing.assert_array_equal(deq[:, 2], 0.0)
    assert q.scale[0, 2] == 1.0
    np.testing.assert_allclose(q.scale[0, [0, 1, 3]], np.abs(w[:, [0, 1, 3]]).max(0) / 127, rtol=1e-6)
    assert np.all(np.abs(deq - w) <= q.scale / 2 + 1e-7)


def test_per_channel_negative_axis_matches_positive():
    x = np.random.default_rng(2).standard_normal((3, 4, 5)).astype(np.float32)
    for neg, pos in ((-1, 2), (-2, 1), (-3, 0)):
        a, b = quantize(x, 6, axis=neg), quantize(x, 6, axis=pos)
        np.testing.assert_array_equal(a.values, b.values)
        np.testing.assert_array_equal(a.scale, b.scale)
        assert a.axis == b.axis == pos


def test_per_channel_scales_are_independent():
    x = np.array([[1.0, 100.0], [-0.5, 50.0]], np.float32)
    q = quantize(x, 8, axis=1)
    np.testing.assert_allclose(q.scale.ravel(), [1.0 / 127, 100.0 / 127], rtol=1e-6)
    assert q.values[0, 0] == 127 and q.values[0, 1] == 127


def test_two_bit_symmetric_is_ternary_and_rounds_half_to_even():
    q = quantize(np.array([-1.0, -0.4, 0.5, 1.0], np.float32), 2)
    np.testing.assert_array_equal(q.values, [-1, 0, 0, 1])  # 0.5 / 1.0 = 0.5 -> rint -> 0
    q16 = quantize(np.array([0.3, -1.0], np.float32), 16)
    assert q16.values.dtype == np.int16 and q16.values[1] == -32767


def test_input_is_not_modified_and_float64_accepted():
    x = np.linspace(-1, 1, 10)
    before = x.copy()
    q = quantize(x, 8)
    np.testing.assert_array_equal(x, before)
    assert dequantize(q).dtype == np.float32


def test_accepts_jax_and_bfloat16_arrays():
    x = jnp.linspace(-2.0, 2.0, 12).reshape(3, 4)
    np.testing.assert_allclose(dequantize(quantize(x, 8)), np.asarray(x), atol=2 / 127 / 2 + 1e-7)
    xb = np.asarray(x).astype(ml_dtypes.bfloat16)
    assert quantize(xb, 8).values.shape == (3, 4)


@pytest.mark.parametrize(
    "x, bits, kwargs, match",
    [
        (np.array([1.0, np.nan], np.float32), 8, {}, "NaN or inf"),
        (np.array([1.0, np.inf], np.float32), 8, {}, "NaN or inf"),
        (np.array([1.0, -np.inf]), 8, {"symmetric": False}, "NaN or inf"),
        (np.ones(3, np.float32), 1, {}, "bits"),
        (np.ones(3, np.float32), 17, {}, "bits"),
        (np.ones(3, np.float32), 8.0, {}, "bits"),
        (np.ones(3, np.float32), True, {}, "bits"),
        (np.ones(3, np.float32), "8", {}, "bits"),
        (np.ones(3, np.int32), 8, {}, "floating"),
        (np.ones(3, np.int8), 8, {}, "floating"),
        (np.ones(3, bool), 8, {}, "floating"),
        (np.ones((2, 3), np.float32), 8, {"axis": 2}, "out of range"),
        (np.ones((2, 3), np.float32), 8, {"axis": -3}, "out of range"),
        (np.float32(1.0), 8, {"axis": 0}, "out of range"),
        (np.ones((2, 3), np.float32), 8, {"axis": 1.0}, "axis"),
        (np.array([1e300, 0.0]), 8, {}, "float32 range"),
    ],
)
def test_quantize_rejects_bad_input(x, bits, kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize(x, bits, **kwargs)


def test_dequantize_rejects_non_qtensor():
    with pytest.raises(ValueError, match="QTensor"):
        dequantize(np.ones(3, np.float32))


# ------------------------------------------------------------------------------------------------ pytree


def test_qtensor_is_a_pytree_with_static_metadata():
    q = quantize(np.arange(6, dtype=np.float32).reshape(2, 3), 4, symmetric=False, axis=0)
    leaves, treedef = jax.tree.flatten({"layer": {"w": q, "b": np.zeros(3, np.float32)}})
    assert len(leaves) == 4  # b + values, scale, zero_point
    shapes = jax.tree.map(lambda a: a.shape, q)
    assert isinstance(shapes, QTensor) and shapes.values == (2, 3) and shapes.scale == (2, 1)
    assert (shapes.bits, shapes.axis, shapes.symmetric) == (4, 0, False)
    rebuilt = jax.tree.unflatten(treedef, leaves)["layer"]["w"]
    np.testing.assert_array_equal(dequantize(rebuilt), dequantize(q))


def test_qtensor_passes_through_jit():
    q = quantize(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4), 8, axis=-1)

    @jax.jit
    def deq(t: QTensor):
        return (t.values.astype(jnp.float32) - t.zero_point) * t.scale

    np.testing.assert_allclose(np.asarray(deq(q)), dequantize(q), rtol=1e-6)


# ---------------------------------------------------------------------------------------------- precision


@pytest.mark.parametrize(
    "text, name, kind, bits",
    [
        ("fp32", "fp32", "float", 32),
        ("FP16", "fp16", "float", 16),
        ("bf16", "bf16", "float", 16),
        (" Int8 ", "int8", "int", 8),
        ("int2", "int2", "int", 2),
        ("int16", "int16", "int", 16),
        ("32", "fp32", "float", 32),
        ("16", "fp16", "float", 16),
        ("8", "int8", "int", 8),
        ("2", "int2", "int", 2),
        ("15", "int15", "int", 15),
        (4, "int4", "int", 4),
    ],
)
def test_parse_precision(text, name, kind, bits):
    assert parse_precision(text) == Precision(name, kind, bits)


@pytest.mark.parametrize("text", ["int1", "int17", "fp8", "1", "64", "", "int", "bfloat"])
def test_parse_precision_unknown_lists_valid_names(text):
    with pytest.raises(ValueError, match="fp32, bf16, fp16, int16"):
        parse_precision(text)


def test_all_precisions_parse_to_themselves():
    assert len(set(ALL_PRECISIONS)) == len(ALL_PRECISIONS) == 18
    for name in ALL_PRECISIONS:
        assert parse_precision(name).name == name


# ---------------------------------------------------------------------------------------- quantize_params


def test_int8_quantizes_only_weight_matrices(d4pg_params):
    qp = quantize_params(d4pg_params, "int8")
    assert isinstance(qp, QuantizedParams) and qp.precision == "int8" and qp.per_channel
    assert set(qp.tree) == set(d4pg_params)
    for module, leaves in d4pg_params.items():
        for name, leaf in leaves.items():
            out = qp.tree[module][name]
            if name == "w":
                assert isinstance(out, QTensor) and out.values.dtype == np.int8 and out.symmetric
                assert out.axis == 1 and out.scale.shape == (1, leaf.shape[1])
            else:  # biases, LayerNorm scale/offset: fp32 and bit-identical
                assert isinstance(out, np.ndarray) and out.dtype == np.float32
                np.testing.assert_array_equal(out, np.asarray(leaf))
    assert "scale" in qp.tree["layer_norm"] and "offset" in qp.tree["layer_norm"]


def test_per_channel_gives_one_scale_per_output_column(d4pg_params):
    w = np.asarray(d4pg_params["linear_0"]["w"])
    q = quantize_params(d4pg_params, "int8", per_channel=True).tree["linear_0"]["w"]
    np.testing.assert_allclose(q.scale[0], np.abs(w).max(axis=0) / 127, rtol=1e-6)
    qt = quantize_params(d4pg_params, "int8", per_channel=False).tree["linear_0"]["w"]
    assert qt.axis is None and qt.scale.shape == (1, 1)
    np.testing.assert_allclose(qt.scale.item(), np.abs(w).max() / 127, rtol=1e-6)


@pytest.mark.parametrize("precision", ["int16", "int8", "int4", "int2"])
@pytest.mark.parametrize("per_channel", [True, False])
def test_dequantize_params_round_trip(d4pg_params, precision, per_channel):
    qp = quantize_params(d4pg_params, precision, per_channel=per_channel)
    back = dequantize_params(qp)
    for module, leaves in d4pg_params.items():
        for name, leaf in leaves.items():
            assert back[module][name].dtype == np.float32
            ref = np.asarray(leaf)
            if name == "w":
                bound = qp.tree[module][name].scale / 2 + np.spacing(np.abs(ref))
                assert np.all(np.abs(back[module][name] - ref) <= bound)
            else:
                np.testing.assert_array_equal(back[module][name], ref)


@pytest.mark.parametrize("precision, dtype", [("fp16", np.float16), ("bf16", ml_dtypes.bfloat16)])
def test_float_precisions_cast_weights_only(d4pg_params, precision, dtype):
    qp = quantize_params(d4pg_params, precision)
    assert qp.tree["linear_1"]["w"].dtype == np.dtype(dtype)
    assert qp.tree["linear_1"]["b"].dtype == np.float32
    assert qp.tree["layer_norm"]["scale"].dtype == np.float32
    w = np.asarray(d4pg_params["linear_1"]["w"])
    rtol = 2.0**-11 if precision == "fp16" else 2.0**-8
    np.testing.assert_allclose(dequantize_params(qp)["linear_1"]["w"], w, rtol=rtol, atol=1e-7)


def test_fp32_copies_do_not_alias_input():
    params = {"linear_0": {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}}
    qp = quantize_params(params, "fp32")
    qp.tree["linear_0"]["w"][0, 0] = 5.0
    assert params["linear_0"]["w"][0, 0] == 1.0
    np.testing.assert_array_equal(dequantize_params(qp)["linear_0"]["b"], params["linear_0"]["b"])


def test_fake_quantize_params_equals_dequantized(d4pg_params):
    fake = fake_quantize_params(d4pg_params, "int4", per_channel=False)
    ref = dequantize_params(quantize_params(d4pg_params, "int4", per_channel=False))
    jax.tree.map(np.testing.assert_array_equal, fake, ref)


def test_dqn_tree_accepts_precision_object():
    params = _policy_params(mlp_q_network(4, [8], 2))
    qp = quantize_params(params, parse_precision("8"))
    assert qp.precision == "int8" and isinstance(qp.tree["linear_1"]["w"], QTensor)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("leaf", ["w", "b"])
def test_quantize_params_rejects_non_finite_naming_the_leaf(d4pg_params, bad, leaf):
    params = jax.tree.map(np.array, d4pg_params)
    params["linear_1"][leaf][0] = bad
    with pytest.raises(ValueError, match=f"linear_1/{leaf}"):
        quantize_params(params, "int8")
    with pytest.raises(ValueError, match=f"linear_1/{leaf}"):
        quantize_params(params, "fp32")


def test_quantize_params_rejects_bad_inputs():
    with pytest.raises(ValueError, match="unknown precision"):
        quantize_params({"l": {"w": np.ones((2, 2), np.float32)}}, "int32")
    with pytest.raises(ValueError, match="l/w.*int32"):
        quantize_params({"l": {"w": np.ones((2, 2), np.int32)}}, "int8")
    with pytest.raises(ValueError, match="l/w.*overflows fp16"):
        quantize_params({"l": {"w": np.full((2, 2), 1e6, np.float32)}}, "fp16")
    with pytest.raises(ValueError, match="mapping"):
        quantize_params([np.ones(2)], "int8")


def test_dequantize_params_rejects_non_finite_scale():
    qp = quantize_params({"l": {"w": np.ones((2, 2), np.float32)}}, "int8")
    qp.tree["l"]["w"].scale[0, 0] = np.nan
    with pytest.raises(ValueError, match="l/w"):
        dequantize_params(qp)
    with pytest.raises(ValueError, match="QuantizedParams"):
        dequantize_params({"l": {}})
