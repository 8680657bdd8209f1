"""`launch.anakin`'s run: a jitted trainer (`agents.anakin`) vmapped over S seeds, driven from Python in chunks, each
seed written as an ordinary run folder (summary.json, evaluator.csv, learner.csv, policy_fp32.qrlp) that `launch.ptq`
and `analysis` read as they read `launch.train`'s.

Why chunks from Python rather than callbacks out of one long jit: between two chunks the run's whole state is at hand,
so a stop (Ctrl-C, SIGTERM, a target reached) ends the run on a consistent state whose policy and summary are then
written; progress and the CSV rows are plain Python; and a callback from inside a vmapped scan would come once per seed
and step, in no promised order. A chunk is one evaluation interval (`Plan`), one jitted call of `lax.scan` over its
periods, so the Python between chunks costs nothing measurable; a stop waits for the chunk under way to end.
"""
from __future__ import annotations

import dataclasses
import math
import time
import types
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import agents
from agents.anakin import make_trainer
from agents.anakin.common import Trainer, evaluate
from analysis.schema import solved_at, sum_energy
from launch.experiments.acting import EVAL_FIELDS, EvalRow, evaluation_row
from launch.experiments.config import ExperimentConfig
from launch.experiments.progress import StepProgress
from launch.experiments.summary import Summary, build_summary, final_policy_record
from launch.program.devices import device_report
from quarl.envs.gymnax_env import GymnaxEnv
from quarl.ops.carbon import start_tracking, stop_tracking
from quarl.ops.io import jsonable, write_json_atomic
from quarl.ops.logs import CSVLogger
from quarl.quant.payload import fp32_payload_nbytes
from quarl.quant.policy_io import save_policy
from quarl.quant.precision import Precision
from quarl.runtimes.kernel_check import kernel_summary

EVAL_SEED_OFFSET = 10_000  # evaluation episodes draw from their own keys, as launch.train's evaluator env
IN_JIT_KERNEL = "aqt_s8s8"  # the JAX runtime's integer kernel (quarl.runtimes.jax_backend)


