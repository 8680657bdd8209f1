"""DQN learner: double-DQN n-step targets, Huber loss, Adam with global-norm clipping, periodic hard target
updates, optional prioritized-replay importance weights — all in one jitted update.

The whole training state lives on the device between steps; the only host transfers are the sampled batch in
and (for prioritized tables) the new priorities out, read when the caller needs them rather than at each step.
Metrics come back as 0-d device arrays so that a caller that does not log every step never waits for the device;
`float(v)` converts one when it is needed.
"""
from __future__ import annotations

import collections
import functools
from typing import Callable, Mapping, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import rlax

from agents.dqn.config import DQNConfig
from agents.dqn.networks import init_params, q_apply_fn
from agents.learner_base import Batch, JaxLearner, Metrics
from quarl.policy.spec import PolicySpec
from quarl.replay.items import StackedSample

CALIBRATION_BATCHES = 4  # sampled batches whose observations calibrate int conv actors (quarl.quant.calibration)


class TrainingState(NamedTuple):
    params: hk.Params
    target_params: hk.Params
    opt_state: optax.OptState
    steps: jax.Array  # int32 scalar, the number of completed updates


def double_q_targets(q_t_value: jax.Array, q_t_selector: jax.Array, reward: jax.Array,
                     discount: jax.Array) -> jax.Array:
    """n-step double-DQN target: r + d * Q_target(s', argmax_a Q_online(s', a)) for a batch.

    Selecting with the online net and evaluating with the target net removes most of max-operator
    overestimation (van Hasselt et al., 2016); `discount` already folds in gamma^n and termination."""
    best = jnp.argmax(q_t_selector, axis=-1)
    bootstrap = jnp.take_along_axis(q_t_value, best[:, None], axis=-1)[:, 0]
    return reward + discount * bootstrap


def importance_weights(probabilities: jax.Array, exponent: float) -> jax.Array:
    """Prioritized-replay correction (1/p)^beta, normalised by its max so the loss scale never grows."""
    w = (1.0 / probabilities) ** exponent
    return w / jnp.max(w)


def make_loss(spec: PolicySpec, huber_loss_parameter: float, qat_bits: int | None = None):
    """Double-DQN Huber loss. With `qat_bits` the online network (what actors deploy) runs through the
    int-B actor arithmetic (quarl.nets.qat: fake-quantized weights, straight-through gradients); the target
    network only ever serves the learner, so it stays fp32."""
    online_apply = q_apply_fn(spec, qat_bits)
    apply = q_apply_fn(spec)

    def loss_fn(params, target_params, batch, weights):
        obs, next_obs = batch["observation"], batch["next_observation"]
        q_tm1 = online_apply(params, obs)
        # s' goes through the online net as a constant: with the params stopped, autodiff builds no backward pass
        # for it. One pass over [s; s'] instead ran the backward over both halves (s' rows with zero cotangent):
        # 1.48x the update time on the Nature torso at batch 32, 1.13-1.31x for MLPs (`bench.micro.dqn_update`).
        q_t_selector = online_apply(jax.lax.stop_gradient(params), next_obs)
        q_t_value = apply(target_params, next_obs)
        target = double_q_targets(q_t_value, q_t_selector, batch["reward"], batch["discount"])
        q_taken = jnp.take_along_axis(q_tm1, batch["action"][:, None], axis=-1)[:, 0]
        td_error = jax.lax.stop_gradient(target) - q_taken
        loss = jnp.mean(weights * rlax.huber_loss(td_error, huber_loss_parameter))
        return loss, (td_error, q_taken)

    return loss_fn


def make_update(spec: PolicySpec, config: DQNConfig) -> tuple[Callable[[jax.Array], TrainingState], Callable]:
    """(init(key) -> TrainingState, update(state, batch, probabilities) -> (state, metrics, td_error)): the one DQN
    update, pure and jittable, for `DQNLearner` and for the jitted trainer (`agents.anakin.dqn`), which runs it inside
    its own jit. `probabilities`: the sampled items' (prioritized replay), or None (uniform)."""
    optimizer = make_optimizer(config)

    def init(key: jax.Array) -> TrainingState:
        params = init_params(spec, key)
        return TrainingState(params=params, target_params=jax.tree.map(jnp.copy, params),
                             opt_state=optimizer.init(params), steps=jnp.zeros((), jnp.int32))

    update = functools.partial(
        _update, loss_fn=make_loss(spec, config.huber_loss_parameter, config.qat_bits), optimizer=optimizer,
        target_update_period=config.target_update_period, target_update_tau=config.target_update_tau,
        is_exponent=config.importance_sampling_exponent if config.prioritized_replay else None)
    return init, update


