"""Reads ActorQ run folders and turns them into the paper's figure and tables.

Shared by `launch.reproduce` (which writes figure.png, speedup.csv, carbon.csv, grid.csv, report.md) and the
notebooks under notebooks/, so a number in a notebook and in report.md always come from the same code.

Both runners' summary.json layouts are read (the single-process `launch.experiment` one and the distributed
`launch.actorq` one) and flattened into one row per run; keys a runner does not write become NaN/None
rather than errors, because results folders outlive the code that wrote them.

Definitions used throughout:
- target return of a panel: `R - (1 - fraction) * |R|`, R = mean over seeds of the baseline's (fp32) final
  evaluation return. For positive R this is `fraction * R` (the paper's "90% of fp32"); the |R| form keeps
  the target reachable for tasks whose returns are negative (MountainCar, Acrobot).
- time of an evaluation (`time_s`): the training clock. The single-process runner evaluates in its training
  loop and logs `train_clock_s`, its clock without the evaluations (a distributed run's evaluator works on
  the side and costs its learner and actors nothing); where that column is absent it is `wall_clock_s`.
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
import platform
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

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
STAGES = ("env_step_s", "inference_s", "pull_s", "deserialize_s", "load_s")  # the paper's runtime breakdown
STAGE_LABELS = {"env_step_s": "env step", "inference_s": "policy inference", "pull_s": "pull (quantize+encode)",
                "deserialize_s": "deserialize", "load_s": "load weights"}
_SEED_DIR = re.compile(r"^seed(\d+)$")


def precision_order(name: str) -> tuple[int, int]:
    """Sort key: fp32, bf16, fp16, then integer precisions from the widest to the narrowest."""
    if name == "fp32":
        return (0, 0)
    if name in ("bf16", "fp16"):
        return (1, 0 if name == "bf16" else 1)
    m = re.fullmatch(r"int(\d+)", str(name))
    return (2, -int(m.group(1))) if m else (3, 0)


def panel_order(name: str) -> tuple[int, str]:
    names = list(PANELS)
    return (names.index(name), "") if name in PANELS else (len(names), str(name))


def precision_color(name: str) -> str:
    """Fixed colours so a precision looks the same in every figure."""
    fixed = {"fp32": "black", "bf16": "tab:brown", "fp16": "tab:green", "int16": "tab:purple",
             "int8": "tab:blue", "int4": "tab:red", "int2": "tab:orange"}
    return fixed.get(name, "tab:gray")


# ------------------------------------------------------------------------------------------------ loading


def _num(value: Any) -> float:
    """A finite float, or NaN for anything missing or unusable (None, strings, inf from a crashed run)."""
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """summary.json of a run as a dict, or None when it is absent or unreadable (an interrupted run)."""
    path = Path(run_dir) / "summary.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_finished(summary: Mapping[str, Any] | None) -> bool:
    """A run counts as done when its summary exists and does not report a failure or interruption
    (the single-process runner writes no status: it only writes a summary when it finished)."""
    return summary is not None and str(summary.get("status", "completed")) == "completed"


def read_evaluator(run_dir: str | os.PathLike) -> pd.DataFrame:
    """evaluator.csv sorted by wall clock, with numeric actor_steps, wall_clock_s, time_s and return columns.

    `time_s` is train_clock_s where the runner logged it, else wall_clock_s (see the module doc). Rows with a
    non-finite return are dropped; a missing file gives an empty frame with those columns."""
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
    train = df["train_clock_s"] if "train_clock_s" in df.columns else None
    df["time_s"] = df["wall_clock_s"] if train is None or not np.isfinite(train).all() else train
    return df.sort_values(["wall_clock_s", "actor_steps"], kind="stable").reset_index(drop=True)


def _runtime(summary: Mapping[str, Any]) -> dict[str, float]:
    """Seconds per stage over the run; the distributed summary sums its actors under runtime.summed_s and
    calls inference policy_s."""
    rt = summary.get("runtime") or {}
    if isinstance(rt.get("summed_s"), Mapping):
        rt = dict(rt["summed_s"])
        rt.setdefault("inference_s", rt.get("policy_s"))
    return {k: _num(rt.get(k)) for k in STAGES}


def _nansum(values: Iterable[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(sum(finite)) if finite else math.nan


def _energy(summary: Mapping[str, Any]) -> tuple[float, float, str | None]:
    """(kWh, kg CO2eq, method): a quarl.carbon EnergyReport dict (single process) or the distributed
    runner's per-node totals."""
    e = summary.get("energy")
    if not isinstance(e, Mapping):
        return math.nan, math.nan, None
    if "total_kwh" in e or "nodes" in e:
        nodes = [n for n in (e.get("nodes") or {}).values() if isinstance(n, Mapping)]
        kwh, kg = _num(e.get("total_kwh")), _num(e.get("total_emissions_kg"))
        # Sum the per-node reports when a total is missing (older summaries did not total the CO2 key).
        if nodes and math.isnan(kwh):
            kwh = _nansum(_num(n.get("energy_kwh")) for n in nodes)
        if nodes and math.isnan(kg):
            kg = _nansum(_num(n.get("emissions_kg_co2eq", n.get("emissions_kg"))) for n in nodes)
        return kwh, kg, e.get("method")
    return _num(e.get("energy_kwh")), _num(e.get("emissions_kg_co2eq")), e.get("method")


