"""Run folders as data: the paper's panels, reading each run's summary.json and evaluator.csv into one row per
run, and evaluation curves on a common grid.

Shared by `launch.reproduce` (which writes figure.png, speedup.csv, carbon.csv, grid.csv, report.md) and the
notebooks under notebooks/, so a number in a notebook and in report.md always come from the same code.

Both runners write one summary.json layout (`analysis.schema.SUMMARY_KEYS`, described in docs/ARCHITECTURE.md);
it is flattened into one row per run, a value a run does not have (None) becoming NaN. Summaries written by the
single-process runner before that layout existed are rewritten once with `python -m analysis.upgrade_summaries
DIR`.

Definitions used throughout:
- target return of a panel: `R - (1 - fraction) * |R|`, R = mean over seeds of the baseline's (fp32) final
  evaluation return. For positive R this is `fraction * R` (the paper's "90% of fp32"); the |R| form keeps
  the target reachable for tasks whose returns are negative (MountainCar, Acrobot).
- time of an evaluation (`time_s`): the training clock, evaluator.csv's `train_clock_s` (both runners write one
  evaluator.csv layout, `launch.experiments.acting.EVAL_FIELDS`): the single-process runner's clock without its evaluations,
  and in a distributed run, whose evaluator works on the side, the wall clock. Runs written before that layout
  (a distributed evaluator.csv had no `train_clock_s`) still read: their time is `wall_clock_s`.
- time to target of a run: the time of its first evaluation whose mean return reaches the target
  (evaluations are discrete, so this is an upper bound by at most one evaluation period).
- speedup of a precision: mean baseline time to target / mean time to target of that precision, each mean
  over the seeds that reached the target.
- energy to target: the run's energy scaled by (wall clock at the target) / (run time), i.e. constant
  average power over the whole run, evaluations included.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path
from typing import Iterable, Mapping, cast

import numpy as np
import pandas as pd

from analysis.execution import run_execution
from analysis.schema import Summary
from quarl.quant.precision import find_precision


# ------------------------------------------------------------------------------------------------ panels


@dataclasses.dataclass(frozen=True)
class Panel:
    """One subplot of the paper's figure: an agent on a task."""

    name: str
    agent: str
    task: str


# The paper's figure, in its order: D4PG on DM Control, then DQN on gym classic control.
PANELS: dict[str, Panel] = {p.name: p for p in (
    Panel("cartpole_balance", "d4pg", "cartpole:balance"),
    Panel("walker_stand", "d4pg", "walker:stand"),
    Panel("hopper_stand", "d4pg", "hopper:stand"),
    Panel("reacher_hard", "d4pg", "reacher:hard"),
    Panel("finger_spin", "d4pg", "finger:spin"),
    Panel("cheetah_run", "d4pg", "cheetah:run"),
    Panel("humanoid_stand", "d4pg", "humanoid:stand"),
    Panel("humanoid_walk", "d4pg", "humanoid:walk"),
    Panel("CartPole", "dqn", "CartPole-v1"),
    Panel("MountainCar", "dqn", "MountainCar-v0"),
    Panel("Acrobot", "dqn", "Acrobot-v1"),
)}
_PANEL_OF_TASK = {p.task: p.name for p in PANELS.values()}

BASELINE = "fp32"
STAGES = ("env_step_s", "policy_s", "pull_s", "deserialize_s", "load_s")  # the paper's runtime breakdown
STAGE_LABELS = {"env_step_s": "env step", "policy_s": "policy inference", "pull_s": "pull (fetch weights)",
                "deserialize_s": "deserialize", "load_s": "load weights"}
_SEED_DIR = re.compile(r"^seed(\d+)$")


def precision_order(name: str) -> tuple[int, int]:
    """Sort key: fp32, bf16, fp16, then integer precisions from the widest to the narrowest."""
    prec = find_precision(name)
    return prec.sort_key if prec is not None else (3, 0)


def panel_order(name: str) -> tuple[int, str]:
    names = list(PANELS)
    return (names.index(name), "") if name in PANELS else (len(names), str(name))


