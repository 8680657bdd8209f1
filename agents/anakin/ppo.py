"""PPO and A2C, jitted end to end (Anakin: acting, environments and learning in one XLA program).

One update: a rollout of `num_steps` steps of `num_envs` gymnax environments (`jax.lax.scan`), the actions sampled from
the quantized policy's logits (the in-jit JAX runtime, `agents.anakin.common.InJitActor`) with their log-probs under
that policy as the behaviour log-probs, then PPO's update on it: `agents.ppo.learning.make_update`, the very function
`launch.train`'s PPO learner jits, fp32 (or QAT with `qat_bits`). The actor's weights are quantized again from the
learner's every `actor_update_period` updates (1, the default, is what a synchronous on-policy actor gets: the
weights of the update before; more is the staleness of asynchronous actors).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from agents.anakin.common import Episodes, InJitActor, Metrics, episode_totals, reset_envs, step_envs
from agents.ppo.config import PPOConfig
from agents.ppo.learning import TrainingState, make_update
from agents.ppo.networks import make_networks
from quarl.envs.gymnax_env import GymnaxEnv
from quarl.policy.spec import ParamTree
from quarl.quant.precision import Precision
from quarl.replay.items import Rollout
from quarl.runtimes.jax_backend import DeviceParams


class PPOState(NamedTuple):
    """One seed's whole run state."""

    train: TrainingState  # the learner's (params, optimiser state, its shuffling key, updates done)
    weights: DeviceParams  # the actor's quantized policy
    env: Any  # the environments' states [N]
    obs: jax.Array  # their current observations [N, ...]
    episodes: Episodes
    key: jax.Array  # acting and environment randomness


class PPOTrainer:
    """`agents.anakin.common.Trainer` for PPO and A2C (an `A2CConfig` is PPO's one-epoch setting)."""

    def __init__(self, env: GymnaxEnv, config: PPOConfig, precision: Precision, *, total_updates: int,
                 actor_update_period: int = 1):
        if not env.spec.discrete:
            raise ValueError("the jitted PPO trainer runs discrete tasks (gymnax ports of the project's tasks)")
        self.env, self.config = env, config
        spec = env.spec
        networks = make_networks(config, spec.obs_dim, spec.num_actions, spec.observation_shape)
        self.policy_spec = networks.policy
        self.actor = InJitActor(networks.policy, precision)
        self._init_train, self._update = make_update(networks, config, total_updates)
        self.updates_per_period = int(actor_update_period)
        self.env_steps_per_period = self.updates_per_period * config.num_envs * config.num_steps
        self.replay: dict[str, int | float | str] = {}  # on-policy: rollouts straight into the update

    def init(self, key: jax.Array) -> PPOState:
        k_learner, k_env, k_act = jax.random.split(key, 3)
        train = self._init_train(k_learner)
        env_state, obs = reset_envs(self.env, k_env, self.config.num_envs)
        return PPOState(train, self.actor.weights(train.params["policy"]), env_state, obs,
                        Episodes.zeros(self.config.num_envs), k_act)

    def policy_params(self, state: PPOState) -> ParamTree:
        return state.train.params["policy"]

    def actor_weights(self, state: PPOState) -> DeviceParams:
        return state.weights

    def learner_steps(self, state: PPOState) -> jax.Array:
        return state.train.steps

    def period(self, state: PPOState) -> tuple[PPOState, Metrics]:
        """The actor takes the learner's newest weights (quantized), then `actor_update_period` updates."""
        state = state._replace(weights=self.actor.weights(state.train.params["policy"]))
        state, metrics = jax.lax.scan(lambda s, _: self._one_update(s), state, None, length=self.updates_per_period)
        return state, {k: jnp.sum(v) if k in ("episode_return_sum", "episode_length_sum", "episodes")
                       else jnp.mean(v) for k, v in metrics.items()}

    def _one_update(self, state: PPOState) -> tuple[PPOState, Metrics]:
        carry, (rollout, finished) = jax.lax.scan(lambda c, _: self._env_step(state.weights, c),
                                                  (state.env, state.obs, state.episodes, state.key), None,
                                                  length=self.config.num_steps)
        env_state, obs, episodes, key = carry
        train, metrics = self._update(state.train, rollout)
        metrics = {k: v for k, v in metrics.items() if jnp.ndim(v) == 0}
        metrics.update(episode_totals(finished))
        return PPOState(train, state.weights, env_state, obs, episodes, key), metrics

    def _env_step(self, weights: DeviceParams, carry: tuple) -> tuple[tuple, tuple[Rollout[jax.Array], Metrics]]:
        env_state, obs, episodes, key = carry
        key, k_act, k_env = jax.random.split(key, 3)
        logits = self.actor.outputs(weights, obs)
        action = jax.random.categorical(k_act, logits).astype(jnp.int32)
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=-1)[:, 0]
        env_state, step = step_envs(self.env, k_env, env_state, action)
        done = step.terminated | step.truncated
        episodes, finished = episodes.step(step.reward, done)
        transition = Rollout(observation=obs, action=action, reward=step.reward,
                             discount=1.0 - step.terminated.astype(jnp.float32), last=done.astype(jnp.float32),
                             next_observation=step.final_obs, behaviour_logp=logp)
        return (env_state, step.obs, episodes, key), (transition, finished)
