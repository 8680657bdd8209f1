"""PPO learner (cleanRL's loss): GAE(lambda) advantages, the clipped-ratio policy loss, an (optionally clipped)
value loss and an entropy bonus, optimised by Adam with global-norm clipping over `update_epochs` passes of
`num_minibatches` shuffled minibatches. A2C is the same update with one epoch, one minibatch and no clipping.

One `step(rollout)` is one whole PPO update on one rollout, jitted end to end: values of the rollout's
observations and of each step's successor, GAE, then every epoch and minibatch in a `lax.scan`, so the host
hands over the rollout once and waits for nothing. `steps` counts these updates.

The rollout comes from quantized actors (`agents.ppo.actor`), so its behaviour log-probs are those of the
quantized policy: the ratio pi_fp32 / pi_actor is the correct importance weight for data the deployed policy
collected, and the clip bounds how far one update moves away from it.
"""
from __future__ import annotations

import collections
import functools
from typing import Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from chex import ArrayTree

from agents.learner_base import Batch, JaxLearner
from agents.ppo.config import PPOConfig
from agents.ppo.networks import PPONetworks, entropy, log_prob
from quarl.replay.items import StackedSample

CALIBRATION_ROLLOUTS = 1  # rollouts whose observations calibrate int conv actors (quarl.quant.calibration)
# (params, observations) -> (policy output, values): `PPONetworks.make_apply`'s function.
ApplyFn = Callable[[dict, jax.Array], tuple[jax.Array, jax.Array]]
ValueFn = Callable[[dict, jax.Array], jax.Array]  # (params, observations) -> values


class TrainingState(NamedTuple):
    params: dict  # {"policy", "value"[, "log_std"]}
    opt_state: optax.OptState
    key: jax.Array  # minibatch shuffling
    steps: jax.Array  # int32 scalar: PPO updates done


def gae_advantages(rewards: jax.Array, values: jax.Array, next_values: jax.Array, discounts: jax.Array,
                   lasts: jax.Array, gamma: float, lam: float) -> jax.Array:
    """GAE(lambda) over a [T, N] rollout (time first).

    delta_t = r_t + gamma * d_t * V(s'_t) - V(s_t), with s'_t the observation that followed step t (an episode's
    final observation on its LAST step, so a time limit, d_t = 1, still bootstraps and a termination, d_t = 0,
    does not); A_t = delta_t + gamma * lambda * (1 - last_t) * A_{t+1}, so no advantage crosses an episode end."""
    deltas = rewards + gamma * discounts * next_values - values
    carry_on = gamma * lam * (1.0 - lasts)

    def backward(adv_next: jax.Array, x: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        delta, cont = x
        adv = delta + cont * adv_next
        return adv, adv

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, carry_on), reverse=True)
    return advantages


def ppo_loss(params: dict, apply: ApplyFn, batch: Mapping[str, jax.Array], config: PPOConfig) -> tuple[jax.Array, dict]:
    """cleanRL's PPO loss on one minibatch: policy loss - entropy_coef * entropy + value_coef * value loss.

    Without `clip_coef` the policy loss is -A * ratio, whose gradient at ratio 1 (one epoch, one minibatch: A2C)
    is the plain policy gradient -A * grad log pi."""
    policy_out, values = apply(params, batch["observation"])
    log_std = params.get("log_std")
    new_logp = log_prob(policy_out, batch["action"], log_std)
    log_ratio = new_logp - batch["behaviour_logp"]
    ratio = jnp.exp(log_ratio)
    adv = batch["advantage"]
    if config.normalize_advantages:
        adv = (adv - jnp.mean(adv)) / (jnp.std(adv) + 1e-8)
    pg_loss = -adv * ratio
    if config.clip_coef is not None:
        pg_loss = jnp.maximum(pg_loss, -adv * jnp.clip(ratio, 1.0 - config.clip_coef, 1.0 + config.clip_coef))
    pg_loss = jnp.mean(pg_loss)
    v_loss = jnp.square(values - batch["return"])
    if config.clip_value_loss:
        clipped = batch["value"] + jnp.clip(values - batch["value"], -config.clip_coef, config.clip_coef)
        v_loss = jnp.maximum(v_loss, jnp.square(clipped - batch["return"]))
    v_loss = 0.5 * jnp.mean(v_loss)
    ent = jnp.mean(entropy(policy_out, log_std))
    loss = pg_loss - config.entropy_coef * ent + config.value_coef * v_loss
    clipped_frac = (jnp.zeros(()) if config.clip_coef is None
                    else jnp.mean((jnp.abs(ratio - 1.0) > config.clip_coef).astype(jnp.float32)))
    return loss, {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": ent,
                  "approx_kl": jnp.mean((ratio - 1.0) - log_ratio), "clip_fraction": clipped_frac}


def make_optimizer(config: PPOConfig, total_updates: int | None) -> optax.GradientTransformation:
    """Adam with global-norm clipping; with `anneal_lr` and a known run length the rate decays linearly to 0 over
    the run's gradient steps (cleanRL's anneal_lr)."""
    lr: float | optax.Schedule = config.learning_rate
    if config.anneal_lr and total_updates:
        grad_steps = total_updates * config.update_epochs * config.num_minibatches
        lr = optax.linear_schedule(config.learning_rate, 0.0, grad_steps)
    return optax.chain(optax.clip_by_global_norm(config.max_gradient_norm), optax.adam(lr, eps=config.adam_eps))