def precision_color(name: str) -> str:
    """Fixed colours so a precision looks the same in every figure."""
    fixed = {"fp32": "black", "bf16": "tab:brown", "fp16": "tab:green", "int16": "tab:purple",
             "int8": "tab:blue", "int4": "tab:red", "int2": "tab:orange"}
    return fixed.get(name, "tab:gray")


# ------------------------------------------------------------------------------------------------ loading


def _num(value: object) -> float:
    """A finite float, or NaN for anything missing or unusable (None, strings, inf from a crashed run)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str, np.generic)):
        return math.nan
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan


def read_summary(run_dir: str | os.PathLike) -> Summary | None:
    """summary.json of a run (`analysis.schema.Summary`), or None when it is absent or unreadable (an interrupted
    run). A summary of an older layout may lack keys (`python -m analysis.upgrade_summaries` adds them), so readers
    `get` what they read and check it."""
    path = Path(run_dir) / "summary.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cast(Summary, data) if isinstance(data, dict) else None


def is_finished(summary: Summary | None) -> bool:
    """A run counts as done when its summary exists and reports it completed (not failed or interrupted)."""
    return summary is not None and summary.get("status") == "completed"


def read_evaluator(run_dir: str | os.PathLike) -> pd.DataFrame:
    """evaluator.csv sorted by wall clock, with numeric actor_steps, wall_clock_s, time_s and return columns.

    `time_s` is train_clock_s (wall_clock_s in a run written before the one layout; see the module doc). Rows
    with a non-finite return are dropped; a missing file gives an empty frame with those columns."""
    path = Path(run_dir) / "evaluator.csv"
    cols = ["actor_steps", "wall_clock_s", "return"]
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame(columns=[*cols, "time_s"], dtype=float)
    df = pd.read_csv(path)
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: evaluator.csv lacks column(s) {', '.join(missing)}")
    for c in df.columns:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df = df[np.isfinite(df["return"]) & np.isfinite(df["wall_clock_s"])].copy()
    if "train_clock_s" not in df.columns:  # the distributed layout before launch.experiments.acting.EVAL_FIELDS
        df["train_clock_s"] = df["wall_clock_s"]
    train = df["train_clock_s"]
    df["time_s"] = train if np.isfinite(train).all() else df["wall_clock_s"]
    return df.sort_values(["wall_clock_s", "actor_steps"], kind="stable").reset_index(drop=True)


def _runtime(summary: Summary) -> dict[str, float]:
    """Seconds per stage over the run (summed over actors): runtime.summed_s."""
    runtime = summary.get("runtime")
    summed = runtime.get("summed_s") if isinstance(runtime, Mapping) else None
    return {k: _num(summed.get(k)) if isinstance(summed, Mapping) else math.nan for k in STAGES}


def _nansum(values: Iterable[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(sum(finite)) if finite else math.nan


def _energy(summary: Summary) -> tuple[float, float, str | None]:
    """(kWh, kg CO2eq, method): the totals over the run's nodes (`analysis.schema.sum_energy`)."""
    e = summary.get("energy")
    if not isinstance(e, Mapping):
        return math.nan, math.nan, None
    method = e.get("method")
    return _num(e.get("total_kwh")), _num(e.get("total_emissions_kg")), method if isinstance(method, str) else None


def _ram_kwh(summary: Summary) -> float:
    """kWh from codecarbon's RAM model (a model, not a measurement), summed over the run's nodes."""
    e = summary.get("energy")
    by_node = e.get("nodes") if isinstance(e, Mapping) else None
    nodes = [n for n in by_node.values() if isinstance(n, Mapping)] if isinstance(by_node, Mapping) else []
    return _nansum(_num(n.get("ram_kwh")) for n in nodes) if nodes else math.nan


