"""PPO / A2C builder: the agent contract (docs/ARCHITECTURE.md, "Builder details") for an on-policy agent.

PPO has no replay: its builder is a `BuilderBase` without `agents.base.ReplayBuilder`'s part. Its actors run the
same acting loop as every agent with another sink (`make_sink`: rollouts of `num_steps` steps of the K
environments, with the behaviour log-probs, straight into the learner, one update per rollout, then new weights).
Policy spec, learner and actors are built as for every other agent.
"""
from __future__ import annotations

import math
from typing import Mapping, cast

import numpy as np

from agents.base import Actor, BuilderBase, Learner
from agents.ppo.actor import ExecutorFactory, PPOActor
from agents.ppo.config import PPOConfig
from agents.ppo.learning import PPOLearner
from agents.ppo.networks import PPONetworks, make_networks
from quarl.acting.loop import RolloutSink
from quarl.envs.spec import EnvSpec
from quarl.policy.spec import PolicySpec
from quarl.quant.quantization import QuantizedParams


class Builder(BuilderBase):
    """Makes every PPO piece from one `PPOConfig` (or `A2CConfig`); precision and backend are run-level."""

    name = "ppo"
    config_class = PPOConfig
    config: PPOConfig

    def networks(self, env_spec: EnvSpec) -> PPONetworks:
        """Policy (logits or Gaussian mean) and value networks for this task."""
        if env_spec.discrete:
            return make_networks(self.config, env_spec.obs_dim, env_spec.num_actions, env_spec.observation_shape)
        low = np.asarray(env_spec.action_spec.minimum, np.float64)
        high = np.asarray(env_spec.action_spec.maximum, np.float64)
        if not (np.allclose(low, -1.0) and np.allclose(high, 1.0)):  # quarl.envs.factory maps every task onto [-1, 1]
            raise ValueError(f"PPO expects canonical [-1, 1] continuous actions, got [{low}, {high}]")
        return make_networks(self.config, env_spec.obs_dim, env_spec.action_dim, env_spec.observation_shape,
                             discrete=False)

    def policy_spec(self, env_spec: EnvSpec) -> PolicySpec:
        """What actors run: the policy network (logits or Gaussian mean); the value network stays with the learner."""
        return self.networks(env_spec).policy

    def num_envs(self, envs_per_actor: int = 1) -> int:
        """Environments a rollout steps: `--envs-per-actor K` when K > 1, else the config's `num_envs`."""
        return int(envs_per_actor) if envs_per_actor > 1 else self.config.num_envs

    def make_learner(self, env_spec: EnvSpec, seed: int, *, max_actor_steps: int | None = None,
                     num_envs: int = 1) -> PPOLearner:
        """The learner of a run of `max_actor_steps` env steps over `num_envs` environments: as many updates as
        whole rollouts fit the run (rounded up), so `anneal_lr` decays the rate to 0 at its end; without a run
        length (None, or not positive) the rate is not annealed."""
        total_updates = None
        if max_actor_steps is not None and max_actor_steps > 0:
            total_updates = max(1, math.ceil(max_actor_steps / self.steps_per_update(num_envs)))
        return PPOLearner(self.networks(env_spec), self.config, seed, total_updates)

    def steps_per_update(self, num_envs: int) -> int:
        """One rollout: `num_steps` steps of each of the K environments."""
        return int(num_envs) * self.config.num_steps

    def make_sink(self, num_envs: int) -> RolloutSink:
        """Rollouts of [num_steps, K] steps with the actor's behaviour log-probs (`PPOActor.act`)."""
        return RolloutSink(self.config.num_steps, num_envs)

    def make_actor(self, env_spec: EnvSpec, qparams: QuantizedParams, *, seed: int, actor_id: int = 0,
                   evaluation: bool = False, backend: str = "auto", num_actors: int = 1,
                   executor_factory: ExecutorFactory | None = None, batch_size: int = 1) -> PPOActor:
        """A sampling actor (or a greedy one with `evaluation`); continuous actors start at `init_log_std` until
        the runner hands them the learner's (`PPOActor.set_log_std`)."""
        del num_actors
        log_std = None if env_spec.discrete else np.full(env_spec.action_dim, self.config.init_log_std, np.float32)
        return PPOActor(self.policy_spec(env_spec), qparams, discrete=env_spec.discrete,
                        seed=int(seed) + 7919 * int(actor_id), log_std=log_std, evaluation=evaluation,
                        backend=backend, executor_factory=executor_factory, batch_size=batch_size)

    def payload_extras(self, learner: Learner) -> dict[str, np.ndarray]:
        """The Gaussian's log-std on continuous tasks (distributed actors sample with the learner's)."""
        log_std = cast(PPOLearner, learner).log_std()
        return {} if log_std is None else {"log_std": log_std}

    def apply_extras(self, actor: Actor, extras: Mapping[str, np.ndarray] | None) -> None:
        ppo_actor = cast(PPOActor, actor)
        if extras and "log_std" in extras and not ppo_actor.discrete:
            ppo_actor.set_log_std(extras["log_std"])

    def action_column(self, env_spec: EnvSpec) -> tuple[tuple[int, ...], np.dtype]:
        """The rollout's action column per environment step."""
        if env_spec.discrete:
            return (), np.dtype(np.int32)
        return (env_spec.action_dim,), np.dtype(np.float32)
