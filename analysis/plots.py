"""The report's figures: the paper's return curves, the runtime breakdown, PTQ sweeps and weight statistics."""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from analysis.runs import (
    STAGES, STAGE_LABELS, curves, finished, panel_order, precision_color, precision_order, read_evaluator,
)
from analysis.tables import panel_targets
from quarl.quant.precision import MAX_KERNEL_BITS, is_int_name


# ------------------------------------------------------------------------------------------------ plots


def pyplot() -> Any:
    import matplotlib  # pylint: disable=import-outside-toplevel
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")  # headless unless a notebook already chose its backend
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    return plt


def clipped_spread(means: Sequence[float], spreads: Sequence[float],
                   bounds: tuple[float, float] | None) -> np.ndarray:
    """[2, N] error-bar lengths (below, above) for mean +- spread, cut where they would pass the task's returns
    (`quarl.envs.factory.return_range`): a std bar past CartPole's 500 shows a return no episode can have."""
    m, s = np.asarray(means, float), np.abs(np.asarray(spreads, float))
    lo, hi = m - s, m + s
    if bounds is not None:  # a mean outside the bounds (not a return; a bug upstream) keeps its bar at the mean
        lo, hi = np.maximum(lo, np.minimum(bounds[0], m)), np.minimum(hi, np.maximum(bounds[1], m))
    return np.stack([m - lo, hi - m])


BAND_MEANING = {"sem": "band: ± standard error of the mean over seeds",
                "std": "band: ± standard deviation over seeds",
                "minmax": "band: min..max over seeds"}


def machine_label(machine: Mapping[str, Any] | None) -> str:
    """'AMD EPYC, 2 logical CPUs' from a machine.json (`quarl.ops.machine.machine_info`), for figure titles."""
    if not machine:
        return "machine not recorded"
    cpu = machine.get("cpu_model") or machine.get("machine") or "unknown CPU"
    cores = machine.get("logical_cpus", machine.get("cores"))
    return f"{cpu}, {cores} logical CPUs" if cores else str(cpu)


def plot_figure(runs: pd.DataFrame, *, x: str = "time_s", points: int = 200, band: str = "sem",
                fraction: float | None = 0.9, title: str | None = None,
                path: str | os.PathLike | None = None) -> Any:
    """The paper's figure: one panel per task, return vs `x`, one curve per precision (mean over seeds) with a
    band of ± standard error (band='sem', the default: narrow enough that the precisions stay apart), ± std
    ('std') or min..max ('minmax'); a dotted line marks the target return when `fraction` is given. Panels fill a
    grid of at most 3 columns; a spare cell holds the shared legend and what the band means, and `title` (the
    budget, runner and machine) heads the figure. Saves to `path` when given; returns the matplotlib Figure.

    Seeds end at different points (a run stopped on its target, a faster one on the time axis): the solid curve is
    the mean over every seed and stops where the first seed's run ended; past it a dashed curve is the mean over
    the seeds still running (never a finished seed's last return carried on), and a cross marks where each seed
    that ended early had its last evaluation."""
    if band not in BAND_MEANING:
        raise ValueError(f"band must be one of {', '.join(BAND_MEANING)}, got {band!r}")
    plt = pyplot()
    data = curves(runs, x=x, points=points)
    panels = sorted(data["panel"].unique(), key=panel_order) if len(data) else []
    targets = panel_targets(runs, fraction) if fraction else {}
    n = max(1, len(panels))
    cols = min(3, n + 1) if n > 1 else 1
    nrows = math.ceil((n + (1 if n > 1 else 0)) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.4 * nrows + 0.6), squeeze=False)
    timed = x != "actor_steps"
    scale, unit = _time_unit(float(data["x"].max()) if len(data) and timed else 0.0)
    handles: dict[str, Any] = {}
    general: set[str] = set()  # the marks of seeds that ended early, drawn in some panel
    for ax, panel in zip(axes.ravel(), panels):
        pdata = data[data["panel"] == panel]
        for precision in sorted(pdata["precision"].unique(), key=precision_order):
            c = pdata[pdata["precision"] == precision]
            color = precision_color(precision)
            seeds = _seed_ends(runs, panel, precision, x)
            first_end = min(end for end, _ in seeds.values()) if seeds else math.inf
            label = f"{precision} (n={int(c['seeds'].iloc[0])} seeds)"
            solid = _draw_mean(ax, c[c["x"] <= first_end], band, color, timed, scale, label=label)
            if solid is not None:
                handles.setdefault(label, solid)
            segments = _live_segments(runs, panel, precision, seeds, x, points)
            for segment in segments:
                _draw_mean(ax, segment, band, color, timed, scale, dashed=True)
            general.update([LIVE_LABEL] if segments else [])
            early = [(end, ret) for end, ret in seeds.values() if end < max(e for e, _ in seeds.values())]
            if early:
                ends, rets = zip(*early)
                ax.plot(np.asarray(ends) / (scale if timed else 1.0), rets, "x", color=color, ms=6, mew=1.5, zorder=4)
                general.add(ENDED_LABEL)
        if panel in targets:
            line = ax.axhline(targets[panel], color="0.4", ls=":", lw=1, zorder=2)
            handles.setdefault(f"target: {int(round(100 * fraction))}% of the fp32 final return", line)
        ax.set_title(panel)
        ax.set_xlabel({"time_s": f"training wall clock ({unit})", "wall_clock_s": f"wall clock ({unit})"}
                      .get(x, "actor steps"))
        ax.set_ylabel("evaluation return")
        ax.grid(alpha=0.3)
    handles.update({name: proxy for name, proxy in _general_handles().items() if name in general})
    spare = list(axes.ravel()[len(panels):])
    for ax in spare:
        ax.axis("off")
    if not panels:
        axes[0, 0].text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=axes[0, 0].transAxes)
    elif spare:
        spare[0].legend(list(handles.values()), list(handles), loc="center", fontsize=9, frameon=False,
                        title="curve: mean over seeds\n" + BAND_MEANING[band], title_fontsize=9)
    else:
        axes.ravel()[0].legend(list(handles.values()), list(handles), fontsize=7, loc="best")
    fig.suptitle(f"{title + ' — ' if title else ''}mean over seeds, {BAND_MEANING[band]}", fontsize=11)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