def describe_method(method: object, cores: object = None) -> object:
    """A recorded energy method, with codecarbon's default TDP named a default.

    Runs recorded before quarl.ops.carbon said so wrote "CPU TDP power model (X W)"; when X is codecarbon's default
    for a CPU it does not know (4 W per thread), say that it is this default, not the CPU's TDP."""
    if not isinstance(method, str):
        return method
    threads = cores if isinstance(cores, int) and cores > 0 else (os.cpu_count() or 1)

    def fix(m: re.Match) -> str:
        watts = float(m.group(1))
        if abs(watts - 4.0 * threads) > 1e-9:
            return m.group(0)
        return (f"CPU TDP power model ({m.group(1)} W = codecarbon's default of 4 W per thread for a CPU it does "
                "not know, not this CPU's TDP)")
    return re.sub(r"CPU TDP power model \(([0-9.]+) W\)", fix, method).replace("=estimated:", "=modelled:")


def _identity(run_dir: Path, root: Path, summary: Summary | None) -> tuple[str, str, int | None]:
    """(panel, precision, seed): from the reproduce layout <panel>/<precision>/seed<k> when the path has
    it, else from the summary (so any folder of runs can be read)."""
    parts = run_dir.relative_to(root).parts if run_dir != root else ()
    if len(parts) >= 3 and _SEED_DIR.match(parts[-1]):
        return parts[-3], parts[-2], int(_SEED_DIR.match(parts[-1]).group(1))
    s = summary if summary is not None else cast(Summary, {})
    task = str(s.get("task", run_dir.name))
    seed = s.get("seed")
    return (_PANEL_OF_TASK.get(task, task), str(s.get("precision", "unknown")),
            int(seed) if isinstance(seed, (int, float)) and not isinstance(seed, bool) else None)


def find_run_dirs(results_dir: str | os.PathLike) -> list[Path]:
    """Every folder under `results_dir` (itself included) that holds a summary.json or an evaluator.csv."""
    root = Path(results_dir)
    found = {p.parent for name in ("summary.json", "evaluator.csv") for p in root.rglob(name)}
    return sorted(found)


RUN_COLUMNS = ("panel", "precision", "seed", "finished", "status", "runner", "agent", "task", "num_actors",
               "backend", "executed", "actor_steps", "learner_steps", "wall_clock_s", "run_time_s", "final_return",
               "best_return", "evaluations", "payload_bytes", "payload_bytes_fp32", *STAGES, "energy_kwh",
               "emissions_kg", "ram_kwh", "energy_method", "run_dir")


def load_runs(results_dir: str | os.PathLike) -> pd.DataFrame:
    """One row per run folder under `results_dir` (a results/<name> folder, its runs/ or any folder of runs).

    `finished` is False for a run without a (successful) summary; such runs keep their identity and what
    evaluator.csv holds, so a grid's progress can be shown, but tables and the figure use finished runs only.
    `run_time_s` is the run's own clock (the distributed runner's evaluations share it; the driver's
    wall_clock_s also counts start-up and shutdown).
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise ValueError(f"results folder {str(root)!r} does not exist")
    rows = []
    for run_dir in find_run_dirs(root):
        summary = read_summary(run_dir)
        panel, precision, seed = _identity(run_dir, root, summary)
        s = summary if summary is not None else cast(Summary, {})
        evals = read_evaluator(run_dir)
        final = _num(s.get("final_eval_return"))
        if math.isnan(final) and len(evals):
            final = float(evals["return"].iloc[-1])
        best = _num(s.get("best_eval_return"))
        if math.isnan(best) and len(evals):
            best = float(evals["return"].max())
        kwh, kg, method = _energy(s)
        backend = s.get("backend")
        rows.append({
            "panel": panel, "precision": precision, "seed": seed, "finished": is_finished(summary),
            "status": s.get("status"), "runner": s.get("runner"), "agent": s.get("agent"), "task": s.get("task"),
            "num_actors": _num(s.get("num_actors")), "backend": ",".join(map(str, backend)) if backend else None,
            # what the actors executed, in words (from the summary's actor records when it predates the words)
            "executed": (s.get("executed") or run_execution(s)["executed"]) if summary else None,
            "actor_steps": _num(s.get("actor_steps")), "learner_steps": _num(s.get("learner_steps")),
            "wall_clock_s": _num(s.get("wall_clock_s")), "run_time_s": _num(s.get("run_wall_clock_s")),
            "final_return": final, "best_return": best, "evaluations": len(evals),
            "payload_bytes": _num(s.get("payload_bytes")), "payload_bytes_fp32": _num(s.get("payload_bytes_fp32")),
            **_runtime(s), "energy_kwh": kwh, "emissions_kg": kg, "ram_kwh": _ram_kwh(s), "energy_method": method,
            "run_dir": str(run_dir),
        })
    df = pd.DataFrame(rows, columns=list(RUN_COLUMNS))
    return sort_runs(df)


def sort_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Panels in the paper's order, precisions fp32 first, then seeds."""
    if df.empty:
        return df.reset_index(drop=True)
    key = df.apply(lambda r: (panel_order(r["panel"]), precision_order(r["precision"]),
                              -1 if r["seed"] is None or pd.isna(r["seed"]) else int(r["seed"])), axis=1)
    return df.iloc[sorted(range(len(df)), key=lambda i: key.iloc[i])].reset_index(drop=True)


