"""The report's tables: time to target and speedup, energy and carbon to target, the actors' runtime breakdown,
and markdown rendering (definitions in `analysis.runs`)."""
from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd

from analysis.execution import integer_kernel
from analysis.runs import BASELINE, STAGES, check_x, finished, panel_order, precision_order, read_evaluator
from quarl.quant.precision import is_int_name


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
    check_x(x)
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
        executed = " / ".join(dict.fromkeys(str(e) for e in g["executed"] if isinstance(e, str))) or "not recorded"
        rows.append({"panel": panel, "precision": precision, "executed": executed,
                     "seeds": len(g), "seeds_reached": len(reached),
                     "final_return_mean": g["final_return"].mean(), "final_return_std": g["final_return"].std(ddof=0),
                     "target_return": g["target_return"].iloc[0],
                     "time_to_target_s": reached.mean() if len(reached) else math.nan,
                     "time_to_target_std": reached.std(ddof=0) if len(reached) else math.nan,
                     "run_time_s_mean": g["run_time_s"].mean()})
    table = pd.DataFrame(rows, columns=["panel", "precision", "executed", "seeds", "seeds_reached", "final_return_mean",
                                        "final_return_std", "target_return", "time_to_target_s",
                                        "time_to_target_std", "run_time_s_mean"])
    base = table[table["precision"] == baseline].set_index("panel")["time_to_target_s"]
    table["speedup_vs_" + baseline] = [base.get(p, math.nan) / t if t and t > 0 else math.nan
                                       for p, t in zip(table["panel"], table["time_to_target_s"])]
    reached = table[table["precision"] == baseline].set_index("panel")[["seeds_reached", "seeds"]]
    table["speedup_over_seeds"] = [
        f"{r}/{n} vs {baseline} {reached.loc[p, 'seeds_reached']}/{reached.loc[p, 'seeds']}" if p in reached.index
        else f"{r}/{n}" for p, r, n in zip(table["panel"], table["seeds_reached"], table["seeds"])]
    table["speedup_note"] = [speedup_note(p, e, baseline) for p, e in zip(table["precision"], table["executed"])]
    if x == "actor_steps":
        table = table.rename(columns={"time_to_target_s": f"{x}_to_target", "time_to_target_std":
                                      f"{x}_to_target_std"})
    return _sorted_table(table)


def speedup_note(precision: str, executed: str, baseline: str = BASELINE) -> str:
    """Empty when a row's speedup is its precision's own (an integer kernel for intN, native compute for
    floats); else what it is instead, so no fp32-compute speed reads as an int8 kernel's."""
    if precision == baseline:
        return ""
    if is_int_name(precision):
        if integer_kernel(executed) and " / " not in executed:
            return ""
        what = "kernel unknown" if "unknown" in executed else "ran fp32 compute" if "fp32 compute" in executed \
            else "mixed executions"
        return f"{what}: not an {precision}-kernel speedup"
    if f"{precision} compute" in executed and " / " not in executed:
        return ""
    what = "compute unknown" if "unknown" in executed or executed == "not recorded" else "ran fp32 compute"
    return f"{what}: not a {precision}-compute speedup"


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
            methods = sorted({_method_kind(m) for m in p["method"].dropna()})
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


_RUN_SHARE = re.compile(r"; RAM model share of the energy: [0-9.]+%")


def _method_kind(method: object) -> str:
    """A run's energy method without its own RAM share (a per-run number, in `ram_model_share_mean` already), so
    that the runs of one cell that were measured the same way show one method, not one per run."""
    return _RUN_SHARE.sub("", str(method))


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
