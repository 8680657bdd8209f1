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
import csv
import itertools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from bench.harness.machine import add_allow_busy, check_load, describe_load, finish, machine_info, run_cli
from bench.peers.offpolicy import run_subprocess
from bench.harness.results_io import command_line, write_json
from launch.cli import OneLineArgumentParser, UsageError
from quarl.ops.io import read_json_list

REPO = Path(__file__).resolve().parents[2]
ACME_SCRIPT = REPO / "bench" / "peers" / "acme_d4pg.py"
DEFAULT_STEPS = {"cartpole:balance": 40_000, "walker:stand": 100_000}
OUR_ARMS = ("fp32", "int8")
ARMS = OUR_ARMS + ("acme",)
PROTOCOLS = {"return": "mean of the evaluation episodes", "return_first": "first episode (Acme's protocol)"}
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


def finished(logdir: Path, arm: str) -> bool:
    return (logdir / ("done.json" if arm == "acme" else "summary.json")).exists()


RUN_TIMEOUT_S = 4 * 3600.0  # one run; a hung one must not stall the whole benchmark


def run_all(args: argparse.Namespace) -> None:
    """Every missing run, one at a time (ours from this checkout: `python -m` imports from the cwd)."""
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    machine = machine_info(args.allow_busy)
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
        run_machine = machine_info(True)
        code, _, seconds = run_subprocess(command(args, task, arm, seed, logdir), log, RUN_TIMEOUT_S, REPO)
        if code != 0 or not finished(logdir, arm):
            raise RuntimeError(f"{task} {arm} seed {seed} failed (exit {code}); see {log}")
        (logdir / MACHINE_FILE).write_text(json.dumps(finish(run_machine)), encoding="utf-8")
        print(f"    done in {seconds:.0f} s", flush=True)
    sessions_file = runs / MACHINE_FILE
    sessions = read_json_list(sessions_file)
    sessions.append(finish(machine))
    write_json(sessions_file, sessions, newline=False)


MACHINE_FILE = "machine.json"  # in a run folder: the CPU and load the run had
CURVE_KEYS = ("task", "arm", "seed", "actor_steps", "learner_steps", "wall_clock_s", "train_clock_s", "return",
              "return_first", "cpu", "load")


def recorded_runs(curves_csv: Path) -> dict[tuple[str, str, int], int]:
    """(task, arm, seed) -> last evaluated env step of the runs already in a fidelity_curves.csv."""
    out: dict[tuple[str, str, int], int] = {}
    for r in read_curves_csv(curves_csv):
        key = (r["task"], r["arm"], r["seed"])
        out[key] = max(out.get(key, 0), r["actor_steps"])
    return out


