"""DQN builder: the agent-agnostic contract (docs/ARCHITECTURE.md, "Builder details") the runners use."""
from __future__ import annotations

from typing import Any

import numpy as np

from agents.dqn.actor import DQNActor, EpsilonSchedule, ExecutorFactory
from agents.dqn.config import DQNConfig, apex_epsilon
from agents.dqn.learning import DQNLearner
from agents.dqn.networks import make_q_spec
from quarl.policy import PolicySpec
from quarl.quantization import QuantizedParams


class Builder:
    """Makes every DQN piece from one `DQNConfig`; precision and backend are run-level arguments."""

    name = "dqn"
    config_class = DQNConfig

    def __init__(self, config: DQNConfig | None = None):
        config = DQNConfig() if config is None else config
        if not isinstance(config, DQNConfig):
            raise ValueError(f"dqn Builder needs a DQNConfig, got {type(config).__name__}")
        self.config = config

    @staticmethod
    def _check_env(env_spec: Any) -> None:
        if not getattr(env_spec, "discrete", False):
            raise ValueError("DQN needs a discrete-action task (e.g. CartPole-v1), got a continuous one")

    def policy_spec(self, env_spec: Any) -> PolicySpec:
        """The Q-network actors run: obs -> one Q-value per action."""
        self._check_env(env_spec)
        return make_q_spec(env_spec.obs_dim, env_spec.num_actions, self.config.hidden_sizes)

    def make_learner(self, env_spec: Any, seed: int) -> DQNLearner:
        return DQNLearner(self.policy_spec(env_spec), self.config, seed)

    def actor_epsilon(self, actor_id: int, num_actors: int) -> EpsilonSchedule:
        """A lone actor decays epsilon linearly; a fleet uses Ape-X's fixed per-actor ladder."""
        c = self.config
        if num_actors == 1 and actor_id == 0:
            return EpsilonSchedule(c.epsilon_start, c.epsilon_end, c.epsilon_decay_steps)
        return EpsilonSchedule.constant(apex_epsilon(actor_id, num_actors, c.apex_epsilon, c.apex_alpha))

    def make_actor(self, env_spec: Any, qparams: QuantizedParams, *, seed: int, actor_id: int = 0,
                   evaluation: bool = False, backend: str = "auto", num_actors: int = 1,
                   executor_factory: ExecutorFactory | None = None, batch_size: int = 1) -> DQNActor:
        """`num_actors` (an extension of the contract, default 1) sizes the Ape-X epsilon ladder."""
        spec = self.policy_spec(env_spec)
        return DQNActor(spec, qparams, num_actions=env_spec.num_actions,
                        schedule=self.actor_epsilon(actor_id, num_actors), eval_epsilon=self.config.eval_epsilon,
                        seed=seed, evaluation=evaluation, backend=backend, executor_factory=executor_factory,
                        batch_size=batch_size)

    def make_adder(self) -> Any:
        from quarl.adders import NStepTransitionAdder  # pylint: disable=import-outside-toplevel
        return NStepTransitionAdder(self.config.n_step, self.config.discount)

    def transition_signature(self, env_spec: Any) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Column name -> (per-item shape, dtype) of what the adder emits and the learner reads."""
        self._check_env(env_spec)
        obs = ((env_spec.obs_dim,), np.dtype(np.float32))
        return {
            "observation": obs,
            "action": ((), np.dtype(np.int32)),
            "reward": ((), np.dtype(np.float32)),
            "discount": ((), np.dtype(np.float32)),
            "next_observation": obs,
        }

    def table_config(self) -> dict[str, Any]:
        """Sampler and rate-limiter settings (plain data, so a remote replay server can build the table)."""
        c = self.config
        return {
            "capacity": c.max_replay_size,
            "sampler": "prioritized" if c.prioritized_replay else "uniform",
            "priority_exponent": c.priority_exponent,
            "samples_per_insert": c.samples_per_insert,
            "min_size_to_sample": c.min_replay_size,
            "error_buffer": c.error_buffer,
        }

    def make_table(self, env_spec: Any, seed: int | None = None) -> Any:
        """The replay table for this config; `seed` fixes its sampling RNG for reproducible runs."""
        from quarl.replay import table_from_config  # pylint: disable=import-outside-toplevel
        return table_from_config(self.transition_signature(env_spec), self.table_config(), seed=seed)