LIVE_LABEL = "mean over the seeds still running"
ENDED_LABEL = "last evaluation of a seed that ended early"


def _draw_mean(ax: Any, c: pd.DataFrame, band: str, color: str, timed: bool, scale: float, *, label: str | None = None,
               dashed: bool = False) -> Any:
    """One stretch of a precision's curve (`curves` rows) with its band; returns the line (None: no points)."""
    if not len(c):
        return None
    xs = c["x"].to_numpy() / (scale if timed else 1.0)
    sem = c["std"] / np.sqrt(c["seeds"].clip(lower=1))
    lo, hi = {"minmax": (c["min"], c["max"]), "std": (c["mean"] - c["std"], c["mean"] + c["std"]),
              "sem": (c["mean"] - sem, c["mean"] + sem)}[band]
    line = ax.plot(xs, c["mean"], color=color, label=label, lw=1.1 if dashed else 1.5, ls="--" if dashed else "-",
                   alpha=0.8 if dashed else 1.0, zorder=3)[0]
    if int(c["seeds"].iloc[0]) > 1:
        ax.fill_between(xs, lo, hi, color=color, alpha=0.07 if dashed else 0.12, lw=0, zorder=1)
    return line


def _general_handles() -> dict[str, Any]:
    """Legend entries for marks every precision draws in its own colour: a grey stand-in each."""
    from matplotlib.lines import Line2D  # pylint: disable=import-outside-toplevel

    return {LIVE_LABEL: Line2D([], [], color="0.35", ls="--", lw=1.1),
            ENDED_LABEL: Line2D([], [], color="0.35", marker="x", ls="", ms=6, mew=1.5)}


def _seed_ends(runs: pd.DataFrame, panel: str, precision: str, x: str) -> dict[str, tuple[float, float]]:
    """Each finished seed's run folder -> (`x` at its last evaluation, that evaluation's return)."""
    done = finished(runs)
    rows = done[(done["panel"] == panel) & (done["precision"] == precision)] if len(done) else done
    out = {}
    for run_dir in rows["run_dir"] if len(rows) else []:
        evals = read_evaluator(run_dir)
        if len(evals):
            last = evals.loc[evals[x].idxmax()]
            out[run_dir] = (float(last[x]), float(last["return"]))
    return out


