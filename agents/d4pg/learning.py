"""D4PG learner: distributional critic (categorical projection) + deterministic policy gradient.

One `jax.jit`-compiled function does a whole SGD step (both losses, both Adam updates, the periodic target
copy) on device-resident state; the host only feeds the sampled batch in and reads a handful of scalar
metrics back. Batches carry n-step transitions from `quarl.replay.adders.NStepTransitionAdder`: `reward` is the
discounted n-step sum and `discount` already includes gamma^n (0 at termination), so the target is
`reward + discount * Z'(s', pi'(s'))` with no further discounting here.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import rlax

from agents.d4pg.config import D4PGConfig
from agents.d4pg.networks import D4PGNetworks, critic_mean
from agents.learner_base import JaxLearner

class TrainingState(NamedTuple):
    policy_params: hk.Params
    critic_params: hk.Params
    target_policy_params: hk.Params
    target_critic_params: hk.Params
    policy_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    steps: jax.Array


def make_optimizer(config: D4PGConfig) -> optax.GradientTransformation:
    """Adam, preceded by global-norm clipping when `max_gradient_norm` is set (Acme's `clipping=True`)."""
    adam = optax.adam(config.learning_rate)
    if config.max_gradient_norm is None:
        return adam
    return optax.chain(optax.clip_by_global_norm(config.max_gradient_norm), adam)


def categorical_target(atoms: jax.Array, reward: jax.Array, discount: jax.Array,
                       logits_t: jax.Array) -> jax.Array:
    """Probabilities on `atoms` of the target r + d * Z_t, projected back onto the fixed support.

    Shapes: atoms [K], reward/discount [B], logits_t [B, K] -> [B, K]. Mass that lands beyond vmin/vmax is
    clipped to the end atoms (Bellemare et al.'s C51 projection, as `rlax.categorical_l2_project`).
    """
    z_t = reward[:, None] + discount[:, None] * atoms[None, :]
    probs_t = jax.nn.softmax(logits_t, axis=-1)
    project = jax.vmap(rlax.categorical_l2_project, in_axes=(0, 0, None))
    return jax.lax.stop_gradient(project(z_t, probs_t, atoms))


def critic_loss(networks: D4PGNetworks, critic_params, target_policy_params, target_critic_params,
                batch: Mapping[str, jax.Array]) -> jax.Array:
    """Mean cross-entropy between Z(s, a) and the projected target r + d * Z'(s', pi'(s'))."""
    logits_tm1 = networks.critic.apply(critic_params, batch["observation"], batch["action"])
    a_t = networks.policy.apply(target_policy_params, batch["next_observation"])
    logits_t = networks.critic.apply(target_critic_params, batch["next_observation"], a_t)
    target = categorical_target(networks.atoms, batch["reward"], batch["discount"], logits_t)
    return jnp.mean(optax.softmax_cross_entropy(logits_tm1, target))


def policy_loss(networks: D4PGNetworks, policy_params, critic_params, observations: jax.Array,
                dqda_clipping: float | None) -> tuple[jax.Array, jax.Array]:
    """DPG loss: push pi(s) along dQ/da (clipped), Q being the mean of the distributional critic.

    Returns (loss, mean Q(s, pi(s))). Rows are independent (LayerNorm is per row), so the gradient of the
    summed Q with respect to the action batch is the per-sample dQ/da. With QAT (`networks.qat_policy`)
    pi(s) is the deployed int-B policy's action, and the gradient reaches the fp32 weights by the STE.
    """
    actions = networks.train_policy.apply(policy_params, observations)

    def total_q(a: jax.Array) -> tuple[jax.Array, jax.Array]:
        q = critic_mean(networks.critic.apply(critic_params, observations, a), networks.atoms)
        return jnp.sum(q), q

    dqda, q = jax.grad(total_q, has_aux=True)(actions)
    losses = jax.vmap(rlax.dpg_loss, in_axes=(0, 0, None))(actions, dqda, dqda_clipping)
    # rlax.dpg_loss is element-wise ([B, act_dim]); Acme averages over batch *and* action dimensions, so the
    # gradient's scale (and how often global-norm clipping bites) does not grow with the action size.
    return jnp.mean(losses), jnp.mean(q)


def make_update_fn(networks: D4PGNetworks, config: D4PGConfig, optimizer: optax.GradientTransformation):
    """The pure SGD step `(state, batch) -> (state, metrics)` (jit it; the learner does)."""

    def update(state: TrainingState, batch: Mapping[str, jax.Array]) -> tuple[TrainingState, dict]:
        c_loss, c_grads = jax.value_and_grad(critic_loss, argnums=1)(
            networks, state.critic_params, state.target_policy_params, state.target_critic_params, batch)
        # The policy climbs the online critic at the arrival states o_t, as Acme's learner does
        # (acme/agents/jax/d4pg/learning.py: `policy_loss(..., transitions.next_observation)`).
        (p_loss, q_mean), p_grads = jax.value_and_grad(policy_loss, argnums=1, has_aux=True)(
            networks, state.policy_params, state.critic_params, batch["next_observation"], config.dqda_clipping)
        c_updates, critic_opt_state = optimizer.update(c_grads, state.critic_opt_state, state.critic_params)
        p_updates, policy_opt_state = optimizer.update(p_grads, state.policy_opt_state, state.policy_params)
        critic_params = optax.apply_updates(state.critic_params, c_updates)
        policy_params = optax.apply_updates(state.policy_params, p_updates)
        steps = state.steps + 1
        target_policy = optax.periodic_update(policy_params, state.target_policy_params, steps,
                                              config.target_update_period)
        target_critic = optax.periodic_update(critic_params, state.target_critic_params, steps,
                                              config.target_update_period)
        new_state = TrainingState(policy_params, critic_params, target_policy, target_critic,
                                  policy_opt_state, critic_opt_state, steps)
        metrics = {
            "critic_loss": c_loss,
            "policy_loss": p_loss,
            "q_mean": q_mean,
            "critic_grad_norm": optax.global_norm(c_grads),
            "policy_grad_norm": optax.global_norm(p_grads),
        }
        return new_state, metrics

    return update


class D4PGLearner(JaxLearner):
    """fp32 D4PG learner holding its state on device; see `agents.d4pg.builder` for the runner contract and
    `agents.learner_base` for the scaffold (step counter, K-step scan, batch checks, checkpoints)."""

    agent_name = "D4PG"
    # The policy trees are not donated: the publisher's snapshot of the served one is then a reference, not a
    # device copy on the training thread per version; the rest of the state (critic, optimizer) is donated.
    kept_fields = ("policy_params", "target_policy_params")

    def __init__(self, networks: D4PGNetworks, config: D4PGConfig, seed: int | jax.Array):
        self._networks = networks
        self._config = config
        self.columns = {"observation": (np.float32, (networks.obs_dim,)),
                        "action": (np.float32, (networks.action_dim,)),
                        "reward": (np.float32, ()), "discount": (np.float32, ()),
                        "next_observation": (np.float32, (networks.obs_dim,))}
        key = jax.random.PRNGKey(seed) if isinstance(seed, (int, np.integer)) else seed
        policy_key, critic_key = jax.random.split(key)
        obs = jnp.zeros((1, networks.obs_dim), jnp.float32)
        act = jnp.zeros((1, networks.action_dim), jnp.float32)
        policy_params = networks.policy.init(policy_key, obs)
        critic_params = networks.critic.init(critic_key, obs, act)
        optimizer = make_optimizer(config)
        state = TrainingState(
            policy_params=policy_params,
            critic_params=critic_params,
            # Copies: the jitted update donates its input state, and a buffer cannot be donated twice.
            target_policy_params=jax.tree_util.tree_map(jnp.copy, policy_params),
            target_critic_params=jax.tree_util.tree_map(jnp.copy, critic_params),
            policy_opt_state=optimizer.init(policy_params),
            critic_opt_state=optimizer.init(critic_params),
            steps=jnp.zeros((), jnp.int32),
        )
        super().__init__(state, make_update_fn(networks, config, optimizer), donate=True)

    def _policy_tree(self) -> hk.Params:
        """The policy actors run. With `config.actor_policy == "target"` (the default) that is the target policy,
        as Acme's D4PG learner serves it (`get_variables("policy")` returns `target_policy_params`): actors and
        evaluators act with weights that change only every `target_update_period` steps. "online" serves the
        online policy."""
        if self._config.actor_policy == "online":
            return self._state.policy_params
        return self._state.target_policy_params