@dataclasses.dataclass(frozen=True)
class AnakinRun:
    """One `launch.anakin` invocation: S seeds of one agent on one task; `out/seed<k>` is seed k's run folder."""

    agent: str
    task: str
    precision: Precision
    seeds: tuple[int, ...]
    max_actor_steps: int  # env steps per seed (rounded up to whole evaluation intervals, `Plan`)
    out: Path
    overrides: dict[str, object]
    eval_every: int | None = None
    eval_episodes: int = 10
    target_return: float | None = None
    target_streak: int = 1
    actor_update_period: int | None = None  # PPO/A2C: updates; DQN: env steps of one environment
    envs_per_actor: int = 1  # DQN's environments stepped together (PPO/A2C: their config's num_envs)

    def seed_dir(self, seed: int) -> Path:
        return self.out / f"seed{seed}"


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a run's env steps split: periods (one actor weight refresh each) of `period_steps` env steps per seed,
    `chunk_periods` to a chunk (one evaluation interval), `chunks` chunks."""

    period_steps: int
    chunk_periods: int
    chunks: int

    @property
    def total_steps(self) -> int:
        return self.period_steps * self.chunk_periods * self.chunks

    @classmethod
    def make(cls, period_steps: int, max_actor_steps: int, eval_every: int) -> "Plan":
        """As many chunks as evaluations fit the run, each of the whole periods that cover the run between them."""
        periods = math.ceil(max_actor_steps / period_steps)
        chunks = min(periods, max(1, round(max_actor_steps / eval_every)))
        return cls(period_steps, math.ceil(periods / chunks), chunks)


def make_plan(run: AnakinRun) -> tuple[Trainer, Plan, dict]:
    """The trainer (built for the planned length: PPO anneals its learning rate over it), the plan and the agent's
    config. `eval_every` None: a tenth of the run, as launch.train."""
    env = GymnaxEnv(run.task)
    config = agents.make_config(run.agent, **run.overrides)
    trainer = make_trainer(run.agent, env, config, run.precision, total_env_steps=run.max_actor_steps,
                           actor_update_period=run.actor_update_period, envs_per_actor=run.envs_per_actor)
    every = run.eval_every or max(1, run.max_actor_steps // 10)
    plan = Plan.make(trainer.env_steps_per_period, run.max_actor_steps, every)
    if plan.total_steps != run.max_actor_steps:
        trainer = make_trainer(run.agent, env, config, run.precision, total_env_steps=plan.total_steps,
                               actor_update_period=run.actor_update_period, envs_per_actor=run.envs_per_actor)
    return trainer, plan, dataclasses.asdict(config)


def experiment(run: AnakinRun, plan: Plan, seed: int, num_envs: int) -> ExperimentConfig:
    """Seed `seed`'s run as an ExperimentConfig (summary.json's `experiment`), with what it ran: the JAX runtime."""
    return ExperimentConfig.create(
        agent=run.agent, task=run.task, precision=run.precision, seed=seed, max_actor_steps=plan.total_steps,
        logdir=str(run.seed_dir(seed)), overrides=run.overrides, backend="jax",
        eval_every=plan.period_steps * plan.chunk_periods, eval_episodes=run.eval_episodes, envs_per_actor=num_envs,
        target_return=run.target_return, target_streak=run.target_streak)


def run_anakin(run: AnakinRun, *, progress: bool = True, energy: bool = True,
               should_stop: Callable[[], bool] | None = None) -> list[Summary]:
    """Trains every seed of `run` in one vmapped jitted program; writes and returns one summary per seed. Stops after
    the chunk under way when `should_stop()` (status "interrupted": rows, policies and summaries still written), or
    once every seed solved `target_return` (`target_streak` evaluations in a row)."""
    trainer, plan, agent_config = make_plan(run)
    stopping = should_stop or (lambda: False)
    num_envs = int(agent_config.get("num_envs") or run.envs_per_actor)
    configs = [experiment(run, plan, s, num_envs) for s in run.seeds]
    logs = _SeedLogs(run)
    tracker = start_tracking(run.out, "anakin") if energy else None
    keys = jnp.stack([jax.random.PRNGKey(s) for s in run.seeds])

    def chunk(state: Any) -> tuple[Any, dict]:
        return jax.lax.scan(lambda s, _: trainer.period(s), state, None, length=plan.chunk_periods)

    def greedy_eval(state: Any, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        weights = trainer.actor_weights(state)
        return evaluate(trainer.env, lambda obs, _: trainer.actor.greedy(weights, obs), key, run.eval_episodes)

    run_chunk = jax.jit(jax.vmap(chunk), donate_argnums=0)
    count_updates = jax.jit(jax.vmap(trainer.learner_steps))
    finite = jax.jit(jax.vmap(lambda s: jnp.all(jnp.stack([jnp.all(jnp.isfinite(x))
                                                            for x in jax.tree.leaves(trainer.policy_params(s))]))))
    run_eval = jax.jit(jax.vmap(greedy_eval))
    # first_chunk_s: the first chunk with every compile (its program's, the checks' after it); later_chunks_s: the
    # chunks after it, each from its call to its checks' results, what the run's env steps/s is taken over.
    clock: dict[str, Any] = {"evaluation_s": 0.0, "first_chunk_s": None, "later_chunks_s": 0.0}
    steps, status, error = 0, "completed", None
    start = time.perf_counter()
    state = jax.block_until_ready(jax.jit(jax.vmap(trainer.init))(keys))
    clock["init_s"] = time.perf_counter() - start
    bar = StepProgress(plan.total_steps, progress, prog="launch.anakin")
    try:
        for index in range(plan.chunks):
            if stopping():
                status = "interrupted"
                break
            t = time.perf_counter()
            state, metrics = run_chunk(state)
            metrics = jax.device_get(metrics)
            learner_steps = np.asarray(jax.device_get(count_updates(state)))
            sound = np.asarray(finite(state))
            if clock["first_chunk_s"] is None:
                clock["first_chunk_s"] = time.perf_counter() - t  # compiles included
            else:
                clock["later_chunks_s"] += time.perf_counter() - t
            steps += plan.period_steps * plan.chunk_periods
            logs.learner_rows(metrics, steps, learner_steps, time.perf_counter() - start)
            bad = [seed for seed, ok in zip(run.seeds, sound) if not ok]
            if bad:  # a diverged learner: its policy is no policy, and the run says so
                status, error = "failed", f"non-finite policy weights after {steps} env steps (seeds {bad})"
                break
            t = time.perf_counter()
            eval_keys = jnp.stack([jax.random.fold_in(jax.random.PRNGKey(s + EVAL_SEED_OFFSET), index)
                                   for s in run.seeds])
            returns = np.asarray(jax.device_get(run_eval(state, eval_keys)[0]), np.float64)
            logs.eval_rows(returns, steps, learner_steps, t - start, t - start - clock["evaluation_s"])
            clock["evaluation_s"] += time.perf_counter() - t
            bar.set_postfix(eval_return=f"{np.mean(returns):.1f}", refresh=False)
            bar.update(plan.period_steps * plan.chunk_periods, learner_steps=int(learner_steps.max()))
            if run.target_return is not None and all(
                    solved_at(e, run.target_return, run.target_streak) for e in logs.evals):
                break
    finally:
        bar.close()
        logs.close()
        energy_result = stop_tracking(tracker)
    wall = time.perf_counter() - start
    host = jax.device_get((count_updates(state), jax.vmap(trainer.policy_params)(state), finite(state)))
    out = []
    for i, seed in enumerate(run.seeds):
        seed_status, seed_error = status, error
        if status == "failed" and bool(host[2][i]):  # a sound seed stopped because another one diverged
            seed_status, seed_error = "interrupted", f"stopped with the run: {error}"
        out.append(_finish(run, configs[i], trainer, plan, seed, jax.tree.map(lambda x, i=i: np.asarray(x[i]), host[1]),
                           int(host[0][i]), steps, logs.evals[i], logs.episodes[i], wall, clock, energy_result,
                           agent_config, status=seed_status, error=seed_error))
    return out


class _SeedLogs:
    """Each seed's evaluator.csv and learner.csv, and what the summaries need of them."""

    def __init__(self, run: AnakinRun):
        self.seeds = run.seeds
        for seed in run.seeds:
            run.seed_dir(seed).mkdir(parents=True, exist_ok=True)
        self._eval = [CSVLogger(run.seed_dir(s) / "evaluator.csv", EVAL_FIELDS) for s in run.seeds]
        self._learner = [CSVLogger(run.seed_dir(s) / "learner.csv") for s in run.seeds]
        self.evals: list[list[EvalRow]] = [[] for _ in run.seeds]
        self.episodes = [0 for _ in run.seeds]

    def learner_rows(self, metrics: dict, steps: int, learner_steps: np.ndarray, wall: float) -> None:
        """One row per seed per chunk: the chunk's mean of each learner metric, and its training episodes."""
        for i, log in enumerate(self._learner):
            m = {k: np.asarray(v[i]) for k, v in metrics.items()}  # [chunk_periods] per metric
            done = int(m["episodes"].sum())
            self.episodes[i] += done
            row = {"actor_steps": steps, "learner_steps": int(learner_steps[i]), "wall_clock_s": round(wall, 3),
                   "train_episodes": done,
                   "train_episode_return": float(m["episode_return_sum"].sum() / done) if done else math.nan,
                   "train_episode_length": float(m["episode_length_sum"].sum() / done) if done else math.nan}
            row.update({k: float(np.mean(v)) for k, v in sorted(m.items())
                        if k not in ("episodes", "episode_return_sum", "episode_length_sum")})
            log.write(row)

    def eval_rows(self, returns: np.ndarray, steps: int, learner_steps: np.ndarray, wall: float,
                  train_clock: float) -> None:
        for i, log in enumerate(self._eval):
            row = evaluation_row(returns[i], actor_steps=steps, learner_steps=int(learner_steps[i]), wall_clock_s=wall,
                                 train_clock_s=train_clock, weights_version=int(learner_steps[i]))
            log.write(row)
            self.evals[i].append(row)

    def close(self) -> None:
        for log in (*self._eval, *self._learner):
            log.close()