def _update(state: TrainingState, rollout: Mapping[str, jax.Array], *, apply: ApplyFn, value_apply: ValueFn,
            optimizer: optax.GradientTransformation, config: PPOConfig) -> tuple[TrainingState, dict]:
    t, n = rollout["reward"].shape
    flat = lambda x: x.reshape((t * n, *x.shape[2:]))  # noqa: E731  [T, N, ...] -> [T * N, ...]
    obs = flat(rollout["observation"])
    values = value_apply(state.params, obs).reshape(t, n)
    next_values = value_apply(state.params, flat(rollout["next_observation"])).reshape(t, n)
    advantages = gae_advantages(rollout["reward"], values, next_values, rollout["discount"], rollout["last"],
                                config.discount, config.gae_lambda)
    data = {"observation": obs, "action": flat(rollout["action"]), "behaviour_logp": flat(rollout["behaviour_logp"]),
            "advantage": flat(advantages), "value": flat(values), "return": flat(advantages + values)}
    grad_fn = jax.value_and_grad(functools.partial(ppo_loss, apply=apply, config=config), has_aux=True)
    size = t * n
    mb = size // config.num_minibatches

    def minibatch_step(carry: tuple, idx: jax.Array) -> tuple[tuple, dict]:
        params, opt_state = carry
        batch = jax.tree_util.tree_map(lambda x: x[idx], data)
        (loss, aux), grads = grad_fn(params, batch=batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), dict(aux, loss=loss,
                                                                        grad_norm=optax.global_norm(grads))

    def epoch(carry: tuple, key: jax.Array) -> tuple[tuple, dict]:
        order = jax.random.permutation(key, size) if config.num_minibatches > 1 else jnp.arange(size)
        return jax.lax.scan(minibatch_step, carry, order.reshape(config.num_minibatches, mb))

    key, sub = jax.random.split(state.key)
    (params, opt_state), metrics = jax.lax.scan(epoch, (state.params, state.opt_state),
                                                jax.random.split(sub, config.update_epochs))
    metrics = jax.tree_util.tree_map(lambda m: m[-1, -1], metrics)  # the last minibatch's
    ret = data["return"]
    metrics["explained_variance"] = 1.0 - jnp.var(ret - data["value"]) / (jnp.var(ret) + 1e-8)
    metrics["value_mean"] = jnp.mean(values)
    if "log_std" in params:
        metrics["std_mean"] = jnp.mean(jnp.exp(params["log_std"]))
    return TrainingState(params, opt_state, key, state.steps + 1), metrics


class PPOLearner(JaxLearner):
    """`step(rollout)` runs one PPO update on a rollout mapping of [T, N, ...] columns (see `ROLLOUT_COLUMNS`);
    `policy_params()` is the policy's fp32 tree (what actors quantize) and `log_std()` the Gaussian's log-std."""

    agent_name = "PPO"

    def __init__(self, networks: PPONetworks, config: PPOConfig, seed: int | jax.Array,
                 total_updates: int | None = None):
        self._networks, self._config = networks, config
        self._recent_obs: collections.deque = collections.deque(maxlen=CALIBRATION_ROLLOUTS)
        action = (np.int32, None) if networks.discrete else (np.float32, None)
        self.columns = {"observation": (np.float32, None), "action": action, "reward": (np.float32, None),
                        "discount": (np.float32, None), "last": (np.float32, None),
                        "next_observation": (np.float32, None), "behaviour_logp": (np.float32, None)}
        key = jax.random.PRNGKey(seed) if isinstance(seed, (int, np.integer)) else seed
        k_init, k_train = jax.random.split(key)
        optimizer = make_optimizer(config, total_updates)
        params = networks.init(k_init, config.init_log_std)
        state = TrainingState(params, optimizer.init(params), k_train, jnp.zeros((), jnp.int32))
        value_fn = networks.make_apply()
        update = functools.partial(_update, apply=networks.make_apply(config.qat_bits),
                                   value_apply=lambda p, o: value_fn(p, o)[1], optimizer=optimizer, config=config)
        super().__init__(state, update, donate=False)

    @property
    def networks(self) -> PPONetworks:
        return self._networks

    def _policy_tree(self) -> ArrayTree:
        return self._state.params["policy"]

    def log_std(self) -> np.ndarray | None:
        """The Gaussian's current log-std (None for discrete tasks): what actors sample with beside the weights."""
        value = self._state.params.get("log_std")
        return None if value is None else np.array(value, np.float32)

    def value(self, observations: np.ndarray) -> np.ndarray:
        """V(s) for a batch of observations (tests, diagnostics)."""
        return np.asarray(self._networks.make_apply()(self._state.params, jnp.asarray(observations, jnp.float32))[1])

    def _extra_columns(self, sample: Batch | StackedSample, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        del sample
        rewards = batch["reward"]
        if rewards.ndim != 2:
            raise ValueError(f"PPO rollout columns are [T, N, ...]; reward has shape {rewards.shape}")
        for key in ("discount", "last", "behaviour_logp"):
            if batch[key].shape != rewards.shape:
                raise ValueError(f"PPO rollout column {key!r} has shape {batch[key].shape}, expected {rewards.shape}")
        if rewards.size % self._config.num_minibatches:
            raise ValueError(f"a rollout of {rewards.size} transitions does not split into "
                             f"{self._config.num_minibatches} minibatches")
        self._recent_obs.append(batch["observation"])
        return {}

    def calibration_observations(self) -> np.ndarray | None:
        """The last rollout's observations, flat over time and environments (int conv actors' calibration)."""
        if not self._recent_obs:
            return None
        obs = self._recent_obs[-1]
        return obs.reshape((-1, *obs.shape[2:]))
