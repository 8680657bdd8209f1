"""The learner's side of the single-process runner (`launch.experiments.run_experiment`), one per kind of agent:
what happens to the items the acting loop's sink hands out, and when the learner steps.

- `ReplayFeed` (DQN, D4PG): n-step transitions go into an in-memory table; after every env step the learner
  takes as many steps as the table's samples-per-insert rate limiter allows (never blocking).
- `RolloutFeed` (PPO, A2C): each rollout [T, K] goes straight to the learner, one update per rollout; the actor
  then pulls the new weights (its update period is one rollout), and continuous actors get the learner's log-std.

Both time the learner into the runner's clock (`learner_s`, `sample_s`) and write learner.csv; `ready()` says
whether the learner has taken what the actor produced, which is when the runner may evaluate (every env step
with replay; at rollout boundaries on-policy, so an evaluation always sees the weights of the latest update).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Sequence

import jax
import numpy as np

from agents.base import ReplayBuilder
from launch.experiments.stages import StageTimes
from quarl.envs.spec import EnvSpec
from quarl.ops.logs import CSVLogger
from quarl.replay.items import Rollout, TableInfo, Transition, stack_items
from quarl.replay.table import Table

if TYPE_CHECKING:
    from agents.base import Actor, BuilderBase, Learner, OnPolicyActor, OnPolicyLearner
    from agents.learner_base import Metrics

LEARNER_LOG_EVERY = 1_000  # learner steps between learner.csv rows (replay agents; on-policy: every update)


class ReplayFeed:
    """Transitions -> in-memory replay table -> learner, under the table's rate limiter (see the module)."""

    def __init__(self, builder: "ReplayBuilder", env_spec: EnvSpec, learner: "Learner", *, seed: int, times: StageTimes,
                 clock: dict[str, float], log: CSVLogger, steps: Callable[[], int], start: float,
                 sync_learner: bool = False):
        self.learner, self._times, self._clock, self._log = learner, times, clock, log
        self._steps, self._sync = steps, bool(sync_learner)
        self.table = builder.make_table(env_spec, seed=seed)
        self._prioritized = getattr(self.table, "sampler", "uniform") == "prioritized"
        self._batch_size = int(builder.config.batch_size)
        self._window = (start, 0)  # (time, learner steps) at the previous learner.csv row
        self._start = start
        self._last_metrics: Metrics = {}
        # Prioritized replay: the last update's (keys, |TD|), written to the table just before the next sample.
        # Reading |TD| waits for the device, so deferring it lets the update run while the actor steps; the table
        # is the same as with an immediate write (new items take priority 1, the sum tree recomputes exact sums),
        # so is every draw.
        self._pending_priorities: list[tuple[np.ndarray, np.ndarray]] = []

    def insert(self, transitions: Sequence[Transition]) -> None:
        if transitions:
            t = time.perf_counter()
            _insert(self.table, transitions, self.learn)
            self._times.insert_s += time.perf_counter() - t

    def learn(self) -> None:
        """As many learner steps as the rate limiter allows now."""
        learner, clock = self.learner, self._clock
        while self.table.can_sample(self._batch_size):
            t = time.perf_counter()
            self._flush_priorities()
            sample = self.table.sample(self._batch_size, timeout=0.0)
            t1 = time.perf_counter()
            metrics = learner.step(sample)
            if self._sync:
                jax.block_until_ready(metrics)
            if self._prioritized:
                self._pending_priorities.append((sample.keys, metrics["priorities"]))
            t2 = time.perf_counter()
            clock["sample_s"] += t1 - t
            clock["learner_s"] += t2 - t1
            self._last_metrics.update(metrics)
            if learner.steps % LEARNER_LOG_EVERY == 0:
                self._log_row()

    def ready(self) -> bool:
        return True

    def on_pull(self, actors: Sequence["Actor | None"]) -> None:
        del actors  # the weights are all a replay actor takes

    def finish(self) -> None:
        """The last priorities, and the learner's final state in learner.csv whatever the log period."""
        self._flush_priorities()
        if self._last_metrics and self.learner.steps % LEARNER_LOG_EVERY:
            self._log_row()

    def info(self) -> TableInfo:
        return self.table.info()

    def _flush_priorities(self) -> None:
        if self._pending_priorities:
            self.table.update_priorities(*self._pending_priorities.pop())

    def _log_row(self) -> None:
        now, steps = time.perf_counter(), self.learner.steps
        rate = (steps - self._window[1]) / max(now - self._window[0], 1e-9)
        row = {"learner_steps": steps, "actor_steps": self._steps(), "wall_clock_s": round(now - self._start, 3),
               "steps_per_s": round(rate, 2)}
        row.update({k: float(v) for k, v in self._last_metrics.items() if k != "priorities"})
        self._log.write(row)
        self._window = (now, steps)


