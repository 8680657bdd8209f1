"""ActorQ on MinAtar: env steps per second of one DQN actor with int8 vs fp32 conv policies, side by side.

    python -m bench.system.actorq_minatar [--task MinAtar/Breakout] [--precisions fp32,int8] [--rounds 40]
                                   [--block 50] [--quick] [--out DIR] [--allow-busy]
    python -m bench.system.actorq_minatar returns ...   (final returns of int8 vs fp32 runs: runs
                                                          `python -m bench.learning.actorq_minatar_returns ...`)

One actor as ActorQ runs it (`agents.dqn` actor, `backend="auto"`, one compute thread), pinned to one core
(`bench.harness.machine.pin_to_one_core`, so no runtime gets a second core), greedy: the policy runs on every observation.
Each precision has its own environment with the same seed stepping the same recorded random actions, so every
precision sees the same observation sequence; precisions take turns every `--block` steps over `--rounds` rounds
(load drift hits all alike). Reported per precision: env steps/s (env + policy time), policy microseconds per step,
env microseconds per step, the backend/kernel `auto` chose; and int8's speed-up over fp32 as the median of each
round's ratio. The Q-network is the learner's initial MinAtar torso (inference cost does not depend on the weight
values); int8 activation ranges are calibrated on observations of a random rollout (a different seed), as the
learner calibrates on replay.

The figure depends on the machine and its load: run it alone. The full run writes DIR/actorq_minatar.json and .md
(default DIR results/bench); --quick (seconds, a smoke run) writes to runs/bench/actorq-minatar-quick.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bench.harness.machine import (
    add_allow_busy, bench_machine, describe_cpu, describe_load, finish, pin_to_one_core, refuse_if_busy,
)
from bench.harness.results_io import write_results
from quarl.quant.precision import precision_list_arg

REPO = Path(__file__).resolve().parents[2]
FULL = {"rounds": 40, "block": 50}
QUICK = {"rounds": 3, "block": 10}


def _actor(builder: Any, env_spec: Any, spec: Any, params: Any, precision: str, calib: np.ndarray) -> Any:
    from quarl.quant.calibration import quantize_for_actors  # pylint: disable=import-outside-toplevel

    qparams = quantize_for_actors(spec, params, precision, calib)
    return builder.make_actor(env_spec, qparams, seed=0, evaluation=True, backend="auto")


def measure(task: str, precisions: Sequence[str], rounds: int, block: int, seed: int = 0) -> dict[str, Any]:
    """Per-precision timings (see the module docstring)."""
    import jax  # pylint: disable=import-outside-toplevel

    from agents.dqn import Builder, DQNConfig  # pylint: disable=import-outside-toplevel
    from agents.dqn.networks import init_params  # pylint: disable=import-outside-toplevel
    from quarl.envs.spec import environment_spec
    from quarl.envs.factory import make_environment  # pylint: disable=import-outside-toplevel

    core = pin_to_one_core()
    builder = Builder(DQNConfig())
    env_spec = environment_spec(make_environment(task, seed))
    spec = builder.policy_spec(env_spec)
    params = jax.device_get(init_params(spec, jax.random.PRNGKey(seed)))
    rng = np.random.default_rng(seed)
    calib_env = make_environment(task, seed + 1)
    ts, calib = calib_env.reset(), []
    while len(calib) < 256:
        calib.append(np.asarray(ts.observation, np.float32).reshape(-1))
        ts = calib_env.reset() if ts.last() else calib_env.step(np.int32(rng.integers(env_spec.num_actions)))
    actors = {p: _actor(builder, env_spec, spec, params, p, np.stack(calib)) for p in precisions}
    envs = {p: make_environment(task, seed) for p in precisions}
    obs = {p: envs[p].reset().observation for p in precisions}
    actions = rng.integers(env_spec.num_actions, size=rounds * block)
    policy_s = {p: [] for p in precisions}
    env_s = {p: [] for p in precisions}
    for p in precisions:  # warm-up: first calls compile / allocate
        actors[p].act(obs[p][None])
    for r in range(rounds):
        for p in precisions:
            t_pol = t_env = 0.0
            for i in range(block):
                t0 = time.perf_counter()
                actors[p].act(obs[p][None])
                t1 = time.perf_counter()
                ts = envs[p].step(np.int32(actions[r * block + i]))
                if ts.last():
                    ts = envs[p].reset()
                t2 = time.perf_counter()
                obs[p] = ts.observation
                t_pol += t1 - t0
                t_env += t2 - t1
            policy_s[p].append(t_pol / block)
            env_s[p].append(t_env / block)
    rows = []
    for p in precisions:
        step = [a + b for a, b in zip(policy_s[p], env_s[p])]
        rows.append({"precision": p, "backend": actors[p].backend, "kernel": actors[p].kernel["form"],
                     "env_steps_per_s": 1.0 / statistics.median(step),
                     "policy_us": 1e6 * statistics.median(policy_s[p]), "env_us": 1e6 * statistics.median(env_s[p])})
    ratios = {}
    if "fp32" in precisions:
        for p in precisions:
            if p != "fp32":
                per_round = [(pf + ef) / (pp + ep) for pf, ef, pp, ep in
                             zip(policy_s["fp32"], env_s["fp32"], policy_s[p], env_s[p])]
                ratios[p] = statistics.median(per_round)
    return {"task": task, "rounds": rounds, "block": block, "core": core, "rows": rows,
            "speedup_vs_fp32": ratios}


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [f"# ActorQ on {result['task']}: one DQN actor's env steps/s, int8 vs fp32", "",
             f"Machine: {describe_cpu(m)}; {describe_load(m)}; the actor pinned to one core, "
             f"one compute thread, `auto` backend; {result['rounds']} rounds of {result['block']} steps a precision.",
             "", "| precision | backend/kernel | env steps/s | policy us/step | env us/step |",
             "|---|---|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['precision']} | {r['backend']}/{r['kernel']} | {r['env_steps_per_s']:,.0f} | "
                     f"{r['policy_us']:.1f} | {r['env_us']:.1f} |")
    for p, v in result["speedup_vs_fp32"].items():
        lines.append(f"\n{p} vs fp32: {v:.2f}x env steps/s (median of per-round ratios).")
    return "\n".join(lines) + "\n"


def run_returns(argv: Sequence[str]) -> int:
    """The `returns` mode: the learning benchmark `bench.learning.actorq_minatar_returns` with `argv`, run as the
    program it is (a benchmark of another kind is run, never imported); its exit code. Its report quotes the
    command as `bench.system.actorq_minatar returns`, the way this mode has always been called."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "bench.learning.actorq_minatar_returns", *argv], env=env,
                          check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["returns"]:  # the returns mode: whole training runs, its own flags
        return run_returns(argv[1:])
    parser = argparse.ArgumentParser(prog="bench.system.actorq_minatar", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="MinAtar/Breakout")
    parser.add_argument("--precisions", default="fp32,int8", type=precision_list_arg("actor"))
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--block", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="seconds: a smoke run, not a figure")
    parser.add_argument("--out", default=None)
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    if not args.task.startswith("MinAtar/"):
        parser.exit(2, f"{parser.prog}: error: --task must be a MinAtar task, got {args.task!r}\n")
    precisions = args.precisions
    budget = dict(QUICK if args.quick else FULL)
    budget.update({k: v for k, v in (("rounds", args.rounds), ("block", args.block)) if v is not None})
    if budget["rounds"] < 1 or budget["block"] < 1 or not precisions:
        parser.exit(2, f"{parser.prog}: error: --rounds/--block must be positive and --precisions non-empty\n")
    refuse_if_busy(parser, args.allow_busy)
    from launch.program.graph import SINGLE_THREAD_ENV  # pylint: disable=import-outside-toplevel

    for k, v in SINGLE_THREAD_ENV.items():  # one compute thread, as an ActorQ actor (set before JAX loads)
        os.environ.setdefault(k, v)
    machine = bench_machine(args.allow_busy)
    with tempfile.TemporaryDirectory(prefix="quarl-auto-") as cache:
        os.environ["QUARL_CACHE_DIR"] = cache  # auto measures afresh in this run
        try:
            result = measure(args.task, precisions, budget["rounds"], budget["block"])
        except ValueError as err:
            parser.exit(2, f"{parser.prog}: error: {err}\n")
    result["machine"] = finish(machine)
    default = REPO / "runs" / "bench" / "actorq-minatar-quick" if args.quick else REPO / "results" / "bench"
    write_results(Path(args.out or default), "actorq_minatar", result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
