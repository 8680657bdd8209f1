"""This project beside the systems its users would otherwise pick, measured in the same benchmark run.

    python -m bench.peers.offpolicy [--quick] [--out DIR] [--seeds 0,1,2] [--dqn-tasks CartPole-v1,...] [--skip-acme]
        [--skip-sb3] [--merge] [--allow-busy]
        [--acme-python VENV/bin/python] [--sb3-python VENV/bin/python] [--anchors DIR]

Peers run as subprocesses of their own interpreters (built by the anchors' setup in `../shared/anchors/`:
`acme_legacy/setup.sh` for Acme 0.4.0 + Launchpad + Reverb on Python 3.10, `sb3_dqn/README.md` for SB3 + rl-zoo3),
one job at a time, alternating with ours, so every figure in the result was measured here in this run:

1. D4PG, cartpole:balance, 2 actors: legacy Acme `DistributedD4PG` (`run_d4pg.py`, wall-clock budget) and this
   project's distributed program (int8 and fp32 actors) at the same network sizes, batch size and samples per
   insert. Ours runs the number of actor steps Acme reached, so both did the same work; reported: wall clock,
   learner steps/s, env steps/s per actor, last evaluation return (Acme's figures parsed from its own log lines).
2. DQN on CartPole-v1, Acrobot-v1 and MountainCar-v0: Stable-Baselines3 with rl-zoo3's tuned hyperparameters
   for each task (`sb3_dqn/run.py`) and this project (the learning benchmark's rows, `bench.harness.rows`, with their
   per-task settings, int8 and fp32 actors), same task, step budget, evaluation cadence (10 greedy episodes every 2,500 env steps) and
   target, each run to its full budget, per seed: env steps and wall clock (evaluation included, for both) to
   the first evaluation at or above the target, whether it stayed solved (the mean of the last 3 evaluations,
   the last evaluation, the fraction of evaluations after the first solve still at or above the target), and env
   steps/s. Step budgets are rl-zoo3's for each task (50k, 100k, 120k env steps; bench.harness.rows.DQN_ROWS).

Interpreters come from the flags or $QUARL_ACME_PYTHON / $QUARL_SB3_PYTHON; a missing one is an error (exit 2)
unless its part is skipped. The full run writes results/bench/peers.{json,md}; --quick writes to
runs/bench/peers-quick.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from bench.harness.learning_runs import eval_metrics, read_our_evals
from bench.harness.machine import add_allow_busy, bench_machine, finish, refuse_if_busy
from bench.harness.results_io import write_results
from bench.harness.subprocess_runs import run_subprocess
from bench.peers.offpolicy_results import (D4PG_SETTINGS, D4PG_TASK, DEFAULT_DQN_TASKS, markdown, merge_results,
                                           parse_acme_log, parse_sb3_log)

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------ running


def first_wall_at(evaluator_csv: Path, target: float) -> float | None:
    """Wall clock (evaluation included) of the first evaluation at or above `target` in our evaluator.csv."""
    return eval_metrics(read_our_evals(evaluator_csv), target)["wall_s_to_target"]


def acme_d4pg(python: str, anchors: Path, setting: str, seconds: float, logdir: Path) -> dict[str, Any]:
    policy, critic, batch, spi = D4PG_SETTINGS[setting]
    cmd = [python, str(anchors / "acme_legacy" / "run_d4pg.py"), "--policy", ",".join(map(str, policy)),
           "--critic", ",".join(map(str, critic)), "--batch", str(batch), "--spi", str(spi), "--actors", "2",
           "--seconds", str(int(seconds))]
    code, text, wall = run_subprocess(cmd, logdir / f"acme-{setting}.log", seconds + 180, logdir)
    return {"exit_code": code, "wall_clock_s": round(wall, 1), "budget_s": seconds, **parse_acme_log(text),
            "log": str(logdir / f"acme-{setting}.log")}


def ours_d4pg(setting: str, precision: str, actor_steps: int, seed: int, logdir: Path) -> dict[str, Any]:
    from launch.experiments.config import ExperimentConfig  # pylint: disable=import-outside-toplevel
    from launch.distributed.supervisor import run_program  # pylint: disable=import-outside-toplevel
    from launch.program.ray_runner import RayRunner  # pylint: disable=import-outside-toplevel

    policy, critic, batch, spi = D4PG_SETTINGS[setting]
    overrides = {"policy_layer_sizes": policy, "critic_layer_sizes": critic, "batch_size": batch,
                 "samples_per_insert": spi, "min_replay_size": 1000}
    config = ExperimentConfig.create(agent="d4pg", task=D4PG_TASK, precision=precision, num_actors=2,
                              max_actor_steps=actor_steps, seed=seed, logdir=str(logdir), overrides=overrides,
                              backend="auto", eval_every=max(1000, actor_steps // 4), eval_episodes=1)
    t0 = time.perf_counter()
    summary, code = run_program(config, RayRunner())
    return {"exit_code": code, "wall_clock_s": round(time.perf_counter() - t0, 1),
            "learner_steps": summary["learner_steps"], "learner_steps_per_s": summary["learner_steps_per_s"],
            "actor_steps": summary["actor_steps"],
            "actor_steps_per_s_each": statistics.median(float(a.get("steps_per_s", 0.0)) for a in summary["actors"])
            if summary["actors"] else None,
            "last_eval_return": summary["final_eval_return"], "logdir": str(logdir)}


def bench_d4pg(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    from launch.program.ray_runner import init_ray  # pylint: disable=import-outside-toplevel

    rows = []
    settings = ["small"] if args.quick else list(D4PG_SETTINGS)
    seconds = 150 if args.quick else 240
    for setting in settings:
        print(f"[bench.peers.offpolicy] Acme D4PG {setting}, {seconds:.0f} s ...", flush=True)
        acme = acme_d4pg(args.acme_python, args.anchors, setting, seconds, out / "logs")
        row = {"setting": setting, "acme": acme, "ours": {}}
        print(f"  Acme: {json.dumps({k: v for k, v in acme.items() if k != 'eval_returns'})}", flush=True)
        steps = acme["actor_steps"]
        if steps <= 0:
            row["note"] = "Acme logged no actor steps (see its log); ours not run"
            rows.append(row)
            continue
        init_ray(None, num_cpus=8)
        import ray  # pylint: disable=import-outside-toplevel
        try:
            for precision in ("int8", "fp32"):
                ours = ours_d4pg(setting, precision, steps, 0, out / "runs" / f"d4pg-{setting}-{precision}")
                row["ours"][precision] = ours
                print(f"  ours {precision}: {json.dumps(ours)}", flush=True)
        finally:
            ray.shutdown()
        rows.append(row)
    return rows


def sb3_command(python: str, anchors: Path, row: Any, seed: int) -> list[str]:
    """SB3's run for `row` (a bench.harness.rows LearningRow): rl-zoo3's tuned settings for the task, our budget,
    evaluation cadence, episodes and target."""
    return [python, str(anchors / "sb3_dqn" / "run.py"), "--env", row.task, "--seed", str(seed),
            "--steps", str(row.max_actor_steps), "--eval_every", str(row.eval_every),
            "--eval_episodes", str(row.eval_episodes), "--threshold", str(row.target), "--max_seconds", "3600"]


def bench_dqn(args: argparse.Namespace, out: Path, seeds: Sequence[int], rows: Sequence[Any] | None = None
              ) -> list[dict[str, Any]]:
    """Every (row, seed): SB3, then ours with int8 and fp32 actors (order reversed on odd seeds), each run to its
    full budget so that the final evaluations say whether the policy stayed solved."""
    from bench.harness.learning_runs import run_one  # pylint: disable=import-outside-toplevel
    from bench.harness.rows import DQN_ROWS, QUICK_ROWS  # pylint: disable=import-outside-toplevel  # imports the agents

    if rows is None:
        rows = list(QUICK_ROWS) if args.quick else [r for r in DQN_ROWS if r.task in args.dqn_tasks]
    results = []
    for row in rows:
        for i, seed in enumerate(seeds):
            order = ["sb3", "int8", "fp32"] if i % 2 == 0 else ["fp32", "int8", "sb3"]
            for system in order:
                if system == "sb3":
                    log = out / "logs" / f"sb3-{row.task}-seed{seed}.log"
                    code, text, wall = run_subprocess(sb3_command(args.sb3_python, args.anchors, row, seed), log,
                                                      4000, out)
                    res = {"system": "sb3", **parse_sb3_log(text, row.target), "exit_code": code,
                           "wall_clock_s": round(wall, 1), "log": str(log)}
                    res.pop("evals")
                else:
                    logdir = out / "runs" / f"dqn-{row.task}-{system}-s{seed}"
                    r, _ = run_one(row, system, seed, logdir=logdir, stop_at_target=False)
                    res = {"system": f"ours {system}", **eval_metrics(read_our_evals(logdir / "evaluator.csv"),
                                                                      row.target),
                           "env_steps_per_s": r["env_steps_per_s"], "overrides": dict(row.overrides)}
                results.append({"task": row.task, "seed": seed, "target": row.target, **res})
                print(f"[bench.peers.offpolicy] {row.task} seed {seed} {res['system']}: steps {res['steps_to_target']}, "
                      f"{res['wall_s_to_target']} s to {row.target}; last 3 evals {res['last3_mean']}, "
                      f"stayed solved {res['stay_fraction']}", flush=True)
    return results


# ------------------------------------------------------------------------------------------------ report


# ------------------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.peers.offpolicy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small settings only, short budgets (a smoke run)")
    parser.add_argument("--out", default=None, help="output directory (default results/bench, or "
                                                    "runs/bench/peers-quick with --quick)")
    parser.add_argument("--seeds", default=None, help="DQN seeds (default 0,1,2; 0 with --quick)")
    parser.add_argument("--dqn-tasks", default=DEFAULT_DQN_TASKS,
                        help="comma-separated bench.learning.int8_vs_fp32 DQN tasks")
    parser.add_argument("--skip-acme", action="store_true", help="no D4PG comparison")
    parser.add_argument("--skip-sb3", action="store_true", help="no DQN comparison")
    parser.add_argument("--acme-python", default=os.environ.get("QUARL_ACME_PYTHON"),
                        help="interpreter of the legacy Acme venv (acme_legacy/setup.sh); $QUARL_ACME_PYTHON")
    parser.add_argument("--sb3-python", default=os.environ.get("QUARL_SB3_PYTHON"),
                        help="interpreter of the SB3 venv (sb3_dqn/README.md); $QUARL_SB3_PYTHON")
    parser.add_argument("--anchors", type=Path, default=REPO.parent / "shared" / "anchors",
                        help="folder holding acme_legacy/ and sb3_dqn/ (default ../shared/anchors)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the DQN rows of other tasks (and the D4PG part, if skipped now) from OUT's "
                             "peers.json: the tasks can be measured in separate sittings into one table")
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not seeds or min(seeds) < 0:
        parser.error("--seeds needs at least one non-negative integer")
    args.dqn_tasks = [t.strip() for t in args.dqn_tasks.split(",") if t.strip()]
    from bench.harness.rows import DQN_ROWS  # pylint: disable=import-outside-toplevel  # imports the agents
    unknown = sorted(set(args.dqn_tasks) - {r.task for r in DQN_ROWS})
    if unknown:
        parser.error(f"--dqn-tasks: no bench.learning.int8_vs_fp32 DQN row for {', '.join(unknown)} "
                     f"(rows: {', '.join(r.task for r in DQN_ROWS)})")
    for skip, flag, python, script in ((args.skip_acme, "--acme-python", args.acme_python, "acme_legacy/run_d4pg.py"),
                                       (args.skip_sb3, "--sb3-python", args.sb3_python, "sb3_dqn/run.py")):
        if skip:
            continue
        if not python or not os.access(python, os.X_OK):
            parser.exit(2, f"{parser.prog}: error: {flag} must name the peer's venv python (got {python!r}); build "
                           f"it with {args.anchors}/{script.split('/')[0]}/, or pass --skip-{flag[2:6]}\n")
        if not (args.anchors / script).is_file():
            parser.exit(2, f"{parser.prog}: error: {args.anchors / script} not found; pass --anchors DIR\n")
    refuse_if_busy(parser, args.allow_busy)
    out = Path(args.out) if args.out else REPO / ("runs/bench/peers-quick" if args.quick else "results/bench")
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m bench.peers.offpolicy", *(argv if argv is not None else sys.argv[1:])])
    result: dict[str, Any] = {"command": command, "machine": bench_machine(args.allow_busy), "quick": args.quick}
    work = out if args.quick else REPO / "runs" / "bench" / "peers"
    if not args.skip_acme:
        result["d4pg"] = bench_d4pg(args, work)
    if not args.skip_sb3:
        result["dqn"] = bench_dqn(args, work, seeds)
    finish(result["machine"])
    if args.merge and (out / "peers.json").is_file():
        result = merge_results(json.loads((out / "peers.json").read_text(encoding="utf-8")), result)
    json_path, md_path = write_results(out, "peers", result, markdown(result), default=str)
    print(f"[bench.peers.offpolicy] wrote {json_path} and {md_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
