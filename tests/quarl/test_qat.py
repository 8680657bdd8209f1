"""quarl.nets.qat: the training-time forward must be the deployed int-B forward, and its gradients must flow."""
from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from quarl.nets.haiku import haiku_forward
from quarl.nets.qat import check_qat_bits, fake_quantize_weight, make_qat_dense, weight_codes
from quarl.policy.spec import Linear, PolicySpec, layer_norm_mlp_policy, mlp_q_network
from quarl.quant.quantization import fake_quantize, quantize, quantize_params
from quarl.runtimes import make_executor

_codes_jit = jax.jit(weight_codes, static_argnums=1)


def _nets(spec: PolicySpec, bits: int | None):
    qat = hk.without_apply_rng(hk.transform(lambda x: haiku_forward(spec, qat_bits=bits)(x)))
    fp32 = hk.without_apply_rng(hk.transform(lambda x: haiku_forward(spec)(x)))
    return qat, fp32


def _random_params(spec: PolicySpec, seed: int) -> dict:
    """Initialised params with every leaf perturbed (LayerNorm scale/offset and biases not at their init)."""
    _, fp32 = _nets(spec, None)
    params = fp32.init(jax.random.PRNGKey(seed), jnp.zeros((1, spec.input_dim)))
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: np.asarray(x + 0.3 * rng.standard_normal(x.shape), np.float32), params)


SPECS = {
    "dqn": mlp_q_network(6, (32, 16), 3),
    "d4pg": layer_norm_mlp_policy(5, (32, 16), (-1.0, -2.0), (1.0, 0.5)),
}
# The default suite runs each network check on the DQN network; the D4PG policy's (LayerNorm, tanh head) are slow.
NAMES = ["dqn", pytest.param("d4pg", marks=pytest.mark.slow)]


@pytest.mark.parametrize("value", [None, 2, 5, 8, np.int64(4)])
def test_check_qat_bits_accepts_none_and_2_to_8(value):
    out = check_qat_bits(value)
    assert out == (None if value is None else int(value))
    assert out is None or type(out) is int


@pytest.mark.parametrize("value", [0, 1, 9, 16, -3, True, 2.0, "4"])
def test_check_qat_bits_rejects_everything_else_naming_the_field(value):
    with pytest.raises(ValueError, match=r"^Cfg\.qat_bits must be None or an int in \[2, 8\]"):
        check_qat_bits(value, "Cfg.qat_bits")


@pytest.mark.parametrize("bits", range(2, 9))
def test_weight_codes_are_bit_identical_to_quantize(bits):
    rng = np.random.default_rng(bits)
    for magnitude in (1e-12, 1e-6, 1e-2, 1.0, 37.0, 1e4, 1e12):
        w = (rng.standard_normal((23, 11)) * magnitude).astype(np.float32)
        w[:, 2] = 0.0  # all-zero column: scale 1, codes 0
        w[:, 3] = 0.0
        w[5, 3] = -magnitude  # a single (negative) non-zero
        codes, scale = _codes_jit(w, bits)
        ref = quantize(w, bits, symmetric=True, axis=-1)
        np.testing.assert_array_equal(np.asarray(codes), ref.values)
        np.testing.assert_array_equal(np.asarray(scale), ref.scale)
        np.testing.assert_array_equal(np.asarray(jax.jit(fake_quantize_weight, static_argnums=1)(w, bits)),
                                      fake_quantize(w, bits, axis=-1))


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_weight_codes_round_exact_ties_to_even_and_near_ties_correctly(bits):
    hi = 2 ** (bits - 1) - 1
    step = np.float32(2.0 ** -3)  # max|w| = hi * step makes the scale exactly `step`
    half_points = (np.arange(-hi, hi) + 0.5).astype(np.float32) * step
    rows = [half_points, np.nextafter(half_points, np.float32(np.inf)),
            np.nextafter(half_points, np.float32(-np.inf))]
    col = np.concatenate([*rows, [hi * step]]).astype(np.float32)
    w = np.stack([col, -col, col * np.float32(0.999)], axis=1)
    codes, scale = _codes_jit(w, bits)
    ref = quantize(w, bits, symmetric=True, axis=-1)
    np.testing.assert_array_equal(np.asarray(scale), ref.scale)
    np.testing.assert_array_equal(np.asarray(codes), ref.values)
    assert np.asarray(scale)[0, 0] == step
    ties = np.asarray(codes)[: half_points.size, 0]
    assert np.all(ties % 2 == 0), "exact ties must go to the even code, as np.rint does"


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, (9, 4), elements=st.one_of(
    st.just(0.0), st.floats(2.0 ** -60, 2.0 ** 60, width=32), st.floats(-(2.0 ** 60), -(2.0 ** -60), width=32))),
    st.integers(2, 8))
