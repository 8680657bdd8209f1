"""On-policy ActorQ, return per env step: int8 against fp32 actors, for each way of taking rollouts and correcting
for the behaviour policy, with the mismatch each run saw beside its return.

    python -m bench.learning.onpolicy_corrections [--tasks CartPole-v1,cartpole:balance] [--seeds 0,1,2,3,4]
        [--arms sync-none,async-none,async-tis,async-vtrace] [--precisions fp32,int8] [--num-actors 2]
        [--steps CartPole-v1=40000,cartpole:balance=100000] [--runs DIR] [--out DIR] [--quick] [--allow-busy]

Each run is `launch.actorq --agent ppo` on Ray with N actors, the 8 environments of the single-process default
split over them (a synchronous update sees as many as a single-process one), to its full step budget, evaluating
every tenth of it.
An arm is a rollout mode and a correction (`agents.ppo.learning`): sync-none is PPO with N actors exactly;
async-* train on rollouts as they come, some versions stale. Per (task, arm, precision) the page shows the final and
the mean evaluation over seeds, and the mismatch between the fp32 learner and the behaviour policy on the rollouts:
KL(pi_learner || pi_behaviour), the spread of pi_learner / pi_behaviour and the rollout lag. In sync mode the
mismatch is quantization alone (int8 against fp32 of the same weights); async adds lag. Then, per arm, int8 minus
fp32 over seeds (paired by seed) with a paired t-test: "within seed noise" when p >= 0.05.

Runs report returns per env step only, so they may share the machine (async runs' lag depends on the relative
speed of actors and learner, so the load is recorded with the results). Resumable: a run whose summary.json says
completed is read, not run again. Writes OUT/onpolicy_corrections.{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

from analysis.runs import is_finished, read_summary
from bench.harness.learning_runs import REPO, empty_run_dir, paired_test, read_our_evals
from bench.harness.machine import add_allow_busy, bench_machine, describe_load, finish, refuse_if_busy
from bench.harness.results_io import command_line, save_figure, write_results
from bench.harness.subprocess_runs import run_subprocess
from quarl.quant.precision import precision_list_arg
from quarl.ops.machine import machine_fields

ARMS = ("sync-none", "async-none", "async-tis", "async-vtrace")
DEFAULT_STEPS = {"CartPole-v1": 40_000, "cartpole:balance": 100_000}
TOTAL_ENVS = 8  # per update, as the single-process PPO defaults: split over the actors
RUN_TIMEOUT_S = 1800.0


def run_command(task: str, arm: str, precision: str, seed: int, steps: int, num_actors: int, logdir: Path,
                episodes: int) -> list[str]:
    mode, correction = arm.split("-")
    return [sys.executable, "-m", "launch.actorq", "--agent", "ppo", "--task", task, "--precision", precision,
            "--num-actors", str(num_actors), "--rollout-mode", mode, "--correction", correction,
            "--set", f"num_envs={max(1, TOTAL_ENVS // num_actors)}", "--max-actor-steps", str(steps),
            "--eval-every", str(steps // 10), "--eval-episodes", str(episodes), "--seed", str(seed),
            "--backend", "auto", "--logdir", str(logdir), "--no-progress"]


def run_one(task: str, arm: str, precision: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run's record (runs it unless a completed summary.json is there already)."""
    logdir = args.runs / task.replace(":", "_").replace("/", "_") / arm / precision / f"seed{seed}"
    summary_path = logdir / "summary.json"
    if not is_finished(read_summary(logdir)):
        empty_run_dir(logdir).parent.mkdir(parents=True, exist_ok=True)
        episodes = 2 if ":" in task else 5
        code, text, wall = run_subprocess(run_command(task, arm, precision, seed, args.steps[task], args.num_actors,
                                                      logdir, episodes), logdir.parent / f"seed{seed}.log",
                                          RUN_TIMEOUT_S, REPO)
        print(f"{task} {arm} {precision} seed {seed}: exit {code} in {wall:.0f} s", flush=True)
        if code != 0 or not summary_path.exists():
            return {"task": task, "arm": arm, "precision": precision, "seed": seed, "failed": text[-500:]}
    summary = json.loads(summary_path.read_text())
    evals = read_our_evals(logdir / "evaluator.csv")
    info = summary["learner"]["on_policy"]
    mismatch = info.get("mismatch") or {}
    return {"task": task, "arm": arm, "precision": precision, "seed": seed,
            "final_return": summary["final_eval_return"],
            "mean_return": statistics.fmean(e["return"] for e in evals) if evals else None,
            "curve": [[e["env_steps"], e["return"]] for e in evals],
            "kl": mismatch.get("kl_learner_behaviour"), "ratio_std": mismatch.get("is_ratio_std"),
            "truncated_frac": mismatch.get("is_truncated_frac"), "lag_mean": info.get("lag_mean"),
            "stale_dropped": info.get("stale_dropped"), "rollouts": info.get("rollouts_trained"),
            "executed": summary.get("executed"), "actor_steps": summary["actor_steps"],
            "run_wall_clock_s": summary["run_wall_clock_s"]}