class RolloutFeed:
    """Rollouts -> learner, one update each (see the module); no replay.

    Each update is waited for where it is timed, so `learner_s` is the update's work, not its dispatch: the next
    rollout acts with the weights this update makes, so nothing could overlap it anyway."""

    def __init__(self, learner: "OnPolicyLearner", *, clock: dict[str, float], log: CSVLogger, steps: Callable[[], int],
                 start: float):
        self.learner, self._clock, self._log = learner, clock, log
        self._steps, self._start = steps, start
        self._updated = False

    def insert(self, rollouts: Sequence[Rollout]) -> None:
        for rollout in rollouts:
            t = time.perf_counter()
            metrics = jax.block_until_ready(self.learner.step(rollout))
            self._clock["learner_s"] += time.perf_counter() - t
            self._log.write({"learner_steps": self.learner.steps, "actor_steps": self._steps(),
                             "wall_clock_s": round(time.perf_counter() - self._start, 3),
                             **{k: float(v) for k, v in metrics.items()}})
            self._updated = True

    def learn(self) -> None:
        """Nothing between rollouts: the learner updates when one is complete (`insert`)."""

    def ready(self) -> bool:
        """Whether a rollout was learnt from since the last call (a rollout boundary)."""
        updated, self._updated = self._updated, False
        return updated

    def on_pull(self, actors: Sequence["OnPolicyActor | None"]) -> None:
        """Continuous actors sample (and evaluate) with the learner's current log-std."""
        log_std = self.learner.log_std()
        for actor in actors:
            if actor is not None and not actor.discrete:
                actor.set_log_std(log_std)

    def finish(self) -> None:
        """Every update already has its learner.csv row."""

    def info(self) -> dict[str, object]:
        """Nothing: no replay (summary.json's `replay` section is empty)."""
        return {}


def make_feed(builder: "BuilderBase", env_spec: EnvSpec, learner: "Learner", *, seed: int, times: StageTimes,
              clock: dict[str, float], log: CSVLogger, steps: Callable[[], int], start: float,
              sync_learner: bool = False) -> ReplayFeed | RolloutFeed:
    """The feed of `builder`'s agent: rollouts for an on-policy agent (no table, so no seed; the learner's time
    is all it clocks), a replay table for the others."""
    if not isinstance(builder, ReplayBuilder):  # on-policy: its learner is an OnPolicyLearner
        return RolloutFeed(learner, clock=clock, log=log, steps=steps, start=start)  # type: ignore[arg-type]
    return ReplayFeed(builder, env_spec, learner, seed=seed, times=times, clock=clock, log=log, steps=steps,
                      start=start, sync_learner=sync_learner)


def _insert(table: Table, transitions: Sequence[Transition], learn: Callable[[], None]) -> None:
    """Stacks the adder's transitions into one batch and inserts it, letting the learner catch up first if
    the rate limiter would block (it cannot in this loop, but a stuck insert must never hang a run)."""
    batch = stack_items(transitions)  # one transition (the common case): a leading axis is a view, not a copy
    if not table.can_insert(len(transitions)):
        learn()
    table.insert(batch, timeout=60.0)