def _ram_kwh(summary: Mapping[str, Any]) -> float:
    """kWh from codecarbon's RAM model (a model, not a measurement), summed over nodes for distributed runs."""
    e = summary.get("energy")
    if not isinstance(e, Mapping):
        return math.nan
    if "total_kwh" in e or "nodes" in e:
        nodes = [n for n in (e.get("nodes") or {}).values() if isinstance(n, Mapping)]
        return _nansum(_num(n.get("ram_kwh")) for n in nodes) if nodes else math.nan
    return _num(e.get("ram_kwh"))


def describe_method(method: Any, cores: Any = None) -> Any:
    """A recorded energy method, with codecarbon's default TDP named a default.

    Runs recorded before quarl.carbon said so wrote "CPU TDP power model (X W)"; when X is codecarbon's default
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


def _identity(run_dir: Path, root: Path, summary: Mapping[str, Any] | None) -> tuple[str, str, int | None]:
    """(panel, precision, seed): from the reproduce layout <panel>/<precision>/seed<k> when the path has
    it, else from the summary (so any folder of runs can be read)."""
    parts = run_dir.relative_to(root).parts if run_dir != root else ()
    if len(parts) >= 3 and _SEED_DIR.match(parts[-1]):
        return parts[-3], parts[-2], int(_SEED_DIR.match(parts[-1]).group(1))
    s = summary or {}
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
               "backend", "actor_steps", "learner_steps", "wall_clock_s", "run_time_s", "final_return",
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
        s = summary or {}
        evals = read_evaluator(run_dir)
        final = _num(s.get("final_eval_return"))
        if math.isnan(final) and len(evals):
            final = float(evals["return"].iloc[-1])
        best = _num(s.get("best_eval_return"))
        if math.isnan(best) and len(evals):
            best = float(evals["return"].max())
        kwh, kg, method = _energy(s)
        backend = s.get("backend")
        wall = _num(s.get("wall_clock_s"))
        run_time = _num(s.get("run_wall_clock_s"))
        rows.append({
            "panel": panel, "precision": precision, "seed": seed, "finished": is_finished(summary),
            "status": None if summary is None else str(s.get("status", "completed")),
            "runner": "actorq" if "num_actors" in s or "run_config" in s else ("single" if summary else None),
            "agent": s.get("agent"), "task": s.get("task"), "num_actors": _num(s.get("num_actors", 1 if s else None)),
            "backend": ",".join(backend) if isinstance(backend, list) else backend,
            "actor_steps": _num(s.get("actor_steps")), "learner_steps": _num(s.get("learner_steps")),
            "wall_clock_s": wall, "run_time_s": wall if math.isnan(run_time) else run_time,
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


def _check_x(x: str) -> None:
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
    _check_x(x)
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


# ------------------------------------------------------------------------------------------------ targets


def target_return(baseline_final: float, fraction: float) -> float:
    """`fraction` of the baseline's final return, measured from the top for negative returns (see module doc)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return float(baseline_final - (1.0 - fraction) * abs(baseline_final))


def time_to_target(evals: pd.DataFrame, target: float, *, x: str = "time_s") -> float:
    """`x` at the first evaluation whose return reaches `target`; NaN when no evaluation does."""
    if not len(evals) or not math.isfinite(target):
        return math.nan
    hit = evals.index[evals["return"].to_numpy(float) >= target]
    return float(evals.loc[hit[0], x]) if len(hit) else math.nan


