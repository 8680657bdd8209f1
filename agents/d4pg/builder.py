"""D4PG builder: the agent-agnostic contract (docs/ARCHITECTURE.md, "Builder details") the runners use."""
from __future__ import annotations

import numpy as np

from agents.base import ReplayBuilder, SamplerSettings
from agents.d4pg.actor import D4PGActor, ExecutorFactory
from agents.d4pg.config import D4PGConfig, sigma_for_actor
from agents.d4pg.learning import D4PGLearner
from agents.d4pg.networks import D4PGNetworks, make_networks
from quarl.envs.spec import EnvSpec
from quarl.policy.spec import PolicySpec
from quarl.quant.quantization import QuantizedParams
from quarl.replay.adders import NStepTransitionAdder


class Builder(ReplayBuilder):
    """Makes every D4PG piece from one `D4PGConfig`; precision and backend are run-level arguments."""

    name = "d4pg"
    config_class = D4PGConfig
    config: D4PGConfig

    @staticmethod
    def _action_bounds(env_spec: EnvSpec) -> tuple[np.ndarray, np.ndarray]:
        if getattr(env_spec, "discrete", False):
            raise ValueError("D4PG needs a continuous-action task (e.g. cartpole:balance), got a discrete one")
        spec = env_spec.action_spec
        lo = np.broadcast_to(np.asarray(spec.minimum, np.float64), spec.shape).reshape(-1)
        hi = np.broadcast_to(np.asarray(spec.maximum, np.float64), spec.shape).reshape(-1)
        return lo, hi

    def networks(self, env_spec: EnvSpec) -> D4PGNetworks:
        """Policy and critic (haiku) for this task."""
        lo, hi = self._action_bounds(env_spec)
        return make_networks(self.config, env_spec.obs_dim, lo, hi)

    def policy_spec(self, env_spec: EnvSpec) -> PolicySpec:
        """What actors run: Acme's LayerNorm MLP policy with a tanh head onto the (canonical) action bounds."""
        return self.networks(env_spec).policy_spec

    def make_learner(self, env_spec: EnvSpec, seed: int, *, max_actor_steps: int | None = None,
                     num_envs: int = 1) -> D4PGLearner:
        """The learner; a run's length changes nothing (its schedules count learner steps)."""
        del max_actor_steps, num_envs
        return D4PGLearner(self.networks(env_spec), self.config, seed)

    def sigma_for_actor(self, actor_id: int, num_actors: int) -> float:
        """Exploration std-dev of actor `actor_id` in a fleet of `num_actors` (see `config.sigma_spread`)."""
        return sigma_for_actor(self.config, actor_id, num_actors)

    def make_actor(self, env_spec: EnvSpec, qparams: QuantizedParams, *, seed: int, actor_id: int = 0,
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

    def make_adder(self) -> NStepTransitionAdder:
        # Acme's D4PG items, including the short windows at an episode's start.
        return NStepTransitionAdder(self.config.n_step, self.config.discount, start_transitions=True)

    def action_column(self, env_spec: EnvSpec) -> tuple[tuple[int, ...], np.dtype]:
        lo, _ = self._action_bounds(env_spec)
        return (lo.size,), np.dtype(np.float32)

    def sampler_settings(self) -> SamplerSettings:
        return {"sampler": "uniform", "priority_exponent": 0.0}  # D4PG samples uniformly, as in Acme

    def error_buffer_setting(self) -> tuple[float, float]:
        return self.config.rate_limiter_diffs  # (min_diff, max_diff): Acme's local learner schedule