def _live_segments(runs: pd.DataFrame, panel: str, precision: str, seeds: Mapping[str, tuple[float, float]],
                   x: str, points: int) -> list[pd.DataFrame]:
    """Past the first seed's end, the mean over the seeds still running: between two successive ends, `curves`
    over exactly the seeds whose runs reach the later one (so no finished seed's return is carried on)."""
    ends = sorted({end for end, _ in seeds.values()})
    out = []
    for before, end in zip(ends, ends[1:]):
        live = [d for d, (e, _) in seeds.items() if e >= end]
        c = curves(runs[runs["run_dir"].isin(live)], x=x, points=points)
        c = c[(c["panel"] == panel) & (c["precision"] == precision) & (c["x"] >= before) & (c["x"] <= end)]
        if len(c):
            out.append(c)
    return out


def _time_unit(max_seconds: float) -> tuple[float, str]:
    if max_seconds > 3 * 3600:
        return 3600.0, "h"
    if max_seconds > 300:
        return 60.0, "min"
    return 1.0, "s"


def plot_runtime_breakdown(table: pd.DataFrame, *, per_1k_steps: bool = True, title: str | None = None,
                           path: str | os.PathLike | None = None) -> Any:
    """Stacked bars of the runtime stages, one bar per panel and precision (ms per 1000 actor steps by
    default, else total seconds), grouped by panel; a stage that is zero everywhere (pull in one process, where
    there is no weight server) says so in the legend instead of drawing nothing. Returns the Figure."""
    plt = pyplot()
    keys = [f"{s[:-2]}_ms_per_1k_steps" for s in STAGES] if per_1k_steps else list(STAGES)
    panels = list(dict.fromkeys(table["panel"])) if len(table) else []
    # a gap between panels, precision under each bar and the panel name centred under its group
    xs, pos = [], 0.0
    for i, p in enumerate(table["panel"] if len(table) else []):
        if i and p != table["panel"].iloc[i - 1]:
            pos += 0.6
        xs.append(pos)
        pos += 1.0
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(xs) + 3.5), 4.6))
    bottom = np.zeros(len(table))
    for stage, key in zip(STAGES, keys):
        values = np.nan_to_num(table[key].to_numpy(float)) if len(table) else np.zeros(0)
        label = STAGE_LABELS[stage] + ("" if values.any() or not len(values) else
                                       " (0 here: one process, nothing to fetch)")
        ax.bar(xs, values, bottom=bottom, width=0.85, label=label)
        bottom += values
    ax.set_xticks(xs, list(table["precision"]) if len(table) else [], fontsize=8)
    for p in panels:
        centre = np.mean([x for x, q in zip(xs, table["panel"]) if q == p])
        ax.annotate(p, (centre, 0), xycoords=("data", "axes fraction"), xytext=(0, -24),
                    textcoords="offset points", ha="center", va="top", fontsize=9)
    ax.set_ylabel("ms per 1000 actor steps (= µs per step)" if per_1k_steps else "seconds (summed over actors)")
    ax.set_title(f"{title + ': ' if title else ''}actor runtime breakdown, mean over seeds", fontsize=10)
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
    plt = pyplot()
    fig, (ax_e, ax_s) = plt.subplots(1, 2, figsize=(11, 4))
    is_int = ptq["precision"].map(is_int_name).astype(bool)
    ints = ptq[is_int]
    for granularity, g in ints.groupby("granularity", sort=True):
        g = g.sort_values("bits")
        ax_e.errorbar(g["bits"], 100 * g["error_mean"], yerr=100 * g["error_std"], marker="o", capsize=3,
                      label=granularity)
        ax_s.plot(g["bits"], g["weight_sqnr_db"], marker="o", label=granularity)
    for row in ptq[~is_int].itertuples():
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
    plt = pyplot()
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