def panel_targets(runs: pd.DataFrame, fraction: float = 0.9, baseline: str = BASELINE) -> dict[str, float]:
    """panel -> target return, for panels with at least one finished baseline run."""
    done = finished(runs)
    base = done[done["precision"] == baseline]
    return {panel: target_return(float(g["final_return"].mean()), fraction)
            for panel, g in base.groupby("panel", sort=False) if np.isfinite(g["final_return"]).any()}


def with_time_to_target(runs: pd.DataFrame, fraction: float = 0.9, baseline: str = BASELINE,
                        x: str = "time_s") -> pd.DataFrame:
    """Finished runs plus `target_return`, `time_to_target` (in `x` units) and `wall_to_target` (the
    wall clock of the same evaluation, for energy) columns."""
    _check_x(x)
    targets = panel_targets(runs, fraction, baseline)
    done = finished(runs).copy().reset_index(drop=True)
    done["target_return"] = [targets.get(p, math.nan) for p in done["panel"]]
    evals = [read_evaluator(d) for d in done["run_dir"]]
    done["time_to_target"] = [time_to_target(e, t, x=x) for e, t in zip(evals, done["target_return"])]
    done["wall_to_target"] = [time_to_target(e, t, x="wall_clock_s") for e, t in zip(evals, done["target_return"])]
    return done


def speedup_table(runs: pd.DataFrame, fraction: float = 0.9, baseline: str = BASELINE,
                  x: str = "time_s") -> pd.DataFrame:
    """Per panel and precision: final return, time to reach the panel's target, and speedup vs `baseline`.

    `time_to_target_s` is the mean over the seeds that reached the target (`seeds_reached` of `seeds`);
    the speedup is NaN when either side has no seed that reached it. With x='actor_steps' the times are
    actor steps (sample efficiency rather than speed)."""
    ttt = with_time_to_target(runs, fraction, baseline, x)
    rows = []
    for (panel, precision), g in ttt.groupby(["panel", "precision"], sort=False):
        reached = g["time_to_target"].dropna()
        rows.append({"panel": panel, "precision": precision, "seeds": len(g), "seeds_reached": len(reached),
                     "final_return_mean": g["final_return"].mean(), "final_return_std": g["final_return"].std(ddof=0),
                     "target_return": g["target_return"].iloc[0],
                     "time_to_target_s": reached.mean() if len(reached) else math.nan,
                     "time_to_target_std": reached.std(ddof=0) if len(reached) else math.nan,
                     "run_time_s_mean": g["run_time_s"].mean()})
    table = pd.DataFrame(rows, columns=["panel", "precision", "seeds", "seeds_reached", "final_return_mean",
                                        "final_return_std", "target_return", "time_to_target_s",
                                        "time_to_target_std", "run_time_s_mean"])
    base = table[table["precision"] == baseline].set_index("panel")["time_to_target_s"]
    table["speedup_vs_" + baseline] = [base.get(p, math.nan) / t if t and t > 0 else math.nan
                                       for p, t in zip(table["panel"], table["time_to_target_s"])]
    reached = table[table["precision"] == baseline].set_index("panel")[["seeds_reached", "seeds"]]
    table["speedup_over_seeds"] = [
        f"{r}/{n} vs {baseline} {reached.loc[p, 'seeds_reached']}/{reached.loc[p, 'seeds']}" if p in reached.index
        else f"{r}/{n}" for p, r, n in zip(table["panel"], table["seeds_reached"], table["seeds"])]
    if x == "actor_steps":
        table = table.rename(columns={"time_to_target_s": f"{x}_to_target", "time_to_target_std":
                                      f"{x}_to_target_std"})
    return _sorted_table(table)


def _sorted_table(table: pd.DataFrame) -> pd.DataFrame:
    if table.empty:
        return table
    order = sorted(range(len(table)), key=lambda i: (panel_order(table["panel"].iloc[i]),
                                                      precision_order(table["precision"].iloc[i])))
    return table.iloc[order].reset_index(drop=True)


# ------------------------------------------------------------------------------------------------ carbon


