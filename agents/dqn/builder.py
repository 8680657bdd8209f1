"""DQN builder: the agent-agnostic contract (docs/ARCHITECTURE.md, "Builder details") the runners use."""
from __future__ import annotations

import numpy as np

from agents.base import ReplayBuilder, SamplerSettings
from agents.dqn.actor import DQNActor, EpsilonSchedule, ExecutorFactory
from agents.dqn.config import DQNConfig, apex_epsilon
from agents.dqn.learning import DQNLearner
from agents.dqn.networks import make_q_spec
from quarl.envs.spec import EnvSpec
from quarl.policy.spec import PolicySpec
from quarl.quant.quantization import QuantizedParams


class Builder(ReplayBuilder):
    """Makes every DQN piece from one `DQNConfig`; precision and backend are run-level arguments."""

    name = "dqn"
    config_class = DQNConfig
    config: DQNConfig

    @staticmethod
    def _check_env(env_spec: EnvSpec) -> None:
        if not getattr(env_spec, "discrete", False):
            raise ValueError("DQN needs a discrete-action task (e.g. CartPole-v1), got a continuous one")

    def policy_spec(self, env_spec: EnvSpec) -> PolicySpec:
        """The Q-network actors run: obs -> one Q-value per action (an MLP, or a conv torso for image tasks)."""
        self._check_env(env_spec)
        return make_q_spec(env_spec.obs_dim, env_spec.num_actions, self.config.hidden_sizes,
                           env_spec.observation_shape, self.config.observation_bounds,
                           activation=self.config.activation, image_torso=self.config.image_torso)

    def make_learner(self, env_spec: EnvSpec, seed: int, *, max_actor_steps: int | None = None,
                     num_envs: int = 1) -> DQNLearner:
        """The learner; a run's length changes nothing (its schedules count learner steps)."""
        del max_actor_steps, num_envs
        return DQNLearner(self.policy_spec(env_spec), self.config, seed)

    def actor_epsilon(self, actor_id: int, num_actors: int) -> EpsilonSchedule:
        """A lone actor decays epsilon linearly; a fleet uses Ape-X's fixed per-actor ladder."""
        c = self.config
        if num_actors == 1 and actor_id == 0:
            return EpsilonSchedule(c.epsilon_start, c.epsilon_end, c.epsilon_decay_steps)
        return EpsilonSchedule.constant(apex_epsilon(actor_id, num_actors, c.apex_epsilon, c.apex_alpha))

    def make_actor(self, env_spec: EnvSpec, qparams: QuantizedParams, *, seed: int, actor_id: int = 0,
                   evaluation: bool = False, backend: str = "auto", num_actors: int = 1,
                   executor_factory: ExecutorFactory | None = None, batch_size: int = 1) -> DQNActor:
        """`num_actors` (an extension of the contract, default 1) sizes the Ape-X epsilon ladder."""
        spec = self.policy_spec(env_spec)
        return DQNActor(spec, qparams, num_actions=env_spec.num_actions,
                        schedule=self.actor_epsilon(actor_id, num_actors), eval_epsilon=self.config.eval_epsilon,
                        seed=seed, evaluation=evaluation, backend=backend, executor_factory=executor_factory,
                        batch_size=batch_size)

    def action_column(self, env_spec: EnvSpec) -> tuple[tuple[int, ...], np.dtype]:
        self._check_env(env_spec)
        return (), np.dtype(np.int32)

    def sampler_settings(self) -> SamplerSettings:
        c = self.config
        return {"sampler": "prioritized" if c.prioritized_replay else "uniform",
                "priority_exponent": c.priority_exponent}