def plot_ptq_returns(rows: Sequence[Mapping[str, Any]], title: str, *,
                     granularities: Sequence[str] = ("per-tensor", "per-channel"),
                     machine: Mapping[str, Any] | None = None, task: str | None = None,
                     path: str | os.PathLike | None = None) -> Any:
    """`launch.ptq`'s rows: return vs bits per granularity with error bars of ± the std of the return over the
    episodes (the title says how many, and the machine), cut at `task`'s possible returns (`clipped_spread`),
    float precisions as reference lines, and the bit widths above the integer kernels' (simulated in fp32)
    shaded; the legend sits right of the axes. Returns the Figure."""
    from quarl.envs.factory import return_range  # pylint: disable=import-outside-toplevel

    bounds = return_range(task) if task else None

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ints = [r for r in rows if is_int_name(r["precision"])]
    for granularity, marker in zip(granularities, ("o", "s")):
        pts = sorted((r["bits"], r["mean_return"], r["std_return"]) for r in ints if r["granularity"] == granularity)
        if pts:
            b, m, s = map(np.asarray, zip(*pts))
            ax.errorbar(b, m, yerr=clipped_spread(m, s, bounds), marker=marker, capsize=3, label=f"int, {granularity}")
    styles = {"fp32": ("black", "-"), "fp16": ("tab:green", "--"), "bf16": ("tab:red", ":")}
    for r in rows:
        if not is_int_name(r["precision"]):
            color, style = styles[r["precision"]]
            ax.axhline(r["mean_return"], color=color, linestyle=style, label=f"{r['precision']}")
    int_bits = [r["bits"] for r in ints]
    if int_bits and max(int_bits) > MAX_KERNEL_BITS:
        ax.axvspan(MAX_KERNEL_BITS + 0.5, max(int_bits) + 0.5, color="0.9", zorder=0, label="simulated (fp32)")
    ax.set_xticks(sorted(set(int_bits)))
    ax.set_xlabel("weight bits")
    ax.set_ylabel("mean episode return")
    episodes = sorted({int(r["episodes"]) for r in rows if r.get("episodes") is not None})
    ax.set_title(f"{title} ({machine_label(machine)})\nbars: ± std of the return over "
                 f"{'/'.join(map(str, episodes)) or '?'} episodes, the same env seeds at every precision", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never over a bar
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
    return fig


def plot_weight_histograms(params: Mapping, stats: Sequence[Mapping[str, Any]], *,
                           path: str | os.PathLike | None = None) -> Any:
    """One histogram per weight matrix named in `stats` (`launch.ptq.weight_stats`), its min and max marked
    (wide ranges are what low bit widths lose). Returns the Figure."""
    from quarl.quant.quantization import path_str, tree_items  # pylint: disable=import-outside-toplevel

    plt = pyplot()
    leaves = {path_str(p): leaf for p, leaf in tree_items(params)}
    cols = min(3, len(stats))
    rows = math.ceil(len(stats) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.ravel()[len(stats):]:
        ax.set_visible(False)
    for ax, s in zip(axes.ravel(), stats):
        ax.hist(np.asarray(leaves[s["layer"]], np.float64).ravel(), bins=60, color="tab:blue")
        for value, label in ((s["min"], "min"), (s["max"], "max")):
            ax.axvline(value, color="tab:red", linestyle="--", linewidth=1)
            ax.annotate(f"{label} {value:.3g}", (value, 1), xycoords=("data", "axes fraction"), fontsize=8,
                        ha="left" if label == "min" else "right", va="top", color="tab:red")
        ax.set_title(f"{s['layer']} [{s['shape']}]\nstd {s['std']:.3g}, |max|/std {s['absmax_over_std']:.1f}",
                     fontsize=9)
        ax.set_xlabel("weight")
        ax.set_ylabel("count")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig


def redraw_ptq_returns(ptq_dir: str | os.PathLike) -> Path:
    """ptq_returns.png again from a `launch.ptq` folder's ptq.csv (no evaluation): the agent and task from
    ptq.md's heading, the machine from machine.json when the sweep wrote one."""
    import json  # pylint: disable=import-outside-toplevel

    d = Path(ptq_dir)
    ptq, _ = load_ptq(d)
    heading = (d / "ptq.md").read_text(encoding="utf-8").splitlines()[0]
    title = "PTQ: " + heading.split(": ", 1)[-1] if ": " in heading else "PTQ"
    task = title.rsplit(" on ", 1)[-1] if " on " in title else None  # "# Post-training quantization: dqn on <task>"
    try:
        machine = json.loads((d / "machine.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        machine = None
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in ptq.to_dict("records")]
    granularities = [g for g in dict.fromkeys(ptq["granularity"]) if isinstance(g, str) and g != "n/a"]
    plot_ptq_returns(rows, title, granularities=granularities, machine=machine, task=task,
                     path=d / "ptq_returns.png")
    return d / "ptq_returns.png"