def test_weight_codes_match_quantize_on_arbitrary_weights(w, bits):
    codes, scale = _codes_jit(w, bits)
    ref = quantize(w, bits, symmetric=True, axis=-1)
    np.testing.assert_array_equal(np.asarray(scale), ref.scale)
    np.testing.assert_array_equal(np.asarray(codes), ref.values)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_qat_forward_equals_the_deployed_jax_int_runtime(name, bits):
    spec = SPECS[name]
    params = _random_params(spec, seed=bits)
    obs = np.random.default_rng(100 + bits).standard_normal((64, spec.input_dim)).astype(np.float32) * 3
    qat, fp32 = _nets(spec, bits)
    trained_view = np.asarray(jax.jit(qat.apply)(params, obs))
    executor = make_executor(spec, quantize_params(params, f"int{bits}"), "jax", batch_size=64)
    deployed = executor(obs)
    np.testing.assert_allclose(trained_view, deployed, rtol=1e-6, atol=1e-6)
    # ...and it is not the fp32 network: quantization is really in the forward pass.
    assert np.max(np.abs(trained_view - np.asarray(fp32.apply(params, obs)))) > 1e-4


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bits", [2, 3])
def test_qat_forward_is_close_to_the_onnx_int_runtime(name, bits):
    """ONNX quantizes activations differently (asymmetric uint8, DynamicQuantizeLinear) but uses the same
    weight codes, so a QAT network deployed there differs only by activation rounding: far less than the
    gap between the QAT forward and the fp32 view of the same weights."""
    spec = SPECS[name]
    params = _random_params(spec, seed=bits)
    obs = np.random.default_rng(200 + bits).standard_normal((64, spec.input_dim)).astype(np.float32) * 3
    qat, fp32 = _nets(spec, bits)
    trained_view = np.asarray(qat.apply(params, obs))
    onnx = make_executor(spec, quantize_params(params, f"int{bits}"), "onnx", batch_size=64)(obs)
    fp32_gap = np.max(np.abs(np.asarray(fp32.apply(params, obs)) - trained_view))
    assert np.max(np.abs(onnx - trained_view)) < 0.25 * fp32_gap


