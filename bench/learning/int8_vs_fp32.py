"""Learning benchmark: full-size single-process runs, fp32 actors vs int8 actors, same seeds, side by side.

    python -m bench.learning.int8_vs_fp32 [--rows dqn|d4pg|all] [--tasks CartPole-v1,...] [--seeds 0,1,2]
                             [--precisions fp32,int8] [--full-curves] [--quick] [--out DIR]

Every run is `launch.experiments.run_experiment.run_experiment` (the learner is fp32 either way; only the actors' weights
and arithmetic change with the precision). A run stops at its first evaluation that reaches the row's target
(unless --full-curves), so "steps/seconds to target" are comparable across precisions; seeds and precisions
are interleaved so that load from other processes on a shared machine hits both alike.

Writes DIR/learning_<rows>.csv (one line per run), DIR/learning_<rows>_curves.csv (every evaluation),
DIR/learning_<rows>.md (summary table) and DIR/learning_<rows>.png (curves); per-run logs go under
runs/bench/learning/. The full run writes to results/bench; --quick (CartPole only, one seed, small budget)
writes to runs/bench/learning-quick so it never overwrites committed results.

Other agents add their rows with `register_rows(name, rows)` (or a module `bench.learning_<name>` that
defines `ROWS`, imported on demand for `--rows <name>`), then `main(["--rows", name])` or `run_rows(...)`.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from agents.dqn.config import task_overrides as dqn_task_overrides
from bench.harness.machine import add_allow_busy, refuse_if_busy

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "bench"
RUNS = REPO / "runs" / "bench"


@dataclasses.dataclass(frozen=True)
class LearningRow:
    """One benchmark task: an agent, its config overrides, a budget and the return that counts as solved."""

    agent: str
    task: str
    target: float
    max_actor_steps: int
    eval_every: int
    eval_episodes: int = 10
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""


# DQN on gym classic control. Targets: CartPole-v1's "solved" 475, Acrobot-v1 -100 and MountainCar-v0 -130
# (returns averaged over the evaluation episodes). Budgets are rl-zoo3's for its tuned DQN (n_timesteps: 50k,
# 100k, 120k env steps), so bench.peers.offpolicy compares final returns at equal env steps. Each task runs with its settings
# from agents.dqn.config.task_overrides ({} where the defaults suit it); MountainCar's reward is sparse, so it
# takes rl-baselines3-zoo's MountainCar settings (faster learning rate, gamma 0.98, small replay, longer
# exploration), with its observation bounds mapped onto [-1, 1] and the learning rate decaying over the run.
DQN_ROWS: tuple[LearningRow, ...] = (
    LearningRow("dqn", "CartPole-v1", 475.0, 50_000, 2_500, overrides=dqn_task_overrides("CartPole-v1")),
    LearningRow("dqn", "Acrobot-v1", -100.0, 100_000, 2_500, overrides=dqn_task_overrides("Acrobot-v1")),
    LearningRow("dqn", "MountainCar-v0", -130.0, 120_000, 2_500, overrides=dqn_task_overrides("MountainCar-v0"),
                note="rl-baselines3-zoo hyper-parameters"),
)
QUICK_ROWS: tuple[LearningRow, ...] = (LearningRow("dqn", "CartPole-v1", 150.0, 15_000, 2_500, 5),)

_ROW_SETS: dict[str, tuple[LearningRow, ...]] = {"dqn": DQN_ROWS}


def register_rows(name: str, rows: Sequence[LearningRow]) -> None:
    """Makes `rows` runnable as `--rows <name>` (and part of `--rows all`)."""
    if not name.isidentifier():
        raise ValueError(f"row set name must be an identifier, got {name!r}")
    if not rows or not all(isinstance(r, LearningRow) for r in rows):
        raise ValueError("rows must be a non-empty sequence of LearningRow")
    _ROW_SETS[name] = tuple(rows)


def row_set(name: str) -> tuple[LearningRow, ...]:
    """Registered rows, or `bench.learning_<name>.ROWS` imported on demand."""
    if name not in _ROW_SETS:
        try:
            module = importlib.import_module(f"bench.learning_{name}")
        except ModuleNotFoundError:
            raise ValueError(f"unknown row set {name!r}; known: {', '.join(sorted(_ROW_SETS))}") from None
        register_rows(name, module.ROWS)
    return _ROW_SETS[name]


def empty_run_dir(logdir: Path) -> Path:
    """Removes a benchmark run's folder left by an earlier sitting, so its run starts empty: run logs are
    append-only (a resumed run continues them), and a rerun into the old folder would read the old run's
    evaluations ahead of its own."""

    if Path(logdir).exists():
        shutil.rmtree(logdir)
    return Path(logdir)


def run_one(row: LearningRow, precision: str, seed: int, *, logdir: Path, stop_at_target: bool = True,
            backend: str = "auto", learner_device: str = "auto",
            max_train_s: float | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One training run; returns its result line and its evaluation curve. With `max_train_s` the run also ends at
    its first evaluation at or past that many training seconds (a wall-clock budget that still ends on an
    evaluation, so the result has its last return).

    The run starts in an empty `logdir`: a benchmark's earlier run there is removed first. Its logs are append-only
    (a resumed run continues them), so a rerun into the same folder would otherwise read the old run's evaluations
    ahead of its own (first solve from one run, last evaluations from the other)."""
    from launch.experiments.run_experiment import run_experiment  # pylint: disable=import-outside-toplevel
    from launch.experiments.config import ExperimentConfig  # pylint: disable=import-outside-toplevel

    reached: dict[str, Any] = {}

    def on_eval(ev: dict[str, Any]) -> bool:
        if not reached and ev["return"] >= row.target:
            reached.update(ev)
        over_budget = max_train_s is not None and ev["train_clock_s"] >= max_train_s
        return (stop_at_target and bool(reached)) or over_budget

    empty_run_dir(logdir)
    config = ExperimentConfig(agent=row.agent, task=row.task, precision=precision, backend=backend,
                              max_actor_steps=row.max_actor_steps, seed=seed, logdir=str(logdir),
                              eval_every=row.eval_every, eval_episodes=row.eval_episodes,
                              overrides=dict(row.overrides), learner_device=learner_device)
    s = run_experiment(config, progress=False, energy=False, on_eval=on_eval)
    rt = s["runtime"]
    result = {
        "agent": row.agent, "task": row.task, "precision": s["precision"], "backend": s["actors"][0]["backend"],
        "seed": seed,
        "target": row.target, "solved": bool(reached),
        "steps_to_target": reached.get("actor_steps"), "train_s_to_target": reached.get("train_clock_s"),
        "final_return": s["final_eval_return"], "best_return": s["best_eval_return"],
        "actor_steps": s["actor_steps"], "learner_steps": s["learner_steps"], "train_s": s["train_clock_s"],
        "env_steps_per_s": round(s["actor_steps"] / max(s["train_clock_s"], 1e-9), 1),
        "learner_device": (s.get("learner_device") or {}).get("platform"),  # where it ran, read in its process
        "payload_bytes": s["payload_bytes"], "payload_bytes_fp32": s["payload_bytes_fp32"],
        # Column names kept from earlier results files: "pull" here is the learner's quantize + encode.
        "pull_ms_per_update": rt["per_update"]["quantize_encode_ms"],
        "load_ms_per_update": rt["per_update"]["load_ms"],
        "inference_us_per_step": rt["per_step"]["policy_us"], "logdir": _relative(logdir),
    }
    with open(logdir / "evaluator.csv", newline="", encoding="utf-8") as f:
        curve = [{"agent": row.agent, "task": row.task, "precision": s["precision"], "seed": seed,
                  "actor_steps": int(r["actor_steps"]), "train_clock_s": float(r["train_clock_s"]),
                  "return": float(r["return"])} for r in csv.DictReader(f)]
    return result, curve


