"""One report of a results folder (figure.png, speedup.csv, carbon.csv, runtime.csv/png, grid.csv, report.md),
for `launch.reproduce` and the notebooks; the analysis API is re-exported here so a notebook imports one module
and a number in a notebook and in report.md always come from the same code."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from quarl.ops.io import read_json_object
from quarl.ops.machine import machine_fields, machine_info

from analysis.plots import (
    BAND_MEANING, load_ptq, machine_label, plot_figure, plot_ptq, plot_runtime_breakdown, plot_weight_stats, pyplot,
)
from analysis.runs import (
    BASELINE, PANELS, RUN_COLUMNS, STAGES, Panel, curves, describe_method, find_run_dirs, finished, is_finished,
    load_runs, precision_order, read_evaluator, read_summary, sort_runs,
)
from analysis.tables import (
    carbon_ratio_table, carbon_table, markdown_table, panel_targets, runtime_breakdown_table, speedup_table,
    target_return, time_to_target, with_time_to_target,
)


# ------------------------------------------------------------------------------------------------ report


@dataclasses.dataclass
class ReportFiles:
    """Where `write_report` put its outputs."""

    figure: Path
    speedup: Path
    carbon: Path
    runtime: Path
    runtime_figure: Path
    grid: Path
    report: Path


def write_report(results_dir: str | os.PathLike, *, runs_dir: str | os.PathLike | None = None,
                 fraction: float = 0.9, plan: pd.DataFrame | None = None,
                 machine: Mapping[str, Any] | None = None, title: str | None = None,
                 notes: Iterable[str] = (), figure_title: str | None = None,
                 run_filter: Callable[[pd.DataFrame], pd.DataFrame] | None = None) -> ReportFiles:
    """Writes figure.png, runtime.png, speedup.csv, carbon.csv, runtime.csv, grid.csv and report.md into
    `results_dir`, from the runs under `runs_dir` (default results_dir/runs).

    `plan` (panel, precision, seed rows) adds the planned runs that have no folder yet to grid.csv as
    'pending'; `machine` defaults to results_dir/machine.json (written when the runs ran), else this machine;
    `run_filter` narrows the loaded runs (e.g. to one grid's panels); `figure_title` heads the figures (the
    machine is added to it).
    """
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs_root = Path(runs_dir) if runs_dir is not None else out / "runs"
    runs = load_runs(runs_root) if runs_root.is_dir() else pd.DataFrame(columns=list(RUN_COLUMNS))
    if run_filter is not None and len(runs):
        runs = run_filter(runs).reset_index(drop=True)
    files = ReportFiles(out / "figure.png", out / "speedup.csv", out / "carbon.csv", out / "runtime.csv",
                        out / "runtime.png", out / "grid.csv", out / "report.md")

    if machine is None:
        mfile = out / "machine.json"
        machine = read_json_object(mfile) or {**machine_info().to_json(), "note": "machine that drew the report "
                                                                                    "(the runs left no machine.json)"}
    machine = machine_fields(machine)  # a machine.json of any format, under the current keys
    cores = machine.get("cores")
    plt = pyplot()
    heading = f"{figure_title + ', ' if figure_title else ''}{machine_label(machine)}"
    plt.close(plot_figure(runs, fraction=fraction, title=heading, path=files.figure))
    speed = speedup_table(runs, fraction)
    speed.to_csv(files.speedup, index=False)
    carbon = carbon_table(runs, fraction)
    carbon["method"] = [describe_method(m, cores) for m in carbon["method"]]
    carbon.to_csv(files.carbon, index=False)
    ratios = carbon_ratio_table(carbon)
    runtime = runtime_breakdown_table(runs)
    runtime.to_csv(files.runtime, index=False)
    plt.close(plot_runtime_breakdown(runtime, title=heading, path=files.runtime_figure))
    grid = grid_table(runs, plan)
    grid["run_dir"] = [_relative(d, out) for d in grid["run_dir"]]  # a committed grid.csv must not name this disk
    grid.to_csv(files.grid, index=False)

    pct = int(round(100 * fraction))
    text = [f"# {title or 'ActorQ reproduction: ' + out.name}", ""]
    notes = list(notes)
    text += [*notes, ""] if notes else []
    text += ["![return vs wall clock](figure.png)", "",
             f"Curves: mean over seeds, {BAND_MEANING['sem']}, against the training clock (the single-process runner's "
             "clock without its own evaluations, else the wall clock), solid while every seed is running; past "
             "the first seed's end, dashed: the mean over the seeds still running (a cross marks each early "
             "seed's last evaluation); dotted line: "
             f"{pct}% of the fp32 final return (target = R - (1 - f)|R|, which is f*R for positive returns).", "",
             f"## Speedup: training time to reach {pct}% of the fp32 final return", "",
             "`time_to_target_s` is the mean over the seeds that reached the target (`seeds_reached` of `seeds`); "
             "seeds that never reached it are left out of the mean, so each speedup compares those subsets "
             "(`speedup_over_seeds`: this precision's seeds vs the fp32 seeds behind the ratio). `executed` is "
             "what the actors ran (\"int8 weights, fp32 compute (dequantized)\": `auto` picked the fp32 graph, no "
             "integer kernel); a row with a `speedup_note` is not its precision's kernel speedup and makes no "
             "int8 claim.", "",
             markdown_table(speed), "",
             "## Energy and carbon", "",
             "Ratios are fp32 / precision (> 1: the quantized run used less). *Same work*: energy per actor step "
             "(equal step budgets). *Same outcome*: energy scaled to the time to target "
             "(run energy x time-to-target / run time). `ram_model_share`: the part of each figure that comes "
             "from codecarbon's RAM power model; where it is large, energy ratios are mostly run-time ratios. "
             "Without RAPL the CPU part is modelled too (see the method).", "",
             markdown_table(ratios), "",
             "Per run (carbon.csv):", "",
             markdown_table(carbon[["panel", "precision", "seed", "run_time_s", "energy_kwh", "emissions_kg",
                                    "ram_model_share", "time_to_target_s", "kwh_to_target", "kg_to_target"]]), "",
             "## Actor runtime breakdown (ms per 1000 actor steps)", "",
             "![runtime breakdown](runtime.png)", "",
             *_runtime_note(runtime),
             markdown_table(runtime[["panel", "precision", "seeds",
                                     *[f"{s[:-2]}_ms_per_1k_steps" for s in STAGES]]]), "",
             "## Runs", "",
             f"{int(runs['finished'].sum()) if len(runs) else 0} finished of {len(grid)} in the grid "
             "(grid.csv lists every run and its state).", "",
             "## Machine", ""]
    text += [f"- {k}: {', '.join(f'{n} {v}' for n, v in value.items()) if isinstance(value, dict) else value}"
             for k, value in machine.items()]
    text += ["", "Energy method(s), as recorded by the runs:", ""]
    methods = sorted({str(describe_method(m, cores)) for m in runs["energy_method"].dropna()}) if len(runs) else []
    text += [f"- {m}" for m in methods] or ["- none recorded"]
    files.report.write_text("\n".join(text) + "\n", encoding="utf-8")
    return files


def _runtime_note(runtime: pd.DataFrame) -> list[str]:
    """The policy-call cost the table implies (ms per 1000 steps = µs per step), so prose can quote it."""
    col = "policy_ms_per_1k_steps"
    if col not in runtime or runtime[col].dropna().empty:
        return []
    values = runtime[col].dropna()
    return [f"ms per 1000 actor steps equal µs per step: a policy call (inference, with its batching and "
            f"conversion) cost {values.min():.0f}-{values.max():.0f} µs per step across these panels and "
            "precisions.", ""]


def _relative(path: Any, base: Path) -> Any:
    if not isinstance(path, str):
        return path
    try:  # runs beside a report (../../runs/... for a subset report) are named relative to it
        return os.path.relpath(Path(path).resolve(), base.resolve())
    except ValueError:  # another drive
        return path


def grid_table(runs: pd.DataFrame, plan: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every run (finished, failed/interrupted, or only planned) with its state and headline numbers."""
    cols = ["panel", "precision", "seed", "state", "final_return", "best_return", "run_time_s", "actor_steps",
            "learner_steps", "energy_kwh", "run_dir"]
    g = runs.copy()
    g["state"] = ["finished" if f else ("failed" if s in ("failed", "interrupted") else "incomplete")
                  for f, s in zip(g["finished"], g["status"])]
    g = g[cols] if len(g) else pd.DataFrame(columns=cols)
    if plan is not None and len(plan):
        have = {(p, q, int(s)) for p, q, s in zip(g["panel"], g["precision"], g["seed"]) if s is not None}
        missing = [{"panel": r.panel, "precision": r.precision, "seed": int(r.seed), "state": "pending"}
                   for r in plan.itertuples() if (r.panel, r.precision, int(r.seed)) not in have]
        if missing:
            g = pd.concat([g, pd.DataFrame(missing, columns=cols)], ignore_index=True)
    return sort_runs(g) if len(g) else g


__all__ = ["BASELINE", "PANELS", "Panel", "STAGES", "carbon_ratio_table", "carbon_table", "curves", "find_run_dirs",
           "finished", "grid_table", "is_finished", "load_ptq", "load_runs", "machine_info", "markdown_table",
           "panel_targets", "plot_figure", "plot_ptq", "plot_runtime_breakdown", "plot_weight_stats",
           "precision_order", "read_evaluator", "read_summary", "runtime_breakdown_table", "speedup_table",
           "target_return", "time_to_target", "with_time_to_target", "write_report"]
