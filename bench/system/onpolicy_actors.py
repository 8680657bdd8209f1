"""On-policy ActorQ actors at the paper's 2048x3 policy, int8 against fp32, in the distributed program.

    python -m bench.system.onpolicy_actors [--steps 6000] [--rounds 2] [--num-actors 2] [--quick] [--out DIR]
        [--allow-busy]

Each run is `launch.actorq --agent ppo --task CartPole-v1 --rollout-mode async` with a 2048x3 policy, one
environment per actor, ONNX Runtime actors, and evaluation only at the end; fp32 and int8 take turns (the order
flips every round, each round its own seed). From each run's summary.json, per precision, medians over rounds:

- *env steps/s*: what the actors delivered, all actors together, over the run (the program's own figure);
- *acting env steps/s*: the same steps over the time the actors spent acting and loading weights (env step +
  policy + pull + deserialize + load), i.e. without the time they waited for the learner to take a rollout.
  On a machine with fewer cores than nodes the learner's update sets the pace of an asynchronous program, and
  the two precisions would tie on the first figure for that reason alone; the second is what the actors would
  deliver with a learner that keeps up (a GPU, or a core of its own);
- policy µs per env step, weight-update ms per version (pull + deserialize + load), payload bytes, what the actors
  executed, the learner's waiting share, rollout lag and stale rollouts dropped.

A speed benchmark: run it alone (it refuses a busy machine unless --allow-busy; the load is recorded).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from bench.harness.learning_runs import REPO, empty_run_dir, median_or_none
from bench.harness.machine import add_allow_busy, bench_machine, describe_load, finish, refuse_if_busy
from bench.harness.results_io import command_line, write_results
from bench.harness.subprocess_runs import run_subprocess
from quarl.ops.machine import machine_fields

PRECISIONS = ("fp32", "int8")
HIDDEN = "2048,2048,2048"
RUN_TIMEOUT_S = 1200.0
ACTING_STAGES = ("env_step_s", "policy_s", "pull_s", "deserialize_s", "load_s")


def run_command(precision: str, seed: int, steps: int, num_actors: int, logdir: Path) -> list[str]:
    return [sys.executable, "-m", "launch.actorq", "--agent", "ppo", "--task", "CartPole-v1", "--precision", precision,
            "--num-actors", str(num_actors), "--rollout-mode", "async", "--backend", "onnx",
            "--set", f"policy_hidden_sizes={HIDDEN}", "--set", "update_epochs=1", "--set", "num_envs=1",
            "--max-actor-steps", str(steps), "--eval-every", str(10 * steps), "--eval-episodes", "1",
            "--seed", str(seed), "--logdir", str(logdir), "--no-progress"]


def read_run(summary: Mapping[str, Any]) -> dict[str, Any]:
    """One run's figures from its summary.json (see the module docstring)."""
    actors = [a for a in summary.get("actors") or [] if a.get("times")]
    acting_rates, policy_us, update_ms = [], [], []
    for actor in actors:
        times = actor["times"]
        busy = sum(float(times.get(stage) or 0.0) for stage in ACTING_STAGES)
        if busy > 0:
            acting_rates.append(float(times["env_steps"]) / busy)  # actors act side by side: their rates add
        if times.get("policy_us_per_step") is not None:
            policy_us.append(float(times["policy_us_per_step"]))
        if times.get("update_ms") is not None:
            update_ms.append(float(times["update_ms"]))
    info = (summary.get("learner") or {}).get("on_policy") or {}
    return {"status": summary.get("status"), "executed": summary.get("executed"),
            "actor_steps": summary.get("actor_steps"), "env_steps_per_s": summary.get("actor_steps_per_s"),
            "acting_env_steps_per_s": sum(acting_rates) if acting_rates else None,
            "policy_us_per_step": statistics.fmean(policy_us) if policy_us else None,
            "update_ms": statistics.fmean(update_ms) if update_ms else None,
            "payload_bytes": summary.get("payload_bytes"), "learner_wait_frac": info.get("wait_frac"),
            "lag_mean": info.get("lag_mean"), "stale_dropped": info.get("stale_dropped"),
            "rollouts_trained": info.get("rollouts_trained"), "wall_clock_s": summary.get("wall_clock_s")}


