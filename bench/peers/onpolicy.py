"""This project's PPO (or A2C) beside Stable-Baselines3's, tuned by rl-zoo3, on the same machine in one run.

    python -m bench.peers.onpolicy [--algo ppo|a2c] [--task CartPole-v1] [--seeds 0,1,2] [--steps 100000]
        [--eval-every 5000] [--eval-episodes 10] [--target 475] [--precisions int8,fp32] [--set KEY=VALUE ...]
        [--sb3-python VENV/bin/python] [--anchors DIR] [--out DIR] [--quick] [--allow-busy]

Per seed, one job at a time and in alternating order (SB3 first on even seeds, last on odd ones, so drifting load
hits both alike): SB3's PPO with rl-zoo3's hyperparameters for the task (`../shared/anchors/sb3_ppo/run.py`, one
torch thread, its own interpreter from the `sb3_dqn` venv: --sb3-python or $QUARL_SB3_PYTHON), then this
project's (`launch.train --agent ppo`, one process, its default settings plus --set) with each of --precisions
for its actors. Both evaluate --eval-episodes greedy (deterministic) episodes every --eval-every env steps and run
their full budget. Reported per system and seed, as bench.peers.offpolicy reports DQN: env steps and wall clock to the first
evaluation at or above --target (time to solve), the final evaluation, the mean of the last 3 and the fraction of
evaluations after the first solve still at or above the target; medians over seeds.

Clocks: SB3's starts when its training starts (after its model is built) and its evaluation rows are stamped
after each evaluation; ours starts when the run starts (building the agent and compiling included) and is
stamped before each evaluation. Both include evaluation time. Timings mean something only on an otherwise idle
machine: like every benchmark it refuses a busy one unless --allow-busy, and records the load at start and end.
The full run writes results/bench/peers_ppo.{json,md}; --quick (one seed, 4,000 steps) writes to
runs/bench/peers_ppo-quick.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

from bench.harness.learning_runs import REPO, empty_run_dir, eval_metrics, read_our_evals
from bench.harness.machine import add_allow_busy, bench_machine, finish, refuse_if_busy
from bench.harness.results_io import write_results
from bench.harness.subprocess_runs import run_subprocess
from bench.peers.offpolicy_results import dqn_markdown
from quarl.quant.precision import precision_list_arg
from quarl.ops.machine import machine_fields

RUN_TIMEOUT_S = 3600.0


def parse_sb3_ppo_log(text: str, threshold: float) -> dict[str, Any]:
    """sb3_ppo/run.py's output: evaluation rows "env_steps wall_clock_s mean std" and its closing line."""
    evals = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 4 or line.startswith("#"):
            continue
        try:
            steps, wall, mean, _ = (float(x) for x in parts)
        except ValueError:
            continue  # the header line
        evals.append({"env_steps": int(steps), "wall_clock_s": wall, "return": mean})
    trained = [e for e in evals if e["env_steps"] > 0]  # step 0 is the untrained policy; ours has no such row
    rate = next((ln.split("-> ")[1].split()[0] for ln in text.splitlines() if ln.startswith("# done:") and "-> " in ln),
                None)
    return {**eval_metrics(trained, threshold), "env_steps_per_s": float(rate) if rate else None,
            "version": next((ln[2:] for ln in text.splitlines() if ln.startswith("# sb3 ")), None)}


def sb3_command(args: argparse.Namespace, seed: int) -> list[str]:
    return [args.sb3_python, str(args.anchors / "sb3_ppo" / "run.py"), "--algo", args.algo, "--env", args.task,
            "--seed", str(seed), "--steps", str(args.steps), "--eval_every", str(args.eval_every),
            "--eval_episodes", str(args.eval_episodes), "--threshold", str(args.target),
            "--max_seconds", str(int(RUN_TIMEOUT_S))]


def our_command(args: argparse.Namespace, precision: str, seed: int, logdir: Path) -> list[str]:
    """`launch.train` for our side, a subprocess of this checkout as SB3's is of its venv."""
    sets = [x for item in args.overrides for x in ("--set", item)]
    return [sys.executable, "-m", "launch.train", "--agent", args.algo, "--task", args.task, "--precision",
            precision, "--steps", str(args.steps), "--seed", str(seed), "--eval-every", str(args.eval_every),
            "--eval-episodes", str(args.eval_episodes), "--logdir", str(logdir), "--no-progress", *sets]


