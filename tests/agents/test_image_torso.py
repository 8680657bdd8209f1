"""`image_torso="mlp"` (PPO and DQN) and DQN's `activation`: a MinAtar frame flattened into the MLP of the hidden sizes,
what rejax runs, so that bench.peers.anakin_rejax compares the same networks. The learner's network and a deployed
ONNX actor (fp32, int8) compute the same function on it, and the jitted trainer and launch.train's builder build it
from the config (the in-jit JAX runtime equals a deployed one on any spec: tests/quarl/test_traced_runtime.py); the
conv torso stays the default, unchanged."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import agents
from agents.anakin import make_trainer
from agents.dqn.config import DQNConfig
from agents.dqn.networks import init_params, make_q_spec, q_apply_fn
from agents.ppo.config import PPOConfig
from agents.ppo.networks import make_networks
from quarl.envs.gymnax_env import GymnaxEnv
from quarl.ops.checks import ConfigError
from quarl.policy.spec import Activation, Flatten, Linear, minatar_q_network
from quarl.quant.precision import parse_precision
from quarl.runtimes import make_executor_from_params

SHAPE = (10, 10, 4)


def _frames(n: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 2, (n, *SHAPE)).astype(np.uint8)


def test_ppo_mlp_torso_flattens_the_frame_into_both_networks():
    nets = make_networks(PPOConfig(image_torso="mlp", policy_hidden_sizes=(64, 64), value_hidden_sizes=(32,)),
                         400, 6, SHAPE)
    for spec, widths in ((nets.policy, [64, 64, 6]), (nets.value, [32, 1])):
        assert spec.input_shape == SHAPE and isinstance(spec.layers[0], Flatten) and not spec.pixels
        assert [layer.out for layer in spec.layers if isinstance(layer, Linear)] == widths
        assert {layer.fn for layer in spec.layers if isinstance(layer, Activation)} == {"tanh"}
    params = nets.init(jax.random.PRNGKey(0), 0.0)
    logits, values = jax.jit(nets.make_apply())(params, _frames(5))
    assert logits.shape == (5, 6) and values.shape == (5,) and np.all(np.isfinite(logits))
    trainer = make_trainer("ppo", GymnaxEnv("MinAtar/Breakout"), PPOConfig(image_torso="mlp"),
                           parse_precision("int8"), total_env_steps=1_000)
    assert trainer.policy_spec == make_networks(PPOConfig(image_torso="mlp"), 400, 6, SHAPE).policy
    conv = make_networks(PPOConfig(), 400, 6, SHAPE)  # the default: the MinAtar conv torso, as before
    assert conv.policy == make_q_spec(400, 6, (64, 64), SHAPE)


def test_dqn_mlp_torso_is_one_function_in_the_learner_and_every_actor():
    config = DQNConfig(hidden_sizes=(64, 64), activation="tanh", image_torso="mlp")
    spec = make_q_spec(400, 6, config.hidden_sizes, SHAPE, activation=config.activation,
                       image_torso=config.image_torso)
    assert spec.input_shape == SHAPE and isinstance(spec.layers[0], Flatten)
    assert [layer.fn for layer in spec.layers if isinstance(layer, Activation)] == ["tanh", "tanh"]
    params = jax.tree.map(np.asarray, init_params(spec, jax.random.PRNGKey(1)))
    frames = _frames(16)
    learner = np.asarray(jax.jit(q_apply_fn(spec))(params, frames))
    int8 = parse_precision("int8")
    for precision, tolerance in (("fp32", 1e-5), ("int8", 0.05)):  # a deployed actor on the flat rows it is given
        actor = make_executor_from_params(spec, params, precision, backend="onnx", batch_size=16)
        assert np.abs(np.asarray(actor(frames.reshape(16, -1))) - learner).max() < tolerance * np.abs(learner).max()
    env = GymnaxEnv("MinAtar/Breakout")  # the jitted trainer and launch.train's builder build the same network
    assert make_trainer("dqn", env, config, int8, total_env_steps=1_000).policy_spec == spec
    assert agents.get_builder("dqn", **dataclasses.asdict(config)).policy_spec(env.spec) == spec
    assert make_q_spec(400, 6, (64,), SHAPE) == minatar_q_network(SHAPE, 6)  # default unchanged
    relu = make_q_spec(4, 2, (8,))
    assert relu == make_q_spec(4, 2, (8,), activation="relu")  # vector nets keep their specs (and digests)


def test_bad_torso_or_activation_is_a_one_line_error():
    with pytest.raises(ConfigError, match="image_torso must be one of conv, mlp"):
        DQNConfig(image_torso="resnet")
    with pytest.raises(ConfigError, match="activation must be one of"):
        DQNConfig(activation="swish")
    with pytest.raises(ValueError, match="image_torso must be one of conv, mlp"):
        PPOConfig(image_torso="dense")