def run_one(precision: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    logdir = empty_run_dir(args.runs / f"{precision}_seed{seed}")
    logdir.parent.mkdir(parents=True, exist_ok=True)
    code, text, wall = run_subprocess(run_command(precision, seed, args.steps, args.num_actors, logdir),
                                      args.runs / f"{precision}_seed{seed}.log", RUN_TIMEOUT_S, REPO)
    summary_path = logdir / "summary.json"
    record: dict[str, Any] = {"precision": precision, "seed": seed, "process_wall_s": round(wall, 1)}
    if code != 0 or not summary_path.exists():
        return {**record, "failed": f"exit {code}: {text[-400:]}"}
    return {**record, **read_run(json.loads(summary_path.read_text()))}


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians over rounds per precision, and the int8 / fp32 ratios of the rates (policy time: fp32 / int8)."""
    cells: dict[str, dict[str, Any]] = {}
    for precision in PRECISIONS:
        ok = [r for r in records if r["precision"] == precision and "failed" not in r]
        cells[precision] = {"runs": len(ok), "executed": ok[0]["executed"] if ok else None,
                            **{k: median_or_none([r.get(k) for r in ok]) for k in (
                                "env_steps_per_s", "acting_env_steps_per_s", "policy_us_per_step", "update_ms",
                                "payload_bytes", "learner_wait_frac", "lag_mean", "stale_dropped",
                                "process_wall_s")}}
    fp32, int8 = cells["fp32"], cells["int8"]

    def ratio(num: float | None, den: float | None) -> float | None:
        return num / den if num and den else None

    return {"cells": cells, "ratios": {
        "env_steps_per_s": ratio(int8["env_steps_per_s"], fp32["env_steps_per_s"]),
        "acting_env_steps_per_s": ratio(int8["acting_env_steps_per_s"], fp32["acting_env_steps_per_s"]),
        "policy_time": ratio(fp32["policy_us_per_step"], int8["policy_us_per_step"]),
        "update_time": ratio(fp32["update_ms"], int8["update_ms"])},
        "failed": [f"{r['precision']} seed {r['seed']}" for r in records if "failed" in r]}


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "—" if value is None else format(value, spec)


def markdown(result: Mapping[str, Any], command: str) -> str:
    machine, summary = machine_fields(result["machine"]), result["summary"]
    lines = ["# On-policy ActorQ actors at a 2048x3 policy: int8 against fp32", "",
             f"`{command}` on {machine['cpu_model']} ({machine['cpu_class']}, {machine.get('cores', '?')} cores), "
             f"{describe_load(machine)}. `launch.actorq --agent ppo` on CartPole-v1, asynchronous, "
             f"{result['num_actors']} actors of one environment, policy {HIDDEN.replace(',', 'x')}, "
             f"{result['steps']:,} env steps per run, ONNX Runtime actors; {result['rounds']} rounds, fp32 and int8 "
             "taking turns. Medians over rounds. *Acting* env steps/s leaves out the time actors waited for the "
             "learner to take a rollout (see `bench/system/onpolicy_actors.py`).", "",
             "| actors | runs | executed | env steps/s | acting env steps/s | policy µs/step | weight update ms | "
             "payload bytes | learner waiting | lag | stale dropped |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for precision in PRECISIONS:
        c = summary["cells"][precision]
        wait = f"{100 * c['learner_wait_frac']:.0f}%" if c["learner_wait_frac"] is not None else "—"
        lines.append(f"| {precision} | {c['runs']} | {c['executed'] or '—'} | {_fmt(c['env_steps_per_s'], ',.1f')} | "
                     f"{_fmt(c['acting_env_steps_per_s'], ',.1f')} | {_fmt(c['policy_us_per_step'])} | "
                     f"{_fmt(c['update_ms'], ',.1f')} | {_fmt(c['payload_bytes'])} | {wait} | "
                     f"{_fmt(c['lag_mean'], '.2f')} | {_fmt(c['stale_dropped'])} |")
    r = summary["ratios"]
    lines += ["", "int8 over fp32: env steps/s " + _fmt(r["env_steps_per_s"], ".2f") + "x; acting env steps/s "
              + _fmt(r["acting_env_steps_per_s"], ".2f") + "x; policy time " + _fmt(r["policy_time"], ".2f")
              + "x less; weight update time " + _fmt(r["update_time"], ".2f") + "x less."]
    if summary["failed"]:
        lines += ["", "Failed runs: " + ", ".join(summary["failed"])]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.system.onpolicy_actors", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6_000, help="env steps per run (default 6,000)")
    p.add_argument("--rounds", type=int, default=2, help="runs per precision, each round its own seed (default 2)")
    p.add_argument("--num-actors", type=int, default=2)
    p.add_argument("--runs", type=Path, default=REPO / "runs" / "bench" / "onpolicy_actors")
    p.add_argument("--out", type=Path, default=REPO / "results" / "bench")
    p.add_argument("--quick", action="store_true", help="one round of 600 steps, into RUNS")
    add_allow_busy(p)
    args = p.parse_args(argv)
    if args.steps < 1 or args.rounds < 1 or args.num_actors < 1:
        p.error("--steps, --rounds and --num-actors must be >= 1")
    if args.quick:
        args.steps, args.rounds, args.out = 600, 1, args.runs
    refuse_if_busy(p, args.allow_busy)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    machine = bench_machine(args.allow_busy)
    records = []
    for seed in range(args.rounds):
        for precision in (PRECISIONS if seed % 2 == 0 else PRECISIONS[::-1]):
            record = run_one(precision, seed, args)
            print(f"{precision} seed {seed}: {record.get('failed') or record['env_steps_per_s']} env steps/s",
                  flush=True)
            records.append(record)
    result = {"machine": finish(machine), "steps": args.steps, "rounds": args.rounds, "num_actors": args.num_actors,
              "summary": summarize(records), "runs": records}
    write_results(args.out, "onpolicy_actors", result, markdown(result, command_line("bench.system.onpolicy_actors",
                                                                                    argv)))
    print(f"wrote {args.out}/onpolicy_actors.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
