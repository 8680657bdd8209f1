"""D4PG fidelity: this project's D4PG (fp32 and int8 actors) beside Acme 0.4.0's JAX D4PG, same settings, same seeds.

    python -m bench.peers.fidelity run [--tasks cartpole:balance,walker:stand] [--seeds 0,1,2,3,4]
        [--arms fp32,int8,acme] [--steps cartpole:balance=40000,walker:stand=100000] [--eval-every 5000]
        [--eval-episodes 10] [--acme-python VENV/bin/python] [--runs runs/bench/fidelity]
        [--out results/bench] [--small] [--allow-busy]
    python -m bench.peers.fidelity report --runs DIR --out DIR      # tables, tests and plot from finished runs

Both agents run at Acme's control-suite settings (policy 256x3 LayerNorm MLP, critic 512-512-256, 51 atoms on
[-150, 150], batch 256, 32 samples per insert, n-step 5, sigma 0.3, Adam 1e-4, target copy every 100; `--small`
shrinks the networks for a smoke test), one process each, one job at a time, arms interleaved per seed so machine
load hits all alike. Ours is `launch.train` (single process); Acme's is `bench/peers/acme_d4pg.py` in the legacy venv
(`--acme-python` or $QUARL_ACME_PYTHON, as bench.peers.offpolicy). Like every benchmark, `run` refuses a busy machine
unless `--allow-busy`; the load at the start and end of each `run` is kept in RUNS/machine.json and reported.
Both evaluate every `eval_every` env steps with a noiseless actor on a separate environment (seed + 10000) for
`eval_episodes` episodes and record two protocols: the mean over the episodes, and the first episode alone
(Acme's usual protocol). Runs are resumable (a finished run is skipped), also across machines and sessions:
a run whose evaluations are already in OUT/fidelity_curves.csv (to its last step) is not run again, and the
report merges those rows with the runs under RUNS, so a long benchmark (walker: hours) can be split into
parts that each commit their results. Every row names the CPU it ran on, and OUT/fidelity_sessions.json keeps
each part's machine and load.

Writes OUT/fidelity_curves.csv (every evaluation of every run), OUT/fidelity_tests.csv (a paired test per
checkpoint: ours - Acme over seeds, both protocols), OUT/fidelity.md (summary) and OUT/fidelity.png (return
vs env steps and vs train seconds). Paired tests: an exact sign-flip permutation test of the mean difference
(no distribution assumed; with 5 seeds it cannot go below p = 0.0625) and a paired t-test.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from bench.harness.machine import add_allow_busy, bench_machine, check_load, finish, run_cli
from bench.harness.results_io import command_line, write_json
from bench.harness.subprocess_runs import run_subprocess
from bench.peers.fidelity_report import ARMS, MACHINE_FILE, finished, plot, read_curves_csv, recorded_runs, report
from launch.cli import OneLineArgumentParser, UsageError
from quarl.ops.io import read_json_list

REPO = Path(__file__).resolve().parents[2]
ACME_SCRIPT = REPO / "bench" / "peers" / "acme_d4pg.py"
DEFAULT_STEPS = {"cartpole:balance": 40_000, "walker:stand": 100_000}
SMALL_NETS = {"policy": (32, 32), "critic": (64, 64)}


def _steps(text: str, tasks: Sequence[str]) -> dict[str, int]:
    steps = {t: DEFAULT_STEPS.get(t, 100_000) for t in tasks}
    for item in filter(None, text.split(",")):
        task, _, value = item.rpartition("=")
        if task not in steps or not value.isdigit() or int(value) <= 0:
            raise UsageError(f"--steps expects TASK=N for the chosen tasks, got {item!r}")
        steps[task] = int(value)
    return steps


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog="bench.peers.fidelity", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the missing runs, then report")
    run.add_argument("--tasks", default="cartpole:balance,walker:stand")
    run.add_argument("--seeds", default="0,1,2,3,4")
    run.add_argument("--arms", default=",".join(ARMS))
    run.add_argument("--steps", default="", help="TASK=N,... (default cartpole:balance=40000,walker:stand=100000)")
    run.add_argument("--eval-every", type=int, default=5000)
    run.add_argument("--eval-episodes", type=int, default=10)
    run.add_argument("--acme-python", default=os.environ.get("QUARL_ACME_PYTHON", "/work/anchors_venv/bin/python"))
    run.add_argument("--runs", default=str(REPO / "runs" / "bench" / "fidelity"))
    run.add_argument("--out", default=str(REPO / "results" / "bench"))
    run.add_argument("--small", action="store_true", help="small networks (smoke test only)")
    add_allow_busy(run)
    report = sub.add_parser("report", help="summarise finished runs")
    replot = sub.add_parser("plot", help="redraw OUT/fidelity.png from OUT/fidelity_curves.csv (nothing else)")
    replot.add_argument("--out", default=str(REPO / "results" / "bench"))
    report.add_argument("--runs", default=str(REPO / "runs" / "bench" / "fidelity"))
    report.add_argument("--out", default=str(REPO / "results" / "bench"))
    args = parser.parse_args(argv)
    if args.command == "run":
        args.tasks = [t for t in args.tasks.split(",") if t]
        for task in args.tasks:
            if task.count(":") != 1:
                raise UsageError(f"--tasks takes DM Control domain:task names, got {task!r}")
        try:
            args.seeds = [int(s) for s in args.seeds.split(",") if s]
        except ValueError:
            raise UsageError(f"--seeds takes comma-separated ints, got {args.seeds!r}") from None
        args.arms = [a for a in args.arms.split(",") if a]
        bad = [a for a in args.arms if a not in ARMS]
        if bad or not args.arms or not args.seeds or not args.tasks or min(args.seeds) < 0:
            raise UsageError(f"need tasks, seeds >= 0 and arms from {ARMS}; got arms {args.arms}")
        args.steps = _steps(args.steps, args.tasks)
        if args.eval_every <= 0 or args.eval_episodes <= 0:
            raise UsageError("--eval-every and --eval-episodes must be positive")
        if "acme" in args.arms and not os.access(args.acme_python, os.X_OK):
            raise UsageError(f"--acme-python {args.acme_python!r} is not an executable (build the legacy venv with "
                             "../shared/anchors/acme_legacy/setup.sh)")
    return args


def run_dir(runs: Path, task: str, arm: str, seed: int) -> Path:
    return runs / task.replace(":", "_") / f"{arm}_s{seed}"


def command(args: argparse.Namespace, task: str, arm: str, seed: int, logdir: Path) -> list[str]:
    """The command line of one run (ours: launch.train; Acme: bench/peers/acme_d4pg.py in the legacy venv)."""
    policy = SMALL_NETS["policy"] if args.small else (256, 256, 256)
    critic = SMALL_NETS["critic"] if args.small else (512, 512, 256)
    csv_sizes = lambda sizes: ",".join(map(str, sizes))
    common = ["--seed", str(seed), "--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes)]
    if arm == "acme":
        return [args.acme_python, str(ACME_SCRIPT), "--task", task, "--steps", str(args.steps[task]), *common,
                "--policy", csv_sizes(policy), "--critic", csv_sizes(critic), "--out", str(logdir)]
    return [sys.executable, "-m", "launch.train", "--agent", "d4pg", "--task", task, "--precision", arm,
            "--steps", str(args.steps[task]), *common, "--logdir", str(logdir), "--no-progress",
            "--set", f"policy_layer_sizes={csv_sizes(policy)}", "--set", f"critic_layer_sizes={csv_sizes(critic)}"]


RUN_TIMEOUT_S = 4 * 3600.0  # one run; a hung one must not stall the whole benchmark


def run_all(args: argparse.Namespace) -> None:
    """Every missing run, one at a time (ours from this checkout: `python -m` imports from the cwd)."""
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    machine = bench_machine(args.allow_busy)
    jobs = [(t, s, a) for t in args.tasks for s in args.seeds for a in args.arms]
    recorded = recorded_runs(Path(args.out) / "fidelity_curves.csv")
    for i, (task, seed, arm) in enumerate(jobs, 1):
        logdir = run_dir(runs, task, arm, seed)
        if finished(logdir, arm):
            continue
        if recorded.get((task, arm, seed), 0) >= args.steps[task]:
            print(f"[{i}/{len(jobs)}] {task} {arm} seed {seed}: in {args.out}/fidelity_curves.csv already", flush=True)
            continue
        if logdir.exists():  # an interrupted run: start it again from scratch
            for p in sorted(logdir.rglob("*"), reverse=True):
                p.unlink() if p.is_file() or p.is_symlink() else p.rmdir()
            logdir.rmdir()
        logdir.parent.mkdir(parents=True, exist_ok=True)
        if arm == "acme":
            logdir.mkdir()
        print(f"[{i}/{len(jobs)}] {task} {arm} seed {seed} ...", flush=True)
        log = logdir.parent / f"{arm}_s{seed}.log"
        run_machine = bench_machine(True)
        code, _, seconds = run_subprocess(command(args, task, arm, seed, logdir), log, RUN_TIMEOUT_S, REPO)
        if code != 0 or not finished(logdir, arm):
            raise RuntimeError(f"{task} {arm} seed {seed} failed (exit {code}); see {log}")
        write_json(logdir / MACHINE_FILE, finish(run_machine), newline=False, indent=None)
        print(f"    done in {seconds:.0f} s", flush=True)
    sessions_file = runs / MACHINE_FILE
    sessions = read_json_list(sessions_file)
    sessions.append(finish(machine))
    write_json(sessions_file, sessions, newline=False)


def _main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.command == "plot":
        plot(read_curves_csv(Path(args.out) / "fidelity_curves.csv"), Path(args.out) / "fidelity.png")
        print(f"bench.peers.fidelity: redrew {Path(args.out) / 'fidelity.png'}")
        return
    if args.command == "run":
        check_load(args.allow_busy)
        run_all(args)
    print(report(Path(args.runs), Path(args.out), command_line("bench.peers.fidelity", argv)))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli("bench.peers.fidelity", lambda: _main(argv))


if __name__ == "__main__":
    sys.exit(main())