def read_curves_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of a fidelity_curves.csv written by `report` (none if the file is absent); a file from before the
    `cpu` or `load` column reads with an empty one."""
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return [{"task": r["task"], "arm": r["arm"], "seed": int(r["seed"]), "actor_steps": int(r["actor_steps"]),
                 "learner_steps": int(r["learner_steps"]), "wall_clock_s": float(r["wall_clock_s"]),
                 "train_clock_s": float(r["train_clock_s"]), "return": float(r["return"]),
                 "return_first": float(r["return_first"]), "cpu": r.get("cpu") or "", "load": r.get("load") or ""}
                for r in csv.DictReader(f)]


def _run_machine(logdir: Path, fallback: str) -> tuple[str, str]:
    """(CPU, "start-end" 1-minute load average) of one run from its machine.json; the load is "" when not
    recorded. The load says whether its seconds were measured alone: a run's seconds on a busy machine are
    longer, while its returns per env step are not affected."""
    try:
        info = json.loads((logdir / MACHINE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return fallback, ""
    if not isinstance(info, dict):
        return fallback, ""
    try:
        load = f"{float(info['load_start'][0]):.1f}-{float(info['load_end'][0]):.1f}"
    except (KeyError, TypeError, IndexError, ValueError):
        load = ""
    return str(info.get("cpu") or fallback), load


def load_curves(runs: Path, previous: Path | None = None) -> list[dict[str, Any]]:
    """Every evaluation of every finished run under `runs`, plus the rows of `previous` (an earlier
    fidelity_curves.csv) for runs that are not under `runs`."""
    if not runs.is_dir():
        raise UsageError(f"no finished runs under {str(runs)!r} (not a directory)")
    sessions = read_json_list(runs / MACHINE_FILE)
    # Runs from before per-run machine records: the CPU of their run session (one machine per runs folder).
    fallback = str(sessions[-1].get("cpu", "")) if sessions else ""
    rows = []
    for task_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
        for logdir in sorted(p for p in task_dir.iterdir() if p.is_dir()):
            arm, _, seed = logdir.name.rpartition("_s")
            if arm not in ARMS or not seed.isdigit() or not finished(logdir, arm):
                continue
            cpu, load = _run_machine(logdir, fallback)
            with open(logdir / "evaluator.csv", newline="", encoding="utf-8") as f:
                for r in csv.DictReader(f):
                    rows.append({"task": task_dir.name.replace("_", ":", 1), "arm": arm, "seed": int(seed),
                                 "actor_steps": int(r["actor_steps"]), "learner_steps": int(r["learner_steps"]),
                                 "wall_clock_s": float(r["wall_clock_s"]), "train_clock_s": float(r["train_clock_s"]),
                                 "return": float(r["return"]), "return_first": float(r["return_first"]),
                                 "cpu": cpu, "load": load})
    have = {(r["task"], r["arm"], r["seed"]) for r in rows}
    rows += [r for r in read_curves_csv(previous) if (r["task"], r["arm"], r["seed"]) not in have] if previous else []
    return sorted(rows, key=lambda r: (r["task"], r["arm"], r["seed"], r["actor_steps"]))


def sign_flip_p(diffs: Sequence[float]) -> float:
    """Exact two-sided sign-flip permutation p of mean(diffs) = 0 (paired, no distribution assumed)."""
    observed = abs(statistics.fmean(diffs))
    flips = list(itertools.product((1, -1), repeat=len(diffs)))
    hits = sum(abs(statistics.fmean(s * d for s, d in zip(signs, diffs))) >= observed - 1e-9 for signs in flips)
    return hits / len(flips)


def paired_t_p(diffs: Sequence[float]) -> float:
    """Two-sided paired t-test p (NaN with fewer than 2 pairs; 1 when every difference is 0)."""
    if len(diffs) < 2:
        return math.nan
    sd = statistics.stdev(diffs)
    if sd == 0:
        return 1.0 if statistics.fmean(diffs) == 0 else 0.0
    from scipy import stats  # pylint: disable=import-outside-toplevel
    t = statistics.fmean(diffs) / (sd / math.sqrt(len(diffs)))
    return float(2 * stats.t.sf(abs(t), len(diffs) - 1))


def paired_tests(curves: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours (each precision) - Acme at every checkpoint both reached, paired by seed, for both protocols."""
    index = {(r["task"], r["arm"], r["seed"], r["actor_steps"]): r for r in curves}
    out = []
    keys = sorted({(r["task"], r["actor_steps"]) for r in curves})
    for (task, steps), arm, protocol in itertools.product(keys, OUR_ARMS, PROTOCOLS):
        seeds = sorted(s for (t, a, s, st) in index if (t, a, st) == (task, arm, steps)
                       and (task, "acme", s, steps) in index)
        if not seeds:
            continue
        ours = [index[(task, arm, s, steps)][protocol] for s in seeds]
        acme = [index[(task, "acme", s, steps)][protocol] for s in seeds]
        diffs = [o - a for o, a in zip(ours, acme)]
        out.append({"task": task, "arm": arm, "protocol": protocol, "actor_steps": steps, "seeds": len(seeds),
                    "ours_mean": statistics.fmean(ours), "acme_mean": statistics.fmean(acme),
                    "diff_mean": statistics.fmean(diffs), "p_sign_flip": sign_flip_p(diffs),
                    "p_t": paired_t_p(diffs)})
    return out


