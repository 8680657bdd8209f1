"""quarl.nets.conv: `hk.Conv2D`'s network with gradients XLA:CPU runs through Eigen inside loops.

What is checked is behaviour, not speed: the gradients equal JAX's own, the parameters equal haiku's, and the
compiled loop body holds only canonical (NHWC/HWIO/NHWC) convolutions, the form XLA:CPU hands to Eigen. The speed
itself is measured alone by `bench.micro.conv_update`."""
from __future__ import annotations

import re

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from quarl.nets.conv import Conv2D, conv2d

_DN = ("NHWC", "HWIO", "NHWC")


@pytest.mark.parametrize("h, w_, k, stride, c_in, c_out", [
    (10, 10, 3, 1, 4, 16),  # MinAtar torso
    (84, 84, 8, 4, 4, 8),  # Nature torso, first layer
    (20, 20, 4, 2, 8, 6),
    (11, 12, 4, 2, 3, 5),  # (H - k) % stride != 0 on one axis: rows the windows never reach
    (9, 13, 3, 3, 2, 2),
])
def test_gradients_equal_jax(h: int, w_: int, k: int, stride: int, c_in: int, c_out: int) -> None:
    rng = np.random.default_rng(k * 100 + stride)
    x = jnp.asarray(rng.standard_normal((3, h, w_, c_in)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((k, k, c_in, c_out)), jnp.float32)

    def reference(x, w):
        return jnp.sum(jnp.sin(lax.conv_general_dilated(x, w, (stride, stride), "VALID", dimension_numbers=_DN)))

    def ours(x, w):
        return jnp.sum(jnp.sin(conv2d(x, w, stride)))

    np.testing.assert_allclose(ours(x, w), reference(x, w), rtol=1e-5)
    for got, want in zip(jax.grad(ours, (0, 1))(x, w), jax.grad(reference, (0, 1))(x, w)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(want))))


def test_parameters_and_output_are_haikus() -> None:
    """Same names, shapes and initial values as hk.Conv2D for the same key, and the same output."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 12, 12, 3)), jnp.float32)
    ours = hk.without_apply_rng(hk.transform(lambda x: Conv2D(7, 4, stride=2, name="c")(x)))
    haikus = hk.without_apply_rng(hk.transform(lambda x: hk.Conv2D(7, 4, stride=2, padding="VALID", name="c")(x)))
    p_ours, p_haiku = ours.init(jax.random.PRNGKey(3), x), haikus.init(jax.random.PRNGKey(3), x)
    assert jax.tree_util.tree_structure(p_ours) == jax.tree_util.tree_structure(p_haiku)
    for a, b in zip(jax.tree_util.tree_leaves(p_ours), jax.tree_util.tree_leaves(p_haiku)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(ours.apply(p_ours, x), haikus.apply(p_haiku, x), rtol=1e-5, atol=1e-5)


def test_bad_layer_is_refused() -> None:
    with pytest.raises(ValueError, match="VALID"):
        hk.transform(lambda x: Conv2D(4, 3, padding="SAME")(x)).init(jax.random.PRNGKey(0), jnp.zeros((1, 5, 5, 1)))


def _loop_body_dim_labels(conv) -> set[str]:
    """The dimension labels of every convolution XLA compiles for K=2 SGD steps of a two-layer conv net in a scan."""
    def loss(w, x):
        return jnp.sum(conv(conv(x, w[0], 2), w[1], 1) ** 2)

    def train(w, xs):
        return lax.scan(lambda w, x: (w - 1e-3 * jax.grad(loss)(w, x), None), w, xs)[0]

    w = jnp.ones((2, 3, 3, 4, 4), jnp.float32)
    xs = jnp.ones((2, 8, 15, 15, 4), jnp.float32)
    text = jax.jit(train).lower(w, xs).compile().as_text()
    assert "while" in text  # the loop was not unrolled away: the body is a while computation
    return set(re.findall(r"dim_labels=([^,\s]+)", text))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the canonical-form rule is XLA:CPU's")
def test_gradient_convolutions_in_a_loop_are_canonical() -> None:
    """The cause of the slow loop, checked on the compiled program: JAX's own gradient leaves a non-canonical
    convolution in the while body (XLA's naive loop); ours leaves only the form XLA:CPU runs with Eigen."""
    canonical = {"b01f_01io->b01f"}
    assert _loop_body_dim_labels(lambda x, w, s: conv2d(x, w, s)) == canonical
    jax_own = _loop_body_dim_labels(
        lambda x, w, s: lax.conv_general_dilated(x, w, (s, s), "VALID", dimension_numbers=_DN))
    assert jax_own - canonical, "JAX's conv gradient is canonical in a loop now: quarl.nets.conv may be unneeded"