@pytest.mark.parametrize("name", NAMES)
def test_qat_network_has_the_fp32_parameter_tree_and_init(name):
    spec = SPECS[name]
    qat, fp32 = _nets(spec, 3)
    x = jnp.zeros((1, spec.input_dim))
    p_qat, p_fp32 = qat.init(jax.random.PRNGKey(7), x), fp32.init(jax.random.PRNGKey(7), x)
    assert jax.tree.structure(p_qat) == jax.tree.structure(p_fp32)
    for a, b in zip(jax.tree.leaves(p_qat), jax.tree.leaves(p_fp32)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", NAMES)
def test_int8_qat_forward_is_close_to_but_not_exactly_fp32(name):
    spec = SPECS[name]
    params = _random_params(spec, seed=3)
    obs = np.random.default_rng(3).standard_normal((128, spec.input_dim)).astype(np.float32)
    qat, fp32 = _nets(spec, 8)
    out_q, out_f = np.asarray(qat.apply(params, obs)), np.asarray(fp32.apply(params, obs))
    assert not np.array_equal(out_q, out_f)
    assert np.max(np.abs(out_q - out_f)) <= 0.05 * np.max(np.abs(out_f))
    # Low bit widths are much further away: the error grows as bits shrink.
    out_2 = np.asarray(_nets(spec, 2)[0].apply(params, obs))
    assert np.max(np.abs(out_2 - out_f)) > 5 * np.max(np.abs(out_q - out_f))


def _aqt_int8_rows(x: np.ndarray) -> np.ndarray:
    """Independent NumPy model of AQT's default 8-bit activation quantizer: per row, scale = max|x| / 127.5,
    codes rounded half-to-even and clipped to +-127, dequantized."""
    amax = np.max(np.abs(x), axis=1, keepdims=True)
    scale = np.where(amax == 0, 1.0, amax) / 127.5
    return np.clip(np.rint(x / scale), -127, 127) * scale


@pytest.mark.parametrize("bits", [2, 3, 8])
def test_straight_through_gradient_of_one_layer(bits):
    """d/dW sum(R * dense(x, W)) must be x_q^T R (the STE), not the zero gradient of rounding; d/dx is
    R W_q^T with the deployed weights W_q."""
    rng = np.random.default_rng(bits)
    x = rng.standard_normal((16, 7)).astype(np.float32)
    w = rng.standard_normal((7, 5)).astype(np.float32)
    r = rng.standard_normal((16, 5)).astype(np.float32)
    dense = make_qat_dense(bits)
    gx, gw = jax.grad(lambda x, w: jnp.sum(r * dense(x, w)), argnums=(0, 1))(x, w)
    gw, gx = np.asarray(gw), np.asarray(gx)
    assert np.all(gw != 0.0)
    np.testing.assert_allclose(gw, _aqt_int8_rows(x).T @ r, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gx, r @ fake_quantize(w, bits, axis=-1).T, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bits", [2, 3, 8])
def test_ste_reaches_every_quantized_weight_of_a_policy(bits):
    """Every weight the deployed policy depends on gets a gradient. The one exception is exact, not
    numerical: a hidden unit whose outgoing int-B codes are all 0 is cut off in the deployed network, so
    the weights feeding it correctly get 0 (a unit before LayerNorm is never cut off: LN mixes units)."""
    spec = SPECS["d4pg"]  # tanh / ELU / LayerNorm: no dead activations, so only rounding can cut a unit
    params = _random_params(spec, seed=11)
    obs = np.random.default_rng(11).standard_normal((32, spec.input_dim)).astype(np.float32)
    qat, fp32 = _nets(spec, bits)
    grads = jax.grad(lambda p: jnp.sum(jnp.square(qat.apply(p, obs))))(params)
    grads_fp32 = jax.grad(lambda p: jnp.sum(jnp.square(fp32.apply(p, obs))))(params)
    linears = spec.linear_layers
    for i, layer in enumerate(linears):
        g = np.asarray(grads[layer.name]["w"])
        cut = np.zeros(layer.out, bool)
        if i + 1 < len(linears) and i > 0:  # followed by ELU -> next Linear (no LayerNorm in between)
            codes = quantize(params[linears[i + 1].name]["w"], bits, axis=-1).values
            cut = np.all(codes == 0, axis=1)
        assert np.all(g[:, ~cut] != 0.0), f"{layer.name}/w has zero gradients under QAT"
        assert np.all(g[:, cut] == 0.0)
        assert not np.allclose(g, np.asarray(grads_fp32[layer.name]["w"]), rtol=1e-3)


def test_trained_qat_network_deploys_with_zero_extra_error():
    """Fit a Q-network through its int3 forward; quantizing the result for an actor changes nothing."""
    spec = mlp_q_network(4, (32, 32), 2)
    qat, fp32 = _nets(spec, 3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 4)).astype(np.float32)
    y = np.stack([np.sin(x[:, 0]) + x[:, 1], x[:, 2] * x[:, 3]], axis=1).astype(np.float32)
    params = qat.init(jax.random.PRNGKey(0), x[:1])
    opt = optax.adam(3e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        loss, g = jax.value_and_grad(lambda p: jnp.mean(jnp.square(qat.apply(p, x) - y)))(params)
        updates, state = opt.update(g, state, params)
        return optax.apply_updates(params, updates), state, loss

    first = None
    for _ in range(300):
        params, state, loss = step(params, state)
        first = float(loss) if first is None else first
    assert float(loss) < 0.5 * first, "QAT training did not reduce the loss"
    params = jax.device_get(params)
    deployed = make_executor(spec, quantize_params(params, "int3"), "jax", batch_size=256)(x)
    own_forward = np.asarray(qat.apply(params, x))
    np.testing.assert_allclose(deployed, own_forward, rtol=1e-6, atol=1e-6)
    deploy_loss = float(np.mean(np.square(deployed - y)))
    assert deploy_loss == pytest.approx(float(np.mean(np.square(own_forward - y))), rel=1e-5)
    # The fp32 view of the same weights is a different function: the weights were fitted to the rounding.
    assert np.max(np.abs(np.asarray(fp32.apply(params, x)) - own_forward)) > 1e-3


def test_bad_arguments_are_one_line_value_errors():
    spec = SPECS["dqn"]
    with pytest.raises(ValueError, match="bits must be None or an int in"):
        hk.transform(lambda x: haiku_forward(spec, qat_bits=9)(x)).init(jax.random.PRNGKey(0), jnp.zeros((1, 6)))
    with pytest.raises(ValueError, match="needs bits in"):
        make_qat_dense(None)
    with pytest.raises(ValueError, match="w\\[in, out\\]"):
        make_qat_dense(4)(jnp.zeros((2, 3)), jnp.zeros((4, 5)))


def test_one_layer_spec_forward_and_ste_use_the_layer_names():
    spec = PolicySpec(3, (Linear("head", 2),))
    qat, _ = _nets(spec, 4)
    params = qat.init(jax.random.PRNGKey(0), jnp.zeros((1, 3)))
    assert set(params) == {"head"} and set(params["head"]) == {"w", "b"}