def carbon_table(runs: pd.DataFrame, fraction: float = 0.9, baseline: str = BASELINE) -> pd.DataFrame:
    """Per finished run: kWh and kg CO2eq for the whole run and scaled to its time to target, with the
    measurement method copied from its summary, and the panel-level baseline/precision ratios
    (see `carbon_ratio_table`) repeated on each row of that panel and precision."""
    ttt = with_time_to_target(runs, fraction, baseline)
    scale = ttt["wall_to_target"] / ttt["run_time_s"]
    per_run = pd.DataFrame({
        "panel": ttt["panel"], "precision": ttt["precision"], "seed": ttt["seed"],
        "actor_steps": ttt["actor_steps"], "run_time_s": ttt["run_time_s"], "energy_kwh": ttt["energy_kwh"],
        "emissions_kg": ttt["emissions_kg"], "ram_model_share": ttt["ram_kwh"] / ttt["energy_kwh"],
        "kwh_per_1k_steps": 1e3 * ttt["energy_kwh"] / ttt["actor_steps"],
        "time_to_target_s": ttt["time_to_target"], "kwh_to_target": ttt["energy_kwh"] * scale,
        "kg_to_target": ttt["emissions_kg"] * scale, "method": ttt["energy_method"],
    })
    ratios = carbon_ratio_table(per_run, baseline)
    if ratios.empty:
        for c in _RATIO_COLUMNS:
            per_run[c] = math.nan
        return per_run
    return per_run.merge(ratios[["panel", "precision", *_RATIO_COLUMNS]], on=["panel", "precision"], how="left")


_RATIO_COLUMNS = ("kwh_ratio_same_work", "kg_ratio_same_work", "kwh_ratio_same_outcome", "kg_ratio_same_outcome")