def finished(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["finished"].astype(bool)] if len(runs) else runs


# ------------------------------------------------------------------------------------------------ curves


X_AXES = ("time_s", "wall_clock_s", "actor_steps")


def check_x(x: str) -> None:
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}, got {x!r}")


def curves(runs: pd.DataFrame, *, x: str = "time_s", points: int = 200) -> pd.DataFrame:
    """Return vs `x` (time_s, wall_clock_s or actor_steps) per panel and precision, aggregated over seeds.

    Each seed's evaluations are linearly interpolated onto a grid shared by the whole panel (0 .. the
    panel's last evaluation). A seed that finished before the slowest seed of its precision keeps its final
    return until then; before a seed's first evaluation it has no value, and a grid point is kept only when
    every seed of the precision has one, so mean/std/min/max are always over the same seeds.
    Columns: panel, precision, x, mean, std, min, max, seeds.
    """
    check_x(x)
    if points < 2:
        raise ValueError(f"points must be >= 2, got {points}")
    done = finished(runs)
    out = []
    for panel, prows in done.groupby("panel", sort=False):
        evals = {r.run_dir: read_evaluator(r.run_dir) for r in prows.itertuples()}
        evals = {k: v for k, v in evals.items() if len(v)}
        if not evals:
            continue
        grid = np.linspace(0.0, max(float(v[x].max()) for v in evals.values()), points)
        for precision, group in prows.groupby("precision", sort=False):
            series = [evals[d] for d in group["run_dir"] if d in evals]
            if not series:
                continue
            end = max(float(e[x].max()) for e in series)
            stacked = np.stack([_resample(e[x].to_numpy(float), e["return"].to_numpy(float), grid, end)
                                for e in series])
            keep = np.all(np.isfinite(stacked), axis=0)
            if not keep.any():
                continue
            v = stacked[:, keep]
            out.append(pd.DataFrame({"panel": panel, "precision": precision, "x": grid[keep],
                                     "mean": v.mean(0), "std": v.std(0), "min": v.min(0), "max": v.max(0),
                                     "seeds": len(series)}))
    cols = ["panel", "precision", "x", "mean", "std", "min", "max", "seeds"]
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=cols)


def _resample(t: np.ndarray, r: np.ndarray, grid: np.ndarray, end: float) -> np.ndarray:
    """Linear interpolation of (t, r) on `grid`; NaN before t[0] and after `end`, last value from t[-1] to end."""
    # Duplicate times (two evaluations logged at one clock reading) would make interp ill-defined: keep last.
    t_unique, idx = np.unique(t[::-1], return_index=True)
    r_unique = r[::-1][idx]
    values = np.interp(grid, t_unique, r_unique)
    values[(grid < t_unique[0]) | (grid > end)] = np.nan
    return values
