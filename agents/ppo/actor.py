"""PPO actor: samples from the action distribution of a quantized policy executed by a `quarl.runtimes` executor.

As every actor here it holds no learner weights and no JAX state: it runs `QuantizedParams` (int8, fp16, ...)
through whichever runtime the executor picked, so the rollouts PPO learns from are collected by the policy that
is deployed. It returns, beside the actions, their log-probabilities under that quantized policy (the behaviour
log-probs of PPO's ratio). Evaluation is deterministic: the argmax of the logits, or the Gaussian mean clipped
to the canonical action bounds [-1, 1].
"""
from __future__ import annotations

import numpy as np

from agents.base import ExecutorActor, ExecutorFactory
from quarl.policy.spec import PolicySpec
from quarl.quant.quantization import QuantizedParams
from quarl.runtimes.base import policy_rows

HALF_LOG_2PI = 0.5 * float(np.log(2.0 * np.pi))


class PPOActor(ExecutorActor):
    """`act(obs[K]) -> (actions, {"behaviour_logp": log_probs})`, or the greedy actions in evaluation (`sample`
    and `greedy` are its two halves); `update(qparams)` swaps weights and `set_log_std` the Gaussian's std
    (continuous tasks). An `agents.base.OnPolicyActor`."""

    def __init__(self, spec: PolicySpec, qparams: QuantizedParams, *, discrete: bool, seed: int,
                 log_std: np.ndarray | None = None, evaluation: bool = False, backend: str = "auto",
                 executor_factory: ExecutorFactory | None = None, batch_size: int = 1):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self._make_executor(spec, qparams, backend, batch_size, executor_factory)
        self._outputs = spec.output_dim
        self.discrete = bool(discrete)
        self._log_std: np.ndarray | None = None
        if not self.discrete:
            self.set_log_std(np.zeros(self._outputs, np.float32) if log_std is None else log_std)
        self._rng = np.random.default_rng(seed)
        self.evaluation = bool(evaluation)

    @property
    def sigma(self) -> float:
        """The mean exploration std-dev (continuous tasks; NaN for discrete ones), as D4PG's actor reports it."""
        return float(np.mean(np.exp(self._log_std))) if self._log_std is not None else float("nan")

    @property
    def exploration(self) -> float:
        """What the episode log records of this actor's exploration: its sigma (NaN on discrete tasks)."""
        return self.sigma

    def set_log_std(self, log_std: np.ndarray) -> None:
        """The learner's current Gaussian log-std, one value per action dimension."""
        value = np.asarray(log_std, np.float32).reshape(-1)
        if value.shape != (self._outputs,) or not np.all(np.isfinite(value)):
            raise ValueError(f"log_std must be {self._outputs} finite values, got {log_std!r}")
        self._log_std = value

    def policy_output(self, observations: np.ndarray) -> np.ndarray:
        """The quantized policy's logits or Gaussian mean for a batch [K, obs_dim] (images are flattened)."""
        out = np.asarray(self._executor(policy_rows(observations, self._spec)), np.float64)
        if not np.all(np.isfinite(out)):
            raise ValueError("the policy produced non-finite outputs")
        return out

    def sample(self, observations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Actions drawn from the policy's distribution and their log-probabilities (float32 [K])."""
        out = self.policy_output(observations)
        if self.discrete:
            logp_all = out - out.max(axis=1, keepdims=True)
            logp_all -= np.log(np.exp(logp_all).sum(axis=1, keepdims=True))
            # Inverse-CDF sampling, one uniform per row.
            cdf = np.cumsum(np.exp(logp_all), axis=1)
            u = self._rng.random((out.shape[0], 1)) * cdf[:, -1:]
            actions = np.minimum((cdf < u).sum(axis=1), out.shape[1] - 1).astype(np.int32)
            return actions, logp_all[np.arange(out.shape[0]), actions].astype(np.float32)
        std = np.exp(self._log_std.astype(np.float64))
        noise = self._rng.standard_normal(out.shape)
        actions = out + std * noise
        logp = np.sum(-0.5 * noise * noise - np.log(std) - HALF_LOG_2PI, axis=1)
        return actions.astype(np.float32), logp.astype(np.float32)

    def greedy(self, observations: np.ndarray) -> np.ndarray:
        """The deterministic actions: argmax of the logits, or the mean clipped to [-1, 1]."""
        out = self.policy_output(observations)
        if self.discrete:
            return np.argmax(out, axis=1).astype(np.int32)
        return np.clip(out, -1.0, 1.0).astype(np.float32)

    def act(self, observations: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """What the acting loop calls: sampled actions with their log-probabilities (`behaviour_logp`, what the
        rollout sink keeps for PPO's ratio), or the greedy actions and nothing else in evaluation."""
        if self.evaluation:
            return self.greedy(observations), {}
        actions, logp = self.sample(observations)
        return actions, {"behaviour_logp": logp}
