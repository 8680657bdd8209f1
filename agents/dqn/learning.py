"""DQN learner: double-DQN n-step targets, Huber loss, Adam with global-norm clipping, periodic hard target
updates, optional prioritized-replay importance weights — all in one jitted update.

The whole training state lives on the device between steps; the only host transfers are the sampled batch in
and (for prioritized tables) the new priorities out. Metrics come back as 0-d device arrays so that a caller
that does not log every step never waits for the device; `float(v)` converts one when it is needed.
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import rlax

from agents.dqn.config import DQNConfig
from agents.dqn.networks import init_params, q_apply_fn
from quarl.policy import PolicySpec

# Columns a transition batch must carry (the NStepTransitionAdder's output). `discount` is the full bootstrap
# multiplier gamma^k * prod(env discounts), so the learner never multiplies by the discount again.
BATCH_KEYS = ("observation", "action", "reward", "discount", "next_observation")


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
    int-B actor arithmetic (quarl.qat: fake-quantized weights, straight-through gradients); the target
    network only ever serves the learner, so it stays fp32."""
    online_apply = q_apply_fn(spec, qat_bits)
    apply = q_apply_fn(spec)

    def loss_fn(params, target_params, batch, weights):
        obs, next_obs = batch["observation"], batch["next_observation"]
        batch_size = obs.shape[0]
        # One forward pass of the online net over s and s' (half the dispatches of two passes).
        q_online = online_apply(params, jnp.concatenate([obs, next_obs], axis=0))
        q_tm1, q_t_selector = q_online[:batch_size], q_online[batch_size:]
        q_t_value = apply(target_params, next_obs)
        target = double_q_targets(q_t_value, jax.lax.stop_gradient(q_t_selector), batch["reward"],
                                  batch["discount"])
        q_taken = jnp.take_along_axis(q_tm1, batch["action"][:, None], axis=-1)[:, 0]
        td_error = jax.lax.stop_gradient(target) - q_taken
        loss = jnp.mean(weights * rlax.huber_loss(td_error, huber_loss_parameter))
        return loss, (td_error, q_taken)

    return loss_fn


