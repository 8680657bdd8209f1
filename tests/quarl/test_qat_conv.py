"""QAT for conv policies (`quarl.nets.qat.qat_conv2d` through `haiku_forward(spec, qat_bits)`): the training forward is
the deployed int-B JAX conv actor's arithmetic, close to the ONNX static int8 graph, shares the fp32 parameter tree,
and its straight-through gradients reach the conv weights."""
from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from quarl.nets.haiku import haiku_forward
from quarl.policy.spec import Activation, Conv2D, Flatten, Linear, PolicySpec, minatar_q_network
from quarl.quant.calibration import quantize_for_actors
from quarl.runtimes import make_executor

SPECS = {
    "minatar": minatar_q_network((10, 10, 4), 6),
    # two convs, a stride of 2 and a conv straight into another (no ReLU between the second and Flatten)
    "strided": PolicySpec(12 * 12 * 3, (Conv2D("conv_0", 8, 3, 2), Activation("relu"), Conv2D("conv_1", 6, 2, 1),
                                        Flatten(), Linear("linear_0", 5)), input_shape=(12, 12, 3)),
}
# The default suite checks the MinAtar network the agents deploy; the strided one is slow.
NAMES = ["minatar", pytest.param("strided", marks=pytest.mark.slow)]


def _nets(spec: PolicySpec, bits: int | None):
    return hk.without_apply_rng(hk.transform(lambda x: haiku_forward(spec, qat_bits=bits)(x)))


def _params(spec: PolicySpec, seed: int) -> dict:
    params = _nets(spec, None).init(jax.random.PRNGKey(seed), jnp.zeros((1, spec.input_dim)))
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: np.asarray(x + 0.1 * rng.standard_normal(x.shape), np.float32), params)


def _obs(spec: PolicySpec, seed: int, n: int = 32) -> np.ndarray:
    return (np.random.default_rng(seed).random((n, spec.input_dim)) < 0.3).astype(np.float32)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_conv_qat_forward_equals_the_deployed_jax_int_runtime(name, bits):
    spec = SPECS[name]
    params, obs = _params(spec, bits), _obs(spec, bits)
    trained_view = np.asarray(jax.jit(_nets(spec, bits).apply)(params, obs))
    qp = quantize_for_actors(spec, params, f"int{bits}", _obs(spec, 99))
    deployed = make_executor(spec, qp, "jax", batch_size=len(obs))(obs)
    np.testing.assert_allclose(trained_view, deployed, rtol=1e-5, atol=1e-5)
    fp32 = np.asarray(_nets(spec, None).apply(params, obs))
    assert np.max(np.abs(trained_view - fp32)) > 1e-4  # the quantization is really in the forward pass


@pytest.mark.parametrize("name", NAMES)
def test_conv_qat_int8_is_close_to_the_onnx_static_graph(name):
    """ONNX int8 conv actors quantize activations with calibrated static scales (JAX: per window), same weight
    codes: the QAT view and the ONNX output differ by activation rounding only."""
    spec = SPECS[name]
    params, obs = _params(spec, 1), _obs(spec, 2)
    trained_view = np.asarray(_nets(spec, 8).apply(params, obs))
    onnx = make_executor(spec, quantize_for_actors(spec, params, "int8", obs), "onnx", batch_size=len(obs))(obs)
    scale = np.max(np.abs(trained_view))
    assert np.max(np.abs(onnx - trained_view)) < 0.03 * scale


@pytest.mark.parametrize("name", NAMES)
def test_conv_qat_network_has_the_fp32_parameter_tree_and_init(name):
    spec = SPECS[name]
    x = jnp.zeros((1, spec.input_dim))
    p_qat, p_fp32 = _nets(spec, 3).init(jax.random.PRNGKey(5), x), _nets(spec, None).init(jax.random.PRNGKey(5), x)
    assert jax.tree.structure(p_qat) == jax.tree.structure(p_fp32)
    for a, b in zip(jax.tree.leaves(p_qat), jax.tree.leaves(p_fp32)):
        np.testing.assert_array_equal(a, b)


def test_conv_qat_straight_through_gradients_reach_the_conv_weights():
    spec = SPECS["minatar"]
    params, obs = _params(spec, 0), _obs(spec, 0)

    def loss(net):
        return lambda p: jnp.mean(net.apply(p, obs) ** 2)

    g_qat = jax.grad(loss(_nets(spec, 4)))(params)
    g_fp32 = jax.grad(loss(_nets(spec, None)))(params)
    w_qat, w_fp32 = np.asarray(g_qat["conv_0"]["w"]), np.asarray(g_fp32["conv_0"]["w"])
    assert np.all(np.isfinite(w_qat)) and np.count_nonzero(w_qat) > 0.5 * w_qat.size
    assert not np.allclose(w_qat, w_fp32)  # computed through the int4 forward, not the fp32 one
    cos = np.sum(w_qat * w_fp32) / (np.linalg.norm(w_qat) * np.linalg.norm(w_fp32))
    assert cos > 0.8, cos  # ...yet pointing the same way: the STE passes the rounding
