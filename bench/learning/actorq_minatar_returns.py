"""ActorQ on MinAtar: the final return of int8 actors against fp32 actors, same settings and seeds, side by side.

    python -m bench.system.actorq_minatar returns [--game Breakout] [--seeds 0,1] [--frames 40000] [--evals 4]
                                           [--eval-episodes 10] [--runner local] [--num-actors 1] [--out DIR]
    python -m bench.system.actorq_minatar returns --from-runs RUN_DIR ... [--out DIR]

(`python -m bench.learning.actorq_minatar_returns ...` is the same program: the `returns` mode runs it.)

Each run is the real distributed program, `python -m launch.actorq --agent dqn --task MinAtar/<game>
--precision {fp32,int8} --seed S`, in its own process, one at a time (seeds outer, precisions inner, so load
drift hits both precisions of a seed alike). Both precisions take exactly the same flags: the MinAtar authors'
DQN settings (`bench.learning.minatar_dqn.AUTHORS_SETTINGS`: their replay, batch, one update per frame, target period,
exploration, learning rate), one actor (so epsilon decays linearly as theirs does; N > 1 actors would take
Ape-X's fixed ladder), weights published every 100 learner steps (= the actor's pull period), and a stop at
`--frames` env steps (`--max-actor-steps`; a MinAtar frame is one env step). The evaluator plays
`--eval-episodes` greedy episodes with the deployed (int8 or fp32) policy `--evals` times during the run and once
more at its end; the returns are read from each run's evaluator.csv (`bench.learning.minatar_dqn.results_from_runs`).

"Within seed noise" needs both: |mean over seeds of int8's final return - the same for fp32| is no larger than
fp32's seed-to-seed range (max - min over seeds of fp32's final return), and the per-seed int8 - fp32 differences
are not significant at 5% in a paired t-test (`bench.harness.learning_runs.paired_test`): a gap inside the range
that has the same sign on every seed is a real, small effect, not noise. A run's final return is the mean of its
last 3 evaluations (the last ones, with the end-of-run one, are the least noisy single figure a run gives). ActorQ is asynchronous (actor, learner and evaluator run concurrently, and how many learner
steps fit between two weight pulls depends on timing), so a rerun with the same seed is not bit-identical;
seeds fix the environments, the initial weights and the exploration draws.

Writes DIR/actorq_minatar_returns.json and .md (default DIR results/bench); run logs go under
runs/bench/actorq_minatar_returns/<time>/<game>_<precision>_s<seed>/ (the launch.actorq log beside each).
Returns are seeded and do not depend on load; the load average is recorded anyway.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from bench.harness.learning_runs import paired_test, relative_path
from bench.harness.machine import add_allow_busy, bench_machine, describe_load, finish
from bench.learning.minatar_dqn import AUTHORS_DQN, AUTHORS_SETTINGS, results_from_runs
from bench.harness.results_io import command_line, write_json, write_results
from launch.cli import OneLineArgumentParser
from quarl.ops.machine import load_average, machine_fields

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "bench"
RUNS = REPO / "runs" / "bench" / "actorq_minatar_returns"
PRECISIONS = ("fp32", "int8")  # fp32 first: the baseline int8 is set against
LAST_K = 3  # evaluations averaged into a run's final return
PUBLISH_PERIOD = 100  # learner steps between weight versions: DQNConfig.actor_update_period, the actor's pull period


def actorq_argv(game: str, precision: str, seed: int, frames: int, eval_every: int, eval_episodes: int,
                runner: str, num_actors: int, logdir: Path) -> list[str]:
    """The `launch.actorq` command line of one run; only --precision, --seed and --logdir differ between runs."""
    sets = [f"{k}={'none' if v is None else v}" for k, v in AUTHORS_SETTINGS.items()]
    return [sys.executable, "-m", "launch.actorq", "--agent", "dqn", "--task", f"MinAtar/{game}",
            "--precision", precision, "--seed", str(seed), "--runner", runner, "--num-actors", str(num_actors),
            "--max-actor-steps", str(frames), "--eval-every", str(eval_every), "--eval-episodes", str(eval_episodes),
            "--publish-period", str(PUBLISH_PERIOD), "--logdir", str(logdir), "--no-progress",
            *(a for s in sets for a in ("--set", s))]


def run_one(argv: list[str], logdir: Path) -> None:
    """Runs one `launch.actorq` process to its end (its output to <logdir>.log) and records its command line and
    the load average before and after it in <logdir>/bench_run.json (what `run_info` reads back)."""
    log, load_start = logdir.with_suffix(".log"), load_average()
    with open(log, "w", encoding="utf-8") as f:
        code = subprocess.run(argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        raise RuntimeError(f"launch.actorq exited {code}; see {log}")
    info = {"argv": ["python", *argv[1:]], "load_start": load_start, "load_end": load_average()}
    write_json(logdir / "bench_run.json", info)


def run_info(logdir: Path) -> dict[str, Any]:
    """One run's key figures from its summary.json, with bench_run.json's command line and load where present."""
    s = json.loads((logdir / "summary.json").read_text(encoding="utf-8"))
    info = {k: s.get(k) for k in ("status", "actor_steps", "learner_steps", "executed", "run_wall_clock_s",
                                  "payload_bytes", "payload_bytes_fp32")}
    extra = logdir / "bench_run.json"
    if extra.exists():
        info.update(json.loads(extra.read_text(encoding="utf-8")))
    return info


def shared_config(dirs: Sequence[Path]) -> dict[str, Any]:
    """The experiment every run shares (its summary.json's `experiment` less precision, seed and logdir), as the
    report shows it; a ValueError when two runs differ in anything else (they would not be side by side)."""
    shared = None
    for d in dirs:
        exp = json.loads((d / "summary.json").read_text(encoding="utf-8"))["experiment"]
        exp = {k: v for k, v in exp.items() if k not in ("precision", "seed", "logdir")}
        if shared is not None and exp != shared:
            diff = sorted(k for k in exp.keys() | shared.keys() if exp.get(k) != shared.get(k))
            raise ValueError(f"{d} was run with other settings than the runs before it ({', '.join(diff)})")
        shared = exp
    if shared is None:
        raise ValueError("no run directories")
    argv = run_info(dirs[0]).get("argv", [])
    return {"game": shared["task"].split("/", 1)[1], "frames": shared["max_actor_steps"],
            "eval_every": shared["eval_every"], "eval_episodes": shared["eval_episodes"],
            "runner": argv[argv.index("--runner") + 1] if "--runner" in argv else "not recorded",
            "num_actors": shared["distributed"]["num_actors"],
            "publish_period": shared["distributed"]["publish_period"], "settings": shared["overrides"]}


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Adds each run's last-K mean and gathers, per seed, int8 - fp32 and fp32's seed-to-seed spread."""
    for r in results:
        tail = [c["return"] for c in r["curve"][-LAST_K:]]
        r["last_k_mean"] = statistics.mean(tail)
    by = {(r["seed"], r["precision"]): r["last_k_mean"] for r in results}
    if len(by) < len(results):
        raise ValueError("two runs share a seed and precision; give one run per seed and precision")
    seeds = sorted({s for s, p in by if (s, "fp32") in by and (s, "int8") in by})
    diffs = [by[(s, "int8")] - by[(s, "fp32")] for s in seeds]
    out: dict[str, Any] = {"last_k": LAST_K, "paired_seeds": seeds, "int8_minus_fp32": dict(zip(seeds, diffs))}
    for p in PRECISIONS:
        vals = [v for (s, q), v in by.items() if q == p]
        out[p] = {"mean": statistics.mean(vals) if vals else None,
                  "range": max(vals) - min(vals) if len(vals) > 1 else None,
                  "stdev": statistics.stdev(vals) if len(vals) > 1 else None}
    if seeds:
        gap = statistics.mean(diffs)
        out["mean_difference"] = gap
        out["paired_t_p"] = paired_test(diffs)
        spread = out["fp32"]["range"]
        significant = out["paired_t_p"] is not None and out["paired_t_p"] < 0.05
        out["paired_significant"] = significant
        out["int8_lower_on_seeds"] = sum(d < 0 for d in diffs)
        out["within_seed_noise"] = None if spread is None else abs(gap) <= spread and not significant
        out["not_below_fp32_noise"] = None if spread is None else gap >= -spread  # the one-sided question
    steps = [abs(r["curve"][-1]["return"] - r["curve"][-2]["return"]) for r in results if len(r["curve"]) > 1]
    out["last_two_evals_abs_change"] = statistics.mean(steps) if steps else None  # evaluation noise, for scale
    return out


def markdown(result: dict[str, Any]) -> str:
    m, s, cfg = machine_fields(result["machine"]), result["summary"], result["config"]
    lines = [f"# ActorQ on MinAtar/{cfg['game']}: final return of int8 vs fp32 actors", "",
             f"Command: `{result['command']}`", "",
             f"Machine: {m['cpu_model']}, {m['cores']} logical cores; "
             f"{'report written from the run logs, ' if m.get('from_runs') else ''}{describe_load(m)} "
             "(returns are seeded and do not depend on load; no times are reported).", "",
             f"Each run: `launch.actorq --agent dqn --task MinAtar/{cfg['game']}` with {cfg['num_actors']} actor(s), "
             f"runner {cfg['runner']}, fp32 learner, the MinAtar authors' DQN settings (`bench.learning.minatar_dqn`), "
             f"{cfg['frames']:,} env steps (= MinAtar frames); every evaluation is {cfg['eval_episodes']} greedy "
             "episodes of the deployed policy at the run's precision. Final = mean of the last "
             f"{s['last_k']} evaluations (the last is the end-of-run one). ActorQ is asynchronous: the same seed "
             "does not replay bit-identically, so each figure is one draw of the run.", "",
             "| seed | precision | frames | last eval | final (mean of last "
             f"{s['last_k']}) | every evaluation (frames: return) | load at start / end |",
             "|---:|---|---:|---:|---:|---|---|"]
    executed = sorted({f"{r['precision']}: {r['run']['executed']}" for r in result["results"]
                       if r.get("run", {}).get("executed")})
    if executed:
        lines[-3:-3] = [f"What the actors executed (summary.json `executed`): {'; '.join(executed)}.", ""]
    for r in sorted(result["results"], key=lambda r: (r["seed"], PRECISIONS.index(r["precision"]))):
        curve = ", ".join(f"{c['actor_steps']:,}: {c['return']:.1f}" for c in r["curve"])
        lines.append(f"| {r['seed']} | {r['precision']} | {r['frames']:,} | {r['final_return']:.1f} | "
                     f"{r['last_k_mean']:.2f} | {curve} | {_load(r['run'])} |")
    lines += ["", "| | fp32 | int8 |", "|---|---:|---:|"]
    for key in ("mean", "range", "stdev"):
        cells = ["—" if s[p][key] is None else f"{s[p][key]:.2f}" for p in PRECISIONS]
        lines.append(f"| final return, {key} over seeds | {cells[0]} | {cells[1]} |")
    if s.get("paired_seeds"):
        per_seed = ", ".join(f"seed {k}: {v:+.2f}" for k, v in s["int8_minus_fp32"].items())
        p_text = "n/a" if s["paired_t_p"] is None else f"{s['paired_t_p']:.2f}"
        verdict = {True: "within", False: "outside", None: "not judged (one fp32 seed:"
                   " no spread)"}[s["within_seed_noise"]]
        n, lower = len(s["paired_seeds"]), s.get("int8_lower_on_seeds")
        sign = "" if lower is None else f"int8 is lower on {lower} of {n} seeds; "
        lines += ["", f"int8 - fp32 final return: {per_seed}; mean {s['mean_difference']:+.2f} ({sign}paired t-test p = "
                      f"{p_text}{', significant at 5%' if s.get('paired_significant') else ''}). fp32's seed-to-seed "
                      f"range is {'—' if s['fp32']['range'] is None else format(s['fp32']['range'], '.2f')}: "
                      f"the int8 - fp32 gap is **{verdict}** seed noise (|mean gap| <= fp32's range over seeds, and "
                      "no significant paired difference)"
                      + ("" if s["not_below_fp32_noise"] is None else
                         f"; int8 is {'not ' if s['not_below_fp32_noise'] else ''}below fp32 by more than that range")
                      + "."]
        if s.get("last_two_evals_abs_change") is not None:
            lines.append(f"\nFor scale, a run's last two evaluations differ by {s['last_two_evals_abs_change']:.2f} "
                         "on average (mean |last - second to last| over the runs above).")
    return "\n".join(lines) + "\n"


def _load(run: dict[str, Any]) -> str:
    """A run's 1-minute load average before / after it, as bench_run.json recorded it."""
    if not run.get("load_start") or not run.get("load_end"):
        return "not recorded"
    return f"{run['load_start'][0]:.1f} / {run['load_end'][0]:.1f}"


def _parse(argv: Sequence[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace, list[int]]:
    parser = OneLineArgumentParser(prog="bench.system.actorq_minatar returns", description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="Breakout", help=f"MinAtar game: {', '.join(AUTHORS_DQN)}")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--frames", type=int, default=40_000, help="env steps (= MinAtar frames) per run")
    parser.add_argument("--evals", type=int, default=4, help="evaluations during a run (plus one at its end)")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--runner", default="local", choices=("local", "ray"),
                        help="launch.actorq's runner (local: threads in one process, lightest on a small machine)")
    parser.add_argument("--num-actors", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--from-runs", nargs="+", default=None, metavar="RUN_DIR",
                        help="write the report from these run directories (<game>_<precision>_s<seed>) instead")
    add_allow_busy(parser)  # accepted for symmetry: returns do not depend on load
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if args.game not in AUTHORS_DQN:
        parser.error(f"unknown game {args.game!r}; valid: {', '.join(AUTHORS_DQN)}")
    if min(args.frames, args.evals, args.eval_episodes, args.num_actors) < 1 or not seeds:
        parser.error("--frames, --evals, --eval-episodes and --num-actors must be "
                     "positive and --seeds non-empty")
    return parser, args, seeds


def main(argv: Sequence[str] | None = None) -> int:
    parser, args, seeds = _parse(argv)
    machine = bench_machine(allow_busy=True)
    eval_every = max(1, args.frames // args.evals)
    if args.from_runs:
        machine["from_runs"] = True  # the load recorded is the report's, not the training runs'
        dirs = [Path(r) for r in args.from_runs]
    else:
        stamp, dirs = time.strftime("%Y%m%d-%H%M%S"), []
        for seed in seeds:
            for precision in PRECISIONS:
                logdir = RUNS / stamp / f"{args.game}_{precision}_s{seed}"
                logdir.parent.mkdir(parents=True, exist_ok=True)
                argv_run = actorq_argv(args.game, precision, seed, args.frames, eval_every, args.eval_episodes,
                                       args.runner, args.num_actors, logdir)
                try:
                    run_one(argv_run, logdir)
                except (RuntimeError, OSError, ValueError) as err:  # a failed run, not a usage error: exit 1
                    sys.stderr.write(f"{parser.prog}: {err}\n")
                    return 1
                dirs.append(logdir)
                print(f"{logdir.name}: done", flush=True)
    try:
        results = results_from_runs(dirs)
        for r, d in zip(results, dirs):
            r.update(run=run_info(d), logdir=relative_path(d))
        config, summary = shared_config(dirs), summarize(results)
    except (OSError, ValueError, KeyError) as err:
        parser.error(str(err))
    result = {"command": command_line("bench.system.actorq_minatar returns", argv),
              "config": config, "machine": finish(machine), "results": results, "summary": summary}
    text = markdown(result)
    write_results(Path(args.out), "actorq_minatar_returns", result, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
