"""bench.learning.ptq_study's report: reward against precision per (algorithm, task) from the study's rows
(`summarize`: mean over seeds, each seed's change from its own fp32 reward), the page (`markdown`: int8 against
fp32, then every precision) and the figure (`plot`). Also the names of the study's result files.
"""
from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from bench.harness.machine import describe_load
from bench.harness.results_io import save_figure
from bench.learning.ptq_study_grid import recorded_rule
from quarl.quant.precision import parse_precision

CSV_FILE, MD_FILE, PNG_FILE, SESSIONS_FILE = "ptq_study.csv", "ptq_study.md", "ptq_study.png", "ptq_study_sessions.json"
QAT_PREFIX = "qat-"  # a QAT run's row: "qat-int4" is the policy trained with --qat-bits 4, evaluated at int4
WITHIN = 0.05  # "int8 within a few percent of fp32": |relative change| <= 5%
HEAD_SUFFIX = "-head"  # a row with a wider output layer: "int8-head16" (launch.ptq_policy.HEAD_SUFFIX)


def precision_order(name: str) -> tuple[int, int, str]:
    """fp32, bf16, fp16, then integers from widest to narrowest, each QAT row ("qat-int4") after its PTQ width:
    the plot's x axis and the table's row order."""
    return (*parse_precision(name.removeprefix(QAT_PREFIX).partition(HEAD_SUFFIX)[0]).sort_key, name)


def shown_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows the tables use: per (algorithm, task) the launch.anakin cells' rows where there are any (10 seeds,
    the study's trainer for tasks with a gymnax port), else the launch.train ones; the others stay in the CSV."""
    jitted = {(r["algo"], r["task"]) for r in rows if r.get("trainer") == "anakin"}
    return [r for r in rows if ((r["algo"], r["task"]) in jitted) == (r.get("trainer") == "anakin")]


def converged(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows of the seeds whose fp32 policy evaluates at or above their cell's reference return, the fp32 rows of
    the seeds that do not or have no reference): the study's claims are made on the first only."""
    ok = {(r["algo"], r["task"], r["seed"]) for r in rows
          if r["precision"] == "fp32" and r.get("reference") is not None and r["mean_return"] >= r["reference"]}
    kept = [r for r in rows if (r["algo"], r["task"], r["seed"]) in ok]
    missed = [r for r in rows if r["precision"] == "fp32" and (r["algo"], r["task"], r["seed"]) not in ok]
    return kept, missed


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (algo, task, precision): mean reward over seeds, the per-seed relative change from the same
    seed's fp32 reward, its mean and spread (sample std) over seeds, the evaluation's standard error of that mean
    (`change_se`), and the policy size."""
    fp32_rows = {(r["algo"], r["task"], r["seed"]): r for r in rows if r["precision"] == "fp32"}
    fp32 = {k: r["mean_return"] for k, r in fp32_rows.items()}
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["algo"], r["task"], r["precision"]), []).append(r)
    out = []
    for (algo, task, precision), rs in groups.items():
        rewards = [r["mean_return"] for r in rs]
        by_seed = {r["seed"]: (r["mean_return"] - fp32[k]) / abs(fp32[k]) for r in rs
                   if (k := (algo, task, r["seed"])) in fp32 and fp32[k] != 0}
        changes = [by_seed[seed] for seed in sorted(by_seed)]
        (reward_mean, reward_std), (change_mean, change_std) = _spread(rewards), _spread(changes)
        ses = [_change_se(r, fp32_rows[k]) for r in rs if (k := (algo, task, r["seed"])) in fp32_rows and fp32[k]]
        out.append({"algo": algo, "task": task, "precision": precision, "seeds": len(rs),
                    "trainer": rs[0].get("trainer") or "train",
                    # standard error of the mean change over seeds (NaN for one seed): seeds and episodes both
                    "change_se_seeds": change_std / math.sqrt(len(changes)) if len(changes) > 1 else math.nan,
                    "seed_list": sorted(r["seed"] for r in rs), "episodes": min(r["episodes"] for r in rs),
                    "train_steps": sorted({r["train_steps"] for r in rs}),
                    "reward_mean": reward_mean, "reward_std": reward_std,
                    "change_mean": change_mean, "change_std": change_std,
                    "changes": changes, "changes_by_seed": by_seed,
                    "change_se": math.sqrt(sum(e * e for e in ses)) / len(ses) if ses else math.nan,
                    "policy_bytes": int(statistics.median(r["policy_bytes"] for r in rs)),
                    "execution": rs[0]["execution"]})
    return sorted(out, key=lambda s: (s["algo"], s["task"], precision_order(s["precision"])))


def _change_se(row: dict[str, Any], fp32: dict[str, Any]) -> float:
    """Standard error of one seed's relative change from its episodes: both means' standard errors, as if the two
    evaluations were independent. They share environment seeds, so where the policies act alike it is smaller: an
    upper bound, what the episodes alone can resolve."""
    if row is fp32:
        return 0.0
    var = row["std_return"] ** 2 / row["episodes"] + fp32["std_return"] ** 2 / fp32["episodes"]
    return math.sqrt(var) / abs(fp32["mean_return"])


def _spread(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample std) over seeds: std 0 for one seed, both NaN for none."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:+.1f}%"


def _below(r: dict[str, Any]) -> str:
    """A missed seed's fp32 return, with the digits that show it is below the reference (5.98, not 6.0)."""
    text = f"{r['mean_return']:.1f}"
    if r.get("reference") is not None and float(text) >= r["reference"]:
        text = f"{r['mean_return']:.2f}"
    return text


