"""Single-process on-policy training (PPO, A2C): rollouts of a quantized actor over K lock-stepped environments,
then one learner update on the whole rollout, then fresh weights to the actor; no replay.

`run_single_process` picks this runner for an on-policy agent (`builder.on_policy`) and
`launch.experiments.run_experiment.run_experiment` for the others; `launch.train` runs through it, so `--agent ppo|a2c` takes the
same flags as any other agent and the run folder is the same: summary.json (`launch.experiments.summary.build_summary`'s
layout), evaluator.csv, learner.csv (one row per update), actor.csv (one row per finished episode) and the final
and best fp32 policies for `launch.ptq`.
As in the replay runner, the actor only ever sees weights that went through quantize -> payload bytes -> decode
(`launch.experiments.run_experiment.WeightChannel`), so a PPO run at `--precision int8` collects its data with the int8 policy
and is evaluated with it. Every count is in env steps; one rollout advances them by K * num_steps, so
evaluations happen at the first rollout boundary past each multiple of `eval_every`.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from analysis.schema import solved_at
from launch.experiments.acting import EPISODE_FIELDS, EVAL_FIELDS, crossed, evaluation_returns, evaluation_row
from launch.experiments.config import ExperimentConfig
from launch.experiments.run_experiment import EVAL_SEED_OFFSET, WeightChannel, _progress, finish_run, save_best_policy
from launch.experiments.stages import StageTimes
from launch.program.devices import use_learner_device
from quarl.envs.factory import make_environment
from quarl.envs.spec import environment_spec
from quarl.envs.vector import make_vector_environment
from quarl.ops.carbon import start_tracking, stop_tracking
from quarl.ops.logs import CSVLogger


class RolloutCollector:
    """Steps K environments with an actor's sampled actions and returns [T, K, ...] rollout columns.

    A LAST step keeps its own observation as `next_observation` (a time limit bootstraps from it) and the
    environment is restarted at once; `discount` is the environment's (0 at a termination, 1 otherwise)."""

    def __init__(self, env: Any, times: StageTimes):
        self.env, self.times = env, times
        t0 = time.perf_counter()
        self._timesteps = env.reset()
        times.env_step_s += time.perf_counter() - t0
        self._returns = np.zeros(env.num_envs)
        self._lengths = np.zeros(env.num_envs, np.int64)

    def collect(self, actor: Any, num_steps: int) -> tuple[dict[str, np.ndarray], list[tuple[float, int]]]:
        """`num_steps` steps of every environment; returns the columns and the (return, length) of each episode
        that ended."""
        cols: dict[str, list] = {k: [] for k in ("observation", "action", "behaviour_logp", "reward", "discount",
                                                 "last", "next_observation")}
        episodes: list[tuple[float, int]] = []
        for _ in range(num_steps):
            obs = np.stack([np.asarray(ts.observation) for ts in self._timesteps])
            t0 = time.perf_counter()
            actions, logp = actor.sample(obs)
            t1 = time.perf_counter()
            steps = self.env.step(actions)
            t2 = time.perf_counter()
            reward = np.array([float(ts.reward) for ts in steps], np.float32)
            last = np.array([ts.last() for ts in steps])
            for name, value in (("observation", obs), ("action", actions), ("behaviour_logp", logp),
                                ("reward", reward), ("last", last.astype(np.float32)),
                                ("discount", np.array([float(ts.discount) for ts in steps], np.float32)),
                                ("next_observation", np.stack([np.asarray(ts.observation) for ts in steps]))):
                cols[name].append(value)
            self._returns += reward
            self._lengths += 1
            t3 = time.perf_counter()
            for i in np.flatnonzero(last):
                episodes.append((float(self._returns[i]), int(self._lengths[i])))
                self._returns[i], self._lengths[i] = 0.0, 0
                steps[i] = self.env.reset_one(int(i))
            self._timesteps = steps
            self.times.policy_s += t1 - t0
            self.times.env_step_s += (t2 - t1) + (time.perf_counter() - t3)
            self.times.env_steps += len(steps)
        return {k: np.stack(v) for k, v in cols.items()}, episodes


def run_single_process(config: ExperimentConfig, **kwargs: Any) -> dict[str, Any]:
    """`config` in one process, whatever its agent: `run_on_policy` for on-policy agents (PPO, A2C), else
    `launch.experiments.run_experiment.run_experiment` (replay); `kwargs` are the keyword arguments both take."""
    if config.builder().on_policy:
        return run_on_policy(config, **kwargs)
    from launch.experiments.run_experiment import run_experiment  # pylint: disable=import-outside-toplevel

    return run_experiment(config, **kwargs)


