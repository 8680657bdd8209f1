"""Pixel training speed in the program: `launch.train` env steps/s on a MinAtar task, where the time goes, and the
same run with the conv learner before its fix, side by side in one process.

    python -m bench.system.pixel_train [--agent ppo] [--task MinAtar/Breakout] [--steps 160000] [--precision int8]
                                       [--variants program,before] [--quick] [--out DIR] [--allow-busy]

Each variant is one single-process run (`launch.experiments.run_experiment`, the task's pixel preset, int8 actors,
seed 0, evaluation every tenth of the run) with the learner built as `bench.micro.conv_update.variant` says:
`program` (what ships: canonical conv gradients, `agents.loops`' scan), `before` (the scan with JAX's own conv
gradient, the program before `quarl.nets.conv`) and `unrolled` (canonical gradients, loops unrolled). Reported per
variant: env steps per second of train clock, the learner's seconds (on-policy updates are waited for where they are
timed, so this is work, not dispatch) and the actor's stages (env, policy, insert, weights), so a miss of the 8,000
env steps/s target shows its cause. Writes DIR/pixel_train.{json,md} (default results/bench; --quick, 20k steps of
`program` only, writes to runs/bench/pixel-train-quick). The figures depend on the machine and its load: run it
alone.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from bench.harness.learner_variants import VARIANTS, variant
from bench.harness.machine import add_allow_busy, bench_machine, describe_cpu, describe_load, finish, refuse_if_busy
from bench.harness.results_io import write_and_print
from quarl.quant.precision import precision_name_arg

REPO = Path(__file__).resolve().parents[2]
ACTOR_STAGES = ("env_step_s", "policy_s", "insert_s", "quantize_encode_s", "load_s", "deserialize_s")
TARGET_STEPS_PER_S = 8_000  # issue 45: PPO on MinAtar Breakout with int8 actors


def run_variant(name: str, agent: str, task: str, steps: int, precision: str, logdir: Path) -> dict[str, Any]:
    """One `launch.train`-equivalent run under `variant(name)`; its speed and time shares."""
    from launch.experiments.config import ExperimentConfig  # pylint: disable=import-outside-toplevel
    from launch.experiments.run_experiment import run_experiment  # pylint: disable=import-outside-toplevel

    import agents  # pylint: disable=import-outside-toplevel

    config = ExperimentConfig(agent=agent, task=task, precision=precision, max_actor_steps=steps, seed=0,
                              logdir=str(logdir), overrides=agents.task_defaults(agent, task),
                              learner_loop="unroll" if name == "unrolled" else "scan")
    with variant(name):
        s = run_experiment(config, progress=False, energy=False)
    times = s["actors"][0]["times"]
    train_s = float(s["train_clock_s"])
    return {"variant": name, "env_steps": int(s["actor_steps"]), "train_clock_s": train_s,
            "run_wall_clock_s": float(s["run_wall_clock_s"]), "env_steps_per_s": s["actor_steps"] / train_s,
            "learner_updates": int(s["learner_steps"]), "learner_s": float(s["learner"]["step_s"]),
            "learner_ms_per_update": 1e3 * float(s["learner"]["step_s"]) / max(1, int(s["learner_steps"])),
            "actor": {k: float(times[k]) for k in ACTOR_STAGES}, "evaluation_s": float(s["evaluation_s"]),
            "loop_form": s["learner"]["loop_form"], "kernel_form": s["kernel_form"],
            "final_eval_return": s["final_eval_return"]}


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    rows = {r["variant"]: r for r in result["rows"]}
    lines = [f"# Pixel training speed in the program: {result['agent']} on {result['task']}, {result['precision']} "
             "actors", "", f"Command: `{result['command']}`", "",
             f"Machine: {describe_cpu(m, flags=True)}; {describe_load(m)}.", "",
             f"One `launch.train` run per variant ({result['steps']:,} env steps, seed 0, the task's preset). Train "
             "clock: the run's wall clock less its evaluations (the first update's compilation included); the "
             "learner's seconds are its updates' work; the actor's stages (s) are what the acting loop timed.", "",
             "| variant | env steps/s | train clock (s) | learner (s) | ms per update | env | policy | insert | "
             "quantize + load | evaluations (s) | final return |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        a = r["actor"]
        lines.append(f"| {r['variant']} | {r['env_steps_per_s']:,.0f} | {r['train_clock_s']:.1f} "
                     f"| {r['learner_s']:.1f} "
                     f"| {r['learner_ms_per_update']:.0f} | {a['env_step_s']:.1f} | {a['policy_s']:.1f} | "
                     f"{a['insert_s']:.1f} | {a['quantize_encode_s'] + a['load_s'] + a['deserialize_s']:.1f} | "
                     f"{r['evaluation_s']:.1f} | {r['final_eval_return']} |")
    if "program" in rows:
        p = rows["program"]
        lines += ["", f"Target: >= {TARGET_STEPS_PER_S:,} env steps/s; the program ran {p['env_steps_per_s']:,.0f} "
                  f"({'met' if p['env_steps_per_s'] >= TARGET_STEPS_PER_S else 'missed'}). The learner took "
                  f"{100 * p['learner_s'] / p['train_clock_s']:.0f}% of the train clock."]
        if "before" in rows:
            lines.append(f"Speed-up over the conv learner before its fix: "
                         f"{p['env_steps_per_s'] / rows['before']['env_steps_per_s']:.2f}x.")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.system.pixel_train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", default="ppo", choices=("ppo", "a2c", "dqn"))
    parser.add_argument("--task", default="MinAtar/Breakout")
    parser.add_argument("--steps", type=int, default=160_000, help="env steps per run")
    parser.add_argument("--precision", default="int8", type=precision_name_arg("actor"))
    parser.add_argument("--variants", default="program,before", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--quick", action="store_true", help="20,000 steps of `program` only (a smoke run)")
    parser.add_argument("--out", type=Path, default=None)
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    variants = ["program"] if args.quick else [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        parser.exit(2, f"{parser.prog}: error: --variants takes {', '.join(VARIANTS)}, got {args.variants!r}\n")
    if args.steps < 1:
        parser.exit(2, f"{parser.prog}: error: --steps must be positive\n")
    steps = 20_000 if args.quick else args.steps
    out = args.out or (REPO / "runs" / "bench" / "pixel-train-quick" if args.quick else REPO / "results" / "bench")
    refuse_if_busy(parser, args.allow_busy)
    machine = bench_machine(args.allow_busy)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pixel-train-") as tmp:
        for name in variants:
            rows.append(run_variant(name, args.agent, args.task, steps, args.precision, Path(tmp) / name))
            print(f"{name}: {rows[-1]['env_steps_per_s']:,.0f} env steps/s", flush=True)
    result = {"agent": args.agent, "task": args.task, "precision": args.precision, "steps": steps, "rows": rows,
              "machine": finish(machine)}
    return write_and_print(out, "bench.system.pixel_train", argv, result, markdown)


if __name__ == "__main__":
    sys.exit(main())
