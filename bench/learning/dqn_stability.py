"""Does a DQN setting stay solved? Seeds x precisions of one learning-benchmark DQN row, every run to its full budget.

    python -m bench.learning.dqn_stability [--task CartPole-v1] [--seeds 0,1,2] [--precisions int8,fp32]
        [--set key=value ...] [--steps N] [--label NAME] [--out runs/bench/dqn_stability.jsonl] [--backend onnx]

Each run is `bench.harness.learning_runs.run_one` at the step budget and evaluation cadence of the task's row
(`bench.harness.rows.DQN_ROWS`: what bench.learning.int8_vs_fp32 and bench.peers.offpolicy run), with the row's task
overrides and then `--set`'s on top. Per run it prints and appends one JSON line: env steps to the
first evaluation at or above the target, the mean of the last 3 evaluations, the fraction of evaluations after the
first solve still at or above it, and every evaluation. Returns per env step are deterministic for a seed,
precision, backend and setting, so this is meaningful on a busy machine; its seconds are not, and are not kept.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from bench.harness.learning_runs import eval_metrics, read_our_evals, run_one
from bench.harness.results_io import append_json_line
from quarl.quant.precision import precision_list_arg

REPO = Path(__file__).resolve().parents[2]


def run_setting(task: str, overrides: dict[str, Any], seeds: Sequence[int], precisions: Sequence[str], *,
                label: str, runs_dir: Path, backend: str, steps: int | None = None) -> Iterator[dict[str, Any]]:
    """Every (seed, precision) of `task`'s DQN row with `overrides` over its own: one record per run, yielded as
    soon as the run ends (a long sweep keeps what it finished if stopped)."""
    import dataclasses  # pylint: disable=import-outside-toplevel

    from bench.harness.rows import DQN_ROWS  # pylint: disable=import-outside-toplevel  # imports the agents

    base = next(r for r in DQN_ROWS if r.task == task)
    row = dataclasses.replace(base, overrides={**base.overrides, **overrides},
                              max_actor_steps=steps or base.max_actor_steps)
    for seed in seeds:
        for precision in precisions:
            logdir = runs_dir / f"{label}-{task}-{precision}-s{seed}"
            result, _ = run_one(row, precision, seed, logdir=logdir, stop_at_target=False, backend=backend)
            metrics = eval_metrics(read_our_evals(logdir / "evaluator.csv"), row.target)
            yield {"label": label, "task": task, "precision": precision, "seed": seed, "backend": result["backend"],
                   "overrides": dict(row.overrides), "learner_steps": result["learner_steps"], **metrics}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.learning.dqn_stability", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="CartPole-v1")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--precisions", default="int8,fp32", type=precision_list_arg("actor"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--label", default="setting")
    parser.add_argument("--steps", type=int, default=None, help="env steps per run (default: the row's budget)")
    parser.add_argument("--backend", default="auto", help="actor backend (auto, onnx, jax, ...)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench" / "dqn_stability.jsonl")
    args = parser.parse_args(argv)
    from bench.harness.rows import DQN_ROWS  # pylint: disable=import-outside-toplevel  # imports the agents
    from launch.cli import UsageError  # pylint: disable=import-outside-toplevel
    from launch.overrides import parse_overrides  # pylint: disable=import-outside-toplevel

    if args.task not in {r.task for r in DQN_ROWS}:
        parser.exit(2, f"{parser.prog}: error: --task must be one of {', '.join(r.task for r in DQN_ROWS)}\n")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        overrides = parse_overrides("dqn", args.overrides)
    except (ValueError, UsageError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    precisions = args.precisions
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for rec in run_setting(args.task, overrides, seeds, precisions, label=args.label,
                           runs_dir=args.out.parent / "dqn_stability", backend=args.backend,
                           steps=args.steps):
        append_json_line(args.out, rec, default=str)
        print(f"{rec['label']} {rec['task']} {rec['precision']} s{rec['seed']}: first {rec['steps_to_target']} "
              f"last3 {rec['last3_mean']:.1f} stayed {rec['stay_fraction']} evals "
              + " ".join(f"{x:.0f}" for x in rec["eval_returns"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
