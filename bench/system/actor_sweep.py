"""Vectorized actors, int8 vs fp32 side by side: env steps per core-second for K environments per actor.

    python -m bench.system.actor_sweep [--quick] [--out DIR] [--envs 1,4,16,64] [--sizes 256,2048] [--allow-busy]

(`python -m bench.system.actorq` runs the same sweep as its part 4.) One D4PG actor on cartpole:balance, in a Ray
actor pinned to one core (`bench.harness.machine.pin_to_one_core`: no runtime gets a second core), steps K
environments and calls its policy once per step on the K observations (`quarl.acting.loop`), for policies of 3
hidden layers of each size, K in `--envs`, at fp32 and int8. Batching amortises fp32's cost too, so
vectorized fp32 is the fair modern baseline: the result reports each precision at its best K.

So that precision alone moves the ratios, both precisions step the *same environment state sequence*: the
environments are seeded alike and driven by one recorded sequence of random actions (the policy still runs on
every observation, its actions are what an actor would send), and fp32 and int8 take turns every few steps so
load from other processes hits both alike. Reported per (size, K, precision), medians over rounds:
- env steps per core-second (process CPU time of the pinned actor, the cost a cluster pays) and per second;
- policy and env microseconds per env step; an env-matched rate (both precisions charged the mean env time
  of the pair), the policy-only ratio, and the ratio of each round's time-matched measurements.
Targets (issue 9), reported, never asserted: K=1 at 2048x3, env steps/s int8 >= 4x fp32; best K for each,
env steps per core-second int8 >= 2x fp32 at 2048x3 and never below fp32 at 256x3.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from quarl.ops.machine import machine_fields

TASK = "cartpole:balance"
PRECISIONS = ("fp32", "int8")
DEFAULT_SIZES = (256, 2048)
DEFAULT_ENVS = (1, 4, 16, 32, 64)


@dataclasses.dataclass(frozen=True)
class SweepBudget:
    block_steps: int  # env steps per precision per round (rounded up to whole batches of K)
    rounds: int
    turn_steps: int  # env steps per turn before the other precision steps (rounded up to whole batches)


FULL = SweepBudget(block_steps=1_000, rounds=7, turn_steps=64)
QUICK = SweepBudget(block_steps=128, rounds=2, turn_steps=32)


class SweepProbe:
    """Runs inside a Ray actor placed like an ActorQ actor (num_cpus=1, one compute thread)."""

    def measure(self, hidden: int, num_envs: int, budget: dict[str, int], seed: int = 0,
                pin: bool = False) -> dict[str, Any]:
        """fp32 and int8 actors for a `hidden`x3 policy, each with its own K environments seeded alike and
        stepped with the same recorded actions, alternating turns; per-round totals per precision. `pin`
        confines the actor to one core first (`bench.harness.machine.pin_to_one_core`)."""
        from bench.harness.machine import pin_to_one_core  # pylint: disable=import-outside-toplevel

        core = pin_to_one_core() if pin else None
        import agents  # pylint: disable=import-outside-toplevel
        from quarl.acting.loop import VectorEnvLoop  # pylint: disable=import-outside-toplevel
        from quarl.envs.spec import environment_spec  # pylint: disable=import-outside-toplevel
        from quarl.quant.quantization import quantize_params  # pylint: disable=import-outside-toplevel
        from quarl.envs.vector import make_vector_environment  # pylint: disable=import-outside-toplevel

        b = SweepBudget(**budget)
        builder = agents.get_builder("d4pg", policy_layer_sizes=(hidden,) * 3)
        loops = {p: VectorEnvLoop(make_vector_environment(TASK, seed, num_envs), builder.make_adder)
                 for p in PRECISIONS}
        env_spec = environment_spec(loops["fp32"].env)
        params = builder.make_learner(env_spec, seed).policy_params()
        actors = {p: builder.make_actor(env_spec, quantize_params(params, p), seed=seed, backend="auto",
                                        batch_size=num_envs) for p in PRECISIONS}
        iters_per_turn = -(-b.turn_steps // num_envs)
        turns = max(1, -(-b.block_steps // (iters_per_turn * num_envs)))
        rng = np.random.default_rng(seed)
        for loop in loops.values():
            loop.reset()
        for p in PRECISIONS:  # warm-up: first-call costs, outside the measurement
            _turn(loops[p], actors[p], rng.uniform(-1, 1, (2, num_envs, env_spec.action_dim)).astype(np.float32))
        rounds = []
        for r in range(b.rounds):
            total = {p: {"policy_s": 0.0, "env_s": 0.0, "cpu_s": 0.0, "wall_s": 0.0, "steps": 0}
                     for p in PRECISIONS}
            for t in range(turns):
                actions = rng.uniform(-1, 1, (iters_per_turn, num_envs, env_spec.action_dim)).astype(np.float32)
                for p in (PRECISIONS if (r + t) % 2 == 0 else PRECISIONS[::-1]):
                    for key, value in _turn(loops[p], actors[p], actions).items():
                        total[p][key] += value
            rounds.append(total)
        # The kernel form tells the int graph from the dequantized fp32 one: both report backend "onnx".
        backends = {p: backend_label(actors[p].backend, actors[p].kernel.get("form")) for p in PRECISIONS}
        for loop in loops.values():
            loop.close()
        return {"hidden": hidden, "envs": num_envs, "backends": backends, "rounds": rounds,
                "threads": {**{k: os.environ.get(k, "") for k in ("OMP_NUM_THREADS", "XLA_FLAGS")},
                            "pinned_core": core}}


def _turn(loop: Any, actor: Any, actions: np.ndarray) -> dict[str, float]:
    """Steps `loop` once per row of `actions` (recorded, so every precision sees the same env states); the
    actor's policy runs on every batch of observations, as in a real actor."""
    policy_s = env_s = 0.0
    c0, w0 = time.process_time(), time.perf_counter()
    for batch in actions:
        out = loop.step(lambda obs, batch=batch: (actor.act(obs), batch)[1])
        policy_s += out.policy_s
        env_s += out.env_s
    return {"policy_s": policy_s, "env_s": env_s, "cpu_s": time.process_time() - c0,
            "wall_s": time.perf_counter() - w0, "steps": actions.shape[0] * actions.shape[1]}