def auc_tests(curves: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean return over a run's checkpoints (area under the curve per env step), ours - Acme paired by seed."""
    by_run: dict[tuple, dict[int, dict]] = {}
    for r in curves:
        by_run.setdefault((r["task"], r["arm"], r["seed"]), {})[r["actor_steps"]] = r
    out = []
    for task in sorted({r["task"] for r in curves}):
        for arm, protocol in itertools.product(OUR_ARMS, PROTOCOLS):
            pairs = []
            for (t, a, seed), ours in sorted(by_run.items()):
                acme = by_run.get((task, "acme", seed))
                if (t, a) != (task, arm) or acme is None:
                    continue
                common = sorted(set(ours) & set(acme))
                if common:
                    pairs.append((statistics.fmean(ours[s][protocol] for s in common),
                                  statistics.fmean(acme[s][protocol] for s in common),
                                  ours[common[-1]]["train_clock_s"], acme[common[-1]]["train_clock_s"]))
            if not pairs:
                continue
            diffs = [o - a for o, a, _, _ in pairs]
            out.append({"task": task, "arm": arm, "protocol": protocol, "seeds": len(pairs),
                        "ours_auc": statistics.fmean(p[0] for p in pairs),
                        "acme_auc": statistics.fmean(p[1] for p in pairs), "diff_mean": statistics.fmean(diffs),
                        "p_sign_flip": sign_flip_p(diffs), "p_t": paired_t_p(diffs),
                        # Acme's train seconds / ours over the same env steps: > 1 means ours is faster.
                        "time_ratio": statistics.median(p[3] / p[2] for p in pairs)})
    return out


def verdict(row: dict[str, Any]) -> str:
    if row["diff_mean"] >= 0:
        return "ours >= Acme"
    return "ours lower (significant)" if min(row["p_t"], row["p_sign_flip"]) < 0.05 else "within seed noise"


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def markdown(curves: list[dict], tests: list[dict], aucs: list[dict], command_line: str,
             sessions: Sequence[dict[str, Any]] = ()) -> str:
    seeds = sorted({r["seed"] for r in curves})
    machine = machine_info()
    loads = "; ".join(f"{m.get('cpu', 'unknown CPU')}: {describe_load(m)}" for m in sessions) \
        or "no run sessions recorded"
    cpus = sorted({r.get("cpu") or "not recorded" for r in curves})
    lines = [
        "# D4PG fidelity: this project vs Acme 0.4.0 (JAX D4PG), same settings, same seeds", "",
        f"`{command_line}`, {time.strftime('%Y-%m-%d')}, reported on {machine['cpu']}, {machine['cores']} cores, "
        f"Python {machine['python']}. Runs on: {', '.join(cpus)}. Run sessions: {loads}.", "",
        "Both at Acme's control-suite settings; single process each, one run at a time, arms interleaved per "
        "seed. Evaluation every checkpoint: a noiseless actor on its own environment, two protocols: the mean "
        "over the evaluation episodes, and the first episode alone (Acme's usual protocol). Return per env step "
        "does not depend on machine load; seconds do (train seconds leave evaluation out).", "",
        f"Seeds: {', '.join(map(str, seeds))}.", "",
        "## Return per env step: area under the curve (mean return over checkpoints), ours - Acme paired by seed",
        "",
        "| task | ours | protocol | seeds | ours | Acme | ours - Acme | p (sign flip) | p (t) | verdict | "
        "Acme train s / ours |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in aucs:
        lines.append(f"| {r['task']} | {r['arm']} | {PROTOCOLS[r['protocol']]} | {r['seeds']} | {r['ours_auc']:.1f} "
                     f"| {r['acme_auc']:.1f} | {r['diff_mean']:+.1f} | {r['p_sign_flip']:.3f} | {r['p_t']:.3f} | "
                     f"{verdict(r)} | {r['time_ratio']:.2f}x |")
    lines += ["", *seconds_table(curves)]
    lines += ["", "## Paired test per checkpoint (ours - Acme over seeds)", "",
              "| task | ours | protocol | env steps | seeds | ours | Acme | ours - Acme | p (sign flip) | p (t) |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in tests:
        lines.append(f"| {r['task']} | {r['arm']} | {'mean' if r['protocol'] == 'return' else 'first'} | "
                     f"{r['actor_steps']:,} | {r['seeds']} | {r['ours_mean']:.1f} | {r['acme_mean']:.1f} | "
                     f"{r['diff_mean']:+.1f} | {r['p_sign_flip']:.3f} | {r['p_t']:.3f} |")
    lines += ["", "Every evaluation: `fidelity_curves.csv`; these tests: `fidelity_tests.csv`; curves: "
              "`fidelity.png`.", ""]
    return "\n".join(lines)


def seconds_table(curves: list[dict[str, Any]]) -> list[str]:
    """Train seconds of every run to its last checkpoint, each with the 1-minute load average at its start and
    end: the ratio above is a median over seeds, and this shows which runs had the machine to themselves."""
    last: dict[tuple[str, int, str], dict[str, Any]] = {}
    for r in curves:
        key = (r["task"], r["seed"], r["arm"])
        if key not in last or r["actor_steps"] > last[key]["actor_steps"]:
            last[key] = r
    cell = lambda r: "" if r is None else f"{r['train_clock_s']:.0f}" + (f" ({r['load']})" if r.get("load") else "")
    lines = ["## Train seconds per run (in brackets: the 1-minute load average at the run's start-end)", "",
             "| task | seed | env steps | ours fp32 | ours int8 | Acme |", "|---|---:|---:|---:|---:|---:|"]
    for task, seed in sorted({(t, s) for t, s, _ in last}):
        runs = {arm: last.get((task, seed, arm)) for arm in ARMS}
        steps = max(r["actor_steps"] for r in runs.values() if r is not None)
        lines.append(f"| {task} | {seed} | {steps:,} | {cell(runs['fp32'])} | {cell(runs['int8'])} | "
                     f"{cell(runs['acme'])} |")
    return lines


def plot(curves: list[dict[str, Any]], path: Path) -> None:
    """Per task: return vs env steps (mean of the evaluation episodes, then Acme's first-episode protocol) and vs
    train seconds; curves are the mean over seeds with a ± standard error band, each column titled by what it
    plots, each env-step panel with the paired p-values ours vs Acme (mean return over the checkpoints, as the
    README quotes them), and the figure titled with the CPU."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    tasks = sorted({r["task"] for r in curves})
    panels = (("actor_steps", "return", "env steps", "vs env steps: mean of the evaluation episodes"),
              ("actor_steps", "return_first", "env steps", "vs env steps: first episode (Acme's protocol)"),
              ("train_clock_s", "return", "train seconds", "vs train seconds: mean of the evaluation episodes"))
    auc = {(r["task"], r["arm"], r["protocol"]): r for r in auc_tests(curves)}
    fig, axes = plt.subplots(len(tasks), len(panels), figsize=(5.2 * len(panels), 3.9 * len(tasks) + 0.5),
                             squeeze=False)
    colors = {"fp32": "tab:blue", "int8": "tab:orange", "acme": "tab:green"}
    for row, task in enumerate(tasks):
        for col, (x_key, y_key, x_label, what) in enumerate(panels):
            ax = axes[row][col]
            for arm in ARMS:
                runs = {}
                for r in curves:
                    if (r["task"], r["arm"]) == (task, arm):
                        runs.setdefault(r["seed"], []).append(r)
                if not runs:
                    continue
                steps = sorted(set.intersection(*(set(x["actor_steps"] for x in v) for v in runs.values())))
                table = {s: {x["actor_steps"]: x for x in v} for s, v in runs.items()}
                y = np.array([[table[s][st][y_key] for st in steps] for s in runs])
                x = np.array([[table[s][st][x_key] for st in steps] for s in runs]).mean(axis=0)
                se = y.std(axis=0, ddof=1) / np.sqrt(len(runs)) if len(runs) > 1 else np.zeros(len(steps))
                label = f"{'Acme' if arm == 'acme' else 'ours ' + arm} (n={len(runs)} seeds)"
                ax.plot(x, y.mean(axis=0), color=colors[arm], label=label, zorder=3)
                ax.fill_between(x, y.mean(axis=0) - se, y.mean(axis=0) + se, color=colors[arm], alpha=0.15, lw=0)
            title = f"{task} {what}"
            if x_key == "actor_steps":
                ps = [f"{arm} p={auc[(task, arm, y_key)]['p_t']:.2f}" for arm in OUR_ARMS if (task, arm, y_key) in auc]
                title += "\nours vs Acme, mean over checkpoints, paired t: " + ", ".join(ps) if ps else ""
            ax.set_title(title, fontsize=9)
            ax.set_xlabel(x_label)
            ax.set_ylabel("return")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    cpus = sorted({str(r.get("cpu") or "") for r in curves} - {""}) or ["CPU not recorded"]
    fig.suptitle(f"Fidelity to Acme's D4PG on {'; '.join(cpus)}: mean over seeds, band ± standard error over "
                 "seeds", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(runs: Path, out: Path, command_line: str) -> str:
    curves = load_curves(runs, out / "fidelity_curves.csv")
    if not curves:
        raise UsageError(f"no finished runs under {str(runs)!r}")
    out.mkdir(parents=True, exist_ok=True)
    tests, aucs = paired_tests(curves), auc_tests(curves)
    _write_csv(out / "fidelity_curves.csv", curves)
    if tests:
        _write_csv(out / "fidelity_tests.csv", tests)
    # Run sessions (machine, load at start and end) of this runs folder and of earlier parts, each once.
    sessions = read_json_list(out / "fidelity_sessions.json")
    sessions += [m for m in read_json_list(runs / MACHINE_FILE) if m not in sessions]
    write_json(out / "fidelity_sessions.json", sessions, newline=False)
    text = markdown(curves, tests, aucs, command_line, sessions)
    (out / "fidelity.md").write_text(text, encoding="utf-8")
    plot(curves, out / "fidelity.png")
    return text


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
