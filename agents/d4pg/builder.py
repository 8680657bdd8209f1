"""D4PG builder: the agent-agnostic contract (docs/ARCHITECTURE.md, "Builder details") the runners use."""
from __future__ import annotations

from typing import Any

import numpy as np

from agents.d4pg.actor import D4PGActor, ExecutorFactory
from agents.d4pg.config import D4PGConfig, sigma_for_actor
from agents.d4pg.learning import D4PGLearner
from agents.d4pg.networks import D4PGNetworks, make_networks
from quarl.policy import PolicySpec
from quarl.quantization import QuantizedParams


class Builder:
    """Makes every D4PG piece from one `D4PGConfig`; precision and backend are run-level arguments."""

    name = "d4pg"
    config_class = D4PGConfig

    def __init__(self, config: D4PGConfig | None = None):
        config = D4PGConfig() if config is None else config
        if not isinstance(config, D4PGConfig):
            raise ValueError(f"d4pg Builder needs a D4PGConfig, got {type(config).__name__}")
        self.config = config

    @staticmethod
    def _action_bounds(env_spec: Any) -> tuple[np.ndarray, np.ndarray]:
        if getattr(env_spec, "discrete", False):
            raise ValueError("D4PG needs a continuous-action task (e.g. cartpole:balance), got a discrete one")
        spec = env_spec.action_spec
        lo = np.broadcast_to(np.asarray(spec.minimum, np.float64), spec.shape).reshape(-1)
        hi = np.broadcast_to(np.asarray(spec.maximum, np.float64), spec.shape).reshape(-1)
        return lo, hi

    def networks(self, env_spec: Any) -> D4PGNetworks:
        """Policy and critic (haiku) for this task."""
        lo, hi = self._action_bounds(env_spec)
        return make_networks(self.config, env_spec.obs_dim, lo, hi)

    def policy_spec(self, env_spec: Any) -> PolicySpec:
        """What actors run: Acme's LayerNorm MLP policy with a tanh head onto the (canonical) action bounds."""
        return self.networks(env_spec).policy_spec

    def make_learner(self, env_spec: Any, seed: int) -> D4PGLearner:
        return D4PGLearner(self.networks(env_spec), self.config, seed)

    def sigma_for_actor(self, actor_id: int, num_actors: int) -> float:
        """Exploration std-dev of actor `actor_id` in a fleet of `num_actors` (see `config.sigma_spread`)."""
        return sigma_for_actor(self.config, actor_id, num_actors)

    def make_actor(self, env_spec: Any, qparams: QuantizedParams, *, seed: int, actor_id: int = 0,
                   evaluation: bool = False, backend: str = "auto", num_actors: int = 1,
                   executor_factory: ExecutorFactory | None = None, batch_size: int = 1) -> D4PGActor:
        """`num_actors` (an extension of the contract, default 1) spreads sigma over the fleet; left at 1,
        every actor explores with `config.sigma` whatever its id (runners that only pass `actor_id`)."""
        lo, hi = self._action_bounds(env_spec)
        sigma = self.config.sigma if num_actors == 1 else self.sigma_for_actor(actor_id, num_actors)
        return D4PGActor(self.policy_spec(env_spec), qparams, action_min=lo, action_max=hi,
                         sigma=sigma, seed=seed, actor_id=actor_id,
                         evaluation=evaluation, backend=backend, executor_factory=executor_factory,
                        batch_size=batch_size)

    def make_adder(self) -> Any:
        from quarl.adders import NStepTransitionAdder  # pylint: disable=import-outside-toplevel
        # Acme's D4PG items, including the short windows at an episode's start.
        return NStepTransitionAdder(self.config.n_step, self.config.discount, start_transitions=True)

    def transition_signature(self, env_spec: Any) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Column name -> (per-item shape, dtype) of what the adder emits and the learner reads."""
        lo, _ = self._action_bounds(env_spec)
        obs = ((env_spec.obs_dim,), np.dtype(np.float32))
        return {
            "observation": obs,
            "action": ((lo.size,), np.dtype(np.float32)),
            "reward": ((), np.dtype(np.float32)),
            "discount": ((), np.dtype(np.float32)),
            "next_observation": obs,
        }

    def table_config(self) -> dict[str, Any]:
        """Sampler and rate-limiter settings (plain data, so a remote replay server can build the table)."""
        c = self.config
        return {
            "capacity": c.max_replay_size,
            "sampler": "uniform",  # D4PG samples uniformly, as in Acme
            "priority_exponent": 0.0,
            "samples_per_insert": c.samples_per_insert,
            "min_size_to_sample": c.min_replay_size,
            "error_buffer": c.rate_limiter_diffs,  # (min_diff, max_diff): Acme's local learner schedule
        }

    def make_table(self, env_spec: Any, seed: int | None = None) -> Any:
        """The replay table for this config; `seed` fixes its sampling RNG for reproducible runs."""
        from quarl.replay import table_from_config  # pylint: disable=import-outside-toplevel
        return table_from_config(self.transition_signature(env_spec), self.table_config(), seed=seed)
