"""DQN's Q-network, described as a `quarl.policy.spec.PolicySpec` so the learner (haiku, fp32) and the actors
(any quarl runtime, quantized) build the very same computation from plain data.

The task's observation shape picks the network: vectors get the MLP of `hidden_sizes` (ReLU, or the config's
`activation`); small images (MinAtar's 10x10xC) the MinAtar authors' torso (one 3x3 conv of 16, fc 128); Atari-sized
frames (84x84x4) the Nature torso. `hidden_sizes` applies to the MLP only: the conv torsos are the published ones.
`image_torso="mlp"` puts an image through the MLP instead, flattened (`flat_image_spec`): what rejax runs on MinAtar,
so that the peer benchmark (`bench.peers.anakin_rejax`) compares the same networks."""
from __future__ import annotations

from typing import Callable, Sequence

import haiku as hk
import jax
import numpy as np

from quarl.nets.haiku import haiku_forward
from quarl.policy.spec import Flatten, PolicySpec, minatar_q_network, mlp_q_network, nature_q_network

# Images at least this high and wide get the Nature torso (its three convs need 36x36); smaller ones MinAtar's.
NATURE_MIN_SIZE = 36


def make_q_spec(obs_dim: int, num_actions: int, hidden_sizes: Sequence[int],
                obs_shape: Sequence[int] | None = None,
                observation_bounds: Sequence[Sequence[float]] | None = None, *, activation: str = "relu",
                image_torso: str = "conv") -> PolicySpec:
    """One Q-value per discrete action: an MLP (`activation`) for vector observations, a conv torso for [H, W, C]
    images, or with `image_torso="mlp"` the MLP on the flattened image (see the module docstring).
    `observation_bounds` ((lows), (highs)): the MLP maps them onto [-1, 1] first (`PolicySpec.input_bounds`), in the
    learner and every actor alike."""
    if num_actions < 2:
        raise ValueError(f"DQN needs a discrete action space with >= 2 actions, got {num_actions}")
    if obs_shape is None or len(obs_shape) == 1:
        return mlp_q_network(obs_dim, tuple(hidden_sizes), num_actions, observation_bounds, activation)
    if observation_bounds is not None:
        raise ValueError("observation_bounds apply to vector observations only")
    if len(obs_shape) != 3:
        raise ValueError(f"DQN takes vector or [H, W, C] image observations, got shape {tuple(obs_shape)}")
    if image_torso == "mlp":
        return flat_image_spec(mlp_q_network(obs_dim, tuple(hidden_sizes), num_actions, None, activation), obs_shape)
    if image_torso != "conv":
        raise ValueError(f"image_torso must be conv or mlp, got {image_torso!r}")
    if min(obs_shape[:2]) >= NATURE_MIN_SIZE:
        return nature_q_network(obs_shape, num_actions)
    return minatar_q_network(obs_shape, num_actions)


def flat_image_spec(mlp: PolicySpec, obs_shape: Sequence[int]) -> PolicySpec:
    """The vector network `mlp` (input_dim H * W * C) on [H, W, C] images: the image flattened in C order first.
    Observations come as the runtime gets them (floats; no `pixels` uint8 path, which feeds a first conv)."""
    if mlp.input_bounds is not None or mlp.input_shape is not None:
        raise ValueError("flat_image_spec wants a plain vector network")
    return PolicySpec(mlp.input_dim, (Flatten(), *mlp.layers), tuple(int(d) for d in obs_shape))


def make_q_network(spec: PolicySpec, qat_bits: int | None = None) -> hk.Transformed:
    """The spec as a pure (init, apply) pair; `apply(params, obs[B, obs_dim]) -> q[B, num_actions]`.
    `qat_bits` computes it as an int-B actor does (quantization-aware training, same params)."""
    return hk.without_apply_rng(hk.transform(lambda obs: haiku_forward(spec, qat_bits=qat_bits)(obs)))


def init_params(spec: PolicySpec, key: jax.Array) -> hk.Params:
    """Fresh fp32 parameters (param keys are the spec's layer names)."""
    return make_q_network(spec).init(key, np.zeros((1, spec.input_dim), np.float32))


def q_apply_fn(spec: PolicySpec, qat_bits: int | None = None) -> Callable[[hk.Params, jax.Array], jax.Array]:
    return make_q_network(spec, qat_bits).apply