class DQNLearner:
    """`step(sample)` runs one update; `policy_params()` hands the fp32 online params to the quantizer."""

    def __init__(self, spec: PolicySpec, config: DQNConfig, seed: int | jax.Array):
        self._spec = spec
        self._config = config
        key = jax.random.PRNGKey(seed) if isinstance(seed, (int, np.integer)) else seed
        self._optimizer = make_optimizer(config)
        params = init_params(spec, key)
        self._state = TrainingState(
            params=params,
            target_params=jax.tree.map(jnp.copy, params),
            opt_state=self._optimizer.init(params),
            steps=jnp.zeros((), jnp.int32),
        )
        self._steps = 0
        self._update = jax.jit(functools.partial(
            _update, loss_fn=make_loss(spec, config.huber_loss_parameter, config.qat_bits),
            optimizer=self._optimizer,
            target_update_period=config.target_update_period, target_update_tau=config.target_update_tau,
            is_exponent=config.importance_sampling_exponent if config.prioritized_replay else None))

    @property
    def steps(self) -> int:
        return self._steps

    @property
    def spec(self) -> PolicySpec:
        return self._spec

    def step(self, sample: Any) -> dict[str, Any]:
        """One update on a `quarl.replay.Sample` (anything with `.data` columns and `.probabilities`).

        Returns loss/q_mean/td_abs_mean/grad_norm as 0-d device arrays, plus `priorities` (np.ndarray, |TD|)
        when the config uses prioritized replay."""
        batch = _as_batch(sample.data)
        probs = np.asarray(sample.probabilities, np.float32) if self._config.prioritized_replay else None
        if probs is not None and (probs.shape != batch["reward"].shape or not np.all(probs > 0)):
            raise ValueError("prioritized sample needs one positive probability per item")
        self._state, metrics, td_error = self._update(self._state, batch, probs)
        self._steps += 1
        if self._config.prioritized_replay:
            metrics = dict(metrics, priorities=np.abs(np.asarray(td_error, np.float64)))
        return metrics

    def policy_params(self) -> dict:
        """The online network's fp32 parameters as a NumPy haiku tree (what actors get, after quantization)."""
        return jax.device_get(self._state.params)

    def get_state(self) -> dict:
        """Everything needed to resume, as a pytree of NumPy arrays (dicts/lists only, orbax-checkpointable)."""
        state = jax.device_get(self._state)
        return {
            "params": state.params,
            "target_params": state.target_params,
            "opt_state": list(jax.tree.leaves(state.opt_state)),
            "steps": np.asarray(self._steps, np.int64),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Inverse of `get_state`; shapes must match this learner's network (ValueError otherwise)."""
        try:
            params = _check_like(self._state.params, state["params"], "params")
            target = _check_like(self._state.target_params, state["target_params"], "target_params")
            treedef = jax.tree.structure(self._state.opt_state)
            old_leaves = jax.tree.leaves(self._state.opt_state)
            leaves = list(state["opt_state"])
            if len(leaves) != len(old_leaves):
                raise ValueError(f"opt_state has {len(leaves)} leaves, expected {len(old_leaves)}")
            leaves = [_check_array(o, n, "opt_state") for o, n in zip(old_leaves, leaves)]
            steps = int(np.asarray(state["steps"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed DQN learner state: {e!r}") from None
        if steps < 0:
            raise ValueError(f"learner state steps must be >= 0, got {steps}")
        self._state = TrainingState(params, target, jax.tree.unflatten(treedef, leaves),
                                    jnp.asarray(steps, jnp.int32))
        self._steps = steps


def learning_rate_schedule(config: DQNConfig) -> optax.Schedule:
    """Adam's step size per update: `learning_rate`, decayed linearly to `learning_rate_end` over
    `learning_rate_decay_steps` updates, then held (constant when the end is None or the decay is 0 updates).

    Why: at a constant 1e-3 (one update per env step) CartPole-v1's policy reached 500 and then lost it, the cart
    drifting off the track; decaying to 5e-5 over 30k updates kept it solved without slowing the first solve
    (bench/results/dqn_collapse.md)."""
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


def _as_batch(data: Mapping[str, Any]) -> dict[str, np.ndarray]:
    missing = [k for k in BATCH_KEYS if k not in data]
    if missing:
        raise ValueError(f"DQN batch is missing columns {missing}; it needs {list(BATCH_KEYS)}")
    batch = {
        "observation": np.asarray(data["observation"], np.float32),
        "next_observation": np.asarray(data["next_observation"], np.float32),
        "action": np.asarray(data["action"], np.int32).reshape(-1),
        "reward": np.asarray(data["reward"], np.float32).reshape(-1),
        "discount": np.asarray(data["discount"], np.float32).reshape(-1),
    }
    n = batch["reward"].shape[0]
    if any(v.shape[0] != n for v in batch.values()):
        raise ValueError(f"DQN batch columns disagree on batch size: { {k: v.shape for k, v in batch.items()} }")
    return batch


def _check_array(old: Any, new: Any, what: str) -> np.ndarray:
    new = np.asarray(new)
    if new.shape != np.shape(old):
        raise ValueError(f"{what}: shape {new.shape} does not match {np.shape(old)}")
    if new.dtype.kind == "f" and not np.all(np.isfinite(new)):
        raise ValueError(f"{what}: non-finite values")
    return new.astype(np.asarray(old).dtype, copy=False)


def _check_like(old_tree: Any, new_tree: Any, what: str) -> Any:
    if jax.tree.structure(old_tree) != jax.tree.structure(new_tree):
        raise ValueError(f"{what}: tree structure does not match this network")
    return jax.tree.map(lambda o, n: _check_array(o, n, what), old_tree, new_tree)