def run_on_policy(config: ExperimentConfig, *, progress: bool = True, energy: bool = True,
                  on_eval: Callable[[dict[str, Any]], bool | None] | None = None,
                  on_builder: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Trains `config`'s on-policy agent for `config.max_actor_steps` env steps (rounded up to whole rollouts);
    returns (and writes) the summary. The keyword arguments mean what they mean for `run_experiment`."""
    use_learner_device(config.learner_device)
    builder = config.builder()
    if on_builder is not None:
        on_builder(builder)
    task, prec, seed = config.task, config.precision, config.seed
    agent_config = builder.config
    num_envs = builder.num_envs(config.envs_per_actor)
    per_rollout = num_envs * agent_config.num_steps
    total_updates = max(1, math.ceil(config.max_actor_steps / per_rollout))

    env = make_vector_environment(task, seed, num_envs)
    eval_env = make_environment(task, seed + EVAL_SEED_OFFSET)
    env_spec = environment_spec(env)
    spec = builder.policy_spec(env_spec)
    learner = builder.make_learner(env_spec, seed, total_updates=total_updates)
    logdir = Path(config.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    times = StageTimes()
    clock = {"sample_s": 0.0, "learner_s": 0.0, "evaluation_s": 0.0}
    channel = WeightChannel(learner, spec, prec, times)
    qparams = channel.pull(count=False)
    pinned = config.executor_factory()
    t0 = time.perf_counter()
    actor = builder.make_actor(env_spec, qparams, seed=seed, backend=config.backend, batch_size=num_envs,
                               executor_factory=pinned)
    actor_build_s = time.perf_counter() - t0
    eval_actor = builder.make_actor(env_spec, qparams, seed=seed + 1, evaluation=True, backend=config.backend,
                                    executor_factory=pinned)
    fp32_channel = WeightChannel(learner, spec, "fp32", StageTimes())
    fp32_actor = None
    if config.eval_fp32 and prec != "fp32":
        fp32_actor = builder.make_actor(env_spec, fp32_channel.pull(), seed=seed + 2, evaluation=True,
                                        backend=config.backend, executor_factory=pinned)
    logs = {"evaluator": CSVLogger(logdir / "evaluator.csv", EVAL_FIELDS), "learner": CSVLogger(logdir / "learner.csv"),
            "actor": CSVLogger(logdir / "actor.csv", EPISODE_FIELDS)}
    tracker = start_tracking(logdir, "run") if energy else None
    evals: list[dict[str, Any]] = []
    best: dict[str, Any] = {"file": None, "return": -math.inf}
    start = time.perf_counter()

    def evaluation(actor_steps: int) -> bool:
        t = time.perf_counter()
        eval_actor.update(channel.pull(count=False))
        returns = evaluation_returns(eval_actor, eval_env, config.eval_episodes)
        fp32_return = None
        if fp32_actor is not None:
            fp32_actor.update(fp32_channel.pull())
            fp32_return = float(np.mean(evaluation_returns(fp32_actor, eval_env, config.eval_episodes)))
        # Clocks at the start of this evaluation; train_clock_s leaves out all evaluation time.
        row = evaluation_row(returns, actor_steps=actor_steps, learner_steps=learner.steps,
                             wall_clock_s=t - start, train_clock_s=t - start - clock["evaluation_s"],
                             weights_version=channel.version, return_fp32=fp32_return)
        logs["evaluator"].write(row)
        evals.append(row)
        if row["return"] > best["return"]:
            best.update(file=save_best_policy(config, spec, learner, row), **{"return": row["return"]})
        clock["evaluation_s"] += time.perf_counter() - t
        stop = bool(on_eval(row)) if on_eval is not None else False
        return stop or solved_at(evals, config.target_return, config.target_streak) is not None

    collector = RolloutCollector(env, times)
    episodes, step = 0, 0
    try:
        with _progress(per_rollout * total_updates, progress) as bar:
            while step < config.max_actor_steps:
                rollout, ended = collector.collect(actor, agent_config.num_steps)
                prev, step = step, step + per_rollout
                for episode_return, length in ended:
                    episodes += 1
                    logs["actor"].write({"actor_steps": step, "wall_clock_s": round(time.perf_counter() - start, 3),
                                         "episode": episodes, "return": episode_return, "length": length,
                                         "steps_per_s": None, "exploration": round(actor.sigma, 5),
                                         "weights_version": channel.version, "total_actor_steps": step})
                t = time.perf_counter()
                metrics = learner.step(rollout)
                clock["learner_s"] += time.perf_counter() - t
                logs["learner"].write({"learner_steps": learner.steps, "actor_steps": step,
                                       "wall_clock_s": round(time.perf_counter() - start, 3),
                                       **{k: float(v) for k, v in metrics.items()}})
                qp = channel.pull()
                t = time.perf_counter()
                actor.update(qp)
                for a in (actor, eval_actor, fp32_actor):
                    if a is not None and not a.discrete:
                        a.set_log_std(learner.log_std())
                times.load_s += time.perf_counter() - t
                times.updates += 1
                times.pulls += 1
                stop = False
                if crossed(prev, step, int(config.eval_every)) or step >= config.max_actor_steps:
                    stop = evaluation(step)
                    bar.set_postfix(eval_return=f"{evals[-1]['return']:.1f}", learner_steps=learner.steps,
                                    refresh=False)
                bar.update(step - bar.n)
                if stop:
                    break
    finally:
        for log in logs.values():
            log.close()
        energy_result = stop_tracking(tracker)
        env.close()
        eval_env.close()

    return finish_run(config, spec, learner, channel, evals, time.perf_counter() - start, times, clock,
                      actor=actor, actor_build_s=actor_build_s, episodes=episodes, table_info={},
                      energy_result=energy_result, best_policy_file=best["file"], sync_learner=False,
                      update_period=per_rollout, agent_config=agent_config)
