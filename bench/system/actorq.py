"""Distributed ActorQ, int8 vs fp32 actors, measured side by side on this machine.

    python -m bench.system.actorq [--quick] [--out DIR] [--seeds 0,1,2] [--skip-e2e] [--skip-sweep] [--allow-busy]

1. Actor throughput: environment steps per second of one D4PG actor (the paper's 2048x3 policy) on
   cartpole:balance, in a Ray actor (one compute thread, as an ActorQ actor) pinned to one core (so no
   runtime gets a second core: `bench.harness.machine.pin_to_one_core`), with fp32, int8 and int4 policies taking
   turns every 50 steps (so load from other processes hits all alike) and stepping the same environment state
   sequence (same seed, same recorded actions; the policy runs on every
   observation); each ratio vs fp32 is the median over rounds of each round's ratio, also with both charged
   the pair's mean env time. Env step and policy time are reported separately. Every precision runs on
   `backend="auto"`, as real actors do: fp32 on the fastest fp32 executor auto measures (the strongest
   baseline), int4 usually on MatMulNBits (`onnx-nbits`). Target: >= 4x fp32 (issue 9: int8; int4 shown
   beside it, the table says which meets it on this CPU class).
2. Weight update cost: pull (Ray call to the real `WeightServer` node + reading the bytes the learner put in the
   object store, payload already quantized by the learner) + deserialize
   (`decode_payload`) + load (`actor.update`, i.e. refreshing the executor) of the 2048x3 policy, int8 vs
   fp32, alternating over rounds. Target: int8 >= 5x cheaper.
3. End to end: wall clock (and actor steps) until the evaluator first reaches a target return, distributed
   program on a local Ray (2 actors), int8 vs fp32 with the same seeds; the ratio is reported. The learner
   network is the laptop preset of `launch.actorq` with a 256x3 policy; on a 2-core machine the learner, not
   the actors, bounds the pace, which the result states rather than hides.

4. Vectorized actors (`bench.system.actor_sweep`): K environments per actor (1, 4, 16, 64) with one policy call per step,
   fp32 and int8 at 256x3 and 2048x3, env steps per core-second, each precision also at its best K.

Peers (legacy Acme D4PG, SB3 DQN) are measured beside this project in the same run by `bench.peers.offpolicy`.

Targets are reported, never asserted: timings depend on the machine and its load. The full run writes
results/bench/actorq.{json,png,md}; --quick (a few minutes) writes to runs/bench/actorq-quick. Parts 1 and 2 are
measured in `bench.system.actorq_probe`, the page and the figure drawn in `bench.system.actorq_report`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from bench.harness.machine import add_allow_busy, bench_machine, finish, refuse_if_busy
from bench.harness.results_io import write_results
from bench.system import actor_sweep
from bench.system.actorq_probe import FULL, QUICK, TARGET_RATIO, TASK, Budget, bench_actor, median
from bench.system.actorq_report import markdown, plot
from quarl.ops.io import jsonable


# --------------------------------------------------------------------------------------------- end to end


def bench_e2e(budget: Budget, seeds: list[int], logroot: Path) -> dict[str, Any]:
    """Part 3: time to a target return, int8 vs fp32, same seeds, precisions alternating first."""
    from launch.actorq import quick_preset  # pylint: disable=import-outside-toplevel
    from launch.distributed.supervisor import run_program  # pylint: disable=import-outside-toplevel
    from launch.experiments.config import ExperimentConfig  # pylint: disable=import-outside-toplevel
    from launch.program.ray_runner import RayRunner  # pylint: disable=import-outside-toplevel

    overrides = dict(quick_preset("d4pg", TASK)["overrides"], policy_layer_sizes=(256, 256, 256))
    runs = []
    for i, seed in enumerate(seeds):
        for precision in (("int8", "fp32") if i % 2 == 0 else ("fp32", "int8")):
            logdir = _fresh(logroot / f"{precision}-seed{seed}")
            config = ExperimentConfig.create(agent="d4pg", task=TASK, precision=precision, num_actors=2,
                                      max_actor_steps=budget.e2e_max_steps, seed=seed, logdir=str(logdir),
                                      overrides=overrides, backend="auto", eval_every=2_000, eval_episodes=2,
                                      target_return=budget.e2e_target)
            summary, code = run_program(config, RayRunner())
            runs.append({"precision": precision, "seed": seed, "exit_code": code,
                         "time_to_target_s": summary["time_to_target_s"],
                         "actor_steps_to_target": summary["actor_steps_to_target"],
                         "best_eval_return": summary["best_eval_return"], "wall_clock_s": summary["wall_clock_s"],
                         "actor_steps_per_s": summary["actor_steps_per_s"],
                         "learner_steps_per_s": summary["learner_steps_per_s"],
                         "update_ms": summary["runtime"]["per_update"]["update_ms"], "logdir": str(logdir)})
            print(f"  e2e {precision} seed {seed}: target {budget.e2e_target} after "
                  f"{runs[-1]['time_to_target_s']} s / {runs[-1]['actor_steps_to_target']} steps", flush=True)
    ratios = []
    for seed in seeds:
        by = {r["precision"]: r for r in runs if r["seed"] == seed}
        if by["int8"]["time_to_target_s"] and by["fp32"]["time_to_target_s"]:
            ratios.append(by["fp32"]["time_to_target_s"] / by["int8"]["time_to_target_s"])
    return {"target_return": budget.e2e_target, "policy": [256, 256, 256], "overrides": jsonable(overrides),
            "runs": runs, "time_ratio_fp32_vs_int8": median(ratios) if ratios else None,
            "per_seed_ratios": ratios}


def _fresh(logdir: Path) -> Path:
    """An empty run directory (the bench owns these; logs append, so a previous run's rows must go)."""
    import shutil  # pylint: disable=import-outside-toplevel

    shutil.rmtree(logdir, ignore_errors=True)
    return logdir


def run(quick: bool, out: Path, seeds: list[int], e2e: bool, allow_busy: bool = False,
        sweep: bool = True) -> dict[str, Any]:
    from launch.program.ray_runner import init_ray  # pylint: disable=import-outside-toplevel

    budget = QUICK if quick else FULL
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": bench_machine(allow_busy), "quick": quick,
                              "budget": dataclasses.asdict(budget),
                              "cpu_flags": actor_sweep.cpu_flags()}  # the CPU class the int8/fp32 ratios belong to
    init_ray(None, num_cpus=8)
    import ray  # pylint: disable=import-outside-toplevel

    try:
        print("actor throughput and update cost (2048x3 policy) ...", flush=True)
        result["actor"] = bench_actor(budget, seeds[0])
        a = result["actor"]
        for p, ratio in a["throughput_ratio_vs_fp32"].items():
            print(f"  env steps/s fp32 {a['throughput']['fp32']['steps_per_s']:.0f}, {p} "
                  f"{a['throughput'][p]['steps_per_s']:.0f} -> {ratio:.2f}x (target >= {TARGET_RATIO:g}x); update ms "
                  f"fp32 {a['update']['fp32']['total_ms']:.1f}, {p} {a['update'][p]['total_ms']:.1f} -> "
                  f"{a['update_ratio_fp32_vs'][p]:.2f}x (target >= 5x)", flush=True)
        if e2e:
            print("end to end, time to target return ...", flush=True)
            result["e2e"] = bench_e2e(budget, seeds, out / "e2e-runs" if quick else Path("runs/bench/actorq-e2e"))
            ratio = result["e2e"]["time_ratio_fp32_vs_int8"]
            print(f"  time to target fp32/int8: {'n/a' if ratio is None else f'{ratio:.2f}x'}", flush=True)
        if sweep:
            print("vectorized actors: K environments per actor, fp32 and int8 ...", flush=True)
            result["sweep"] = actor_sweep.bench_sweep(actor_sweep.QUICK if quick else actor_sweep.FULL,
                                                      list(actor_sweep.DEFAULT_SIZES), list(actor_sweep.DEFAULT_ENVS),
                                                      seeds[0])
    finally:
        ray.shutdown()
    finish(result["machine"])
    write_results(out, "actorq", jsonable(result), markdown(result))
    plot(result, out / "actorq.png")
    print(f"wrote {out / 'actorq.json'}, {out / 'actorq.png'} and {out / 'actorq.md'}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.system.actorq", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few minutes; writes to runs/bench/actorq-quick")
    parser.add_argument("--out", default=None, help="output directory (default: results/bench, or "
                                                    "runs/bench/actorq-quick with --quick)")
    parser.add_argument("--seeds", default=None,
                        help="comma-separated seeds for the end-to-end runs (default: 0,1,2; 0 with --quick)")
    parser.add_argument("--skip-e2e", action="store_true", help="no end-to-end time-to-target runs")
    parser.add_argument("--skip-sweep", action="store_true", help="no vectorized-actor sweep (part 4)")
    parser.add_argument("--report-only", action="store_true",
                        help="redraw OUT/actorq.png from OUT/actorq.json, measuring nothing")
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    if args.report_only:
        out = Path(args.out or "results/bench")
        plot(json.loads((out / "actorq.json").read_text(encoding="utf-8")), out / "actorq.png")
        print(f"[bench.system.actorq] redrew {out / 'actorq.png'}")
        return 0
    try:
        text = args.seeds if args.seeds is not None else ("0" if args.quick else "0,1,2")
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not seeds or min(seeds) < 0:
        parser.error("--seeds needs at least one non-negative integer")
    out = Path(args.out) if args.out else Path("runs/bench/actorq-quick" if args.quick else "results/bench")
    refuse_if_busy(parser, args.allow_busy)
    run(args.quick, out, seeds, not args.skip_e2e, args.allow_busy, not args.skip_sweep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
