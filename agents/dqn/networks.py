"""DQN's Q-network, described as a `quarl.policy.PolicySpec` so the learner (haiku, fp32) and the actors
(any quarl runtime, quantized) build the very same computation from plain data."""
from __future__ import annotations

from typing import Callable, Sequence

import haiku as hk
import jax
import numpy as np

from quarl.policy import PolicySpec, haiku_forward, mlp_q_network


def make_q_spec(obs_dim: int, num_actions: int, hidden_sizes: Sequence[int]) -> PolicySpec:
    """ReLU MLP with one linear Q-value output per discrete action."""
    if num_actions < 2:
        raise ValueError(f"DQN needs a discrete action space with >= 2 actions, got {num_actions}")
    return mlp_q_network(obs_dim, tuple(hidden_sizes), num_actions)


def make_q_network(spec: PolicySpec, qat_bits: int | None = None) -> hk.Transformed:
    """The spec as a pure (init, apply) pair; `apply(params, obs[B, obs_dim]) -> q[B, num_actions]`.
    `qat_bits` computes it as an int-B actor does (quantization-aware training, same params)."""
    return hk.without_apply_rng(hk.transform(lambda obs: haiku_forward(spec, qat_bits=qat_bits)(obs)))


def init_params(spec: PolicySpec, key: jax.Array) -> hk.Params:
    """Fresh fp32 parameters (param keys are the spec's layer names)."""
    return make_q_network(spec).init(key, np.zeros((1, spec.input_dim), np.float32))


def q_apply_fn(spec: PolicySpec, qat_bits: int | None = None) -> Callable[[hk.Params, jax.Array], jax.Array]:
    return make_q_network(spec, qat_bits).apply
