"""DQN on one ALE game (Pong or Breakout) with int8 actors: env steps and wall-clock time to a return a random policy
cannot reach.

    python -m bench.learning.ale_dqn [--game Pong] [--steps 1000000] [--eval-every 25000] [--seed 0] [--target -15]
                            [--max-minutes M] [--learner-device cpu|gpu] [--tiny] [--out DIR] [--allow-busy]

The Nature torso (convs 32-8-4 / 64-4-2 / 64-3-1, fc 512) on the standard preprocessing (`quarl.envs.ale`: v5
sticky actions, frame skip 4 with max-pool, 84x84 grey, stack 4; rewards clipped for training only, so evaluations
report the game score). Settings: the agent's ALE preset (`agents.dqn.config.ATARI_OVERRIDES`, what
`launch.train --task ALE/<Game>` starts from; its comment says why each value), the usual DQN-on-Atari recipe
scaled to one CPU machine, where the Nature update and not acting sets the time.
Steps are agent steps (4 emulator frames each).

A random policy scores about -20.7 on Pong and 1.7 on Breakout (Mnih et al., 2015, Extended Data Table 2); the
default targets (-15 and 10) are beyond it. The run stops at its first greedy evaluation (10 episodes, int8 actors)
reaching the target, or at --steps, or at the first evaluation past --max-minutes of training. Writes
DIR/ale_dqn_<game>_s<seed>.json and .md (one file pair per game and seed) with the machine, seed, the time and env
steps to target and every evaluation (default DIR results/bench; --tiny: a seconds-long smoke run of the whole
path, to runs/bench/ale-dqn-tiny). The time depends on the machine and its load: run it alone.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from bench.harness.learning_runs import run_one
from bench.harness.machine import add_allow_busy, bench_machine, describe_cpu, describe_load, finish, refuse_if_busy
from bench.harness.results_io import command_line, write_results
from agents.dqn.config import ATARI_OVERRIDES
from bench.harness.rows import LearningRow

REPO = Path(__file__).resolve().parents[2]
TARGETS = {"Pong": -15.0, "Breakout": 10.0}
RANDOM_RETURN = {"Pong": -20.7, "Breakout": 1.7}  # Mnih et al. (2015), Extended Data Table 2
TINY_SETTINGS: dict[str, Any] = {**ATARI_OVERRIDES, "batch_size": 8, "samples_per_insert": 1.0,
                                 "max_replay_size": 1_000, "min_replay_size": 100, "epsilon_decay_steps": 200,
                                 "target_update_period": 20}


def report(result: dict[str, Any]) -> str:
    m = result["machine"]
    reached = result["steps_to_target"] is not None
    lines = [f"# DQN on ALE/{result['game']}, int8 actors", "",
             f"Command: `{result['command']}`", "",
             f"Machine: {describe_cpu(m, flags=True)}; "
             f"learner device {result['learner_device']}; "
             f"{describe_load(m)}.", "",
             f"Seed {result['seed']}; target {result['target']} (a random policy: {RANDOM_RETURN[result['game']]}).",
             "", "| reached | env steps to target | train s to target | env steps run | train s | best | last |",
             "|---|---:|---:|---:|---:|---:|---:|",
             f"| {'yes' if reached else 'no'} | {result['steps_to_target'] or '-'} | "
             f"{'-' if not reached else round(result['train_s_to_target'])} | {result['actor_steps']:,} | "
             f"{result['train_s']:.0f} | {result['best_return']:.1f} | {result['final_return']:.1f} |", "",
             "Evaluations (env steps: return, train s): " + ", ".join(
                 f"{c['actor_steps']:,}: {c['return']:.1f} ({c['train_clock_s']:.0f} s)" for c in result["curve"])]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.learning.ale_dqn", description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", choices=sorted(TARGETS), default="Pong")
    parser.add_argument("--steps", type=int, default=1_000_000, help="agent steps at most (4 frames each)")
    parser.add_argument("--eval-every", type=int, default=25_000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=None, help="default: -15 (Pong) or 10 (Breakout)")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="end at the first evaluation past this many minutes of training (default: no limit)")
    parser.add_argument("--learner-device", default="auto", help="where the learner runs (auto: a GPU if any)")
    parser.add_argument("--tiny", action="store_true", help="a smoke run of the whole path (seconds), not a figure")
    parser.add_argument("--out", default=None)
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.eval_every < 1 or args.eval_episodes < 1 or args.seed < 0 or (
            args.max_minutes is not None and not args.max_minutes > 0):
        parser.exit(2, f"{parser.prog}: error: --steps, --eval-every, --eval-episodes, --max-minutes must be "
                       "positive, --seed >= 0\n")
    if not args.tiny:
        refuse_if_busy(parser, args.allow_busy)
    machine = bench_machine(args.allow_busy or args.tiny)
    target = TARGETS[args.game] if args.target is None else args.target
    settings = TINY_SETTINGS if args.tiny else ATARI_OVERRIDES
    row = LearningRow("dqn", f"ALE/{args.game}", target, args.steps, args.eval_every, args.eval_episodes, settings)
    runs = REPO / "runs" / "bench" / "ale_dqn" / time.strftime("%Y%m%d-%H%M%S")
    try:
        result, curve = run_one(row, "int8", args.seed, logdir=runs / f"{args.game}_s{args.seed}",
                                learner_device=args.learner_device,
                                max_train_s=None if args.max_minutes is None else args.max_minutes * 60)
    except ValueError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    out = Path(args.out or (REPO / "runs" / "bench" / "ale-dqn-tiny" if args.tiny else REPO / "results" / "bench"))
    record = {"game": args.game, "seed": args.seed, "target": target, "learner_device": result["learner_device"],
              "max_minutes": args.max_minutes,
              "settings": settings, "command": command_line("bench.learning.ale_dqn", argv),
              **{k: result[k] for k in ("steps_to_target", "train_s_to_target", "actor_steps", "learner_steps",
                                        "train_s", "best_return", "final_return")},
              "curve": curve, "machine": finish(machine)}
    write_results(out, f"ale_dqn_{args.game}_s{args.seed}", record, report(record))
    print(report(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