def _energy_share(result: dict | None, seeds: int) -> dict | None:
    """This seed's share of the one process's energy (all seeds trained together: 1/S of every figure)."""
    if result is None:
        return None
    share = dict(result)
    for key in ("duration_s", "energy_kwh", "cpu_kwh", "gpu_kwh", "ram_kwh", "emissions_kg_co2eq", "measured_kwh",
                "modelled_kwh", "package_kwh"):
        if isinstance(share.get(key), (int, float)):
            share[key] = float(share[key]) / seeds
    share["method"] = f"{share.get('method')}; 1/{seeds} of one process that trained {seeds} seeds together"
    return share


def _rate(run: AnakinRun, plan: Plan, steps: int, clock: dict) -> float | None:
    """Env steps per second over all seeds in the chunks after the first (which holds the compiles), over those
    chunks' own time: evaluations, CSV rows and the run's start and end left out. None with one chunk."""
    chunk_steps = plan.period_steps * plan.chunk_periods
    if steps <= chunk_steps or clock["first_chunk_s"] is None or clock["later_chunks_s"] <= 0:
        return None
    return round(len(run.seeds) * (steps - chunk_steps) / clock["later_chunks_s"], 1)


def _finish(run: AnakinRun, config: ExperimentConfig, trainer: Trainer, plan: Plan, seed: int, params: dict,
            learner_steps: int, steps: int, evals: Sequence[EvalRow], episodes: int, wall: float, clock: dict,
            energy_result: dict | None, agent_config: dict, *, status: str, error: str | None) -> Summary:
    """Seed `seed`'s final policy and summary.json, in launch.train's layout (`runner` "anakin"). A seed whose
    weights are not finite (`error`) gets no policy file: save_policy refuses NaN and inf, and so does every reader."""
    logdir = run.seed_dir(seed)
    spec = trainer.policy_spec
    final = evals[-1]["return"] if evals else None
    policy_name, fp32_bytes = None, None
    if status != "failed":
        policy_name = save_policy(logdir, spec, params, task=run.task, agent=run.agent, steps=learner_steps,
                                  extra={"seed": seed, "precision": run.precision.name, "final_eval_return": final,
                                         "runner": "anakin"}).name
        fp32_bytes = fp32_payload_nbytes(params, version=learner_steps, spec_hash=spec.digest())
    versions = steps // plan.period_steps
    train_s = wall - clock["evaluation_s"]
    form = IN_JIT_KERNEL if run.precision.is_int else None
    actor = {"actor_id": 0, "attempt": 1, "starts": 1, "actor_steps": steps, "total_steps": steps,
             "episodes": episodes, "envs_per_actor": config.envs_per_actor, "elapsed_s": wall,
             "steps_per_s": steps / max(train_s, 1e-9), "backend": "jax",
             "kernel": kernel_summary(types.SimpleNamespace(kernel_form=form)), "weights_version": learner_steps,
             "first_weights_version": 0, "transitions_inserted": None, "payloads_rejected": 0,
             "last_payload_rejection": None, "build_s": None, "times": None, "energy": None}
    publish = {"versions": versions, "quantize_encode_s": None, "put_s": None, "payload_bytes": None}
    learner = {"learner_steps": learner_steps, "steps_this_run": learner_steps, "training_s": train_s,
               "steps_per_s": learner_steps / max(train_s, 1e-9), "weights_version": learner_steps,
               "policy_file": policy_name, "publish": publish, "loop_form": None,
               "anakin": {"seeds": list(run.seeds), "env_steps_per_s_all_seeds": _rate(run, plan, steps, clock),
                          "first_chunk_s": clock["first_chunk_s"], "init_s": clock["init_s"],
                          "later_chunks_s": clock["later_chunks_s"], "chunks": len(evals),
                          "actor_update_period_env_steps": plan.period_steps,
                          "note": "actors, environments and learner in one jitted program (agents.anakin); the "
                                  "actors' weights are quantized inside it, never encoded as a payload"}}
    payload = {"precision": run.precision.name, "bytes": None, "fp32_bytes": fp32_bytes, "compression": None,
               "versions": versions, "quantize_encode_s": None, "put_s": None, "published": versions}
    summary = build_summary(
        config, runner="anakin", status=status, error=error, wall_clock_s=wall, run_wall_clock_s=wall,
        counts={"actor_steps": steps, "learner_steps": learner_steps, "episodes": episodes}, evals=list(evals),
        final_eval_return=final, actors=[actor], learner=learner, runtime={"updates": versions, "versions": versions},
        payload=payload, replay=trainer.replay, energy=sum_energy({"run": _energy_share(energy_result, len(run.seeds))}),
        agent_config=jsonable(agent_config), train_clock_s=round(train_s, 3), evaluation_s=clock["evaluation_s"],
        sync_learner=True, actor_update_period=plan.period_steps, policy_file=policy_name,
        final_policy=final_policy_record(learner_steps, learner_steps, solved=None))
    summary["learner_device"] = device_report()
    write_json_atomic(logdir / "summary.json", summary)
    return summary
