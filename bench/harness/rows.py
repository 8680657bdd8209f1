"""The training settings more than one kind of benchmark runs: the learning benchmark's rows (`LearningRow`,
`DQN_ROWS`, `QUICK_ROWS`) that bench.peers.offpolicy and bench.learning.dqn_stability also run.

They live in the harness so that a peer comparison, a stability sweep and the learning benchmark run the same
budget, cadence and target without one benchmark importing another.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from agents.dqn.config import task_overrides as dqn_task_overrides


@dataclasses.dataclass(frozen=True)
class LearningRow:
    """One benchmark task: an agent, its config overrides, a budget and the return that counts as solved."""

    agent: str
    task: str
    target: float
    max_actor_steps: int
    eval_every: int
    eval_episodes: int = 10
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""


# DQN on gym classic control. Targets: CartPole-v1's "solved" 475, Acrobot-v1 -100 and MountainCar-v0 -130
# (returns averaged over the evaluation episodes). Budgets are rl-zoo3's for its tuned DQN (n_timesteps: 50k,
# 100k, 120k env steps), so bench.peers.offpolicy compares final returns at equal env steps. Each task runs with
# its settings from agents.dqn.config.task_overrides ({} where the defaults suit it); MountainCar's reward is
# sparse, so it takes rl-baselines3-zoo's MountainCar settings (faster learning rate, gamma 0.98, small replay,
# longer exploration), with its observation bounds mapped onto [-1, 1] and the learning rate decaying over the run.
DQN_ROWS: tuple[LearningRow, ...] = (
    LearningRow("dqn", "CartPole-v1", 475.0, 50_000, 2_500, overrides=dqn_task_overrides("CartPole-v1")),
    LearningRow("dqn", "Acrobot-v1", -100.0, 100_000, 2_500, overrides=dqn_task_overrides("Acrobot-v1")),
    LearningRow("dqn", "MountainCar-v0", -130.0, 120_000, 2_500, overrides=dqn_task_overrides("MountainCar-v0"),
                note="rl-baselines3-zoo hyper-parameters"),
)
QUICK_ROWS: tuple[LearningRow, ...] = (LearningRow("dqn", "CartPole-v1", 150.0, 15_000, 2_500, 5),)

