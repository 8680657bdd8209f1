"""The single-process entry point every caller uses whatever the agent (`launch.train`, `launch.reproduce`'s
single-process runs, the learning tests): `run_single_process`.

On-policy agents (PPO, A2C) no longer have a runner of their own: `launch.experiments.run_experiment` runs them
through the same acting loop as the replay agents (`launch.experiments.acting.ActingLoop`), with their builder's
sink (`quarl.acting.loop.RolloutSink`: rollouts of `num_steps` steps of the K environments with the behaviour
log-probs of the quantized actor) and their learning side (`launch.experiments.feeds.RolloutFeed`: one learner
update per rollout, then fresh weights to the actor). The run folder is every agent's: summary.json,
evaluator.csv, learner.csv (one row per update), actor.csv (one row per finished episode) and the final and best
fp32 policies for `launch.ptq`. Every count is in env steps; one rollout advances them by K * num_steps, a run
takes whole rollouts, and evaluations happen at the first rollout boundary past each multiple of `eval_every`.
"""
from __future__ import annotations

from typing import Unpack

from launch.experiments.config import ExperimentConfig
from launch.experiments.run_experiment import RunOptions, run_experiment
from launch.experiments.summary import Summary


def run_single_process(config: ExperimentConfig, **kwargs: Unpack[RunOptions]) -> Summary:
    """`config` in one process, whatever its agent (`launch.experiments.run_experiment.run_experiment`, whose
    keyword arguments `kwargs` are)."""
    return run_experiment(config, **kwargs)
