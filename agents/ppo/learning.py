"""PPO learner (cleanRL's loss): GAE(lambda) advantages, the clipped-ratio policy loss, an (optionally clipped)
value loss and an entropy bonus, optimised by Adam with global-norm clipping over `update_epochs` passes of
`num_minibatches` shuffled minibatches. A2C is the same update with one epoch, one minibatch and no clipping.

One `step(rollout)` is one whole PPO update on one rollout, jitted end to end: values of the rollout's
observations and of each step's successor, GAE, then every epoch and minibatch in a `lax.scan`, so the host
hands over the rollout once and waits for nothing. `steps` counts these updates.

The rollout comes from quantized actors (`agents.ppo.actor`), so its behaviour log-probs are those of the
quantized policy (and, with asynchronous distributed actors, of weights some versions old). `config.correction`
says what the update does about it:

- "none": PPO's ratio pi / mu against the behaviour policy mu itself. It is the correct importance weight for
  data mu collected, and the clip bounds how far one update moves away from mu; but when mu is far from the
  learner's policy pi_old (stale weights) the ratio starts outside the clip range and those samples give no
  gradient.
- "tis": the ratio is anchored at pi_old (the learner's policy before this update: 1 at the first epoch, so the
  clip bounds the move from what the learner has) and each sample's loss is weighted by the truncated importance
  ratio min(pi_old / mu, is_cap), as FlashRL and FP8-rollout RL do for quantized rollouts (decoupled PPO).
- "vtrace": IMPALA's V-trace (Espeholt et al., 2018) with rho-bar and c-bar gives the value targets and the
  policy-gradient advantages in place of GAE; the ratio is anchored at pi_old as for "tis".

Whatever the correction, every update reports the mismatch it saw: the spread of pi_old / mu on the rollout's
actions and KL(pi_old || mu) estimated from them (E_mu[r log r]).
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
from agents.loops import sgd_loop
from agents.ppo.config import PPOConfig
from agents.ppo.networks import PPONetworks, entropy, log_prob
from quarl.replay.items import ROLLOUT_KEYS, Rollout, StackedSample

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


def vtrace_targets(rewards: jax.Array, values: jax.Array, next_values: jax.Array, discounts: jax.Array,
                   lasts: jax.Array, log_rhos: jax.Array, gamma: float, rho_bar: float, c_bar: float
                   ) -> tuple[jax.Array, jax.Array]:
    """V-trace over a [T, N] rollout (time first): (value targets v_s, policy-gradient advantages).

    With rho_t = min(rho_bar, pi/mu), c_t = min(c_bar, pi/mu) and delta_t = rho_t (r_t + gamma d_t V(s'_t) -
    V(s_t)): v_s - V(s_s) = delta_s + gamma d_s c_s (1 - last_s) (v_{s+1} - V(s_{s+1})), and the advantage is
    rho_s (r_s + gamma d_s v'_s - V(s_s)) with v'_s = v_{s+1}, or V(s'_s) where the episode or the rollout ends.
    s'_t is the observation that followed step t, as for `gae_advantages`, so time limits bootstrap."""
    rhos = jnp.exp(log_rhos)
    clipped_rho = jnp.minimum(rho_bar, rhos)
    carry_on = gamma * discounts * jnp.minimum(c_bar, rhos) * (1.0 - lasts)
    deltas = clipped_rho * (rewards + gamma * discounts * next_values - values)

    def backward(acc_next: jax.Array, x: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        delta, cont = x
        acc = delta + cont * acc_next
        return acc, acc

    _, vs_minus_v = jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, carry_on), reverse=True)
    vs = values + vs_minus_v
    following = jnp.concatenate([vs[1:], next_values[-1:]], axis=0)
    next_vs = jnp.where(lasts > 0, next_values, following)
    return vs, clipped_rho * (rewards + gamma * discounts * next_vs - values)


def importance_stats(log_rhos: jax.Array, cap: float) -> dict[str, jax.Array]:
    """The mismatch between the learner's policy and the behaviour policy on the rollout's actions: the spread
    of r = pi / mu, the share of samples a cap would truncate, and KL(pi || mu) estimated as E_mu[r log r]."""
    r = jnp.exp(log_rhos)
    return {"is_ratio_mean": jnp.mean(r), "is_ratio_std": jnp.std(r), "is_ratio_max": jnp.max(r),
            "is_ratio_min": jnp.min(r), "is_truncated_frac": jnp.mean((r > cap).astype(jnp.float32)),
            "kl_learner_behaviour": jnp.mean(r * log_rhos)}


def ppo_loss(params: dict, apply: ApplyFn, batch: Mapping[str, jax.Array], config: PPOConfig) -> tuple[jax.Array, dict]:
    """cleanRL's PPO loss on one minibatch: policy loss - entropy_coef * entropy + value_coef * value loss.
    `batch["behaviour_logp"]` is the ratio's anchor (see the module), `batch["is_weight"]` (optional) each sample's
    weight.

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
    if "is_weight" in batch:  # 1 unless correction "tis"
        pg_loss = pg_loss * batch["is_weight"]
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


def _update(state: TrainingState, rollout: Rollout[jax.Array], *, apply: ApplyFn, value_apply: ValueFn,
            optimizer: optax.GradientTransformation, config: PPOConfig) -> tuple[TrainingState, dict]:
    t, n = rollout.reward.shape
    flat = lambda x: x.reshape((t * n, *x.shape[2:]))  # noqa: E731  [T, N, ...] -> [T * N, ...]
    obs = flat(rollout.observation)
    values = value_apply(state.params, obs).reshape(t, n)
    next_values = value_apply(state.params, flat(rollout.next_observation)).reshape(t, n)
    actions, behaviour_logp = flat(rollout.action), flat(rollout.behaviour_logp)
    # pi_old: the learner's policy before this update, on the actions the behaviour policy mu took.
    learner_logp = log_prob(apply(state.params, obs)[0], actions, state.params.get("log_std"))
    log_rhos = learner_logp - behaviour_logp
    stats = importance_stats(log_rhos, config.is_cap)
    anchor, is_weight = behaviour_logp, jnp.ones_like(behaviour_logp)
    if config.correction != "none":
        anchor = learner_logp
    if config.correction == "vtrace":
        returns, advantages = vtrace_targets(rollout.reward, values, next_values, rollout.discount,
                                             rollout.last, log_rhos.reshape(t, n), config.discount,
                                             config.vtrace_rho_bar, config.vtrace_c_bar)
    else:
        advantages = gae_advantages(rollout.reward, values, next_values, rollout.discount, rollout.last,
                                    config.discount, config.gae_lambda)
        returns = advantages + values
        if config.correction == "tis":
            is_weight = jnp.minimum(jnp.exp(log_rhos), config.is_cap)
    data = {"observation": obs, "action": actions, "behaviour_logp": jax.lax.stop_gradient(anchor),
            "is_weight": jax.lax.stop_gradient(is_weight), "advantage": flat(advantages), "value": flat(values),
            "return": flat(returns)}
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
        return sgd_loop(minibatch_step, carry, order.reshape(config.num_minibatches, mb))

    key, sub = jax.random.split(state.key)
    # Epochs x minibatches in the process's loop form (agents.loops: a scan, or unrolled).
    (params, opt_state), metrics = sgd_loop(epoch, (state.params, state.opt_state),
                                            jax.random.split(sub, config.update_epochs))
    metrics = jax.tree_util.tree_map(lambda m: m[-1, -1], metrics)  # the last minibatch's
    ret = data["return"]
    metrics["explained_variance"] = 1.0 - jnp.var(ret - data["value"]) / (jnp.var(ret) + 1e-8)
    metrics["value_mean"] = jnp.mean(values)
    metrics.update(stats)
    if "log_std" in params:
        metrics["std_mean"] = jnp.mean(jnp.exp(params["log_std"]))
    return TrainingState(params, opt_state, key, state.steps + 1), metrics


UpdateFn = Callable[[TrainingState, Rollout[jax.Array]], tuple[TrainingState, dict]]


def make_update(networks: PPONetworks, config: PPOConfig, total_updates: int | None
                ) -> tuple[Callable[[jax.Array], TrainingState], UpdateFn]:
    """(init(key) -> TrainingState, update(state, rollout) -> (state, metrics)): the one PPO/A2C update, pure and
    jittable, for `PPOLearner` and for the jitted trainer (`agents.anakin.ppo`), which runs it inside its own jit."""
    optimizer = make_optimizer(config, total_updates)
    value_fn = networks.make_apply()

    def init(key: jax.Array) -> TrainingState:
        k_init, k_train = jax.random.split(key)
        params = networks.init(k_init, config.init_log_std)
        return TrainingState(params, optimizer.init(params), k_train, jnp.zeros((), jnp.int32))

    update = functools.partial(_update, apply=networks.make_apply(config.qat_bits),
                               value_apply=lambda p, o: value_fn(p, o)[1], optimizer=optimizer, config=config)
    return init, update


class PPOLearner(JaxLearner):
    """`step(rollout)` runs one PPO update on a `quarl.replay.items.Rollout` of [T, N, ...] columns (a mapping of
    the same columns is taken too); `policy_params()` is the policy's fp32 tree (what actors quantize) and
    `log_std()` the Gaussian's log-std."""

    agent_name = "PPO"

    def __init__(self, networks: PPONetworks, config: PPOConfig, seed: int | jax.Array,
                 total_updates: int | None = None):
        self._networks, self._config = networks, config
        self._recent_obs: collections.deque = collections.deque(maxlen=CALIBRATION_ROLLOUTS)
        action = np.int32 if networks.discrete else np.float32
        self.columns = {k: (action if k == "action" else np.float32, None) for k in ROLLOUT_KEYS}
        key = jax.random.PRNGKey(seed) if isinstance(seed, (int, np.integer)) else seed
        init, update = make_update(networks, config, total_updates)
        # The scaffold hands the update its checked columns by name: the Rollout's fields, exactly.
        super().__init__(init(key), lambda state, columns: update(state, Rollout(**columns)), donate=False)

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

    def compile(self, sample: Rollout[np.ndarray] | Mapping[str, np.ndarray]) -> None:
        super().compile(sample)
        self._recent_obs.clear()  # a compile-time sample is no observation to calibrate int conv actors on

    def calibration_observations(self) -> np.ndarray | None:
        """The last rollout's observations, flat over time and environments (int conv actors' calibration)."""
        if not self._recent_obs:
            return None
        obs = self._recent_obs[-1]
        return obs.reshape((-1, *obs.shape[2:]))