def cpu_flags() -> list[str]:
    """The CPU class and SIMD features that decide int8 vs fp32 speed (`quarl.runtimes.cpu`)."""
    from quarl.runtimes.cpu import cpu_class, cpu_info  # pylint: disable=import-outside-toplevel

    return [cpu_class(), *cpu_info()["flags"]]


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def backend_label(backend: str, form: str | None) -> str:
    """What ran a precision's policy: the backend, and for int weights the kernel form ("fp32" = the int
    weights dequantized through fp32 MatMuls, auto's pick where no int kernel is faster at that batch)."""
    if form is None:
        return backend
    return f"{backend} (dequantized)" if form == "fp32" else f"{backend} {form}"


def spread(values: list[float]) -> float:
    """Half the rounds' range over their median: how far one round strays, the scale of the cell's noise."""
    return 0.5 * (max(values) - min(values)) / _median(values) if values else 0.0


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Per-precision medians over rounds and the int8/fp32 ratios of one (size, K) cell."""
    rounds = raw["rounds"]
    out: dict[str, Any] = {"hidden": raw["hidden"], "envs": raw["envs"], "backends": raw["backends"]}
    for p in PRECISIONS:
        rows = [r[p] for r in rounds]
        out[p] = {
            "steps_per_core_s": _median([r["steps"] / r["cpu_s"] for r in rows]),
            "steps_per_s": _median([r["steps"] / (r["policy_s"] + r["env_s"]) for r in rows]),
            "policy_us": _median([1e6 * r["policy_s"] / r["steps"] for r in rows]),
            "env_us": _median([1e6 * r["env_s"] / r["steps"] for r in rows]),
            "steps_per_core_s_spread": spread([r["steps"] / r["cpu_s"] for r in rows]),
        }
    # Env-matched: both precisions charged the pair's mean env time (same states), so only the policy differs.
    matched = {p: [] for p in PRECISIONS}
    for r in rounds:
        env_mean = 0.5 * sum(r[p]["env_s"] / r[p]["steps"] for p in PRECISIONS)
        for p in PRECISIONS:
            matched[p].append(1.0 / (env_mean + r[p]["policy_s"] / r[p]["steps"]))
    for p in PRECISIONS:
        out[p]["steps_per_s_env_matched"] = _median(matched[p])
    out["ratio_core_s"] = _median([r["int8"]["steps"] / r["int8"]["cpu_s"] / (r["fp32"]["steps"] / r["fp32"]["cpu_s"])
                                   for r in rounds])
    out["ratio_env_matched"] = _median([i / f for i, f in zip(matched["int8"], matched["fp32"])])
    out["ratio_policy_only"] = _median([(r["fp32"]["policy_s"] / r["fp32"]["steps"])
                                        / (r["int8"]["policy_s"] / r["int8"]["steps"]) for r in rounds])
    return out


def best_k(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """For each policy size: each precision at its own best K (env steps per core-second), and the ratio."""
    best: dict[str, Any] = {}
    for hidden in sorted({c["hidden"] for c in cells}):
        row: dict[str, Any] = {}
        for p in PRECISIONS:
            top = max((c for c in cells if c["hidden"] == hidden), key=lambda c, p=p: c[p]["steps_per_core_s"])
            row[p] = {"envs": top["envs"], "steps_per_core_s": top[p]["steps_per_core_s"],
                      "spread": top[p].get("steps_per_core_s_spread")}
        row["ratio_core_s"] = row["int8"]["steps_per_core_s"] / row["fp32"]["steps_per_core_s"]
        best[str(hidden)] = row
    return best


def bench_sweep(budget: SweepBudget, sizes: list[int], envs: list[int], seed: int = 0) -> dict[str, Any]:
    """Every (size, K) cell in a fresh pinned Ray actor (so one cell's memory and caches do not carry over)."""
    from bench.harness.machine import measuring_actor_env  # pylint: disable=import-outside-toplevel
    from quarl.envs.vector import env_implementation  # pylint: disable=import-outside-toplevel

    with measuring_actor_env("quarl-sweep-auto-") as env_vars:
        cells = [_measure_cell(hidden, k, budget, seed, env_vars) for hidden in sizes for k in envs]
    return {"task": TASK, "env_implementation": env_implementation(TASK), "cpu_flags": cpu_flags(),
            "sizes": sizes, "envs": envs, "budget": dataclasses.asdict(budget), "cells": cells,
            "best_k": best_k(cells)}


def _measure_cell(hidden: int, k: int, budget: SweepBudget, seed: int, env_vars: dict[str, str]) -> dict[str, Any]:
    import ray  # pylint: disable=import-outside-toplevel

    probe = ray.remote(SweepProbe).options(num_cpus=1, runtime_env={"env_vars": env_vars}).remote()
    try:
        raw = ray.get(probe.measure.remote(hidden, k, dataclasses.asdict(budget), seed, pin=True))
    finally:
        ray.kill(probe)
    cell = summarize(raw)
    cell["threads"] = raw["threads"]
    print(f"  {hidden}x3 K={k}: env steps per core-second fp32 {cell['fp32']['steps_per_core_s']:.0f}, "
          f"int8 {cell['int8']['steps_per_core_s']:.0f} ({cell['ratio_core_s']:.2f}x; env-matched "
          f"{cell['ratio_env_matched']:.2f}x, policy only {cell['ratio_policy_only']:.2f}x)", flush=True)
    return cell


def markdown(sweep: dict[str, Any]) -> list[str]:
    """The sweep's section of a results page."""
    lines = [f"## Vectorized actors: K environments per actor, one policy call per step ({sweep['task']})", "",
             f"Environments: {sweep['env_implementation']}; CPU class and features: "
             f"{', '.join(sweep['cpu_flags'])}. "
             "Same environment state sequence for both precisions (recorded actions), turns alternating; "
             "medians over rounds. Core-second = CPU time of the pinned one-thread actor process.", "",
             "| policy | K | fp32 steps/core-s | int8 steps/core-s | int8/fp32 | env-matched int8/fp32 | "
             "policy-only int8/fp32 | fp32 policy us/step | int8 policy us/step | env us/step | backends |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in sweep["cells"]:
        f, i = c["fp32"], c["int8"]
        lines.append(f"| {c['hidden']}x3 | {c['envs']} | {f['steps_per_core_s']:.0f} | {i['steps_per_core_s']:.0f} | "
                     f"{c['ratio_core_s']:.2f}x | {c['ratio_env_matched']:.2f}x | {c['ratio_policy_only']:.2f}x | "
                     f"{f['policy_us']:.0f} | {i['policy_us']:.0f} | {0.5 * (f['env_us'] + i['env_us']):.0f} | "
                     f"{c['backends']['fp32']}/{c['backends']['int8']} |")
    lines += ["", "Each precision at its best K (env steps per core-second):", "",
              "| policy | fp32 (best K) | int8 (best K) | int8/fp32 | rounds' spread fp32; int8 | target |",
              "|---|---:|---:|---:|---:|---:|"]
    for hidden, row in sweep["best_k"].items():
        target = {"2048": ">= 2x", "256": ">= 1x"}.get(hidden, "")
        spreads = "; ".join("—" if row[p].get("spread") is None else f"±{100 * row[p]['spread']:.1f}%"
                            for p in PRECISIONS)
        lines.append(f"| {hidden}x3 | {row['fp32']['steps_per_core_s']:.0f} (K={row['fp32']['envs']}) | "
                     f"{row['int8']['steps_per_core_s']:.0f} (K={row['int8']['envs']}) | "
                     f"**{row['ratio_core_s']:.2f}x** | {spreads} | {target} |")
    return lines + ["", "Backends: `onnx u8s8` etc. is the int8 graph on that integer kernel form; `onnx "
                        "(dequantized)` is the int8 weights dequantized through fp32 MatMuls, which `auto` picks "
                        "at a batch where it measures no int kernel faster (so an int8 actor runs at fp32's speed "
                        "there, not below it). Rounds' spread: half the range of the best cell's per-round "
                        "steps/core-s over its median, the scale of a ratio's noise.", ""]


def _int_list(text: str, flag: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"{flag} must be comma-separated positive integers, got {text!r}")
    if not values or min(values) < 1:
        parser.error(f"{flag} must be comma-separated positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    from bench.harness.machine import (  # pylint: disable=import-outside-toplevel
        add_allow_busy, finish, bench_machine, refuse_if_busy)
    from bench.harness.results_io import write_results  # pylint: disable=import-outside-toplevel

    parser = argparse.ArgumentParser(prog="bench.system.actor_sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a minute or two; writes to runs/bench/actor-sweep-quick")
    parser.add_argument("--out", default=None, help="output directory (default: results/bench, or "
                                                    "runs/bench/actor-sweep-quick with --quick)")
    parser.add_argument("--envs", default=",".join(map(str, DEFAULT_ENVS)),
                        help="environments per actor to sweep (default 1,4,16,64)")
    parser.add_argument("--sizes", default="256,2048", help="hidden widths of the 3-layer policy (default 256,2048)")
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    envs = _int_list(args.envs, "--envs", parser)
    sizes = _int_list(args.sizes, "--sizes", parser)
    out = Path(args.out) if args.out else Path("runs/bench/actor-sweep-quick" if args.quick else "results/bench")
    refuse_if_busy(parser, args.allow_busy)

    from launch.program.ray_runner import init_ray  # pylint: disable=import-outside-toplevel
    import ray  # pylint: disable=import-outside-toplevel

    result: dict[str, Any] = {"machine": bench_machine(args.allow_busy), "quick": args.quick}
    init_ray(None, num_cpus=2)
    try:
        result["sweep"] = bench_sweep(QUICK if args.quick else FULL, sizes, envs)
    finally:
        ray.shutdown()
    finish(result["machine"])
    m = machine_fields(result["machine"])
    page = ["# Vectorized actors (`python -m bench.system.actor_sweep`)", "",
            f"Machine: {m['cpu_model']}, {m['cores']} logical cores; load average {m['load_start'][0]:.1f} at start, "
            f"{m['load_end'][0]:.1f} at end.", "", *markdown(result["sweep"])]
    json_path, md_path = write_results(out, "actor_sweep", result, "\n".join(page))
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
