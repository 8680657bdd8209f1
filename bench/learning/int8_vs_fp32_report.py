"""The learning benchmark's report: the summary table (`markdown_table`, with the seed-paired steps to target
of `paired_steps`) and the figure of every evaluation curve (`plot_curves`), drawn from the result lines and
curves that `bench.learning.int8_vs_fp32` writes as CSV (`read_curves` reads the curves back). Used by that
benchmark and by bench.learning.d4pg_rows, which merges separate invocations into one report.
"""
from __future__ import annotations

import csv
import statistics
import time
from pathlib import Path
from typing import Sequence

from bench.harness.learning_runs import paired_test
from bench.harness.results_io import save_figure
from bench.harness.rows import LearningRow


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
    save_figure(fig, path, dpi=110)


def read_curves(path: Path) -> list[dict]:
    """A learning_<rows>_curves.csv back as the curve dicts `plot_curves` takes."""
    with open(path, newline="", encoding="utf-8") as f:
        return [{**r, "seed": int(r["seed"]), "actor_steps": int(float(r["actor_steps"])),
                 "return": float(r["return"])} for r in csv.DictReader(f)]
