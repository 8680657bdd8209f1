"""Single-process training CLI:

    python -m launch.train --agent dqn --task CartPole-v1 --precision int8 --steps 50000 --seed 0 \
        --logdir runs/dqn_cartpole [--eval-every K --eval-episodes E --actor-update-period P --envs-per-actor K
        --set key=value]

Bad flags print one line on stderr and exit 2 before anything is written.
"""
from __future__ import annotations

import json
import sys
from typing import Sequence

from launch.devices import LEARNER_DEVICES
from launch.cli import OneLineArgumentParser, UsageError, add_common_arguments, fail, validate_common


def build_parser() -> OneLineArgumentParser:
    parser = OneLineArgumentParser(prog="launch.train", description=__doc__.split("\n\n")[0])
    add_common_arguments(parser)
    parser.add_argument("--eval-fp32", action="store_true",
                        help="also evaluate an fp32 actor next to the deployed-precision one")
    parser.add_argument("--learner-device", default="auto", choices=LEARNER_DEVICES,
                        help="where JAX runs in this one process: auto (JAX's choice), cpu, or gpu (error without one)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = validate_common(args)
    except UsageError as e:
        fail(f"launch.train: error: {e}")
    from launch.experiment import run_experiment  # pylint: disable=import-outside-toplevel
    summary = run_experiment(config, progress=not args.no_progress)
    keys = ("agent", "task", "precision", "backend", "actor_steps", "learner_steps", "final_eval_return",
            "best_eval_return", "wall_clock_s")
    print(json.dumps({k: summary[k] for k in keys}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
