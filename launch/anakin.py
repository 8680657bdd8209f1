r"""The jitted (Anakin) trainer: actors, environments (gymnax ports) and the fp32 learner in one XLA program, vmapped
over seeds, the actors acting with the quantized policy inside the jit (docs/anakin.md).

    python -m launch.anakin --agent ppo --task CartPole-v1 --seeds 0-9 --precision int8 --steps 100000 \
        --out runs/anakin/ppo [--eval-every K --eval-episodes E --actor-update-period P --target-return R
        --target-streak S --qat-bits B --set key=value --no-progress]

Agents ppo, a2c, dqn; tasks CartPole-v1, Acrobot-v1, MountainCar-v0 and MinAtar/{Breakout, SpaceInvaders, Asterix,
Freeway}; precisions fp32 and int2..int8 (the in-jit JAX runtime: AQT's s8 x s8 dot, per-row int8 activations). Each
seed k is written to OUT/seed<k> as an ordinary run folder (summary.json, evaluator.csv, learner.csv,
policy_fp32.qrlp) that `launch.ptq --checkpoint OUT/seed<k>` and analysis read. --steps is per seed, rounded up to
whole evaluation intervals (default: a tenth of the run). --actor-update-period: PPO/A2C updates (default 1, the
weights of the update before), DQN env steps (default the config's). The agent's settings start from its task presets
(`agents.task_defaults`), then --set. Bad flags print one line and exit 2 before anything is written. SIGINT (Ctrl-C)
or SIGTERM stop after the chunk under way (at most one evaluation interval): rows, policies and summaries (status
"interrupted") are written, exit code 130 or 143.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import agents
from agents.anakin import ANAKIN_AGENTS
from launch.cli import (
    ListTasksAction, OneLineArgumentParser, UsageError, add_qat_argument, check_actor_precision, check_carbon_country,
    check_logdir, check_positive, fail, qat_overrides,
)
from launch.experiments.stopping import StopSignals, exit_code
from launch.overrides import parse_overrides

if TYPE_CHECKING:  # JAX loads once the flags are checked
    from launch.experiments.anakin_run import AnakinRun

PROG = "launch.anakin"
DEFAULT_STEPS = {"ppo": 100_000, "a2c": 100_000, "dqn": 25_000}
MAX_SEEDS = 1024


def build_parser() -> OneLineArgumentParser:
    parser = OneLineArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument("--agent", default="ppo", help="ppo, a2c or dqn")
    parser.add_argument("--task", default="CartPole-v1", help="a task with a gymnax port (--list-tasks)")
    parser.add_argument("--list-tasks", action=_ListAnakinTasks)
    parser.add_argument("--seeds", default="0", help="seeds trained together (vmapped): 0-9, 0,3,5 or 7")
    parser.add_argument("--precision", default="int8", help="actor precision: fp32 or int2..int8 (shorthands 32, 8..2)")
    parser.add_argument("--steps", type=int, default=None, help="env steps per seed (default: "
                        + ", ".join(f"{n} for {a}" for a, n in DEFAULT_STEPS.items()) + ")")
    parser.add_argument("--out", default=None, help="new or empty folder; seed k goes to OUT/seed<k> (default: "
                                                    "runs/anakin/<agent>-<task>-<precision>-<time>)")
    parser.add_argument("--eval-every", type=int, default=None, help="env steps per seed between evaluations "
                                                                     "(default: a tenth of the run)")
    parser.add_argument("--eval-episodes", type=int, default=10, help="greedy episodes per evaluation")
    parser.add_argument("--target-return", type=float, default=None,
                        help="stop once every seed has --target-streak evaluations in a row at or above this")
    parser.add_argument("--target-streak", type=int, default=1, help="evaluations in a row for --target-return")
    parser.add_argument("--actor-update-period", type=int, default=None,
                        help="between actor weight refreshes: PPO/A2C updates (default 1), DQN env steps (default: "
                             "the config's actor_update_period)")
    parser.add_argument("--envs-per-actor", type=int, default=1, metavar="K",
                        help="environments stepped together: DQN's K (one batched policy call each step); PPO/A2C "
                             "replace their num_envs with K when K > 1")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="agent config override, repeatable (e.g. --set num_envs=16)")
    add_qat_argument(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    return parser


class _ListAnakinTasks(ListTasksAction):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from quarl.envs.gymnax_env import GYMNAX_TASKS  # pylint: disable=import-outside-toplevel
        print("\n".join(GYMNAX_TASKS))
        parser.exit(0)


def parse_seeds(text: str) -> tuple[int, ...]:
    """'0-9' -> 0..9, '0,3,5' -> (0, 3, 5): distinct non-negative ints, in the order given."""
    seeds: list[int] = []
    for item in (t.strip() for t in str(text).split(",")):
        low, dash, high = item.partition("-")
        try:
            values = range(int(low), int(high) + 1) if dash else [int(low)]
        except ValueError:
            raise UsageError(f"--seeds wants ranges and numbers like 0-9 or 0,3,5, got {text!r}") from None
        if not values or min(values) < 0:
            raise UsageError(f"--seeds {item!r}: seeds are non-negative and a range runs low-high")
        seeds.extend(values)
    if len(set(seeds)) != len(seeds) or len(seeds) > MAX_SEEDS:
        raise UsageError(f"--seeds must name distinct seeds, at most {MAX_SEEDS}, got {text!r}")
    return tuple(seeds)


def validate(args: argparse.Namespace) -> "AnakinRun":
    """The run from the flags; every check (UsageError) before anything is written."""
    from launch.experiments.anakin_run import AnakinRun  # pylint: disable=import-outside-toplevel
    from quarl.envs.gymnax_env import check_gymnax_task  # pylint: disable=import-outside-toplevel

    check_carbon_country()
    if args.agent not in ANAKIN_AGENTS:
        raise UsageError(f"--agent {args.agent!r}: the jitted trainer runs {', '.join(ANAKIN_AGENTS)}")
    try:
        task = check_gymnax_task(args.task)
    except ValueError as e:
        raise UsageError(f"--task: {e}") from None
    precision = check_actor_precision(args.precision)
    if not (precision.name == "fp32" or precision.has_int_kernel):
        raise UsageError(f"--precision {precision.name}: the in-jit actors run fp32 or int2..int8")
    seeds = parse_seeds(args.seeds)
    steps = check_positive("--steps", DEFAULT_STEPS[args.agent] if args.steps is None else args.steps)
    period = check_positive("--actor-update-period", args.actor_update_period, optional=True)
    overrides = {**agents.task_defaults(args.agent, task), **parse_overrides(args.agent, args.overrides)}
    overrides.update(qat_overrides(args.qat_bits, precision))
    if args.agent == "dqn" and period is not None:
        overrides["actor_update_period"] = period
    envs = check_positive("--envs-per-actor", args.envs_per_actor)
    if args.agent != "dqn" and envs > 1:
        overrides["num_envs"] = envs
    try:
        config = agents.make_config(args.agent, **overrides)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.agent == "dqn" and (config.prioritized_replay or config.eval_epsilon != 0.0):
        raise UsageError("the jitted DQN trainer replays uniformly and evaluates greedily: prioritized_replay=false, "
                         "eval_epsilon=0")
    out = Path(args.out or _default_out(args.agent, task, precision.name))
    for seed in seeds:
        check_logdir(str(out / f"seed{seed}"))
    return AnakinRun(agent=args.agent, task=task, precision=precision, seeds=seeds, max_actor_steps=steps, out=out,
                     overrides=overrides, eval_every=check_positive("--eval-every", args.eval_every, optional=True),
                     eval_episodes=check_positive("--eval-episodes", args.eval_episodes),
                     target_return=args.target_return,
                     target_streak=check_positive("--target-streak", args.target_streak),
                     actor_update_period=None if args.agent == "dqn" else period,
                     envs_per_actor=envs if args.agent == "dqn" else 1)


def _default_out(agent: str, task: str, precision: str) -> str:
    return str(Path("runs", "anakin", f"{agent}-{task.replace('/', '-')}-{precision}-{time.strftime('%Y%m%d-%H%M%S')}"))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run = validate(args)
    except UsageError as e:
        fail(f"{PROG}: error: {e}")
    from launch.experiments.anakin_run import run_anakin  # pylint: disable=import-outside-toplevel
    with StopSignals() as signals:
        summaries = run_anakin(run, progress=not args.no_progress, should_stop=signals.requested)
    for s in summaries:
        final = s["final_eval_return"]
        print(f"seed {s['seed']}: final return {'-' if final is None else f'{final:.1f}'}, "
              f"best {s['best_eval_return']}, {s['actor_steps']} env steps, {s['status']} -> {s['logdir']}")
    facts = summaries[0]["learner"]["anakin"]
    rate = facts["env_steps_per_s_all_seeds"]
    print(f"{len(summaries)} seeds, {summaries[0]['executed']}: first chunk (compile included) "
          f"{facts['first_chunk_s']:.1f} s" + ("" if rate is None else f", then {rate:,.0f} env steps/s over all seeds "
                                              "(the later chunks' own time, evaluations excluded)"))
    statuses = {s["status"] for s in summaries}
    for s in summaries:
        if s["error"]:
            print(f"seed {s['seed']}: {s['error']}", file=sys.stderr)
    return exit_code("failed" if "failed" in statuses else summaries[0]["status"], signals.signum)


if __name__ == "__main__":
    sys.exit(main())