def _mean_sd(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Cells per (task, arm, precision) and int8 - fp32 per (task, arm), paired by seed."""
    ok = [r for r in records if "failed" not in r]
    cells, pairs = [], []
    keys = sorted({(r["task"], r["arm"], r["precision"]) for r in ok}, key=lambda k: (k[0], ARMS.index(k[1]), k[2]))
    for task, arm, precision in keys:
        rows = [r for r in ok if (r["task"], r["arm"], r["precision"]) == (task, arm, precision)]
        cell = {"task": task, "arm": arm, "precision": precision, "seeds": len(rows)}
        for key in ("final_return", "mean_return", "kl", "ratio_std", "truncated_frac", "lag_mean", "stale_dropped"):
            cell[key], cell[f"{key}_sd"] = _mean_sd([r[key] for r in rows])
        cells.append(cell)
    for task, arm in sorted({(t, a) for t, a, _ in keys}, key=lambda k: (k[0], ARMS.index(k[1]))):
        by = {p: {r["seed"]: r for r in ok if (r["task"], r["arm"], r["precision"]) == (task, arm, p)}
              for p in ("int8", "fp32")}
        seeds = sorted(set(by["int8"]) & set(by["fp32"]))
        if not seeds:
            continue
        entry: dict[str, Any] = {"task": task, "arm": arm, "seeds": seeds}
        for key in ("final_return", "mean_return"):
            diffs = [by["int8"][s][key] - by["fp32"][s][key] for s in seeds]
            p = paired_test(diffs)
            entry[key] = {"diff_mean": statistics.fmean(diffs), "p": p,
                          "within_noise": p is None or p >= 0.05}
        pairs.append(entry)
    return {"cells": cells, "int8_vs_fp32": pairs, "failed": [r for r in records if "failed" in r]}


def _fmt(value: float | None, sd: float | None = None, spec: str = ".1f") -> str:
    if value is None:
        return "—"
    return format(value, spec) + ("" if sd is None else f" ± {format(sd, spec)}")


def markdown(result: dict[str, Any], command: str) -> str:
    machine = machine_fields(result["machine"])
    lines = ["# On-policy ActorQ: int8 against fp32 actors, by rollout mode and correction", "",
             f"`{command}` on {machine['cpu_model']} ({machine['cpu_class']}), {describe_load(machine)}. "
             f"PPO, {result['num_actors']} actors on Ray, {TOTAL_ENVS} environments per update in all; budgets "
             f"{', '.join(f'{t} {n:,} steps' for t, n in result['steps'].items())}; seeds "
             f"{', '.join(map(str, result['seeds']))}. Every run goes to its full budget.", "",
             "Mean ± sd over seeds. *final*: the last evaluation (greedy, at the actors' precision); *mean*: the mean "
             "of all evaluations (area under the return curve per evaluation). KL and ratio sd: KL(pi_learner || "
             "pi_behaviour) and the sd of pi_learner / pi_behaviour on the rollouts' actions, means over the run's "
             "updates; in sync mode the learner's weights are those the actors quantized, so this is the "
             "quantization mismatch alone.", "",
             "| task | arm | actors | seeds | final | mean | KL(learner ‖ behaviour) | ratio sd | truncated | lag "
             "(versions) | stale dropped |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in result["summary"]["cells"]:
        lines.append(f"| {c['task']} | {c['arm']} | {c['precision']} | {c['seeds']} | "
                     f"{_fmt(c['final_return'], c['final_return_sd'])} | "
                     f"{_fmt(c['mean_return'], c['mean_return_sd'])} | "
                     f"{_fmt(c['kl'], None, '.2e')} | {_fmt(c['ratio_std'], None, '.3f')} | "
                     f"{_fmt(c['truncated_frac'], None, '.3f')} | {_fmt(c['lag_mean'], None, '.2f')} | "
                     f"{_fmt(c['stale_dropped'], None, '.1f')} |")
    lines += ["", "## int8 minus fp32, paired by seed", "",
              "| task | arm | seeds | final: int8 − fp32 (p) | mean: int8 − fp32 (p) | within seed noise |",
              "|---|---|---:|---:|---:|---|"]
    for e in result["summary"]["int8_vs_fp32"]:
        f, m = e["final_return"], e["mean_return"]

        def cell(x: dict[str, Any]) -> str:
            return f"{x['diff_mean']:+.1f} ({'—' if x['p'] is None else format(x['p'], '.2f')})"

        both = f["within_noise"] and m["within_noise"]
        if both:
            verdict = "yes"
        else:  # which way: a difference in int8's favour is no loss
            off = [x["diff_mean"] for x in (f, m) if not x["within_noise"]]
            verdict = "no: int8 higher" if all(d > 0 for d in off) else "no: int8 lower"
        lines.append(f"| {e['task']} | {e['arm']} | {len(e['seeds'])} | {cell(f)} | {cell(m)} | {verdict} |")
    if result["summary"]["failed"]:
        lines += ["", "Failed runs: " + ", ".join(f"{r['task']} {r['arm']} {r['precision']} seed {r['seed']}"
                                                 for r in result["summary"]["failed"])]
    lines += ["", "![return per env step](onpolicy_corrections.png)", ""]
    return "\n".join(lines)


def plot(records: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Return per env step, one panel per task: mean over seeds per arm, int8 solid, fp32 dashed."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    ok = [r for r in records if "failed" not in r and r["curve"]]
    tasks = sorted({r["task"] for r in ok})
    if not tasks:
        return None
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    colors = dict(zip(ARMS, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for ax, task in zip(axes[0], tasks):
        for arm in ARMS:
            for precision, style in (("int8", "-"), ("fp32", "--")):
                runs = [r["curve"] for r in ok if (r["task"], r["arm"], r["precision"]) == (task, arm, precision)]
                if not runs:
                    continue
                n = min(len(c) for c in runs)
                steps = [runs[0][i][0] for i in range(n)]
                mean = [statistics.fmean(c[i][1] for c in runs) for i in range(n)]
                ax.plot(steps, mean, style, color=colors[arm], label=f"{arm} {precision}")
        ax.set_title(task)
        ax.set_xlabel("env steps")
        ax.set_ylabel("evaluation return (mean over seeds)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def _steps(text: str, tasks: Sequence[str]) -> dict[str, int]:
    steps = {t: DEFAULT_STEPS.get(t, 100_000) for t in tasks}
    for item in filter(None, text.split(",")):
        task, _, value = item.rpartition("=")
        if task not in steps or not value.isdigit() or int(value) <= 0:
            raise SystemExit(f"bench.learning.onpolicy_corrections: error: --steps expects TASK=N for the chosen "
                             f"tasks, got {item!r}")
        steps[task] = int(value)
    return steps


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.learning.onpolicy_corrections", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="CartPole-v1,cartpole:balance")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--precisions", default="fp32,int8", type=precision_list_arg("actor"))
    p.add_argument("--num-actors", type=int, default=2)
    p.add_argument("--steps", default="")
    p.add_argument("--runs", type=Path, default=REPO / "runs" / "bench" / "onpolicy_corrections")
    p.add_argument("--out", type=Path, default=REPO / "results" / "bench")
    p.add_argument("--quick", action="store_true", help="CartPole, one seed, 4,000 steps, into RUNS/quick")
    add_allow_busy(p)
    args = p.parse_args(argv)
    args.tasks = [t for t in args.tasks.split(",") if t]
    args.arms = [a for a in args.arms.split(",") if a]
    bad = [a for a in args.arms if a not in ARMS]
    if bad:
        p.error(f"--arms: unknown {', '.join(bad)} (choose from {', '.join(ARMS)})")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        p.error(f"--seeds must be integers, got {args.seeds!r}")
    if args.quick:
        args.tasks, args.seeds, args.steps = ["CartPole-v1"], args.seeds[:1], "CartPole-v1=4000"
        args.runs, args.out = args.runs / "quick", args.runs / "quick"
    args.steps = _steps(args.steps, args.tasks)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    p = argparse.ArgumentParser(prog="bench.learning.onpolicy_corrections")
    refuse_if_busy(p, args.allow_busy)
    machine = bench_machine(args.allow_busy)
    records = []
    for task in args.tasks:  # seeds outermost within a task: a stop part-way leaves every arm with some seeds
        for seed in args.seeds:
            for arm in args.arms:
                for precision in args.precisions:
                    records.append(run_one(task, arm, precision, seed, args))
    result = {"machine": finish(machine), "tasks": args.tasks, "seeds": args.seeds, "arms": args.arms,
              "precisions": args.precisions, "num_actors": args.num_actors, "steps": args.steps,
              "summary": summarize(records), "runs": records}
    args.out.mkdir(parents=True, exist_ok=True)
    plot(records, args.out / "onpolicy_corrections.png")
    write_results(args.out, "onpolicy_corrections", result,
                  markdown(result, command_line("bench.learning.onpolicy_corrections", argv)))
    print(f"wrote {args.out}/onpolicy_corrections.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
