"""The grid's runs for `launch.reproduce`: the budgets (steps, evaluation cadence and agent config per panel),
one planned run, and the two ways to run it (in this process, or as a `launch.actorq` subprocess).

Kept apart from the CLI so `launch.grid.cluster`'s Ray tasks can run a grid run without importing the
launcher that drives them (no import cycle).
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from agents.dqn.config import MOUNTAINCAR_OVERRIDES
from analysis.runs import PANELS, is_finished, read_summary
from launch.experiments.config import ExperimentConfig
from launch.experiments.run_experiment import run_experiment
from quarl.ops.io import write_json_atomic

if TYPE_CHECKING:
    from launch.experiments.summary import Summary


# ------------------------------------------------------------------------------------------------ budgets


@dataclasses.dataclass(frozen=True)
class RunBudget:
    """A panel's part of an ExperimentConfig: how long a run is, how often it is evaluated, and the agent config
    it uses (fields named as ExperimentConfig's; PlannedRun.config completes them)."""

    max_actor_steps: int  # actor (environment) steps, over all actors
    eval_every: int  # actor steps between evaluations (the figure's time resolution)
    eval_episodes: int  # episodes per evaluation (the figure's noise)
    overrides: Mapping[str, object]  # agent config fields (agents.get_builder(agent, **overrides))
    num_actors: int = 1  # ignored by the single-process runner


# Small budget, D4PG: 64x64 policy and critic, batch 64; 32 samples per insert gives one learner step per two
# env steps. n-step 5, discount 0.99 and the actor update period of 100 are the paper's. Measured on the 2-core
# dev box (under load): cartpole:balance reaches returns of 900-1000 within 28-40k steps, 40k steps take
# ~75 s of CPU (~150 s wall when the machine is shared).
_D4PG_SMALL = {"policy_layer_sizes": (64, 64), "critic_layer_sizes": (64, 64), "batch_size": 64,
               "min_replay_size": 1_000, "samples_per_insert": 32.0, "learning_rate": 3e-4, "n_step": 5,
               "discount": 0.99, "actor_update_period": 100}
# Small budget, DQN: the agent's own classic-control setting (256x256, one update per env step, fast target),
# written out so that a later change of the defaults does not silently change this budget. Measured on the
# shared 2-core dev box: CartPole reaches 500 at ~12k steps; a 25k-step run takes ~30 s (9 runs: ~5 min).
_DQN_SMALL = {"hidden_sizes": (256, 256), "learning_rate": 1e-3, "batch_size": 64, "min_replay_size": 1_000,
              "samples_per_insert": 64.0, "target_update_period": 100, "epsilon_decay_steps": 10_000, "n_step": 3,
              "discount": 0.99, "actor_update_period": 100}
# The paper's setting: a 2048x3 policy (the point of ActorQ: inference is a large share of actor time),
# batch 256, n-step 5, discount 0.99, 4 actors pulling weights every 100 steps; critics keep Acme's sizes.
_D4PG_PAPER = {"policy_layer_sizes": (2048, 2048, 2048), "batch_size": 256, "n_step": 5, "discount": 0.99,
               "actor_update_period": 100}
_DQN_PAPER = {"hidden_sizes": (2048, 2048, 2048), "batch_size": 256, "n_step": 5, "discount": 0.99,
              "actor_update_period": 100}
# Test budget: a few hundred steps and tiny nets; exercises the whole pipeline in seconds, learns nothing.
_D4PG_TINY = {"policy_layer_sizes": (16,), "critic_layer_sizes": (16,), "batch_size": 16, "min_replay_size": 64,
              "samples_per_insert": 4.0, "num_atoms": 11, "actor_update_period": 50}
_DQN_TINY = {"hidden_sizes": (16,), "batch_size": 16, "min_replay_size": 64, "samples_per_insert": 4.0,
             "epsilon_decay_steps": 200, "actor_update_period": 50}


def _panel_budgets(d4pg: Mapping[str, RunBudget], dqn: Mapping[str, RunBudget]) -> dict[str, RunBudget]:
    out = {name: d4pg[name] for name, p in PANELS.items() if p.agent == "d4pg"}
    out.update({name: dqn[name] for name, p in PANELS.items() if p.agent == "dqn"})
    return out


def _d4pg(steps: int, overrides: Mapping[str, object], *, evals: int = 10, episodes: int = 2,
          actors: int = 1) -> RunBudget:
    return RunBudget(steps, max(1, steps // evals), episodes, overrides, actors)


def _dqn(steps: int, overrides: Mapping[str, object], *, evals: int = 20, episodes: int = 5,
         actors: int = 1) -> RunBudget:
    return RunBudget(steps, max(1, steps // evals), episodes, overrides, actors)


BUDGETS: dict[str, dict[str, RunBudget]] = {
    # small: a 2-core laptop. cartpole_balance + CartPole x {fp32, fp16, int8} x 3 seeds (18 runs) take about
    # 20-30 min with the single-process runner (under an hour on a shared 2-core machine). The other
    # panels are sized to show some learning at proportionally longer times (MountainCar uses the sparse-reward
    # settings of agents.dqn.config.MOUNTAINCAR_OVERRIDES; the humanoids are not solved at this budget: they
    # are there to time, not to solve).
    "small": _panel_budgets(
        d4pg={"cartpole_balance": _d4pg(40_000, _D4PG_SMALL, evals=20),  # 1000-step episodes: 40 episodes
              "walker_stand": _d4pg(100_000, _D4PG_SMALL, evals=20),
              "hopper_stand": _d4pg(200_000, _D4PG_SMALL, evals=20),
              "reacher_hard": _d4pg(100_000, _D4PG_SMALL, evals=20),
              "finger_spin": _d4pg(100_000, _D4PG_SMALL, evals=20),
              "cheetah_run": _d4pg(200_000, _D4PG_SMALL, evals=20),
              "humanoid_stand": _d4pg(200_000, _D4PG_SMALL, evals=20),
              "humanoid_walk": _d4pg(200_000, _D4PG_SMALL, evals=20)},
        dqn={"CartPole": _dqn(25_000, _DQN_SMALL, evals=25),
             "MountainCar": _dqn(80_000, {**_DQN_SMALL, **MOUNTAINCAR_OVERRIDES}),
             "Acrobot": _dqn(50_000, _DQN_SMALL, evals=25)}),
    # paper: the paper's agent settings with 4 actors on Ray and budgets long enough for each task to reach
    # its plateau (days of CPU for the humanoids; meant for a large machine).
    "paper": _panel_budgets(
        d4pg={"cartpole_balance": _d4pg(500_000, _D4PG_PAPER, evals=50, episodes=5, actors=4),
              "walker_stand": _d4pg(1_000_000, _D4PG_PAPER, evals=50, episodes=5, actors=4),
              "hopper_stand": _d4pg(3_000_000, _D4PG_PAPER, evals=50, episodes=5, actors=4),
              "reacher_hard": _d4pg(1_000_000, _D4PG_PAPER, evals=50, episodes=5, actors=4),
              "finger_spin": _d4pg(1_000_000, _D4PG_PAPER, evals=50, episodes=5, actors=4),
              "cheetah_run": _d4pg(3_000_000, _D4PG_PAPER, evals=50, episodes=5, actors=4),
              "humanoid_stand": _d4pg(10_000_000, _D4PG_PAPER, evals=50, episodes=5, actors=4),
              "humanoid_walk": _d4pg(10_000_000, _D4PG_PAPER, evals=50, episodes=5, actors=4)},
        dqn={"CartPole": _dqn(200_000, _DQN_PAPER, evals=50, episodes=10, actors=4),
             "MountainCar": _dqn(1_000_000, _DQN_PAPER, evals=50, episodes=10, actors=4),
             "Acrobot": _dqn(500_000, _DQN_PAPER, evals=50, episodes=10, actors=4)}),
    # tiny (hidden from --help): for tests only.
    "tiny": _panel_budgets(
        d4pg={name: RunBudget(1_000, 500, 1, _D4PG_TINY) for name in PANELS},
        dqn={name: RunBudget(300, 100, 1, _DQN_TINY) for name in PANELS}),
}
DEFAULT_RUNNER = {"small": "single", "paper": "actorq", "tiny": "single"}
PUBLIC_BUDGETS = ("small", "paper")
RUNNERS = ("single", "actorq")


# ------------------------------------------------------------------------------------------------ plan


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    panel: str
    precision: str
    seed: int
    budget: RunBudget

    @property
    def agent(self) -> str:
        return PANELS[self.panel].agent

    @property
    def task(self) -> str:
        return PANELS[self.panel].task

    def run_dir(self, root: Path) -> Path:
        return root / "runs" / self.panel / self.precision / f"seed{self.seed}"

    def config(self, run_dir: Path, backend: str) -> ExperimentConfig:
        """The experiment this run is: what either runner runs and summary.json records."""
        return ExperimentConfig.create(agent=self.agent, task=self.task, precision=self.precision, seed=self.seed,
                                       logdir=str(run_dir), backend=backend, **dataclasses.asdict(self.budget))


# ------------------------------------------------------------------------------------------------ running


def run_single(run: PlannedRun, run_dir: Path, backend: str) -> Summary:
    """One run in this process (`launch.experiments.run_experiment.run_experiment`, every agent)."""
    return run_experiment(run.config(run_dir, backend), progress=False)


CONFIG_FILE = "experiment.json"  # the ExperimentConfig a `launch.actorq` grid run is started with


def actorq_command(run: PlannedRun, run_dir: Path, backend: str) -> list[str]:
    """Writes the run's ExperimentConfig into `run_dir` and returns `python -m launch.actorq --config FILE`:
    the subprocess runs exactly this config (no flags to parse back, no preset applied)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG_FILE
    write_json_atomic(path, run.config(run_dir, backend).to_dict())
    return [sys.executable, "-m", "launch.actorq", "--config", str(path), "--no-progress"]


def run_actorq(run: PlannedRun, run_dir: Path, backend: str) -> Summary:
    """One distributed run in its own process (its own private Ray), output kept in runner.log.

    A separate process keeps each run's Ray cluster, JAX state and memory from leaking into the next."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "runner.log", "w", encoding="utf-8") as log:
        code = subprocess.call(actorq_command(run, run_dir, backend), stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    summary = read_summary(run_dir)
    if code != 0 or not is_finished(summary):
        if code in (130, -2):
            raise KeyboardInterrupt
        reason = (summary or {}).get("error") or f"exit code {code}"
        raise RuntimeError(f"launch.actorq failed ({reason}); see {run_dir / 'runner.log'}")
    return summary or {}