def carbon_ratio_table(carbon: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Per panel and precision: baseline energy / this precision's energy (>1: this precision is greener).

    same work: energy per actor step (every run of a grid has the same step budget, so this is the energy of
    the whole run); same outcome: energy until the target return (runs that never reached it are left out).
    CO2 ratios equal kWh ratios on one grid intensity; both are given since the summaries carry both."""
    rows = []
    for panel, g in carbon.groupby("panel", sort=False):
        b = g[g["precision"] == baseline]
        if b.empty:
            continue
        b_work = (b["energy_kwh"] / b["actor_steps"]).mean(), (b["emissions_kg"] / b["actor_steps"]).mean()
        b_out = b["kwh_to_target"].mean(), b["kg_to_target"].mean()
        for precision, p in g.groupby("precision", sort=False):
            work = (p["energy_kwh"] / p["actor_steps"]).mean(), (p["emissions_kg"] / p["actor_steps"]).mean()
            out = p["kwh_to_target"].mean(), p["kg_to_target"].mean()
            methods = sorted({str(m) for m in p["method"].dropna()})
            rows.append({"panel": panel, "precision": precision, "seeds": len(p),
                         "energy_kwh_mean": p["energy_kwh"].mean(), "emissions_kg_mean": p["emissions_kg"].mean(),
                         "ram_model_share_mean": p["ram_model_share"].mean() if "ram_model_share" in p else math.nan,
                         "kwh_ratio_same_work": _ratio(b_work[0], work[0]),
                         "kg_ratio_same_work": _ratio(b_work[1], work[1]),
                         "kwh_ratio_same_outcome": _ratio(b_out[0], out[0]),
                         "kg_ratio_same_outcome": _ratio(b_out[1], out[1]),
                         "method": " | ".join(methods) if methods else None})
    cols = ["panel", "precision", "seeds", "energy_kwh_mean", "emissions_kg_mean", "ram_model_share_mean",
            *_RATIO_COLUMNS, "method"]
    return _sorted_table(pd.DataFrame(rows, columns=cols))


def _ratio(a: float, b: float) -> float:
    return float(a / b) if np.isfinite(a) and np.isfinite(b) and b > 0 else math.nan


# ------------------------------------------------------------------------------------------------ runtime


def runtime_breakdown_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per panel and precision, mean over seeds: seconds in each stage (summed over actors for distributed
    runs) and the same per 1000 actor steps in ms, which is comparable across budgets and runners."""
    done = finished(runs)
    rows = []
    for (panel, precision), g in done.groupby(["panel", "precision"], sort=False):
        row: dict[str, Any] = {"panel": panel, "precision": precision, "seeds": len(g),
                               "actor_steps": g["actor_steps"].mean()}
        for stage in STAGES:
            row[stage] = g[stage].mean()
            row[f"{stage[:-2]}_ms_per_1k_steps"] = (1e6 * g[stage] / g["actor_steps"]).mean()
        row["total_s"] = sum(row[s] for s in STAGES if np.isfinite(row[s]))
        rows.append(row)
    cols = ["panel", "precision", "seeds", "actor_steps", *STAGES,
            *[f"{s[:-2]}_ms_per_1k_steps" for s in STAGES], "total_s"]
    return _sorted_table(pd.DataFrame(rows, columns=cols))


# ------------------------------------------------------------------------------------------------ plots


def _pyplot() -> Any:
    import matplotlib  # pylint: disable=import-outside-toplevel
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")  # headless unless a notebook already chose its backend
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    return plt


def plot_figure(runs: pd.DataFrame, *, x: str = "time_s", points: int = 200, band: str = "minmax",
                fraction: float | None = 0.9, path: str | os.PathLike | None = None) -> Any:
    """The paper's figure: one panel per task, return vs `x`, one curve per precision (mean over seeds) with
    a min-max (band='minmax') or ±std (band='std') band; a dotted line marks the target return when
    `fraction` is given. Saves to `path` when given; returns the matplotlib Figure."""
    if band not in ("minmax", "std"):
        raise ValueError(f"band must be 'minmax' or 'std', got {band!r}")
    plt = _pyplot()
    data = curves(runs, x=x, points=points)
    panels = sorted(data["panel"].unique(), key=panel_order) if len(data) else []
    targets = panel_targets(runs, fraction) if fraction else {}
    n = max(1, len(panels))
    cols = min(4, n)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.3 * nrows), squeeze=False)
    timed = x != "actor_steps"
    scale, unit = _time_unit(float(data["x"].max()) if len(data) and timed else 0.0)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    for ax, panel in zip(axes.ravel(), panels):
        pdata = data[data["panel"] == panel]
        for precision in sorted(pdata["precision"].unique(), key=precision_order):
            c = pdata[pdata["precision"] == precision]
            xs = c["x"].to_numpy() / (scale if timed else 1.0)
            lo, hi = (c["min"], c["max"]) if band == "minmax" else (c["mean"] - c["std"], c["mean"] + c["std"])
            color = precision_color(precision)
            ax.plot(xs, c["mean"], color=color, label=f"{precision} (n={int(c['seeds'].iloc[0])})", lw=1.6)
            ax.fill_between(xs, lo, hi, color=color, alpha=0.18, lw=0)
        if panel in targets:
            ax.axhline(targets[panel], color="0.4", ls=":", lw=1, label=f"{int(round(100 * fraction))}% of fp32")
        ax.set_title(panel)
        ax.set_xlabel({"time_s": f"training wall clock ({unit})", "wall_clock_s": f"wall clock ({unit})"}
                      .get(x, "actor steps"))
        ax.set_ylabel("evaluation return")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    if not panels:
        axes[0, 0].text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=axes[0, 0].transAxes)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def _time_unit(max_seconds: float) -> tuple[float, str]:
    if max_seconds > 3 * 3600:
        return 3600.0, "h"
    if max_seconds > 300:
        return 60.0, "min"
    return 1.0, "s"


def plot_runtime_breakdown(table: pd.DataFrame, *, per_1k_steps: bool = True,
                           path: str | os.PathLike | None = None) -> Any:
    """Stacked bars of the runtime stages, one bar per panel and precision (ms per 1000 actor steps by
    default, else total seconds). Returns the Figure."""
    plt = _pyplot()
    keys = [f"{s[:-2]}_ms_per_1k_steps" for s in STAGES] if per_1k_steps else list(STAGES)
    labels = [f"{p}\n{q}" for p, q in zip(table["panel"], table["precision"])]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(labels) + 2) + 2.0, 4.2))
    bottom = np.zeros(len(table))
    for stage, key in zip(STAGES, keys):
        values = np.nan_to_num(table[key].to_numpy(float)) if len(table) else np.zeros(0)
        ax.bar(range(len(table)), values, bottom=bottom, label=STAGE_LABELS[stage])
        bottom += values
    ax.set_xticks(range(len(table)), labels, fontsize=8)
    ax.set_ylabel("ms per 1000 actor steps" if per_1k_steps else "seconds (summed over actors)")
    ax.set_title("actor runtime breakdown")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: bars fill the axes
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


# ------------------------------------------------------------------------------------------------ PTQ


