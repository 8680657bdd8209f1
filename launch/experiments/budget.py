"""What a step budget reaches, said before a run starts: a budget that ends before the learner's first step trains
nothing (its evaluations see the initial policy), and one that ends before the first evaluation gets only the final
one. Neither is an error (a smoke run may want exactly that), so the CLIs print these as warnings and go on.

When learning starts, in actor steps over all actors:
- a replay agent (DQN, D4PG) samples once replay holds `min_replay_size` transitions, about one per actor step;
- an on-policy agent (PPO, A2C) updates on whole rollouts: in one process the budget is rounded up to whole
  rollouts, so it always updates; distributed, each of the N actors must finish one rollout (a partial one is
  counted but trained on by no one), about N rollouts' steps.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from launch.experiments.config import ExperimentConfig

if TYPE_CHECKING:
    from agents.base import BuilderBase


def learning_starts(config: ExperimentConfig, builder: "BuilderBase", *, distributed: bool) -> int | None:
    """The actor steps (over all actors) before the learner's first step; None: from the first rollout on (one
    process rounds an on-policy budget up to whole rollouts)."""
    rollout = builder.steps_per_update(builder.num_envs(config.envs_per_actor))  # None: a replay agent
    if rollout is None:
        return int(builder.config.min_replay_size)
    return config.distributed.num_actors * int(rollout) if distributed else None


def budget_warnings(config: ExperimentConfig, budget_flag: str, *, distributed: bool) -> list[str]:
    """One line per thing `config.max_actor_steps` ends before (`budget_flag` names it as the CLI does); none for
    a resumed run, whose learner and evaluations started in the run it continues."""
    if config.distributed.resume is not None and distributed:
        return []
    builder = config.builder()
    budget, out = int(config.max_actor_steps), []
    starts = learning_starts(config, builder, distributed=distributed)
    if starts is not None and budget < starts:
        why = (f"replay must hold min_replay_size={starts:,} transitions (about one per actor step)"
               if builder.steps_per_update(1) is None else
               f"each of the {config.distributed.num_actors} actors must finish a rollout first "
               f"({starts:,} actor steps in all)")
        out.append(f"{budget_flag} {budget:,} ends before learning starts: {why}, so the learner takes no step and "
                   "every evaluation sees the initial policy")
    if int(config.eval_every) > budget:
        out.append(f"{budget_flag} {budget:,} ends before the first evaluation (every {config.eval_every:,} actor "
                   "steps, --eval-every): only the final evaluation runs")
    return out
