"""D4PG actor: a quantized deterministic policy plus Gaussian exploration noise (Acme's behaviour policy).

The actor holds no learner weights and no JAX state: a `quarl.runtimes` executor runs the `QuantizedParams`
it was given (int8, fp16, ...), so the data it explores with is exactly what the quantized policy does.
Noise comes from the actor's own `np.random.Generator`, seeded by (seed, actor_id), so a fleet of actors
started from one run seed explores independently and reproducibly.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from agents.base import ExecutorActor, ExecutorFactory
from quarl.policy.spec import PolicySpec
from quarl.quant.quantization import QuantizedParams



class D4PGActor(ExecutorActor):
    """`act(obs[K]) -> (actions[K, act_dim], {})`; `update(qparams)` swaps weights; `evaluation` drops noise."""

    def __init__(self, spec: PolicySpec, qparams: QuantizedParams, *, action_min: Sequence[float],
                 action_max: Sequence[float], sigma: float, seed: int, actor_id: int = 0,
                 evaluation: bool = False, backend: str = "auto",
                 executor_factory: ExecutorFactory | None = None, batch_size: int = 1):
        lo = np.asarray(action_min, np.float32).reshape(-1)
        hi = np.asarray(action_max, np.float32).reshape(-1)
        if lo.shape != (spec.output_dim,) or hi.shape != (spec.output_dim,):
            raise ValueError(f"action bounds must have {spec.output_dim} dims, got {lo.shape} and {hi.shape}")
        if not np.all(lo < hi):
            raise ValueError("action bounds need minimum < maximum in every dimension")
        if not np.isfinite(sigma) or sigma < 0:
            raise ValueError(f"sigma must be a finite number >= 0, got {sigma!r}")
        for name, value in (("seed", seed), ("actor_id", actor_id)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        self._make_executor(spec, qparams, backend, batch_size, executor_factory)
        self._low, self._high = lo, hi
        self._sigma = float(sigma)
        self._rng = np.random.default_rng([int(seed), int(actor_id)])
        self.actor_id = int(actor_id)
        self.evaluation = bool(evaluation)

    @property
    def sigma(self) -> float:
        """Exploration std-dev in action units (unused while `evaluation` is set)."""
        return self._sigma

    @property
    def exploration(self) -> float:
        """What the episode log records of this actor's exploration: its sigma."""
        return self._sigma

    def act(self, observations: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """pi(obs) + N(0, sigma^2) per row while exploring, *not* clipped; pi(obs) clipped to the bounds in
        evaluation; one policy call for the batch [K, obs_dim], and no extras (replay transitions carry none).

        As in Acme (`rlax.add_gaussian_noise`, then the environment's `CanonicalSpecWrapper(clip=True)`), the
        environment clips what it executes (`quarl.envs.factory`) while replay stores the noisy action itself, so the
        critic sees how far past a bound the policy was pushed. Evaluation actions are clipped because a
        low-precision tanh head may overshoot its bounds by a rounding step."""
        obs = np.asarray(observations, np.float32)
        if obs.ndim != 2 or obs.shape[1] != self._obs_dim:
            raise ValueError(f"observations must be [K, {self._obs_dim}], got shape {obs.shape}")
        actions = np.asarray(self._executor(obs), np.float32)
        if self.evaluation or self._sigma == 0.0:
            return np.clip(actions, self._low, self._high), {}
        return actions + self._rng.normal(0.0, self._sigma, actions.shape).astype(np.float32), {}