def load_ptq(ptq_dir: str | os.PathLike) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ptq.csv, weights.csv) of a `launch.ptq` output folder, numeric columns parsed."""
    d = Path(ptq_dir)
    out = []
    for name in ("ptq.csv", "weights.csv"):
        path = d / name
        if not path.exists():
            raise ValueError(f"{str(path)!r} not found: run `python -m launch.ptq --checkpoint RUN_DIR` first")
        df = pd.read_csv(path)
        for c in df.columns:
            if c not in ("precision", "granularity", "backend", "execution", "layer", "shape"):
                df[c] = pd.to_numeric(df[c], errors="coerce")
        out.append(df)
    return out[0], out[1]


def plot_ptq(ptq: pd.DataFrame, *, path: str | os.PathLike | None = None) -> Any:
    """Relative return error (the paper's E) and weight SQNR vs bits, per quantization granularity; float
    precisions as horizontal reference lines. Returns the Figure."""
    plt = _pyplot()
    fig, (ax_e, ax_s) = plt.subplots(1, 2, figsize=(11, 4))
    ints = ptq[ptq["precision"].astype(str).str.startswith("int")]
    for granularity, g in ints.groupby("granularity", sort=True):
        g = g.sort_values("bits")
        ax_e.errorbar(g["bits"], 100 * g["error_mean"], yerr=100 * g["error_std"], marker="o", capsize=3,
                      label=granularity)
        ax_s.plot(g["bits"], g["weight_sqnr_db"], marker="o", label=granularity)
    for row in ptq[~ptq["precision"].astype(str).str.startswith("int")].itertuples():
        if row.precision != "fp32":
            color = precision_color(row.precision)
            ax_e.axhline(100 * row.error_mean, color=color, ls="--", lw=1, label=row.precision)
            if np.isfinite(row.weight_sqnr_db):
                ax_s.axhline(row.weight_sqnr_db, color=color, ls="--", lw=1, label=row.precision)
    ax_e.axhline(0, color="black", lw=0.8)
    ax_e.set_xlabel("weight bits")
    ax_e.set_ylabel("return error vs fp32 (%)")
    ax_e.set_title("PTQ: relative return error")
    ax_s.set_xlabel("weight bits")
    ax_s.set_ylabel("weight SQNR (dB)")
    ax_s.set_title("PTQ: weight SQNR")
    for ax in (ax_e, ax_s):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_weight_stats(weights: pd.DataFrame, *, path: str | os.PathLike | None = None) -> Any:
    """Per weight matrix: its [min, max] range and ±std, and |max|/std (how heavy the tails are, which is
    what per-tensor int scaling pays for). Returns the Figure."""
    plt = _pyplot()
    fig, (ax_r, ax_t) = plt.subplots(1, 2, figsize=(11, 0.45 * len(weights) + 2.0))
    y = np.arange(len(weights))
    ax_r.hlines(y, weights["min"], weights["max"], color="tab:blue", lw=2, label="min..max")
    ax_r.errorbar(weights["mean"], y, xerr=weights["std"], fmt="o", color="tab:red", capsize=3, label="mean±std")
    ax_r.set_yticks(y, [f"{l} [{s}]" for l, s in zip(weights["layer"], weights["shape"])], fontsize=8)
    ax_r.set_xlabel("weight value")
    ax_r.set_title("weight ranges")
    ax_r.legend(fontsize=8)
    ax_t.barh(y, weights["absmax_over_std"], color="tab:purple")
    ax_t.set_yticks(y, [""] * len(y))
    ax_t.set_xlabel("|max| / std")
    ax_t.set_title("tail heaviness")
    for ax in (ax_r, ax_t):
        ax.invert_yaxis()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


# ------------------------------------------------------------------------------------------------ report


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on: OS, Python, CPU model, cores, memory and the main libraries."""
    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(),
                            "machine": platform.machine(), "logical_cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            models = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        if models:
            info["cpu_model"] = models[0]
    except OSError:
        pass
    try:
        import psutil  # pylint: disable=import-outside-toplevel
        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
        info["physical_cpus"] = psutil.cpu_count(logical=False)
    except Exception:  # pylint: disable=broad-except
        pass
    from importlib import metadata  # pylint: disable=import-outside-toplevel
    for pkg in ("jax", "jaxlib", "onnxruntime", "dm-control", "gymnasium", "ray", "codecarbon"):
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return info


def markdown_table(df: pd.DataFrame, float_digits: int = 3) -> str:
    """A GitHub markdown table (pandas' to_markdown needs tabulate; this needs nothing)."""
    if df.empty:
        return "_(no rows)_\n"

    def fmt(v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "–"
        if isinstance(v, (float, np.floating)):
            a = abs(float(v))
            if a != 0 and (a < 10 ** -float_digits or a >= 1e6):
                return f"{float(v):.{float_digits}e}"
            return f"{float(v):.{float_digits}f}".rstrip("0").rstrip(".")
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


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
                 notes: Iterable[str] = (),
                 run_filter: Callable[[pd.DataFrame], pd.DataFrame] | None = None) -> ReportFiles:
    """Writes figure.png, runtime.png, speedup.csv, carbon.csv, runtime.csv, grid.csv and report.md into
    `results_dir`, from the runs under `runs_dir` (default results_dir/runs).

    `plan` (panel, precision, seed rows) adds the planned runs that have no folder yet to grid.csv as
    'pending'; `machine` defaults to results_dir/machine.json (written when the runs ran), else this machine;
    `run_filter` narrows the loaded runs (e.g. to one grid's panels).
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
        machine = read_summary_like(mfile) or {**machine_info(), "note": "machine that drew the report "
                                                                          "(the runs left no machine.json)"}
    cores = machine.get("logical_cpus", machine.get("cores"))
    plt = _pyplot()
    plt.close(plot_figure(runs, fraction=fraction, path=files.figure))
    speed = speedup_table(runs, fraction)
    speed.to_csv(files.speedup, index=False)
    carbon = carbon_table(runs, fraction)
    carbon["method"] = [describe_method(m, cores) for m in carbon["method"]]
    carbon.to_csv(files.carbon, index=False)
    ratios = carbon_ratio_table(carbon)
    runtime = runtime_breakdown_table(runs)
    runtime.to_csv(files.runtime, index=False)
    plt.close(plot_runtime_breakdown(runtime, path=files.runtime_figure))
    grid = grid_table(runs, plan)
    grid["run_dir"] = [_relative(d, out) for d in grid["run_dir"]]  # a committed grid.csv must not name this disk
    grid.to_csv(files.grid, index=False)

    pct = int(round(100 * fraction))
    text = [f"# {title or 'ActorQ reproduction: ' + out.name}", ""]
    notes = list(notes)
    text += [*notes, ""] if notes else []
    text += ["![return vs wall clock](figure.png)", "",
             "Curves: mean over seeds, band min..max, against the training clock (the single-process runner's "
             "clock without its own evaluations, else the wall clock); dotted line: "
             f"{pct}% of the fp32 final return (target = R - (1 - f)|R|, which is f*R for positive returns).", "",
             f"## Speedup: training time to reach {pct}% of the fp32 final return", "",
             "`time_to_target_s` is the mean over the seeds that reached the target (`seeds_reached` of `seeds`); "
             "seeds that never reached it are left out of the mean, so each speedup compares those subsets "
             "(`speedup_over_seeds`: this precision's seeds vs the fp32 seeds behind the ratio).", "",
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
    text += [f"- {k}: {v}" for k, v in machine.items()]
    text += ["", "Energy method(s), as recorded by the runs:", ""]
    methods = sorted({str(describe_method(m, cores)) for m in runs["energy_method"].dropna()}) if len(runs) else []
    text += [f"- {m}" for m in methods] or ["- none recorded"]
    files.report.write_text("\n".join(text) + "\n", encoding="utf-8")
    return files


def _runtime_note(runtime: pd.DataFrame) -> list[str]:
    """The policy-call cost the table implies (ms per 1000 steps = µs per step), so prose can quote it."""
    col = "inference_ms_per_1k_steps"
    if col not in runtime or runtime[col].dropna().empty:
        return []
    values = runtime[col].dropna()
    return [f"ms per 1000 actor steps equal µs per step: a policy call (inference, with its batching and "
            f"conversion) cost {values.min():.0f}-{values.max():.0f} µs per step across these panels and "
            "precisions.", ""]


def _relative(path: Any, base: Path) -> Any:
    if not isinstance(path, str):
        return path
    try:
        return str(Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        return path


def read_summary_like(path: Path) -> dict[str, Any] | None:
    """A small JSON object file (machine.json) or None."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
