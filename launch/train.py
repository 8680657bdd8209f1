r"""Single-process training: the learner, one actor and the evaluator in one process, through the same quantized
weight path as the distributed runner (launch.actorq). For debugging and tests; it writes the same files.

    python -m launch.train --agent dqn --task CartPole-v1 --precision int8 --steps 20000 --seed 0 \
        --logdir runs/dqn [--eval-every K --eval-episodes E --actor-update-period P --envs-per-actor K
        --target-return R --target-streak S --backend onnx --kernel-form FORM --set PATH=VALUE]
    python -m launch.train --config runs/dqn/summary.json --logdir runs/dqn_again [--seed 1]

Every flag has a default, as launch.actorq's: --agent d4pg on cartpole:balance, each agent's step budget, seed
0, runs/train/<agent>-<task>-<precision>-<time> (the agent config is the agent's own defaults; launch.actorq
starts from a quick preset instead). --config reruns a recorded run (a summary.json's `experiment`) or an
ExperimentConfig file. On a terminal it shows a progress bar, in a log one line every 10 s; it ends with the same
table as launch.actorq and the run folder. Bad flags print one line on stderr and exit 2 before anything is
written. SIGINT (Ctrl-C) or SIGTERM stops the run as launch.actorq's: logs flushed, the final policy and
summary.json (status "interrupted") written, exit code 130 or 143.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Sequence

import agents
from launch.cli import (
    DEFAULT_AGENT, DEFAULT_STEPS, DEFAULT_TASKS, OneLineArgumentParser, UsageError, add_common_arguments,
    check_actor_precision, check_agent, check_agent_task, check_carbon_country, check_logdir, check_positive,
    check_task, fail, flag_names, qat_overrides, warn,
)
from launch.config_file import config_with_overrides, default_logdir, reject_with_config
from launch.overrides import parse_settings, settings_help
from launch.experiments.budget import budget_warnings
from launch.experiments.config import ExperimentConfig
from launch.experiments.stopping import StopSignals, exit_code
from launch.experiments.summary_table import print_summary
from launch.program.devices import LEARNER_DEVICES

PROG = "launch.train"
TRAIN_FLAGS = flag_names(max_actor_steps="--steps")
SET_SECTIONS = ("agent", "experiment")  # one process: no distributed settings to --set


def build_parser() -> OneLineArgumentParser:
    parser = OneLineArgumentParser(prog=PROG, description=__doc__, epilog=lambda: settings_help(SET_SECTIONS))
    add_common_arguments(parser)
    parser.add_argument("--eval-fp32", action="store_true",
                        help="also evaluate an fp32 actor next to the deployed-precision one")
    parser.add_argument("--learner-device", default="auto", choices=LEARNER_DEVICES,
                        help="where JAX runs in this one process: auto (JAX's choice), cpu, or gpu (error without one)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    return parser


def validate(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> ExperimentConfig:
    """The experiment from the flags or --config; every check (raising UsageError) before anything is written."""
    parser = parser or build_parser()
    check_carbon_country()
    if args.config is not None:
        reject_with_config(args, parser, ("no_progress",))
        config = config_with_overrides(args.config, args.logdir, args.seed)
    else:
        config = _config_from_flags(args, parser)
    check_logdir(config.logdir)
    check_agent_task(config)
    return config


def _config_from_flags(args: argparse.Namespace,
                       parser: argparse.ArgumentParser | None = None) -> ExperimentConfig:
    agent = check_agent(args.agent or DEFAULT_AGENT)
    task = check_task(args.task or DEFAULT_TASKS[agent])
    settings = parse_settings(agent, args.overrides, SET_SECTIONS)
    settings.check_once(args, parser or build_parser(), TRAIN_FLAGS)
    # The user's --set values and flags, over the agent's tuned settings for this task (`task_preset`).
    overrides = dict(settings.agent)
    period = check_positive("--actor-update-period", args.actor_update_period, optional=True)
    if period is not None:
        if "actor_update_period" not in {f.name for f in dataclasses.fields(agents.config_class(agent))}:
            raise UsageError(f"--actor-update-period does not apply to --agent {agent}: an on-policy actor gets new "
                             "weights after every update")
        overrides["actor_update_period"] = period
    given = settings.experiment  # over the flags' defaults (`Settings.check_once`: not over a flag given)
    # Parsed once: the config carries the Precision.
    precision = check_actor_precision(str(given.get("precision", args.precision)))
    overrides.update(qat_overrides(args.qat_bits, precision))
    return settings.config(TRAIN_FLAGS, agent=agent, task=task, precision=precision, backend=args.backend,
                        task_preset=agents.task_defaults(agent, task), kernel_form=args.kernel_form,
                        max_actor_steps=DEFAULT_STEPS[agent] if args.steps is None else args.steps,
                        seed=0 if args.seed is None else args.seed,
                        logdir=given.get("logdir") or args.logdir or default_logdir("train", agent, task, precision),
                        target_return=args.target_return, target_streak=args.target_streak,
                        eval_every=args.eval_every, eval_episodes=args.eval_episodes,
                        envs_per_actor=args.envs_per_actor, overrides=overrides, eval_fp32=bool(args.eval_fp32),
                        learner_device=args.learner_device, learner_loop=args.learner_loop)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = validate(args, parser)
    except UsageError as e:
        fail(f"{PROG}: error: {e}")
    from launch.experiments.run_experiment import run_experiment  # pylint: disable=import-outside-toplevel
    warn(PROG, budget_warnings(config, "--steps", distributed=False))
    with StopSignals() as signals:  # SIGINT/SIGTERM: stop, then write the logs, the policy and summary.json
        summary = run_experiment(config, progress=not args.no_progress, should_stop=signals.requested)
    print_summary(summary)
    return exit_code(summary["status"], signals.signum)


if __name__ == "__main__":
    sys.exit(main())
