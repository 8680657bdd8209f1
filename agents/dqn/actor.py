"""DQN actor: epsilon-greedy over the Q-values of a quantized policy executed by a `quarl.runtimes` executor.

The actor never touches the learner's fp32 weights or JAX: it gets `QuantizedParams` (decoded from a payload)
and runs them through whichever runtime the executor picked, so what it explores with is exactly what a
deployed int8 policy would do. Random actions skip inference altogether (most steps early in training).
"""
from __future__ import annotations

import numpy as np

from agents.base import ExecutorActor, ExecutorFactory
from agents.dqn.config import linear_epsilon
from quarl.policy.spec import PolicySpec
from quarl.quant.quantization import QuantizedParams
from quarl.runtimes.base import policy_rows



class EpsilonSchedule:
    """epsilon as a function of this actor's own step count: linear decay, or constant when start == end."""

    def __init__(self, start: float, end: float, decay_steps: int):
        for name, v in (("start", start), ("end", end)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"epsilon {name} must be in [0, 1], got {v!r}")
        if decay_steps < 0:
            raise ValueError(f"epsilon decay_steps must be >= 0, got {decay_steps!r}")
        self.start, self.end, self.decay_steps = float(start), float(end), int(decay_steps)

    @classmethod
    def constant(cls, epsilon: float) -> "EpsilonSchedule":
        return cls(epsilon, epsilon, 0)

    def __call__(self, step: int) -> float:
        return linear_epsilon(step, self.start, self.end, self.decay_steps)


class DQNActor(ExecutorActor):
    """`act(obs[K]) -> (actions[K], {})`, epsilon-greedy per row; `update(qparams)` swaps weights; `evaluation`
    selects `eval_epsilon`."""

    def __init__(self, spec: PolicySpec, qparams: QuantizedParams, *, num_actions: int,
                 schedule: EpsilonSchedule, eval_epsilon: float, seed: int, evaluation: bool = False,
                 backend: str = "auto", executor_factory: ExecutorFactory | None = None, batch_size: int = 1):
        if num_actions != spec.output_dim:
            raise ValueError(f"num_actions ({num_actions}) does not match the Q-network output ({spec.output_dim})")
        if not 0.0 <= eval_epsilon <= 1.0:
            raise ValueError(f"eval_epsilon must be in [0, 1], got {eval_epsilon!r}")
        self._make_executor(spec, qparams, backend, batch_size, executor_factory)
        self._num_actions = int(num_actions)
        self._schedule = schedule
        self._eval_epsilon = float(eval_epsilon)
        self._rng = np.random.default_rng(seed)
        self._steps = 0  # exploration steps taken (evaluation steps do not advance the schedule)
        self.evaluation = bool(evaluation)

    @property
    def epsilon(self) -> float:
        """The exploration rate the next row `act` explores with."""
        return self._eval_epsilon if self.evaluation else self._schedule(self._steps)

    @property
    def exploration(self) -> float:
        """What the episode log records of this actor's exploration: its epsilon."""
        return float(self.epsilon)

    @property
    def steps(self) -> int:
        return self._steps

    def act(self, observations: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Epsilon-greedy actions for a batch [K, ...] and no extras (replay transitions carry none): row i
        explores with the epsilon of this actor's step count + i (the schedule counts env steps, whatever K), and
        the policy runs once, on the whole batch, unless every row acts at random (most steps early in
        training). Every observation is checked first (size, NaN/inf, pixel range), whether or not it is used."""
        obs = policy_rows(observations, self._spec)  # [K, H, W, C] images flattened; validated
        actions = np.empty(obs.shape[0], np.int32)
        greedy = np.ones(obs.shape[0], bool)
        for i in range(obs.shape[0]):
            epsilon = self.epsilon
            if not self.evaluation:
                self._steps += 1
            if epsilon > 0.0 and self._rng.random() < epsilon:
                actions[i] = self._rng.integers(self._num_actions)
                greedy[i] = False
        if greedy.any():
            q = np.asarray(self._executor(obs))
            actions[greedy] = np.argmax(q[greedy], axis=1)
        return actions, {}