def run_rows(rows: Sequence[LearningRow], *, name: str, seeds: Sequence[int], precisions: Sequence[str],
             outdir: Path, runs_dir: Path, stop_at_target: bool = True, backend: str = "auto",
             command: str = "") -> list[dict]:
    """Runs every (row, seed, precision), interleaved, and writes the CSVs, the table and the plot."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    load_start = os.getloadavg()[0]
    results, curves = [], []
    for seed in seeds:
        for row in rows:
            for precision in precisions:
                logdir = runs_dir / f"{stamp}-{name}" / f"{row.agent}_{row.task.replace(':', '-')}_{precision}_s{seed}"
                result, curve = run_one(row, precision, seed, logdir=logdir, stop_at_target=stop_at_target,
                                        backend=backend)
                results.append(result)
                curves.extend(curve)
                print(f"{row.task:16s} {precision:5s} seed {seed}: solved={result['solved']!s:5s} "
                      f"steps={result['steps_to_target']} train_s={result['train_s_to_target']} "
                      f"best={result['best_return']:.1f} ({result['env_steps_per_s']:.0f} env steps/s)",
                      flush=True)
    outdir.mkdir(parents=True, exist_ok=True)
    _write_csv(outdir / f"learning_{name}.csv", results)
    _write_csv(outdir / f"learning_{name}_curves.csv", curves)
    from bench.harness.machine import cpu_model  # pylint: disable=import-outside-toplevel
    machine = (f"{cpu_model()}, {os.cpu_count()} logical cores; load average {load_start:.1f} at the start and "
               f"{os.getloadavg()[0]:.1f} at the end of the benchmark")
    (outdir / f"learning_{name}.md").write_text(markdown_table(results, rows, name, command, machine),
                                                encoding="utf-8")
    plot_curves(curves, rows, outdir / f"learning_{name}.png", machine=f"{cpu_model()}, {os.cpu_count()} cores")
    return results


def _relative(path: Path) -> str:
    """Paths inside the repository are recorded relative to it (results files travel between machines)."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(v: float | None, digits: int = 0) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def markdown_table(results: list[dict], rows: Sequence[LearningRow], name: str, command: str = "",
                   machine: str = "") -> str:
    """Per task and precision: seeds solved, median steps and train-seconds to target, returns, payload size;
    then, per task, the int8/fp32 ratios of those medians."""
    command = command or f"python -m bench.learning.int8_vs_fp32 --rows {name}"
    lines = [
        f"# Learning benchmark: {name}",
        "",
        f"`{command}`, {time.strftime('%Y-%m-%d')}. Single-process runs (`launch.experiments.run_experiment`): fp32 learner, "
        "actors at the listed precision pulling weights as encoded payloads. A run stops at its first evaluation "
        "(mean over the row's evaluation episodes, greedy actor at the deployed precision) reaching the target. "
        "Medians over seeds that reached it; train seconds exclude evaluation time. On a shared machine "
        "seconds are inflated and noisy, steps are not" + (f" ({machine})." if machine else "."),
        "",
        "| task | precision | target | solved | median steps to target | median train s to target | "
        "final return (mean) | best return (mean) | payload KB | fp32 payload / this |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        by_prec: dict[str, list[dict]] = {}
        for r in results:
            if r["agent"] == row.agent and r["task"] == row.task:
                by_prec.setdefault(r["precision"], []).append(r)
        for prec, rs in by_prec.items():
            solved = [r for r in rs if r["solved"]]
            lines.append(
                f"| {row.task} | {prec} | {row.target:g} | {len(solved)}/{len(rs)} | "
                f"{_fmt(_median([r['steps_to_target'] for r in solved]))} | "
                f"{_fmt(_median([r['train_s_to_target'] for r in solved]), 1)} | "
                f"{_fmt(statistics.mean(r['final_return'] for r in rs), 1)} | "
                f"{_fmt(statistics.mean(r['best_return'] for r in rs), 1)} | "
                f"{rs[0]['payload_bytes'] / 1024:.1f} | {rs[0]['payload_bytes_fp32'] / rs[0]['payload_bytes']:.2f}x |")
    ratios = []
    for row in rows:
        med: dict[str, tuple[float | None, float | None]] = {}
        for prec in ("fp32", "int8"):
            solved = [r for r in results if r["agent"] == row.agent and r["task"] == row.task
                      and r["precision"] == prec and r["solved"]]
            med[prec] = (_median([r["steps_to_target"] for r in solved]),
                         _median([r["train_s_to_target"] for r in solved]))
        if all(v is not None for pair in med.values() for v in pair):
            (s8, t8), (s32, t32) = med["int8"], med["fp32"]
            ratios.append(f"| {row.task} | {s8 / s32:.2f} | {t8 / t32:.2f} |")
    if ratios:
        lines += ["", "int8 actors relative to fp32 actors (median over solved seeds; < 1: int8 got there sooner):", "",
                  "| task | steps to target, int8 / fp32 | train s to target, int8 / fp32 |", "|---|---:|---:|",
                  *ratios]
    lines += paired_steps(results, rows)
    tuned = [f"- {row.agent} {row.task}: " + ", ".join(f"{k}={v}" for k, v in row.overrides.items())
             + (f" ({row.note})" if row.note else "") for row in rows if row.overrides]
    lines += ["", "Configs are the agents' defaults" + (", except:" if tuned else "."), *([""] + tuned if tuned else [])]
    lines += ["", "Per-run lines: `learning_" + name + ".csv`; every evaluation: `learning_" + name + "_curves.csv`; "
              "curves: `learning_" + name + ".png`.", ""]
    return "\n".join(lines)


def paired_test(diffs: Sequence[float]) -> float | None:
    """Two-sided paired t-test p-value of per-seed differences (None below 2 pairs or with no spread)."""
    if len(diffs) < 2 or statistics.pstdev(diffs) == 0:
        return None
    from scipy import stats  # pylint: disable=import-outside-toplevel

    return float(stats.ttest_1samp(list(diffs), 0.0).pvalue)


def paired_steps(results: list[dict], rows: Sequence[LearningRow]) -> list[str]:
    """Per task, seed by seed: int8 minus fp32 steps to target, how many seeds went each way, paired t-test.

    Medians alone hide direction: a ratio near 1 can come from int8 needing more steps on every seed."""
    out = []
    for row in rows:
        by = {(r["precision"], int(r["seed"])): r for r in results if r["agent"] == row.agent and r["task"] == row.task}
        seeds = sorted({s for p, s in by if (("fp32", s) in by and ("int8", s) in by)})
        pairs = [(s, by[("fp32", s)], by[("int8", s)]) for s in seeds]
        if not pairs:
            continue
        both = [(s, int(b["steps_to_target"]) - int(a["steps_to_target"])) for s, a, b in pairs
                if a["solved"] and b["solved"]]
        diffs = [d for _, d in both]
        p = paired_test(diffs)
        per_seed = ", ".join(f"seed {s}: {d:+,}" for s, d in both)
        unsolved = len(pairs) - len(both)
        out.append(f"| {row.task} | {len(both)} | {sum(d > 0 for d in diffs)} / {sum(d < 0 for d in diffs)} / "
                   f"{sum(d == 0 for d in diffs)} | {f'{statistics.mean(diffs):+,.0f}' if diffs else '—'} | "
                   f"{'—' if p is None else f'{p:.2f}'} | {per_seed or '—'}"
                   + (f" ({unsolved} seed(s) unsolved at a precision, left out)" if unsolved else "") + " |")
    if not out:
        return []
    return ["", "Paired by seed (seeds solved at both precisions): int8 minus fp32 env steps to target; seeds where "
                "int8 needed more / fewer / the same steps; two-sided paired t-test over those seeds:", "",
            "| task | seeds paired | int8 more / fewer / same | mean int8 - fp32 steps | paired p | per seed |",
            "|---|---:|---:|---:|---:|---|", *out]


def plot_curves(curves: list[dict], rows: Sequence[LearningRow], path: Path, *, machine: str = "") -> None:
    """One panel per task: every seed's evaluation curve (the spread is the seeds themselves, no band), coloured
    by precision, with the target line; the title names the machine and what a point is."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.8), squeeze=False)
    colors = {"fp32": "tab:blue", "int8": "tab:orange"}
    for ax, row in zip(axes[0], rows):
        mine = [c for c in curves if c["agent"] == row.agent and c["task"] == row.task]
        runs = sorted({(c["precision"], c["seed"]) for c in mine})
        labelled = set()
        for prec, seed in runs:
            pts = [(c["actor_steps"], c["return"]) for c in mine if c["precision"] == prec and c["seed"] == seed]
            color = colors.get(prec)
            ax.plot(*zip(*pts), color=color, alpha=0.8, lw=1.3, marker=".", ms=3,
                    label=prec if prec not in labelled else None)
            labelled.add(prec)
        ax.axhline(row.target, color="grey", ls="--", lw=1, label=f"target {row.target:g}")
        ax.set_title(f"{row.agent.upper()} {row.task}")
        ax.set_xlabel("actor steps")
        ax.set_ylabel("evaluation return")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
    seeds = len({c["seed"] for c in curves})
    fig.suptitle(f"bench.learning.int8_vs_fp32 on {machine or 'a machine the run did not record'}: one line per seed "
                 f"({seeds} seeds), each point the mean return of one evaluation's greedy episodes", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.learning.int8_vs_fp32", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="dqn", help="row set: dqn, d4pg, ... or all")
    p.add_argument("--tasks", default=None, help="comma-separated subset of the row set's tasks")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--precisions", default="fp32,int8")
    p.add_argument("--backend", default="auto")
    p.add_argument("--full-curves", action="store_true", help="run every budget to the end (no stop at target)")
    p.add_argument("--quick", action="store_true", help="CartPole only, seed 0, small budget (a smoke run)")
    p.add_argument("--out", default=None)
    p.add_argument("--report-only", action="store_true",
                   help="redraw OUT/learning_<rows>.png from its _curves.csv (training nothing); --machine names it")
    p.add_argument("--machine", default="", help="with --report-only: the machine the runs ran on")
    add_allow_busy(p)
    args = p.parse_args(argv)
    if args.report_only:
        outdir = Path(args.out) if args.out else RESULTS
        curves = _read_curves(outdir / f"learning_{args.rows}_curves.csv")
        tasks = {(c["agent"], c["task"]) for c in curves}
        rows = tuple(r for r in row_set(args.rows) if (r.agent, r.task) in tasks)
        plot_curves(curves, rows, outdir / f"learning_{args.rows}.png", machine=args.machine)
        print(f"redrew {outdir}/learning_{args.rows}.png")
        return 0
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        precisions = [s.strip() for s in args.precisions.split(",") if s.strip()]
        if args.quick:
            name, rows, seeds = "quick", QUICK_ROWS, seeds[:1]
        elif args.rows == "all":
            name = "all"
            rows = tuple(r for n in sorted(set(_ROW_SETS) | {"d4pg"}) for r in _try_row_set(n))
        else:
            name, rows = args.rows, row_set(args.rows)
        if args.tasks:
            wanted = {t.strip() for t in args.tasks.split(",")}
            unknown = wanted - {r.task for r in rows}
            if unknown:
                raise ValueError(f"tasks {sorted(unknown)} are not in row set {name!r}")
            rows = tuple(r for r in rows if r.task in wanted)
        if not seeds or min(seeds) < 0 or not precisions:
            raise ValueError("need at least one non-negative seed and one precision")
    except ValueError as e:
        sys.stderr.write(f"bench.learning.int8_vs_fp32: error: {e}\n")
        return 2
    refuse_if_busy(p, args.allow_busy)
    outdir = Path(args.out) if args.out else (RUNS / "learning-quick" if args.quick else RESULTS)
    run_rows(rows, name=name, seeds=seeds, precisions=precisions, outdir=outdir, runs_dir=RUNS / "learning",
             stop_at_target=not args.full_curves, backend=args.backend,
             command=" ".join(["python -m bench.learning.int8_vs_fp32", *(argv if argv is not None else sys.argv[1:])]))
    print(f"wrote {outdir}/learning_{name}.{{csv,md,png}}")
    return 0


def _read_curves(path: Path) -> list[dict]:
    """A learning_<rows>_curves.csv back as the curve dicts `plot_curves` takes."""
    with open(path, newline="", encoding="utf-8") as f:
        return [{**r, "seed": int(r["seed"]), "actor_steps": int(float(r["actor_steps"])),
                 "return": float(r["return"])} for r in csv.DictReader(f)]


def _try_row_set(name: str) -> tuple[LearningRow, ...]:
    try:
        return row_set(name)
    except ValueError:
        return ()


if __name__ == "__main__":
    # Run the importable `bench.learning.int8_vs_fp32`, not this `__main__` copy of it: row modules (bench.learning_<name>)
    # build their rows from bench.learning.int8_vs_fp32.LearningRow, the class register_rows checks against.
    from bench.learning.int8_vs_fp32 import main as _main  # pylint: disable=import-self
    sys.exit(_main())
