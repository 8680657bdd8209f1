"""What an ActorQ run is made of, as one frozen record (plain data: importing it costs nothing, so CLIs build and
check it before JAX or Ray load)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

SERVICE_SHARE = 0.01  # of each learner resource, asked by the learner, every service and the evaluator


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything a distributed ActorQ run is made of (validated by `launch.actorq` before anything starts).

    `overrides` are agent config fields (`--set key=value`); `actor_update_period` is folded into them so
    the agent config is the single source of truth for it.
    """

    agent: str
    task: str
    precision: str
    num_actors: int
    max_actor_steps: int
    seed: int
    logdir: str
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    backend: str = "auto"  # policy runtime of actors and evaluator: auto | onnx | jax
    eval_every: int = 2_000  # actor steps between evaluations
    eval_episodes: int = 2
    publish_period: int = 10  # learner steps between weight versions
    insert_batch: int = 64  # transitions per replay insert call
    prefetch: int = 2  # sampled batches the learner keeps in flight
    checkpoint_every: int = 0  # learner steps; 0 = only at shutdown
    resume: str | None = None
    log_every_s: float = 1.0  # learner.csv cadence (seconds)
    target_return: float | None = None  # end the run once `target_streak` evaluations in a row reach it
    target_streak: int = 1
    envs_per_actor: int = 1  # environments each actor steps with one batched policy call (the paper: 1)
    actor_resources: Mapping[str, float] = dataclasses.field(default_factory=dict)  # per actor (Ray custom)
    # Ray custom resources marking the learner's machine: learner, services and evaluator each ask for
    # SERVICE_SHARE of every one, so they run there together.
    learner_resources: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["overrides"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.overrides.items()}
        d["actor_resources"] = dict(self.actor_resources)
        d["learner_resources"] = dict(self.learner_resources)
        return d
