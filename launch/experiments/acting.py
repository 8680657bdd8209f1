"""The actor's loop (the upper of the two acting layers) and the one evaluation record of both runners and every
agent (Acme's `EnvironmentLoop` idea, `acme/environment_loop.py`: one loop object owns the update cadence, the stage
timing and the episode rows, and the caller only says where the steps go and how weights are pulled). It steps
the environments through the environment stepper below it (`quarl.acting.loop.VectorEnvLoop`: K environments,
one policy call, a sink), which knows none of these.

The single-process runner (`launch.experiments.run_experiment`, replay and on-policy agents alike), every actor
node (`launch.distributed.nodes.actor`, `launch.distributed.nodes.rollout_actor`) and the evaluator node
(`launch.distributed.nodes.evaluator`) use it, so that:
- what an agent's steps become is its builder's sink (`quarl.acting.loop`: n-step transitions, or fixed-length
  rollouts with the behaviour log-probs), handed to the caller's `insert`;
- a periodic action happens when a count crosses a multiple of its period (`crossed`): weight pulls every
  `actor_update_period` env steps, evaluations every `eval_every` actor steps, whatever the step size K;
- the actor's stages are timed in one place (`launch.experiments.stages.StageTimes`: env, policy, adders + insert);
- the per-episode log (`actor.csv` / `actor_<i>.csv`, `EPISODE_FIELDS`) and `evaluator.csv` (`EVAL_FIELDS`)
  have the same columns in both runners by construction; a value a runner does not have is left empty.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Generic, Mapping, Protocol, Sequence, TypedDict, TypeVar

import dm_env
import numpy as np

from launch.experiments.stages import StageTimes
from quarl.acting.evaluation import run_episode
from quarl.acting.loop import Sink, VectorEnvLoop, VectorStep
from quarl.envs.vector import VectorEnv
from quarl.replay.items import Rollout, Transition

if TYPE_CHECKING:  # agents.base imports JAX; the loop only needs the Protocol's names
    from agents.base import Actor

# evaluator.csv, both runners. train_clock_s: the run's clock without evaluation time (the distributed evaluator
# works on the side, so there it is the wall clock); return_first: the first, noiseless episode (Acme's usual
# one-episode protocol); return_fp32: the same episodes at fp32 (single process with --eval-fp32 only). One row
# is an `EvalRow` (functional form: "return" is a keyword), its columns in this order.
EvalRow = TypedDict("EvalRow", {
    "actor_steps": int, "learner_steps": int, "wall_clock_s": float, "train_clock_s": float, "return": float,
    "return_std": float, "return_min": float, "return_max": float, "return_first": float, "episodes": int,
    "weights_version": int | None, "return_fp32": float | None})
EVAL_FIELDS: tuple[str, ...] = tuple(EvalRow.__annotations__)
# One row per finished episode: the actor's own env steps, its steps/s over the episode (its K environments step
# together), exploration (DQN epsilon, D4PG sigma), the weights it acted with, and the run's total actor steps.
EPISODE_FIELDS = ("actor_steps", "wall_clock_s", "episode", "return", "length", "steps_per_s", "exploration",
                  "weights_version", "total_actor_steps")
# What the loop's sink hands to `insert`: n-step transitions (replay agents) or whole rollouts (on-policy ones).
ItemT = TypeVar("ItemT", Transition, Rollout)


class RowLog(Protocol):
    """Where rows go: a CSV file (`quarl.ops.logs.CSVLogger`), or CSV plus TensorBoard on a node (`Logger`)."""

    def write(self, values: Mapping[str, object]) -> None: ...


def crossed(before: int, after: int, period: int) -> bool:
    """Whether a multiple of `period` lies in (before, after]: the one cadence rule for counts that advance K
    at a time (with K = 1, `after % period == 0`)."""
    return int(after) // int(period) > int(before) // int(period)


class ActingLoop(Generic[ItemT]):
    """One actor's loop over K environments, on a `VectorEnvLoop` (one batched policy call per step, `actor.act`):
    stage times, episode rows and the weight-pull cadence. `sink` is the agent's (`BuilderBase.make_sink`); the caller
    supplies `insert(items)` (transitions into an in-memory table or a replay server, rollouts into a learner
    or an outbox; it times its own work) and `pull()` (a payload made in this process or fetched)."""

    def __init__(self, env: VectorEnv, sink: Sink[ItemT], times: StageTimes, *, update_period: int,
                 episode_log: RowLog, clock: Callable[[], float]):
        self.env_loop: VectorEnvLoop[ItemT] = VectorEnvLoop(env, sink=sink)
        self.num_envs = self.env_loop.num_envs
        self.times = times
        self.update_period = int(update_period)
        self.steps = 0  # this loop's env steps (K per iteration)
        self.episodes = 0
        self._log, self._clock = episode_log, clock
        self._episode_start: list[float] = []

    @property
    def sink(self) -> Sink[ItemT]:
        return self.env_loop.sink

    def reset(self) -> None:
        self.times.env_step_s += self.env_loop.reset()
        self._episode_start = [time.monotonic()] * self.num_envs

    def step(self, actor: "Actor", insert: Callable[[Sequence[ItemT]], None], pull: Callable[[], None], *,
             weights_version: int, total_actor_steps: Callable[[], int] | None = None) -> VectorStep[ItemT]:
        """One iteration: act, hand the sink's finished items to `insert`, log finished episodes, and `pull()`
        when the env-step count crossed a multiple of the update period."""
        out = self.env_loop.step(actor.act)
        times = self.times
        times.policy_s += out.policy_s
        times.env_step_s += out.env_s
        times.insert_s += out.sink_s
        prev, self.steps = self.steps, self.steps + self.num_envs
        times.env_steps = self.steps
        insert(out.items)
        if out.episodes:
            total = self.steps if total_actor_steps is None else int(total_actor_steps())
            self._log_episodes(out, actor, weights_version, total)
        if crossed(prev, self.steps, self.update_period):
            pull()
        return out

    def _log_episodes(self, out: VectorStep[ItemT], actor: "Actor", weights_version: int, total: int) -> None:
        now = time.monotonic()
        for episode in out.episodes:
            self.episodes += 1
            seconds = max(now - self._episode_start[episode.env_index], 1e-9)
            self._episode_start[episode.env_index] = now
            self._log.write({"actor_steps": self.steps, "wall_clock_s": round(self._clock(), 3),
                             "episode": self.episodes, "return": episode.episode_return, "length": episode.length,
                             "steps_per_s": round(self.num_envs * episode.length / seconds, 2),
                             "exploration": round(float(actor.exploration), 5), "weights_version": weights_version,
                             "total_actor_steps": total})

    def close(self) -> None:
        self.env_loop.close()


def evaluation_returns(actor: "Actor", env: dm_env.Environment, episodes: int,
                       should_stop: Callable[[], bool] | None = None) -> list[float]:
    """Undiscounted returns of `episodes` full episodes with the (evaluation-mode) actor, acting through the one
    loop (`actor.act` on a batch of one); `should_stop` abandons the evaluation
    (`quarl.acting.evaluation.EpisodeInterrupted`)."""
    return [run_episode(env, actor.act, should_stop=should_stop)[0] for _ in range(int(episodes))]


def evaluation_row(returns: Sequence[float], *, actor_steps: int, learner_steps: int, wall_clock_s: float,
                   train_clock_s: float, weights_version: int | None,
                   return_fp32: float | None = None) -> EvalRow:
    """One evaluator.csv row (`EVAL_FIELDS`, in order) from the episodes' returns and the clocks at its start."""
    values = np.asarray(returns, np.float64)
    return {"actor_steps": int(actor_steps), "learner_steps": int(learner_steps),
            "wall_clock_s": round(float(wall_clock_s), 3), "train_clock_s": round(float(train_clock_s), 3),
            "return": float(values.mean()), "return_std": float(values.std()), "return_min": float(values.min()),
            "return_max": float(values.max()), "return_first": float(values[0]), "episodes": len(values),
            "weights_version": None if weights_version is None else int(weights_version),
            "return_fp32": return_fp32}