class DQNLearner(JaxLearner):
    """`step(sample)` runs one update (`prepare` + `run_block`: K in one scan, see `agents.learner_base`);
    `policy_params()` hands the fp32 online params to the quantizer. With prioritized replay the metrics carry
    `priorities` (|TD| as a device array, [B] per step, [K, B] per block; `np.asarray` brings it to the host)."""

    agent_name = "DQN"

    def __init__(self, spec: PolicySpec, config: DQNConfig, seed: int | jax.Array):
        self._spec = spec
        self._config = config
        # The observations of the last few prepared batches: int conv actors' activation ranges are calibrated on
        # them at each publish (quarl.quant.calibration). References only, no copies; deque appends are thread-safe, so
        # the prefetch thread may record them.
        self._recent_obs: collections.deque = collections.deque(maxlen=CALIBRATION_BATCHES)
        # Observations keep whatever item shape the network takes (vectors here, frames for a conv torso).
        self.columns = {"observation": (np.float32, None), "action": (np.int32, ()), "reward": (np.float32, ()),
                        "discount": (np.float32, ()), "next_observation": (np.float32, None)}
        key = jax.random.PRNGKey(seed) if isinstance(seed, (int, np.integer)) else seed
        init, update = make_update(spec, config)
        state = init(key)

        def update_batch(state: TrainingState, batch: Mapping[str, jax.Array]) -> tuple[TrainingState, dict]:
            columns = {k: batch[k] for k in self.columns}
            state, metrics, td_error = update(state, columns, batch.get("probabilities"))
            return state, dict(metrics, td_abs=jnp.abs(td_error))

        super().__init__(state, update_batch, donate=False)

    @property
    def spec(self) -> PolicySpec:
        return self._spec

    def _policy_tree(self) -> hk.Params:
        return self._state.params

    def calibration_batches(self) -> tuple[np.ndarray, ...]:
        """The observation columns of the last `CALIBRATION_BATCHES` prepared batches, as references (what the
        training thread hands the publisher: no copy on its side)."""
        return tuple(self._recent_obs)

    def calibration_observations(self) -> np.ndarray | None:
        """Those observations in one array (None before the first batch)."""
        recent = self.calibration_batches()
        return np.concatenate(recent) if recent else None

    def _extra_columns(self, sample: Batch | StackedSample, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        obs = batch["observation"]  # [B, ...], or [K, B, ...] from a stacked sample: one entry per batch
        self._recent_obs.extend(obs if batch["reward"].ndim == 2 else (obs,))
        if not self._config.prioritized_replay:
            return {}
        probs = np.asarray(sample.probabilities, np.float32)
        if probs.shape != batch["reward"].shape or not np.all(probs > 0):
            raise ValueError("prioritized sample needs one positive probability per item")
        return {"probabilities": probs}

    def _host_outputs(self, metrics: Metrics) -> Metrics:
        # |TD| stays a device array: reading it waits for the update, so a caller that can act meanwhile (the
        # single-process loop steps the environment) reads it only when the table next samples.
        td_abs = metrics.pop("td_abs")
        if self._config.prioritized_replay:
            metrics["priorities"] = td_abs
        return metrics


def learning_rate_schedule(config: DQNConfig) -> optax.Schedule:
    """Adam's step size per update: `learning_rate`, decayed linearly to `learning_rate_end` over
    `learning_rate_decay_steps` updates, then held (constant when the end is None or the decay is 0 updates).

    Why: at a constant 1e-3 (one update per env step) CartPole-v1's policy reached 500 and then lost it, the cart
    drifting off the track; decaying to 5e-5 over 30k updates kept it solved without slowing the first solve
    (results/bench/dqn_collapse.md)."""
    if config.learning_rate_end is None or config.learning_rate_decay_steps == 0:
        return optax.constant_schedule(config.learning_rate)
    return optax.linear_schedule(config.learning_rate, config.learning_rate_end, config.learning_rate_decay_steps)


def make_optimizer(config: DQNConfig) -> optax.GradientTransformation:
    """Adam with global-norm gradient clipping, on the config's learning-rate schedule."""
    return optax.chain(
        optax.clip_by_global_norm(config.max_gradient_norm),
        optax.adam(learning_rate_schedule(config), eps=config.adam_eps),
    )


def update_target(params: hk.Params, target_params: hk.Params, steps: jax.Array, period: int,
                  tau: float | None) -> hk.Params:
    """The target network after update number `steps`: a hard copy every `period` updates, or with `tau`
    Polyak averaging every update (target <- tau * online + (1 - tau) * target)."""
    if tau is None:
        return optax.periodic_update(params, target_params, steps, period)
    return optax.incremental_update(params, target_params, tau)


def _update(state: TrainingState, batch: dict, probabilities: jax.Array | None, *, loss_fn,
            optimizer: optax.GradientTransformation, target_update_period: int, target_update_tau: float | None,
            is_exponent: float | None):
    if is_exponent is None or probabilities is None:
        weights = jnp.ones_like(batch["reward"])
    else:
        weights = importance_weights(probabilities, is_exponent)
    (loss, (td_error, q_taken)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, state.target_params, batch, weights)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    steps = state.steps + 1
    target_params = update_target(params, state.target_params, steps, target_update_period, target_update_tau)
    metrics = {
        "loss": loss,
        "q_mean": jnp.mean(q_taken),
        "td_abs_mean": jnp.mean(jnp.abs(td_error)),
        "grad_norm": optax.global_norm(grads),
    }
    return TrainingState(params, target_params, opt_state, steps), metrics, td_error
