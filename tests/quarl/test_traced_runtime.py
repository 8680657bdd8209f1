"""The JAX runtime inside a jit (what `launch.anakin`'s actors run): weights quantized by jnp inside the jit are the
payload's codes and scales bit for bit, and the int forward on them equals the deployed `JaxExecutor`'s on the same
weights exactly, also vmapped over several parameter trees (one per seed); fp32 within float rounding."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from quarl.policy.spec import PolicySpec, minatar_q_network, mlp_q_network
from quarl.quant.precision import parse_precision
from quarl.quant.calibration import quantize_for_actors
from quarl.quant.quantization import QTensor
from quarl.runtimes.jax_backend import JaxExecutor, policy_forward, traced_device_params
from tests.quarl.helpers import random_params

SPECS = {
    "mlp_bounds": mlp_q_network(4, [64, 64], 2, ((-2.4, -3.0, -0.21, -3.5), (2.4, 3.0, 0.21, 3.5))),
    "minatar_conv": minatar_q_network((10, 10, 4), 6),
}


def _obs(spec: PolicySpec, rng: np.random.Generator, n: int) -> np.ndarray:
    if spec.pixels:
        return rng.integers(0, 2, (n, spec.input_dim)).astype(np.uint8)
    return rng.normal(0, 1.5, (n, spec.input_dim)).astype(np.float32)


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("precision", ["int8", "int4", "fp32"])
def test_traced_weights_and_forward_equal_the_jax_runtime(name, precision):
    spec, prec = SPECS[name], parse_precision(precision)
    rng = np.random.default_rng(3)
    trees = [random_params(spec, seed=s) for s in (0, 1)]
    obs = _obs(spec, rng, 16)
    forward = policy_forward(spec, prec)
    # Two trees stacked (as seeds are in the jitted trainer): quantized and run inside one jit, under vmap.
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *trees)

    @jax.jit
    def run(params: dict, o: jax.Array) -> tuple[dict, jax.Array]:
        device = traced_device_params(spec, params, prec)
        return device, forward(device, o)

    device, out = jax.vmap(run, in_axes=(0, None))(stacked, obs)
    for k, tree in enumerate(trees):
        host = quantize_for_actors(spec, tree, prec, obs)  # conv policies' payloads carry calibrated ranges too
        for layer in (*spec.linear_layers, *spec.conv_layers):
            want = host.tree[layer.name]["w"]
            got = jax.tree.map(lambda x, k=k: np.asarray(x[k]), device[layer.name])
            if prec.is_int:
                assert isinstance(want, QTensor)
                assert got["codes"].dtype == np.int8
                assert np.array_equal(got["codes"], np.asarray(want.values).reshape(-1, want.shape[-1]))
                assert np.array_equal(got["scale"], np.asarray(want.scale).reshape(1, -1))
            else:
                assert np.array_equal(got["w"], want)
        deployed = JaxExecutor(spec, host, batch_size=len(obs))(obs)
        if prec.is_int:  # an s32 accumulator and the same rescale: the very same numbers
            np.testing.assert_array_equal(np.asarray(out[k]), deployed)
        else:  # a vmapped fp32 conv or dot may sum in another order than the unbatched one
            np.testing.assert_allclose(np.asarray(out[k]), deployed, rtol=1e-5, atol=1e-6)


def test_traced_weights_refuse_precisions_without_an_in_jit_form():
    spec = SPECS["mlp_bounds"]
    with pytest.raises(ValueError, match="fp32 or int2..int8"):
        traced_device_params(spec, random_params(spec), parse_precision("int16"))
