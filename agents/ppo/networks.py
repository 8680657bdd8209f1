"""PPO's networks: a policy that actors run (a `quarl.policy.spec.PolicySpec`, so every quantized runtime executes it)
and a separate value network that only the learner runs (fp32, never quantized).

The policy's output is what a quantized actor acts on: logits for discrete tasks (sampled while training,
argmax in evaluation) and the Gaussian mean for continuous ones (plus noise of the learned, state-independent
std while training; the mean, clipped to [-1, 1], in evaluation). Keeping the std outside the spec keeps the
spec a plain feed-forward network the runtimes already know; the std travels to actors beside the weights.
Image tasks reuse DQN's conv torsos (`agents.dqn.networks.make_q_spec`) for the policy, and the same torso with
one output for the value; with `image_torso="mlp"` both are the MLPs on the flattened image (`flat_image_spec`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from agents.dqn.networks import NATURE_MIN_SIZE, flat_image_spec, make_q_spec
from agents.ppo.config import PPOConfig
from quarl.nets.haiku import haiku_forward
from quarl.policy.spec import Activation, Linear, PolicySpec, minatar_q_network, nature_q_network

# A near-zero policy head starts with near-uniform logits / a near-zero mean (cleanRL's 0.01 orthogonal head);
# a unit-scale value head, as cleanRL's.
POLICY_HEAD_SCALE = 1e-4
VALUE_HEAD_SCALE = 1.0
HALF_LOG_2PI_E = 0.5 * float(np.log(2.0 * np.pi * np.e))


def mlp_spec(obs_dim: int, hidden: Sequence[int], out: int, activation: str, head_scale: float) -> PolicySpec:
    """An MLP with `activation` between Linear layers and a linear head of `out` units (VarianceScaling head)."""
    layers: list = []
    for i, h in enumerate(hidden):
        layers += [Linear(f"linear_{i}", int(h)), Activation(activation)]
    layers.append(Linear(f"linear_{len(hidden)}", int(out), init_scale=head_scale))
    return PolicySpec(int(obs_dim), tuple(layers))


def _is_image(obs_shape: Sequence[int] | None) -> bool:
    return obs_shape is not None and len(obs_shape) == 3


def _mlp_on(spec: PolicySpec, obs_shape: Sequence[int] | None) -> PolicySpec:
    """`spec` (an MLP) on the task's observations: as it is for vectors, flattened first for images."""
    return flat_image_spec(spec, obs_shape) if _is_image(obs_shape) else spec


def policy_spec(config: PPOConfig, obs_dim: int, num_outputs: int, obs_shape: Sequence[int] | None = None,
                discrete: bool = True) -> PolicySpec:
    """Logits (discrete, >= 2 actions) or the Gaussian mean (continuous) for the task."""
    if discrete and num_outputs < 2:
        raise ValueError(f"a discrete task needs >= 2 actions, got {num_outputs}")
    if not discrete and num_outputs < 1:
        raise ValueError(f"a continuous task needs >= 1 action dimension, got {num_outputs}")
    if _is_image(obs_shape) and config.image_torso == "conv":
        if not discrete:
            raise ValueError("PPO's image torsos are for discrete actions (MinAtar, ALE)")
        return make_q_spec(obs_dim, num_outputs, config.policy_hidden_sizes, obs_shape)
    if obs_shape is not None and len(obs_shape) not in (1, 3):
        raise ValueError(f"PPO takes vector or [H, W, C] image observations, got shape {tuple(obs_shape)}")
    return _mlp_on(mlp_spec(obs_dim, config.policy_hidden_sizes, num_outputs, config.activation, POLICY_HEAD_SCALE),
                   obs_shape)


def value_spec(config: PPOConfig, obs_dim: int, obs_shape: Sequence[int] | None = None) -> PolicySpec:
    """The state-value network: the policy's torso kind with one output."""
    if _is_image(obs_shape) and config.image_torso == "conv":
        if min(obs_shape[:2]) >= NATURE_MIN_SIZE:
            return nature_q_network(obs_shape, 1)
        return minatar_q_network(obs_shape, 1)
    return _mlp_on(mlp_spec(obs_dim, config.value_hidden_sizes, 1, config.activation, VALUE_HEAD_SCALE), obs_shape)


@dataclasses.dataclass(frozen=True)
class PPONetworks:
    """Both specs, what the action head is, and pure apply functions.

    `apply(params, obs) -> (policy_out [B, A], value [B])`; `params` = {"policy", "value", "log_std"}
    ("log_std" [A] only for continuous tasks). With `qat_bits` the policy computes as an int-B actor does."""

    policy: PolicySpec
    value: PolicySpec
    discrete: bool
    num_outputs: int

    def init(self, key: jax.Array, init_log_std: float) -> dict:
        """Fresh parameters, initialised in one jitted call (eager haiku init compiles every op on its own)."""
        dummy = np.zeros((1, self.policy.input_dim), np.float32)

        def init(key: jax.Array) -> dict:
            k_pi, k_v = jax.random.split(key)
            return {"policy": _transform(self.policy).init(k_pi, dummy),
                    "value": _transform(self.value).init(k_v, dummy)}

        params = jax.jit(init)(key)
        if not self.discrete:
            params["log_std"] = jnp.full((self.num_outputs,), init_log_std, jnp.float32)
        return params

    def make_apply(self, qat_bits: int | None = None) -> Callable[[dict, jax.Array], tuple[jax.Array, jax.Array]]:
        pi = _transform(self.policy, qat_bits).apply
        v = _transform(self.value).apply

        def apply(params: dict, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
            return pi(params["policy"], obs), v(params["value"], obs)[:, 0]

        return apply


def _transform(spec: PolicySpec, qat_bits: int | None = None) -> hk.Transformed:
    return hk.without_apply_rng(hk.transform(lambda obs: haiku_forward(spec, qat_bits=qat_bits)(obs)))


def make_networks(config: PPOConfig, obs_dim: int, num_outputs: int, obs_shape: Sequence[int] | None = None,
                  discrete: bool = True) -> PPONetworks:
    return PPONetworks(policy_spec(config, obs_dim, num_outputs, obs_shape, discrete),
                       value_spec(config, obs_dim, obs_shape), bool(discrete), int(num_outputs))


# ------------------------------------------------------------------------------------------ distributions
# The same formulas in JAX (learner) and NumPy (actors, `agents.ppo.actor`), so behaviour log-probs recorded by a
# quantized actor and the learner's log-probs of the same actions are the same quantity.


def log_prob(policy_out: jax.Array, actions: jax.Array, log_std: jax.Array | None) -> jax.Array:
    """log pi(a|s) per row: categorical over logits, or a diagonal Gaussian (summed over action dims)."""
    if log_std is None:
        logp = jax.nn.log_softmax(policy_out, axis=-1)
        return jnp.take_along_axis(logp, actions.astype(jnp.int32)[:, None], axis=-1)[:, 0]
    z = (actions - policy_out) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z * z - log_std - 0.5 * jnp.log(2.0 * jnp.pi), axis=-1)


def entropy(policy_out: jax.Array, log_std: jax.Array | None) -> jax.Array:
    """Per-row entropy of the action distribution."""
    if log_std is None:
        logp = jax.nn.log_softmax(policy_out, axis=-1)
        return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return jnp.broadcast_to(jnp.sum(log_std + HALF_LOG_2PI_E), policy_out.shape[:1])