def run_pair(args: argparse.Namespace, work: Path, seed: int, index: int) -> list[dict[str, Any]]:
    """SB3 and ours on one seed (order alternating with `index`); one result row per system."""
    systems = ["sb3", *args.precisions]
    rows = []
    for system in systems if index % 2 == 0 else systems[::-1]:
        if system == "sb3":
            log = work / "logs" / f"sb3-{args.algo}-{args.task}-s{seed}.log"
            code, text, wall = run_subprocess(sb3_command(args, seed), log, RUN_TIMEOUT_S + 120, work)
            res = {"system": f"sb3 {args.algo}", **parse_sb3_ppo_log(text, args.target)}
        else:
            logdir = empty_run_dir(work / "runs" / f"{args.algo}-{args.task}-{system}-s{seed}")
            log = work / "logs" / f"ours-{args.algo}-{args.task}-{system}-s{seed}.log"
            code, _, wall = run_subprocess(our_command(args, system, seed, logdir), log, RUN_TIMEOUT_S, REPO)
            evals = read_our_evals(logdir / "evaluator.csv") if (logdir / "evaluator.csv").is_file() else []
            summary = logdir / "summary.json"
            rate = None
            if summary.is_file():
                s = json.loads(summary.read_text(encoding="utf-8"))
                rate = s["actor_steps"] / max(float(s.get("train_clock_s") or 0.0), 1e-9)
            res = {"system": f"ours {system}", **eval_metrics(evals, args.target), "env_steps_per_s": rate}
        if code != 0:
            raise RuntimeError(f"{res['system']} seed {seed} exited {code}; see {log}")
        res.update({"task": args.task, "seed": seed, "target": args.target, "exit_code": code,
                    "process_wall_s": round(wall, 1), "log": str(log)})
        print(f"[bench.peers.onpolicy] {args.task} seed {seed} {res['system']}: steps {res['steps_to_target']}, "
              f"{res['wall_s_to_target']} s to {args.target}; final {res['final_return']}", flush=True)
        rows.append(res)
    return rows


def markdown(result: dict[str, Any]) -> str:
    from bench.harness.machine import describe_load  # pylint: disable=import-outside-toplevel

    machine = machine_fields(result["machine"])
    lines = [f"# {result['algo'].upper()}: this project beside Stable-Baselines3 (rl-zoo3 tuned), measured in one run",
             "", f"`{result['command']}` ({describe_load(machine)}; {machine['cpu_model']}). "
             "Both ran as subprocesses one "
             "at a time, alternating per seed. Our wall clock starts with the run (building and compiling "
             "included); SB3's when its training starts.", ""]
    table = dqn_markdown(result["rows"], title=f"{result['algo'].upper()} on {result['task']}: time to solve and "
                                               "final return")
    final = [f"- {r['system']} seed {r['seed']}: final evaluation {r['final_return']}" for r in result["rows"]]
    return "\n".join(lines + table + ["Final evaluation per run:", "", *final, ""])


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.peers.onpolicy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", default="ppo", choices=("ppo", "a2c"))
    parser.add_argument("--task", default="CartPole-v1")
    parser.add_argument("--seeds", default=None, help="default 0,1,2 (0 with --quick)")
    parser.add_argument("--steps", type=int, default=None, help="env steps per run (default 100000; 4000 quick)")
    parser.add_argument("--eval-every", type=int, default=None, help="default 5000 (2000 quick)")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--precisions", default="int8,fp32", type=precision_list_arg("actor"),
                        help="our actors' precisions")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="our agent's config overrides (launch.train --set)")
    parser.add_argument("--sb3-python", default=os.environ.get("QUARL_SB3_PYTHON"),
                        help="interpreter of the SB3 venv (sb3_dqn/README.md); $QUARL_SB3_PYTHON")
    parser.add_argument("--anchors", type=Path, default=REPO.parent / "shared" / "anchors")
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true", help="one seed, a short budget (a smoke run)")
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    try:
        args.seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    args.steps = args.steps or (4000 if args.quick else 100_000)
    args.eval_every = args.eval_every or (2000 if args.quick else 5000)
    if not args.seeds or min(args.seeds) < 0 or min(args.steps, args.eval_every, args.eval_episodes) <= 0:
        parser.error("--seeds, --steps, --eval-every and --eval-episodes must be non-negative / positive")
    import agents  # pylint: disable=import-outside-toplevel
    if args.algo not in agents.AGENT_NAMES:
        parser.exit(2, f"{parser.prog}: error: agent {args.algo!r} is not in this build "
                       f"(agents: {', '.join(agents.AGENT_NAMES)})\n")
    if not args.sb3_python or not os.access(args.sb3_python, os.X_OK):
        parser.exit(2, f"{parser.prog}: error: --sb3-python must name the SB3 venv's python (got "
                       f"{args.sb3_python!r}); build it as {args.anchors}/sb3_dqn/README.md says\n")
    if not (args.anchors / "sb3_ppo" / "run.py").is_file():
        parser.exit(2, f"{parser.prog}: error: {args.anchors / 'sb3_ppo' / 'run.py'} not found; pass --anchors DIR\n")
    refuse_if_busy(parser, args.allow_busy)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    out = Path(args.out) if args.out else REPO / ("runs/bench/peers_ppo-quick" if args.quick else "results/bench")
    work = out if args.quick or args.out else REPO / "runs" / "bench" / "peers_ppo"
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"command": "python -m bench.peers.onpolicy " + " ".join(argv), "algo": args.algo,
                              "task": args.task, "machine": bench_machine(args.allow_busy), "rows": []}
    try:
        for i, seed in enumerate(args.seeds):
            result["rows"] += run_pair(args, work, seed, i)
    except RuntimeError as e:
        print(f"bench.peers.onpolicy: {e}", file=sys.stderr)
        return 1
    finish(result["machine"])
    medians = {}
    for system in dict.fromkeys(r["system"] for r in result["rows"]):
        solved = [r["wall_s_to_target"] for r in result["rows"] if r["system"] == system and r["solved"]]
        medians[system] = statistics.median(solved) if solved else None
    result["median_wall_s_to_target"] = medians
    json_path, md_path = write_results(out, "peers_ppo", result, markdown(result), default=str)
    print(f"[bench.peers.onpolicy] wrote {json_path} and {md_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
