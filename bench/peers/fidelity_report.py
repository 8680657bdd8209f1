"""bench.peers.fidelity's runs read back and reported: every evaluation of the finished runs (and of an earlier
fidelity_curves.csv, so a benchmark split over sessions merges into one), the paired tests of ours against Acme
(per checkpoint, `paired_tests`; over the whole curve, `auc_tests`: an exact sign-flip permutation test and a
paired t-test), the page (`markdown`, `seconds_table`), the figure (`plot`) and the files `report` writes. Also the
layout of a run folder both sides share (`ARMS`, `finished`, `MACHINE_FILE`).
"""
from __future__ import annotations

import csv
import itertools
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from bench.harness.machine import bench_machine, describe_load
from bench.harness.results_io import save_figure, write_csv, write_json, write_text
from launch.cli import UsageError
from quarl.ops.io import read_json_list
from quarl.ops.machine import machine_fields

OUR_ARMS = ("fp32", "int8")
ARMS = OUR_ARMS + ("acme",)
PROTOCOLS = {"return": "mean of the evaluation episodes", "return_first": "first episode (Acme's protocol)"}


def finished(logdir: Path, arm: str) -> bool:
    return (logdir / ("done.json" if arm == "acme" else "summary.json")).exists()


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
    info = machine_fields(info)
    try:
        load = f"{float(info['load_start'][0]):.1f}-{float(info['load_end'][0]):.1f}"
    except (KeyError, TypeError, IndexError, ValueError):
        load = ""
    return str(info.get("cpu_model") or fallback), load


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


def markdown(curves: list[dict], tests: list[dict], aucs: list[dict], command_line: str,
             sessions: Sequence[dict[str, Any]] = ()) -> str:
    seeds = sorted({r["seed"] for r in curves})
    machine = bench_machine()
    loads = "; ".join(f"{machine_fields(m).get('cpu_model', 'unknown CPU')}: {describe_load(m)}" for m in sessions) \
        or "no run sessions recorded"
    cpus = sorted({r.get("cpu") or "not recorded" for r in curves})
    lines = [
        "# D4PG fidelity: this project vs Acme 0.4.0 (JAX D4PG), same settings, same seeds", "",
        f"`{command_line}`, {time.strftime('%Y-%m-%d')}, reported on {machine['cpu_model']}, {machine['cores']} cores, "
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
    save_figure(fig, path, dpi=110)


def report(runs: Path, out: Path, command_line: str) -> str:
    curves = load_curves(runs, out / "fidelity_curves.csv")
    if not curves:
        raise UsageError(f"no finished runs under {str(runs)!r}")
    out.mkdir(parents=True, exist_ok=True)
    tests, aucs = paired_tests(curves), auc_tests(curves)
    write_csv(out / "fidelity_curves.csv", curves)
    if tests:
        write_csv(out / "fidelity_tests.csv", tests)
    # Run sessions (machine, load at start and end) of this runs folder and of earlier parts, each once.
    sessions = read_json_list(out / "fidelity_sessions.json")
    sessions += [m for m in read_json_list(runs / MACHINE_FILE) if m not in sessions]
    write_json(out / "fidelity_sessions.json", sessions, newline=False)
    text = markdown(curves, tests, aucs, command_line, sessions)
    write_text(out / "fidelity.md", text)
    plot(curves, out / "fidelity.png")
    return text