def _change(mean: float, std: float) -> str:
    """A change from fp32 over seeds, as the tables write it: "-3.1% ± 2.0%"."""
    return f"{_pct(mean)} ± {100 * std:.1f}%"


def markdown(rows: Sequence[dict[str, Any]], sessions: Sequence[dict[str, Any]], grid: Sequence[Any] = ()) -> str:
    """The study's page, on the seeds whose fp32 policy reached its reference (`converged`): int8 against fp32
    per (algorithm, task), QAT beside PTQ, every precision; then the seeds that did not converge, and the settings
    of the `grid` rows (bench.learning.ptq_study_grid.GRID) the cells ran."""
    all_rows = shown_rows(rows)
    rows, missed = converged(all_rows)
    summary = summarize(rows)
    cpus = sorted({r["cpu"] for r in all_rows})
    loads = "; ".join(f"{s.get('cpu', '?')}: {describe_load(s)}" for s in sessions) or "none recorded"
    lines = ["# PTQ across algorithms: reward vs precision (DQN, D4PG, PPO, A2C)", "",
             f"`python -m bench.learning.ptq_study run ...` sessions: {loads}. Evaluated on: {', '.join(cpus)}. "
             f"Written "
             f"{time.strftime('%Y-%m-%d')}.", "",
             "Each cell is one training run (`launch.anakin` or `launch.train`: the trainer column; fp32 actors) "
             "that stops once its evaluations reach the "
             "cell's reference return (else at its budget; the rule per cell is under Sizes and settings);"
             " its final fp32 policy is evaluated greedily "
             "at every precision on the same environment seeds. Only seeds whose fp32 policy evaluates at or above "
             "the reference enter the tables; the others are listed as not converged. QAT rows (qat-intB) are "
             "separate runs trained with `--qat-bits B` and int-B actors at the same budget and stopping rule, "
             "evaluated at int-B; their change is from the same seed's fp32 policy. Reward: mean over a "
             "seed's evaluation episodes, then mean ± sample std over seeds. Change: (R_q - R_fp32) / |R_fp32| per "
             "seed (negative = reward lost), mean ± sample std over seeds; its evaluation s.e. is the standard "
             "error of that mean from the episodes (both precisions' episode spreads, as if independent: an "
             "upper bound), and a cell outside 5% by less than 2 s.e. is *not resolved*: its episodes cannot tell "
             "it from the bound. The int8 claim holds for a cell when |change| + 2 s.e. < 5%, the s.e. being the "
             "standard error of the mean change over its seeds (sample std / sqrt(seeds): seed-to-seed and "
             "episode noise together), or the evaluation's where that is larger; it fails when |change| - 2 s.e. "
             "> 5%, and is not resolved in between. "
             "Cells trained by `launch.anakin` (the jitted trainer, 10 seeds vmapped, fp32 actors, on gymnax ports "
             "of the tasks) are evaluated like the others, on the project's own environments; where a cell has "
             "them, its 3-seed `launch.train` rows stay in the CSV (column trainer) and leave the tables. "
             "int8-head16: int8 but the output layer (DQN's Q head) at 16 bits, run dequantized. "
             "Integer rows: weights per channel, the "
             "integer kernel with 8-bit activations (W<b>A8); fp16/bf16 computed in that format. Policy bytes: the "
             "payload an actor pulls (codes bit-packed; scales, biases and LayerNorm fp32; header). Returns do not "
             "depend on machine load; no timing is reported.", "",
             "## int8 vs fp32 (the paper's claim: int8 costs almost no reward)", "",
             f"| algorithm | task | trainer | seeds | env steps | fp32 reward | int8 change | s.e. over seeds | "
             f"evaluation s.e. | int8 holds: abs(change) + 2 s.e. < {100 * WITHIN:.0f}%? |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    by_key = {(s["algo"], s["task"], s["precision"]): s for s in summary}
    any_outside = False  # a cell or a seed of it outside the bound: the margins page says why
    for algo, task in dict.fromkeys((s["algo"], s["task"]) for s in summary):
        base, q = by_key.get((algo, task, "fp32")), by_key.get((algo, task, "int8"))
        if base is None or q is None:
            continue
        verdict, ok = int8_verdict(q)
        outside = [seed for seed, c in sorted(q["changes_by_seed"].items()) if abs(c) > WITHIN]
        any_outside = any_outside or not ok or bool(outside)
        if outside:
            verdict += (" on the mean" if ok else "") + "; " + "; ".join(
                _seed_note(seed, q["changes_by_seed"][seed], [by_key.get((algo, task, f)) for f in ("bf16", "fp16")])
                for seed in outside)
        lines.append(f"| {algo} | {task} | {q['trainer']} | {q['seeds']} | {_steps(q)} | {base['reward_mean']:.1f} ± "
                     f"{base['reward_std']:.1f} | {_change(q['change_mean'], q['change_std'])} | "
                     f"{_se(q['change_se_seeds'])} | {100 * q['change_se']:.1f}% | {verdict} |")
    if any_outside:
        lines += ["", "Why a discrete policy misses: `python -m bench.learning.ptq_margins` measures each cell's "
                  "greedy-action margins against int8's output error on the states it visits "
                  "([ptq_margins.md](ptq_margins.md))."]
    heads = [s for s in summary if HEAD_SUFFIX in s["precision"] and not s["precision"].startswith(QAT_PREFIX)]
    if heads:
        lines += ["", "## The Q head at 16 bits (every other layer int8)", "",
                  "The same fp32 policies as the int8 row, the output layer kept at 16 bits and run dequantized; "
                  "int8 on the same seeds; the verdict as above.", "",
                  "| algorithm | task | seeds | int8 change | int8-head16 change | s.e. over seeds | verdict |",
                  "|---|---|---:|---:|---:|---:|---|"]
        for h in heads:
            q = by_key.get((h["algo"], h["task"], h["precision"].partition(HEAD_SUFFIX)[0]))
            paired = [q["changes_by_seed"][k] for k in sorted(h["changes_by_seed"]) if k in q["changes_by_seed"]] \
                if q else []
            int8 = _change(*_spread(paired)) if paired else "—"  # on the head row's seeds
            lines.append(f"| {h['algo']} | {h['task']} | {h['seeds']} | {int8} | "
                         f"{_change(h['change_mean'], h['change_std'])} | {_se(h['change_se_seeds'])} | "
                         f"{int8_verdict(h)[0]} |")
    qat = [s for s in summary if s["precision"].startswith(QAT_PREFIX)]
    if qat:
        lines += ["", "## QAT beside PTQ (change from the seed's fp32 reward, mean ± std over seeds)", "",
                  "PTQ on the QAT runs' seeds only, so each row compares the same seeds (a QAT run may exist for "
                  "fewer seeds than the cell has).", "",
                  "| algorithm | task | bits | PTQ | QAT | seeds (QAT) |", "|---|---|---:|---:|---:|---:|"]
        for s in qat:
            deployed = parse_precision(s["precision"].removeprefix(QAT_PREFIX))
            ptq = by_key.get((s["algo"], s["task"], deployed.name))
            paired = [] if ptq is None else [ptq["changes_by_seed"][k] for k in sorted(s["changes_by_seed"])
                                             if k in ptq["changes_by_seed"]]
            ptq_text = _change(*_spread(paired)) if paired else "—"
            lines.append(f"| {s['algo']} | {s['task']} | {deployed.bits} | {ptq_text} | "
                         f"{_change(s['change_mean'], s['change_std'])} | {s['seeds']} |")
    lines += ["", "## Every precision", "",
              "| algorithm | task | precision | seeds | episodes / seed | env steps | reward (mean ± std over seeds) | "
              "change from fp32 (mean ± std over seeds) | policy bytes | execution |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in summary:
        change = "—" if s["precision"] == "fp32" else _change(s["change_mean"], s["change_std"])
        lines.append(f"| {s['algo']} | {s['task']} | {s['precision']} | {s['seeds']} | {s['episodes']} | {_steps(s)} "
                     f"| {s['reward_mean']:.1f} ± {s['reward_std']:.1f} | {change} | {s['policy_bytes']:,} | "
                     f"{s['execution']} |")
    lines += ["", "## Not converged (kept out of the tables above)", ""]
    lines += [f"- {r['algo']} / {r['task']} seed {r['seed']}: fp32 {_below(r)} after {r['train_steps']:,} "
              f"env steps, " + ("no reference return" if r.get("reference") is None else
                                f"reference {r['reference']:g}") + _int8_beside(r, all_rows)
              for r in missed] or ["- none"]
    lines += ["", "## Sizes and settings (`bench.learning.ptq_study_grid.GRID`)", ""]
    for algo, task in dict.fromkeys((r["algo"], r["task"]) for r in all_rows):
        row = next((r for r in grid if (r.algo, r.task) == (algo, task)), None)
        if row is not None:
            cell = [r for r in all_rows if (r["algo"], r["task"]) == (algo, task)]
            steps = {r["train_steps"] for r in cell if r["precision"] == "fp32"}
            ran = " / ".join(f"{n:,}" for n in sorted(steps))
            sets = ", ".join(f"{k}={v}" for k, v in row.overrides.items()) or "the task's preset"
            ref = "" if row.reference is None else f"; reference {row.reference:g} ({row.source})"
            # (streak, episodes) per rule the cell's runs stopped by
            rules = sorted({recorded_rule(r.get("train_eval_episodes"), r.get("train_target_streak"))[::-1]
                            for r in cell})
            stops = " / ".join(f"{n} evaluations of {k} episodes in a row" if n > 1 else
                               f"1 evaluation of {k} episodes" if n == 1 else "none (trained to the budget)"
                               for n, k in rules)
            lines.append(f"- {algo} / {task}: trained {ran} env steps (the grid's default budget: {row.steps:,}); "
                         f"{sets}" + (f" ({row.note})" if row.note else "") + ref + f"; stopped by {stops}")
    lines += ["", f"Per seed and precision: `{CSV_FILE}`; plot: `{PNG_FILE}`.", ""]
    return "\n".join(lines)


def int8_verdict(q: dict[str, Any]) -> tuple[str, bool]:
    """(verdict, holds) for a cell's int8 line: holds when |change| + 2 s.e. < 5%, fails when |change| - 2 s.e. > 5%,
    else not resolved. The s.e. is the one over seeds, or the evaluation's where that is larger (a few seeds that
    happen to agree do not make noisy episodes exact); a single seed has no s.e. over seeds, so no verdict."""
    change, se = abs(q["change_mean"]), max(q["change_se_seeds"], q["change_se"])
    if math.isnan(change) or math.isnan(se):
        return "n/a (one seed: no s.e. over seeds)", False
    if change + 2 * se < WITHIN:
        return "yes", True
    if change - 2 * se > WITHIN:
        return "no", False
    spans = f"abs(change) {100 * change:.1f}% ± 2 s.e. {100 * 2 * se:.1f}% spans {100 * WITHIN:.0f}%"
    return f"not resolved ({spans})", False


def _se(se: float) -> str:
    return "n/a" if math.isnan(se) else f"{100 * se:.1f}%"


def _int8_beside(fp32: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """The same seed's int8 reward and change, shown beside a seed that is kept out of the tables."""
    key = (fp32["algo"], fp32["task"], fp32["seed"])
    int8 = next((r for r in rows if (r["algo"], r["task"], r["seed"]) == key and r["precision"] == "int8"), None)
    if int8 is None or not fp32["mean_return"]:
        return ""
    change = (int8["mean_return"] - fp32["mean_return"]) / abs(fp32["mean_return"])
    return f"; int8 {int8['mean_return']:.1f} ({_pct(change)})"


def _seed_note(seed: int, change: float, floats: Sequence[dict[str, Any] | None]) -> str:
    """Why a seed's int8 change may be large: if bf16/fp16 rounding alone moved the same seed's reward as much,
    the fp32 policy sits on a knife edge (any perturbation flips episodes) rather than int8 being too coarse."""
    note = f"seed {seed} {_pct(change)}"
    moves = [(f["precision"], f["changes_by_seed"][seed]) for f in floats if f and seed in f["changes_by_seed"]]
    big = [(name, c) for name, c in moves if abs(c) > WITHIN]
    if big:
        note += " (" + ", ".join(f"{name} {_pct(c)}" for name, c in big) + " on the same seed: fp32 policy fragile)"
    return note


def _steps(s: dict[str, Any]) -> str:
    return " / ".join(f"{n:,}" for n in s["train_steps"])


MIN_SPAN = 0.1  # of the task's return range (or of the returns' size): the least a panel's y axis spans


def _y_limits(limits: tuple[float, float], bounds: tuple[float, float] | None) -> tuple[float, float]:
    """A panel's y range: what matplotlib chose, within the task's possible returns (a little margin), and at least
    MIN_SPAN of their range wide, so that a 1-point difference on CartPole's 0..500 looks like one, not a cliff."""
    low, high = limits
    pad = 0.03 * (bounds[1] - bounds[0]) if bounds is not None else 0.0
    if bounds is not None:
        low, high = max(low, bounds[0] - pad), min(high, bounds[1] + pad)
    span = MIN_SPAN * (bounds[1] - bounds[0] if bounds is not None else max(abs(low), abs(high), 1.0))
    if high - low < span:
        middle = (low + high) / 2
        low, high = middle - span / 2, middle + span / 2
        if bounds is not None:  # slide back inside the returns the task can have
            shift = min(0.0, bounds[1] + pad - high) + max(0.0, bounds[0] - pad - low)
            low, high = low + shift, high + shift
    return low, high


def plot(rows: Sequence[dict[str, Any]], path: Path) -> Any:
    """One panel per (algorithm, task): every seed's return at each precision as a point, the mean over seeds as
    a line over the PTQ precisions and as marks for the QAT runs;
    no std bars (with three seeds they drew returns past the task's maximum). The y axis stays within
    the task's possible returns (`quarl.envs.factory.return_range`) and spans at least a tenth of them
    (`_y_limits`); the legend sits below the panels and the title above them. Returns the (saved, closed) Figure."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    from quarl.envs.factory import return_range  # pylint: disable=import-outside-toplevel

    rows = shown_rows(rows)
    rows = converged(rows)[0] or rows  # the converged seeds; all of them before any converged
    summary = summarize(rows)
    panels = list(dict.fromkeys((s["algo"], s["task"]) for s in summary))
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.0 * cols, 3.6 * nrows + 0.9), squeeze=False)
    for ax, (algo, task) in zip(axes.flat, panels):
        ss = [s for s in summary if (s["algo"], s["task"]) == (algo, task)]
        names = [s["precision"] for s in ss]
        seeds = sorted({r["seed"] for r in rows if (r["algo"], r["task"]) == (algo, task)})
        for k, seed in enumerate(seeds):
            per = {r["precision"]: r["mean_return"] for r in rows
                   if (r["algo"], r["task"], r["seed"]) == (algo, task, seed)}
            dx = 0.5 * (k / (len(seeds) - 1) - 0.5) if len(seeds) > 1 else 0.0  # side by side: equal returns show
            ax.plot([i + dx for i, n in enumerate(names) if n in per], [per[n] for n in names if n in per], "o",
                    ms=3.5, color="grey", alpha=0.7, label="one seed")
        ptq = [i for i, n in enumerate(names) if not n.startswith("qat-")]  # one line: the same policy requantized
        ax.plot(ptq, [ss[i]["reward_mean"] for i in ptq], "-", marker="_", ms=14, color="tab:blue",
                label="mean over seeds (PTQ of one fp32 policy)")
        qat = [i for i, n in enumerate(names) if n.startswith("qat-")]
        if qat:  # separate training runs: marks, not joined to the PTQ line
            ax.plot(qat, [ss[i]["reward_mean"] for i in qat], "D", ms=6, color="tab:orange",
                    label="mean over seeds (QAT run at that width)")
        ax.set_ylim(*_y_limits(ax.get_ylim(), return_range(task)))
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_title(f"{algo} / {task} ({_steps(ss[0])} env steps)", fontsize=9)
        ax.set_ylabel("reward")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    unique: dict[str, Any] = {}
    for ax in axes.flat:  # every kind of mark any panel drew, once
        for handle, label in zip(*ax.get_legend_handles_labels()):
            unique.setdefault(label, handle)
    fig.legend(list(unique.values()), list(unique), loc="lower center", ncol=len(unique), fontsize=8, frameon=False)
    fig.suptitle(f"Post-training quantization: reward vs precision; "
                 f"{'; '.join(sorted({r['cpu'] for r in rows}))}", fontsize=10)
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, 0.6 / height, 1, 1 - 0.45 / height))  # room for the legend below, the title above
    save_figure(fig, path, dpi=110)
    return fig
