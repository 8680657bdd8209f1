"""On-policy ActorQ beside Ray RLlib's PPO and APPO with the same number of actors (env runners), in one run.

    python -m bench.peers.rllib_onpolicy [--seeds 5,6,7] [--num-actors 2] [--steps 60000] [--rllib-python PY]
        [--anchors DIR] [--systems ours-sync,ours-async,rllib-ppo,rllib-appo] [--out DIR]
        [--quick] [--allow-busy]

CartPole-v1, per seed one job at a time, the systems in rotating order (so drifting load hits all alike):
RLlib 2.60 PPO and APPO at their tuned examples' settings (`../shared/anchors/rllib_ppo/run.py`, its own venv:
--rllib-python or $QUARL_RLLIB_PYTHON; APPO asks Ray for 4 logical CPUs), and this project's `launch.actorq --agent
ppo` with int8 actors, synchronous and asynchronous (truncated IS). All evaluate 10 greedy episodes every 4,000 env
steps and run to the same budget. Time to target (first evaluation >= 475) on each system's clock from its first
training step: RLlib's from its first `train()` iteration (after its algorithm is built), ours from the first
weights version (after the nodes are up and the update compiled); the process wall clock of both is recorded too.
RLlib evaluates inside its training loop, ours in a separate evaluator process.

Actors at the paper's 2048x3 policy, int8 against fp32, are `bench.system.onpolicy_actors`.

Timings mean something only on an otherwise idle machine: refuses a busy one unless --allow-busy and records the
load at start and end. Writes OUT/rllib_onpolicy.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

from bench.harness.learning_runs import REPO, median_or_none, read_our_evals
from bench.harness.machine import add_allow_busy, bench_machine, describe_load, finish, refuse_if_busy
from bench.harness.results_io import command_line, write_results
from bench.harness.subprocess_runs import run_subprocess
from quarl.ops.machine import machine_fields

SYSTEMS = ("ours-sync", "ours-async", "rllib-ppo", "rllib-appo")
TARGET = 475.0
EVAL_EVERY, EVAL_EPISODES = 4_000, 10
RUN_TIMEOUT_S = 900.0


def parse_rllib_log(text: str) -> dict[str, Any]:
    """run.py's output: "iter env_steps wall_clock_s iter_env_steps_per_s train_return_mean eval_return_mean" rows
    (eval empty where none ran) and "# build Xs"."""
    evals, build_s, steps, wall = [], None, 0, 0.0
    for line in text.splitlines():
        if line.startswith("# build"):
            build_s = float(line.split()[2].rstrip("s"))
            continue
        parts = line.split()
        if line.startswith("#") or len(parts) not in (5, 6) or not parts[0].isdigit():
            continue
        steps, wall = int(float(parts[1])), float(parts[2])
        if len(parts) == 6:
            evals.append({"env_steps": steps, "wall_clock_s": wall, "return": float(parts[5])})
    return {"evals": evals, "build_s": build_s, "env_steps": steps, "train_s": wall}


def _metrics(evals: Sequence[dict[str, Any]], start_s: float, env_steps: int, train_s: float) -> dict[str, Any]:
    hit = next((e for e in evals if e["return"] >= TARGET), None)
    after = [e["return"] for e in evals if hit is not None and e["env_steps"] > hit["env_steps"]]
    return {"s_to_target": None if hit is None else round(hit["wall_clock_s"] - start_s, 2),
            "steps_to_target": None if hit is None else hit["env_steps"],
            "final_return": evals[-1]["return"] if evals else None,
            "stay_fraction": (sum(r >= TARGET for r in after) / len(after)) if after else None,
            "env_steps_per_s": round(env_steps / train_s, 1) if train_s > 0 else None,
            "eval_returns": [e["return"] for e in evals]}


def run_ours(system: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    mode = system.split("-")[1]
    logdir = args.runs / system / f"seed{seed}"
    cmd = [sys.executable, "-m", "launch.actorq", "--agent", "ppo", "--task", "CartPole-v1", "--precision", "int8",
           "--num-actors", str(args.num_actors), "--rollout-mode", mode, "--correction",
           "none" if mode == "sync" else "tis", "--set", f"num_envs={max(1, 8 // args.num_actors)}",
           "--max-actor-steps", str(args.steps), "--eval-every", str(EVAL_EVERY), "--eval-episodes",
           str(EVAL_EPISODES), "--seed", str(seed), "--logdir", str(logdir), "--no-progress"]
    if logdir.exists():
        import shutil  # pylint: disable=import-outside-toplevel

        shutil.rmtree(logdir)
    code, text, wall = run_subprocess(cmd, args.runs / system / f"seed{seed}.log", RUN_TIMEOUT_S, REPO)
    if code != 0:
        return {"system": system, "seed": seed, "failed": text[-400:]}
    summary = json.loads((logdir / "summary.json").read_text())
    info = summary["learner"]["on_policy"]
    start = float(info.get("started_at_s") or 0.0)
    evals = [e for e in read_our_evals(logdir / "evaluator.csv")]
    evals = evals[:-1] if len(evals) > 1 and evals[-1]["env_steps"] == evals[-2]["env_steps"] else evals  # final
    train_s = float(summary["run_wall_clock_s"]) - start
    return {"system": system, "seed": seed, "process_wall_s": round(wall, 1), "start_s": round(start, 2),
            **_metrics(evals, start, int(summary["actor_steps"]), train_s),
            "lag_mean": info.get("lag_mean"), "learner_wait_frac": info.get("wait_frac"),
            "executed": summary.get("executed")}


def run_rllib(system: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    algo = system.split("-")[1]
    cmd = [args.rllib_python, str(args.anchors / "rllib_ppo" / "run.py"), "--algo", algo, "--env_runners",
           str(args.num_actors), "--steps", str(args.steps), "--seed", str(seed), "--eval_interval",
           str(max(1, EVAL_EVERY // 2000)), "--threshold", str(TARGET), "--max_seconds", "600"]
    code, text, wall = run_subprocess(cmd, args.runs / system / f"seed{seed}.log", RUN_TIMEOUT_S, REPO)
    if code != 0:
        return {"system": system, "seed": seed, "failed": text[-400:]}
    parsed = parse_rllib_log(text)
    return {"system": system, "seed": seed, "process_wall_s": round(wall, 1), "start_s": 0.0,
            "build_s": parsed["build_s"], **_metrics(parsed["evals"], 0.0, parsed["env_steps"], parsed["train_s"])}


def markdown(result: dict[str, Any], command: str) -> str:
    machine = machine_fields(result["machine"])
    lines = ["# On-policy ActorQ beside RLlib PPO and APPO (same number of actors), measured in one run", "",
             f"`{command}` on {machine['cpu_model']} ({machine['cpu_class']}), {describe_load(machine)}. CartPole-v1, "
             f"{result['num_actors']} actors / env runners, {result['steps']:,} env steps per run, 10 greedy "
             "episodes every 4,000 env steps, target 475. Seconds to target are on each system's clock from its "
             "first training step (RLlib: its first `train()` iteration, after the algorithm is built; ours: the "
             "first weights version, after the nodes are up and the update is compiled); the process wall clock "
             "(start-up included) is beside it. Ours: int8 ONNX actors, sync = PPO with N actors, async = "
             "truncated IS.", "",
             "| system | seeds reaching 475 | median s to target | median env steps to target | median process s | "
             "final: min / median | stayed | median env steps/s | per seed (s to target; final) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for system in result["systems"]:
        rows = [r for r in result["runs"] if r["system"] == system and "failed" not in r]
        if not rows:
            continue
        reached = [r for r in rows if r["s_to_target"] is not None]
        finals = [r["final_return"] for r in rows if r["final_return"] is not None]
        stays = [r["stay_fraction"] for r in rows if r["stay_fraction"] is not None]
        per_seed = ", ".join(f"s{r['seed']}: {r['s_to_target'] if r['s_to_target'] is not None else '—'}; "
                             f"{r['final_return']}" for r in rows)
        stayed = f"{statistics.fmean(stays):.2f}" if stays else "—"
        lines.append(f"| {system} | {len(reached)}/{len(rows)} | "
                     f"{median_or_none([r['s_to_target'] for r in rows]) or '—'} | "
                     f"{median_or_none([r['steps_to_target'] for r in rows]) or '—'} | "
                     f"{median_or_none([r['process_wall_s'] for r in rows])} | "
                     f"{min(finals) if finals else '—'} / {median_or_none(finals) or '—'} | {stayed} | "
                     f"{median_or_none([r['env_steps_per_s'] for r in rows])} | {per_seed} |")
    ratio = result.get("ratios") or {}
    if ratio:
        lines += ["", "Median seconds to target, RLlib's over ours: " + "; ".join(
            f"{k}: {v:.1f}x" for k, v in ratio.items() if v is not None)]
    failed = [r for r in result["runs"] if "failed" in r]
    if failed:
        lines += ["", "Failed: " + ", ".join(f"{r['system']} seed {r['seed']}" for r in failed)]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.peers.rllib_onpolicy", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="5,6,7")
    p.add_argument("--num-actors", type=int, default=2)
    p.add_argument("--steps", type=int, default=60_000)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--rllib-python", default=os.environ.get("QUARL_RLLIB_PYTHON"))
    p.add_argument("--anchors", type=Path, default=REPO.parent / "shared" / "anchors")
    p.add_argument("--runs", type=Path, default=REPO / "runs" / "bench" / "rllib_onpolicy")
    p.add_argument("--out", type=Path, default=REPO / "results" / "bench")
    p.add_argument("--quick", action="store_true", help="one seed, 8,000 steps, into RUNS")
    add_allow_busy(p)
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.systems = [s for s in args.systems.split(",") if s]
    bad = [s for s in args.systems if s not in SYSTEMS]
    if bad:
        p.error(f"--systems: unknown {', '.join(bad)}")
    if any(s.startswith("rllib") for s in args.systems) and not (args.rllib_python
                                                                  and os.access(args.rllib_python, os.X_OK)):
        p.error(f"--rllib-python must name the RLlib venv's python (got {args.rllib_python!r}); build it as "
                f"{args.anchors}/rllib_ppo/README.md says")
    if args.quick:
        args.seeds, args.steps, args.out = args.seeds[:1], 8_000, args.runs
    refuse_if_busy(p, args.allow_busy)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    machine = bench_machine(args.allow_busy)
    runs = []
    for i, seed in enumerate(args.seeds):
        order = args.systems[i % len(args.systems):] + args.systems[:i % len(args.systems)]
        for system in order:
            record = run_ours(system, seed, args) if system.startswith("ours") else run_rllib(system, seed, args)
            print(f"{system} seed {seed}: {record.get('s_to_target', record.get('failed'))}", flush=True)
            runs.append(record)
    medians = {s: median_or_none([r["s_to_target"] for r in runs if r["system"] == s and "failed" not in r])
               for s in args.systems}
    ratios = {f"{peer} / {ours}": (medians[peer] / medians[ours]) if medians.get(peer) and medians.get(ours) else None
              for peer in args.systems if peer.startswith("rllib") for ours in args.systems if ours.startswith("ours")}
    result = {"machine": finish(machine), "num_actors": args.num_actors, "steps": args.steps, "seeds": args.seeds,
              "systems": args.systems, "runs": runs, "medians_s_to_target": medians, "ratios": ratios}
    page = markdown(result, command_line("bench.peers.rllib_onpolicy", argv))
    write_results(args.out, "rllib_onpolicy", result, page)
    print(f"wrote {args.out}/rllib_onpolicy.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
