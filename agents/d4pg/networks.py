"""D4PG networks (haiku): the policy from a `quarl.policy.spec.PolicySpec`, and Acme's distributional critic.

The policy is built with `quarl.nets.haiku.haiku_forward`, so the tree the learner trains is exactly the tree the
quantizer and every actor runtime consume (same layer names, same computation). The critic never leaves the
learner, so it is plain haiku: concat(obs, action) -> Linear -> LayerNorm -> tanh -> ELU MLP -> Linear to
`num_atoms` logits over the fixed support `linspace(vmin, vmax, num_atoms)` (Acme's DiscreteValuedHead).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from quarl.nets.haiku import haiku_forward
from quarl.policy import spec as qpolicy

from agents.d4pg.config import D4PGConfig


@dataclasses.dataclass(frozen=True)
class D4PGNetworks:
    """Pure functions and constants the learner needs; `policy_spec` is what actors receive."""

    policy_spec: qpolicy.PolicySpec
    policy: hk.Transformed  # apply(params, obs[B, obs_dim]) -> actions[B, act_dim]
    critic: hk.Transformed  # apply(params, obs[B, obs_dim], actions[B, act_dim]) -> logits[B, num_atoms]
    atoms: jax.Array  # [num_atoms] float32 support of the return distribution
    obs_dim: int
    action_dim: int
    # The policy as the learner's DPG loss runs it: with `D4PGConfig.qat_bits` set, the same parameters
    # through the deployed int-B arithmetic (quarl.nets.qat); None = `policy` (fp32).
    qat_policy: hk.Transformed | None = None

    @property
    def train_policy(self) -> hk.Transformed:
        """The network the policy gradient flows through (QAT when configured, else the fp32 policy)."""
        return self.policy if self.qat_policy is None else self.qat_policy


def policy_spec(obs_dim: int, layer_sizes: Sequence[int], action_min: Sequence[float],
                action_max: Sequence[float]) -> qpolicy.PolicySpec:
    """Acme's D4PG policy as a spec: LayerNorm MLP, near-zero last layer, tanh onto the action bounds."""
    return qpolicy.layer_norm_mlp_policy(obs_dim, tuple(layer_sizes), tuple(action_min), tuple(action_max))


def critic_forward(layer_sizes: Sequence[int], num_atoms: int):
    """Acme's critic torso + categorical head as a haiku function of (obs, action)."""
    # Acme 0.4.0's LayerNormMLP initialiser, every layer including the logits: U(+-0.333 * sqrt(3 / fan_in)).
    w_init = hk.initializers.UniformScaling(qpolicy.ACME_UNIFORM_SCALE)

    def forward(obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs, action], axis=-1)
        x = hk.Linear(layer_sizes[0], w_init=w_init, name="critic_linear_0")(x)
        x = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, name="critic_layer_norm")(x)
        x = jnp.tanh(x)
        for i, size in enumerate(layer_sizes[1:], start=1):
            x = jax.nn.elu(hk.Linear(size, w_init=w_init, name=f"critic_linear_{i}")(x))
        return hk.Linear(num_atoms, w_init=w_init, name=f"critic_linear_{len(layer_sizes)}")(x)

    return forward


def critic_mean(logits: jax.Array, atoms: jax.Array) -> jax.Array:
    """Expected return of the categorical distribution, the Q value the policy climbs."""
    return jnp.sum(jax.nn.softmax(logits, axis=-1) * atoms, axis=-1)


def make_networks(config: D4PGConfig, obs_dim: int, action_min: Sequence[float],
                  action_max: Sequence[float]) -> D4PGNetworks:
    """Policy and critic for an observation width and (canonical) action bounds."""
    lo = np.asarray(action_min, np.float64).reshape(-1)
    hi = np.asarray(action_max, np.float64).reshape(-1)
    if lo.shape != hi.shape or lo.size == 0:
        raise ValueError(f"action bounds must be equal-length non-empty vectors, got {lo.shape} and {hi.shape}")
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise ValueError("D4PG needs finite action bounds")
    spec = policy_spec(obs_dim, config.policy_layer_sizes, lo.tolist(), hi.tolist())
    policy = hk.without_apply_rng(hk.transform(haiku_forward(spec)))
    qat_policy = None
    if config.qat_bits is not None:
        qat_policy = hk.without_apply_rng(hk.transform(haiku_forward(spec, qat_bits=config.qat_bits)))
    critic = hk.without_apply_rng(hk.transform(critic_forward(config.critic_layer_sizes, config.num_atoms)))
    atoms = jnp.linspace(config.vmin, config.vmax, config.num_atoms, dtype=jnp.float32)
    return D4PGNetworks(spec, policy, critic, atoms, int(obs_dim), int(lo.size), qat_policy)
