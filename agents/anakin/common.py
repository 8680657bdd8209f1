"""What the jitted trainers (`agents.anakin.ppo`, `agents.anakin.dqn`) share: the quantized actor inside the jit,
episode bookkeeping, greedy evaluation episodes, and the contract the runner (`launch.experiments.anakin_run`) drives.

The actor is the JAX runtime itself (`quarl.runtimes.jax_backend.policy_forward`) on weights quantized inside the jit
(`traced_device_params`: the payload's per-channel codes and scales, bit for bit), so an int8 actor here computes
what a deployed int8 JAX actor computes on the same weights: AQT's s8 x s8 dot with per-row dynamic int8 activations.
The weights are quantized again once per period of `actor_update_period` (`Trainer.period`), at a fixed place in the
program rather than under a `lax.cond`: under `vmap` over seeds a cond runs both branches.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from quarl.envs.gymnax_env import GymnaxEnv
from quarl.policy.spec import ParamTree, PolicySpec
from quarl.quant.precision import Precision
from quarl.runtimes.jax_backend import DeviceParams, policy_forward, traced_device_params

# Per-period metrics: scalars (means over the period's updates, sums of its finished episodes).
Metrics = dict[str, jax.Array]


class InJitActor:
    """The deployed policy at `precision`, inside the jit: `weights(params)` quantizes an fp32 policy tree (what a
    learner publishes), `outputs(weights, obs)` runs it (logits or Q-values), `greedy(weights, obs)` acts on the
    argmax, as every discrete evaluator does."""

    def __init__(self, spec: PolicySpec, precision: Precision):
        self.spec, self.precision = spec, precision
        self._forward = policy_forward(spec, precision)

    def weights(self, params: ParamTree) -> DeviceParams:
        return traced_device_params(self.spec, params, self.precision)

    def outputs(self, weights: DeviceParams, obs: jax.Array) -> jax.Array:
        return self._forward(weights, obs)

    def greedy(self, weights: DeviceParams, obs: jax.Array) -> jax.Array:
        return jnp.argmax(self.outputs(weights, obs), axis=-1).astype(jnp.int32)


class Episodes(NamedTuple):
    """The running return and length of each environment's current episode."""

    returns: jax.Array
    lengths: jax.Array

    @classmethod
    def zeros(cls, num_envs: int) -> "Episodes":
        return cls(jnp.zeros((num_envs,), jnp.float32), jnp.zeros((num_envs,), jnp.int32))

    def step(self, reward: jax.Array, done: jax.Array) -> tuple["Episodes", Metrics]:
        """This step's rewards added; the episodes that ended are counted (return and length sums) and restarted."""
        returns, lengths = self.returns + reward, self.lengths + 1
        finished = {"episode_return_sum": jnp.sum(jnp.where(done, returns, 0.0)),
                    "episode_length_sum": jnp.sum(jnp.where(done, lengths, 0)),
                    "episodes": jnp.sum(done.astype(jnp.int32))}
        return Episodes(jnp.where(done, 0.0, returns), jnp.where(done, 0, lengths)), finished


def episode_totals(per_step: Metrics) -> Metrics:
    """Per-step episode counts ([T] leaves) summed over the steps."""
    return {k: jnp.sum(per_step[k]) for k in ("episode_return_sum", "episode_length_sum", "episodes")}


def reset_envs(env: GymnaxEnv, key: jax.Array, num_envs: int) -> tuple[Any, jax.Array]:
    """`num_envs` fresh environments: (batched states, observations [N, ...])."""
    return jax.vmap(env.reset)(jax.random.split(key, num_envs))


def step_envs(env: GymnaxEnv, key: jax.Array, state: Any, actions: jax.Array) -> tuple[Any, Any]:
    """One step of every environment (each with its own key); auto-resets those that ended."""
    return jax.vmap(env.step)(jax.random.split(key, actions.shape[0]), state, actions)


def evaluate(env: GymnaxEnv, act: Callable[[jax.Array, jax.Array], jax.Array], key: jax.Array,
             episodes: int) -> tuple[jax.Array, jax.Array]:
    """`episodes` episodes side by side, each to its end (or the task's time limit): (returns [E], lengths [E]).
    `act(obs [E, ...], key) -> actions [E]` (a fresh key each step; a greedy policy ignores it). The environments step
    until the last one has ended, those already done frozen, so the loop is as long as the longest episode."""
    k_reset, k_run = jax.random.split(key)
    state, obs = reset_envs(env, k_reset, episodes)
    zeros = jnp.zeros((episodes,), jnp.float32)
    init = (state, obs, k_run, zeros, jnp.zeros((episodes,), jnp.int32), jnp.zeros((episodes,), bool))

    def running(carry: tuple) -> jax.Array:
        return jnp.logical_not(jnp.all(carry[5]))

    def body(carry: tuple) -> tuple:
        state, obs, key, returns, lengths, done = carry
        key, k_step, k_act = jax.random.split(key, 3)
        state, step = step_envs(env, k_step, state, act(obs, k_act))
        live = jnp.logical_not(done)
        returns = returns + jnp.where(live, step.reward, 0.0)
        lengths = lengths + live.astype(jnp.int32)
        done = done | step.terminated | step.truncated
        return state, step.obs, key, returns, lengths, done

    out = jax.lax.while_loop(running, body, init)
    return out[3], out[4]


class Trainer(Protocol):
    """What `launch.experiments.anakin_run` drives, for any agent. One `period` is `actor_update_period` worth of
    acting and learning with one set of quantized actor weights, which are then quantized again from the learner's
    newest; `env_steps_per_period` and `updates_per_period` count it. Everything but the constructor is pure and
    jittable, and carries one seed's state (the runner vmaps it over seeds)."""

    policy_spec: PolicySpec
    actor: InJitActor
    env: GymnaxEnv
    env_steps_per_period: int
    updates_per_period: int
    replay: dict[str, int | float | str]  # what summary.json's `replay` says of the in-jit replay ({}: none)

    def init(self, key: jax.Array) -> Any: ...

    def period(self, state: Any) -> tuple[Any, Metrics]: ...

    def policy_params(self, state: Any) -> ParamTree: ...

    def actor_weights(self, state: Any) -> DeviceParams: ...

    def learner_steps(self, state: Any) -> jax.Array: ...
