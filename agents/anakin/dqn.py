"""DQN, jitted end to end (Anakin): epsilon-greedy int8 actors inside the jit, a replay ring inside the jit
(`quarl.replay.ring`: uniform, n-step windows read at sampling time), and the project's DQN update
(`agents.dqn.learning.make_update`: double DQN, Huber, Adam, target copies; QAT with `qat_bits`).

One iteration steps the K environments once (K = `envs_per_actor`), writes the step to the ring, then runs
K * samples_per_insert / batch_size updates (rounded, at least 1; `updates_per_iteration`) once the ring holds
`min_replay_size` transitions, as launch.train's rate limiter does on average. A period is the iterations of
`actor_update_period` env steps of one environment group; the actors' weights are quantized again from the online
network at its start. Epsilon decays linearly over the actor's env steps (all K environments counted), as one
vectorized actor's schedule does in launch.train. Prioritized replay and a non-zero `eval_epsilon` are refused.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from agents.anakin.common import Episodes, InJitActor, Metrics, reset_envs, step_envs
from agents.dqn.config import DQNConfig
from agents.dqn.learning import TrainingState, make_update
from agents.dqn.networks import make_q_spec
from quarl.envs.gymnax_env import GymnaxEnv
from quarl.policy.spec import ParamTree
from quarl.quant.precision import Precision
from quarl.replay.ring import StepRing, ring_add, ring_init, ring_samplable, ring_sample
from quarl.runtimes.jax_backend import DeviceParams

_LEARNER_METRICS = ("loss", "q_mean", "td_abs_mean", "grad_norm")


class DQNState(NamedTuple):
    """One seed's whole run state."""

    train: TrainingState
    weights: DeviceParams  # the actors' quantized Q-network
    ring: StepRing
    env: Any
    obs: jax.Array
    episodes: Episodes
    key: jax.Array
    env_steps: jax.Array  # int32: the actor's env steps (all K environments), what epsilon decays over


class DQNTrainer:
    """`agents.anakin.common.Trainer` for DQN."""

    def __init__(self, env: GymnaxEnv, config: DQNConfig, precision: Precision, *, total_env_steps: int,
                 actor_update_period: int | None = None, envs_per_actor: int = 1):
        del total_env_steps  # DQN's schedules count updates and env steps, not the run's length
        if config.prioritized_replay:
            raise ValueError("the jitted DQN trainer replays uniformly: set prioritized_replay=false")
        if config.eval_epsilon != 0.0:
            raise ValueError("the jitted DQN trainer evaluates greedily: set eval_epsilon=0")
        self.env, self.config, self.num_envs = env, config, int(envs_per_actor)
        spec = env.spec
        self.policy_spec = make_q_spec(spec.obs_dim, spec.num_actions, config.hidden_sizes, spec.observation_shape,
                                       config.observation_bounds, activation=config.activation,
                                       image_torso=config.image_torso)
        self.actor = InJitActor(self.policy_spec, precision)
        self._init_train, self._update = make_update(self.policy_spec, config)
        period = int(actor_update_period or config.actor_update_period)
        self.iterations = max(1, math.ceil(period / self.num_envs))
        self.env_steps_per_period = self.iterations * self.num_envs
        self.updates_per_iteration = max(1, round(self.num_envs * config.samples_per_insert / config.batch_size))
        self.updates_per_period = self.iterations * self.updates_per_iteration
        self._capacity = max(config.n_step, math.ceil(config.max_replay_size / self.num_envs))
        self.replay: dict[str, int | float | str] = {
            "kind": "in-jit step ring (quarl.replay.ring), uniform, n-step windows at sampling",
            "capacity": self._capacity * self.num_envs, "min_size": config.min_replay_size,
            "samples_per_insert": self.updates_per_iteration * config.batch_size / self.num_envs}

    def init(self, key: jax.Array) -> DQNState:
        k_learner, k_env, k_act = jax.random.split(key, 3)
        train = self._init_train(k_learner)
        env_state, obs = reset_envs(self.env, k_env, self.num_envs)
        ring = ring_init(self._capacity, self.num_envs, self.env.obs_shape, jnp.dtype(self.env.obs_dtype))
        return DQNState(train, self.actor.weights(train.params), ring, env_state, obs, Episodes.zeros(self.num_envs),
                        k_act, jnp.zeros((), jnp.int32))

    def policy_params(self, state: DQNState) -> ParamTree:
        return state.train.params

    def actor_weights(self, state: DQNState) -> DeviceParams:
        return state.weights

    def learner_steps(self, state: DQNState) -> jax.Array:
        return state.train.steps

    def epsilon(self, env_steps: jax.Array) -> jax.Array:
        """`agents.dqn.config.linear_epsilon` in jnp."""
        c = self.config
        if c.epsilon_decay_steps <= 0:
            return jnp.float32(c.epsilon_end)
        frac = jnp.minimum(env_steps.astype(jnp.float32) / c.epsilon_decay_steps, 1.0)
        return c.epsilon_start + (c.epsilon_end - c.epsilon_start) * frac

    def period(self, state: DQNState) -> tuple[DQNState, Metrics]:
        """The actors take the online network's newest weights (quantized), then `actor_update_period` env steps."""
        state = state._replace(weights=self.actor.weights(state.train.params))
        state, metrics = jax.lax.scan(lambda s, _: self._iteration(s), state, None, length=self.iterations)
        learned = metrics.pop("learned")
        out = {k: jnp.sum(v) for k, v in metrics.items() if k not in _LEARNER_METRICS}
        count = jnp.maximum(jnp.sum(learned), 1.0)
        out.update({k: jnp.sum(metrics[k] * learned) / count for k in _LEARNER_METRICS})
        out["epsilon"] = self.epsilon(state.env_steps)
        return state, out

    def _iteration(self, state: DQNState) -> tuple[DQNState, Metrics]:
        key, k_explore, k_random, k_env, k_learn = jax.random.split(state.key, 5)
        q = self.actor.outputs(state.weights, state.obs)
        greedy = jnp.argmax(q, axis=-1).astype(jnp.int32)
        explore = jax.random.uniform(k_explore, (self.num_envs,)) < self.epsilon(state.env_steps)
        action = jnp.where(explore, jax.random.randint(k_random, (self.num_envs,), 0, self.env.num_actions), greedy)
        env_state, step = step_envs(self.env, k_env, state.env, action)
        done = step.terminated | step.truncated
        ring = ring_add(state.ring, state.obs, action, step.reward, step.terminated, done, step.final_obs)
        episodes, finished = state.episodes.step(step.reward, done)
        ready = ring_samplable(ring, self.config.n_step) >= self.config.min_replay_size
        # Under vmap a cond on `ready` would run both branches anyway: the updates run and are kept where ready.
        train, learner_metrics = jax.lax.scan(lambda t, k: self._learn(t, ring, k), state.train,
                                              jax.random.split(k_learn, self.updates_per_iteration))
        train = jax.tree.map(lambda new, old: jnp.where(ready, new, old), train, state.train)
        metrics = {**finished, **{k: jnp.mean(v) for k, v in learner_metrics.items()},
                   "learned": ready.astype(jnp.float32)}
        return DQNState(train, state.weights, ring, env_state, step.obs, episodes, key,
                        state.env_steps + self.num_envs), metrics

    def _learn(self, train: TrainingState, ring: StepRing, key: jax.Array) -> tuple[TrainingState, Metrics]:
        c = self.config
        batch = ring_sample(ring, key, c.batch_size, c.n_step, c.discount)
        train, metrics, _ = self._update(train, batch, None)
        return train, metrics
