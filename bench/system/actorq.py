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
results/bench/actorq.{json,png,md}; --quick (a few minutes) writes to runs/bench/actorq-quick.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.system import actor_sweep
from bench.harness.machine import add_allow_busy, finish, machine_info, measuring_actor_env, pin_to_one_core, refuse_if_busy
from bench.harness.results_io import write_json
from quarl.envs.vector import env_implementation
from quarl.ops.io import jsonable

TASK = "cartpole:balance"
PAPER_POLICY = (2048, 2048, 2048)
CHUNK = 50  # env steps per turn when the precisions' actors alternate
PRECISIONS = ("fp32", "int8", "int4")  # fp32 first: the baseline every ratio divides by
TARGET_RATIO = 4.0  # issue 9: one actor, 2048x3, K=1, env steps/s vs fp32


@dataclasses.dataclass(frozen=True)
class Budget:
    block_steps: int  # env steps per precision per throughput round
    rounds: int
    update_rounds: int
    e2e_target: float
    e2e_max_steps: int


FULL = Budget(block_steps=500, rounds=8, update_rounds=8, e2e_target=800.0, e2e_max_steps=60_000)
QUICK = Budget(block_steps=200, rounds=3, update_rounds=3, e2e_target=500.0, e2e_max_steps=30_000)


# --------------------------------------------------------------------------------------------- probe


class ActorProbe:
    """Runs inside a Ray actor placed like an ActorQ actor (num_cpus=1, one compute thread)."""

    def __init__(self, servers: dict[str, Any], seed: int = 0, pin: bool = False):
        # pin: confine this actor (its runtimes' threads and envpool's worker included) to one core, as the
        # benchmark's "one actor at the limit of one core" requires; before anything starts a thread.
        self.core = pin_to_one_core() if pin else None
        import agents  # pylint: disable=import-outside-toplevel
        from launch.experiments.agent_spec import AgentSpec  # pylint: disable=import-outside-toplevel

        self._spec = AgentSpec("d4pg", TASK, {"policy_layer_sizes": PAPER_POLICY})
        self._builder = agents.get_builder("d4pg", policy_layer_sizes=PAPER_POLICY)
        self._env_spec = self._spec.env_spec()
        self._servers = servers  # precision -> RayNodeHandle of a WeightServer node
        self._seed = seed
        self._actors: dict[str, Any] = {}
        self._clients: dict[str, Any] = {}
        self._envs: dict[str, Any] = {}
        self._timesteps: dict[str, Any] = {}

    def _client(self, precision: str) -> Any:
        from launch.experiments.stages import StageTimes  # pylint: disable=import-outside-toplevel
        from launch.distributed.nodes.weights_client import PolicyClient  # pylint: disable=import-outside-toplevel

        if precision not in self._clients:
            self._clients[precision] = PolicyClient(self._servers[precision], StageTimes())
        return self._clients[precision]

    def update_cost(self, precision: str) -> dict[str, float]:
        """One weight update as an actor does it (`PolicyClient.fetch`: pull -> deserialize -> load, timed
        by the client itself). Seconds per stage."""
        client = self._client(precision)
        before = dataclasses.replace(client.times)

        def apply(payload: Any) -> None:
            actor = self._actors.get(precision)
            if actor is None:
                self._actors[precision] = self._builder.make_actor(self._env_spec, payload.params, seed=self._seed,
                                                                   backend="auto")
            else:
                actor.update(payload.params)

        if client.fetch(apply=apply) is None:
            raise RuntimeError(f"no new {precision} weights to pull ({client.last_rejection or 'none published'})")
        after = client.times
        return {"pull_s": after.pull_s - before.pull_s, "deserialize_s": after.deserialize_s - before.deserialize_s,
                "load_s": after.load_s - before.load_s, "bytes": after.payload_bytes - before.payload_bytes,
                "backend": self._actors[precision].backend}

    def throughput(self, precisions: list[str], steps: int, chunk: int) -> dict[str, dict[str, float]]:
        """`steps` env steps per precision, the precisions taking turns every `chunk` steps (so a burst of
        load from other processes hits both alike); env and policy time accumulated separately.

        Both precisions step the same environment state sequence: their environments (the ones a real actor
        runs, `quarl.envs.vector`) are seeded alike and take the same recorded random actions, while each
        policy runs on every observation. So env time differs only by noise, and precision alone moves the
        policy time."""
        from quarl.envs.vector import make_vector_environment  # pylint: disable=import-outside-toplevel

        if not self._envs:
            self._envs = {p: make_vector_environment(TASK, self._seed, 1) for p in precisions}
            self._timesteps = {p: self._envs[p].reset()[0] for p in precisions}
            self._rng = np.random.default_rng(self._seed)
        env_s = dict.fromkeys(precisions, 0.0)
        policy_s = dict.fromkeys(precisions, 0.0)
        for k in range(max(1, steps // chunk)):
            actions = self._rng.uniform(-1.0, 1.0, (chunk, self._env_spec.action_dim)).astype(np.float32)
            for precision in (precisions if k % 2 == 0 else precisions[::-1]):
                actor, env = self._actors[precision], self._envs[precision]
                timestep = self._timesteps[precision]
                for action in actions:
                    t0 = time.perf_counter()
                    actor.select_action(timestep.observation)
                    t1 = time.perf_counter()
                    timestep = env.step([action])[0]
                    if timestep.last():
                        timestep = env.reset_one(0)
                    t2 = time.perf_counter()
                    policy_s[precision] += t1 - t0
                    env_s[precision] += t2 - t1
                self._timesteps[precision] = timestep
        n = max(1, steps // chunk) * chunk
        return {p: {"steps_per_s": n / (env_s[p] + policy_s[p]), "env_us": 1e6 * env_s[p] / n,
                    "policy_us": 1e6 * policy_s[p] / n} for p in precisions}

    def auto_choices(self) -> dict[str, dict[str, Any]]:
        """What `backend="auto"` measured for each precision's actor in this process: the backend it chose and
        every candidate's microseconds per call (so a reader sees the fp32 baseline was the fastest fp32)."""
        from quarl.runtimes import auto_decisions  # pylint: disable=import-outside-toplevel
        from quarl.runtimes.auto import parse_decision_key  # pylint: disable=import-outside-toplevel

        out = {}
        for key, entry in auto_decisions().items():
            precision = parse_decision_key(key)["precision"]
            if precision in self._actors:
                out[precision] = {"backend": entry["backend"], "us_per_call": entry.get("us_per_call"),
                                  "source": entry.get("source")}
        return out

    def threads(self) -> dict[str, Any]:
        return {**{k: os.environ.get(k, "") for k in ("OMP_NUM_THREADS", "XLA_FLAGS")}, "pinned_core": self.core,
                "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def bench_actor(budget: Budget, seed: int) -> dict[str, Any]:
    """Parts 1 and 2 (throughput and update cost), with the real WeightServer nodes on Ray; this process
    plays the learner (quantize + encode + put once per version)."""
    import ray  # pylint: disable=import-outside-toplevel

    import agents  # pylint: disable=import-outside-toplevel
    from launch.distributed.nodes.services import WeightServer  # pylint: disable=import-outside-toplevel
    from launch.distributed.nodes.shared_blob import Blob  # pylint: disable=import-outside-toplevel
    from quarl.quant.payload import encode_payload  # pylint: disable=import-outside-toplevel
    from quarl.quant.quantization import quantize_params  # pylint: disable=import-outside-toplevel
    from launch.experiments.agent_spec import AgentSpec  # pylint: disable=import-outside-toplevel
    from launch.program.ray_runner import RayNodeHandle  # pylint: disable=import-outside-toplevel

    spec = AgentSpec("d4pg", TASK, {"policy_layer_sizes": PAPER_POLICY})
    builder = agents.get_builder("d4pg", policy_layer_sizes=PAPER_POLICY)
    env_spec = spec.env_spec()
    spec_hash = builder.policy_spec(env_spec).digest()
    learner = builder.make_learner(env_spec, seed)
    params = learner.policy_params()
    namespace = f"bench-actorq-{os.getpid()}"
    precisions = list(PRECISIONS)
    servers = {}
    for p in precisions:
        servers[p] = ray.remote(WeightServer).options(name=f"weights_{p}", namespace=namespace,
                                                      max_concurrency=4).remote(p)
    handles = {p: RayNodeHandle(f"weights_{p}", namespace) for p in precisions}
    quantize_s: dict[str, list[float]] = {p: [] for p in precisions}
    with measuring_actor_env("quarl-bench-auto-") as env_vars:  # removed when the actors are gone
        probe = ray.remote(ActorProbe).options(num_cpus=1, runtime_env={"env_vars": env_vars}).remote(
            handles, seed, pin=True)
        try:
            rng = np.random.default_rng(seed)
            updates: dict[str, list[dict[str, float]]] = {p: [] for p in precisions}
            for r in range(budget.update_rounds + 1):  # round 0 builds the executors (not a refresh): dropped
                version = r + 1
                noisy = _perturb(params, rng)
                for p in precisions:  # the learner's side: quantize + encode once, put once, publish the reference
                    t0 = time.perf_counter()
                    data = encode_payload(quantize_params(noisy, p), version=version, spec_hash=spec_hash)
                    quantize_s[p].append(time.perf_counter() - t0)
                    ray.get(servers[p].publish.remote(version, Blob.put(data)))
                for p in (precisions if r % 2 == 0 else precisions[::-1]):
                    cost = ray.get(probe.update_cost.remote(p))
                    if r > 0:
                        updates[p].append(cost)
            blocks: dict[str, list[dict[str, float]]] = {p: [] for p in precisions}
            ray.get(probe.throughput.remote(precisions, 2 * CHUNK, CHUNK))  # warm-up (first-call costs)
            for _ in range(budget.rounds):
                for p, row in ray.get(probe.throughput.remote(precisions, budget.block_steps, CHUNK)).items():
                    blocks[p].append(row)
            threads = ray.get(probe.threads.remote())
            auto_choices = ray.get(probe.auto_choices.remote())
        finally:
            for actor in (probe, *servers.values()):
                ray.kill(actor)
    throughput = {p: {k: _median([b[k] for b in blocks[p]]) for k in ("steps_per_s", "env_us", "policy_us")}
                  for p in precisions}
    ratios = throughput_ratios(blocks)
    update = {}
    for p in precisions:
        rows = updates[p]
        stage = {k: 1e3 * _median([u[k] for u in rows]) for k in ("pull_s", "deserialize_s", "load_s")}
        stage = {k.replace("_s", "_ms"): v for k, v in stage.items()}
        stage["total_ms"] = 1e3 * _median([u["pull_s"] + u["deserialize_s"] + u["load_s"] for u in rows])
        stage["payload_bytes"] = rows[0]["bytes"]
        stage["backend"] = rows[0]["backend"]
        stage["quantize_ms_per_version"] = 1e3 * _median(quantize_s[p])
        update[p] = stage
    return {
        "policy": list(PAPER_POLICY),
        "threads": threads,
        "auto": auto_choices,
        "throughput": throughput,
        "throughput_blocks": blocks,
        **ratios,
        # int8's, under the names earlier results used
        "throughput_ratio_int8_vs_fp32": ratios["throughput_ratio_vs_fp32"]["int8"],
        "throughput_round_ratios": ratios["throughput_round_ratios_vs_fp32"]["int8"],
        "throughput_ratio_env_matched": ratios["throughput_ratio_env_matched_vs_fp32"]["int8"],
        "env_implementation": env_implementation(TASK),
        "update": update,
        "update_ratio_fp32_vs": {p: update["fp32"]["total_ms"] / update[p]["total_ms"] for p in precisions[1:]},
        "payload_ratio_fp32_vs": {p: update["fp32"]["payload_bytes"] / update[p]["payload_bytes"]
                                  for p in precisions[1:]},
        "update_ratio_fp32_vs_int8": update["fp32"]["total_ms"] / update["int8"]["total_ms"],
        "payload_ratio_fp32_vs_int8": update["fp32"]["payload_bytes"] / update["int8"]["payload_bytes"],
    }


def throughput_ratios(blocks: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """Each non-fp32 precision vs fp32 from the per-round rows of `ActorProbe.throughput`: the median of each
    round's steps/s ratio (rounds compare time-matched measurements; the median resists load bursts), and the
    same with both charged the pair's mean env time (same env states: only the policy moves that ratio)."""
    base = blocks["fp32"]
    rounds, matched = {}, {}
    for p, rows in blocks.items():
        if p == "fp32":
            continue
        rounds[p] = [x["steps_per_s"] / f["steps_per_s"] for x, f in zip(rows, base)]
        matched[p] = [(0.5 * (x["env_us"] + f["env_us"]) + f["policy_us"])
                      / (0.5 * (x["env_us"] + f["env_us"]) + x["policy_us"]) for x, f in zip(rows, base)]
    return {"throughput_ratio_vs_fp32": {p: _median(r) for p, r in rounds.items()},
            "throughput_round_ratios_vs_fp32": rounds,
            "throughput_ratio_env_matched_vs_fp32": {p: _median(r) for p, r in matched.items()}}


def _perturb(params: dict, rng: np.random.Generator) -> dict:
    """A new weights version (a small step of every leaf), so each round really transfers new weights."""
    if isinstance(params, dict):
        return {k: _perturb(v, rng) for k, v in params.items()}
    arr = np.asarray(params, np.float32)
    return (arr + rng.normal(0.0, 1e-3, arr.shape).astype(np.float32)).astype(np.float32)


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
            "runs": runs, "time_ratio_fp32_vs_int8": _median(ratios) if ratios else None,
            "per_seed_ratios": ratios}


def _fresh(logdir: Path) -> Path:
    """An empty run directory (the bench owns these; logs append, so a previous run's rows must go)."""
    import shutil  # pylint: disable=import-outside-toplevel

    shutil.rmtree(logdir, ignore_errors=True)
    return logdir


# --------------------------------------------------------------------------------------------- output


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    actor = result["actor"]
    panels = 3 if result.get("e2e") else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    tp = actor["throughput"]
    precisions = [p for p in PRECISIONS if p in tp]
    colors = {"fp32": "tab:gray", "int8": "tab:blue", "int4": "tab:purple"}
    ax = axes[0]
    means = np.array([tp[p]["steps_per_s"] for p in precisions])
    blocks = actor.get("throughput_blocks") or {}
    spread = [[v["steps_per_s"] for v in blocks.get(p) or []] for p in precisions]
    if all(spread):  # the interleaved measurement blocks: min..max around the headline figure
        err = [means - np.array([min(v) for v in spread]), np.array([max(v) for v in spread]) - means]
        ax.bar(precisions, means, yerr=err, capsize=4, color=[colors[p] for p in precisions])
        what = f"error bars: min..max over {min(len(v) for v in spread)} interleaved blocks"
    else:
        ax.bar(precisions, means, color=[colors[p] for p in precisions])
        what = "no per-block spread recorded"
    vs = ", ".join(f"{p} = {r:.1f}x" for p, r in actor["throughput_ratio_vs_fp32"].items())
    ax.set_title(f"actor env steps/s (2048x3 policy)\n{vs} fp32; {what}", fontsize=9)
    ax.set_ylabel("env steps / s (one pinned actor)")
    ax = axes[1]
    bottom = np.zeros(len(precisions))
    for stage, color in (("pull_ms", "tab:orange"), ("deserialize_ms", "tab:green"), ("load_ms", "tab:red")):
        values = np.array([actor["update"][p][stage] for p in precisions])
        ax.bar(precisions, values, bottom=bottom, label=stage[:-3], color=color)
        bottom += values
    cheaper = ", ".join(f"{r:.1f}x {p}" for p, r in actor["update_ratio_fp32_vs"].items())
    ax.set_title(f"one weight update (ms, mean per update)\nfp32 = {cheaper}", fontsize=9)
    ax.legend()
    if panels == 3:
        import csv  # pylint: disable=import-outside-toplevel

        ax = axes[2]
        for run in result["e2e"]["runs"]:
            path_csv = Path(run["logdir"]) / "evaluator.csv"
            if not path_csv.exists():
                continue
            with open(path_csv, newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
            ax.plot([float(r["wall_clock_s"]) for r in rows], [float(r["return"]) for r in rows],
                    color=colors[run["precision"]], marker=".", label=f"{run['precision']} seed {run['seed']}")
        ax.axhline(result["e2e"]["target_return"], color="k", linestyle=":", linewidth=1)
        ax.set_xlabel("wall clock (s)")
        ax.set_ylabel("eval return")
        ax.set_title("D4PG cartpole:balance, 2 actors")
        ax.legend(fontsize=7)
    machine = result.get("machine") or {}
    load = f"load {machine.get('load_start', ['?'])[0]} -> {machine.get('load_end', ['?'])[0]}"
    fig.suptitle(f"bench.system.actorq on {machine.get('cpu', 'an unrecorded CPU')} ({machine.get('cores', '?')} cores, "
                 f"1-min {load})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: dict[str, Any]) -> str:
    a = result["actor"]
    m = result["machine"]
    lines = [
        "# ActorQ distributed benchmark (`python -m bench.system.actorq`)",
        "",
        f"Machine: {m['cpu']} ({', '.join(result.get('cpu_flags', []))}), "
        f"{m['cores']} logical cores; load average {m['load_start'][0]:.1f} at start, "
        f"{m['load_end'][0]:.1f} at end (shared machine: absolute numbers are noisy, ratios are measured "
        "side by side). Raw data: `actorq.json`; chart: `actorq.png`.",
        "",
        "## One actor, D4PG policy 2048x3 on cartpole:balance (Ray actor pinned to one core)",
        "",
        *actor_table(a),
        "",
        *target_lines(a, ", ".join(result.get("cpu_flags", [])) or m["cpu"]),
        "",
    ]
    e = result.get("e2e")
    if e:
        lines += [
            f"## End to end: time to eval return >= {e['target_return']:.0f} (D4PG, 2 actors, policy 256x3)",
            "",
            "| precision | seed | time to target (s) | actor steps to target | best return | actor steps/s | "
            "learner steps/s | ms/update |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in e["runs"]:
            lines.append(f"| {r['precision']} | {r['seed']} | {_num(r['time_to_target_s'])} | "
                         f"{_num(r['actor_steps_to_target'])} | {_num(r['best_eval_return'])} | "
                         f"{_num(r['actor_steps_per_s'])} | {_num(r['learner_steps_per_s'])} | "
                         f"{_num(r['update_ms'])} |")
        ratio = e["time_ratio_fp32_vs_int8"]
        int8_rate = _median([r["actor_steps_per_s"] for r in e["runs"] if r["precision"] == "int8"])
        fp32_rate = _median([r["actor_steps_per_s"] for r in e["runs"] if r["precision"] == "fp32"])
        per_seed = ", ".join(f"{r:.2f}" for r in e["per_seed_ratios"])
        lines += ["", f"Time-to-target ratio fp32/int8 (median over seeds; per seed: {per_seed}): "
                      f"**{'n/a' if ratio is None else f'{ratio:.2f}x'}**; actor steps/s (all actors, median) "
                      f"int8 {int8_rate:.0f} vs fp32 {fp32_rate:.0f}. Both runs share the learner settings, so "
                      "the samples-per-insert limiter ties actor speed to learner speed: on a 2-core machine the "
                      "learner, not policy inference (a 256x3 policy costs tens of microseconds), sets the pace "
                      "and single-seed differences mostly reflect learning noise and machine load. The int8 gain "
                      "appears where actors are the bottleneck: large policies (table above) and many actors per "
                      "learner.", ""]
    if result.get("sweep"):
        lines += actor_sweep.markdown(result["sweep"])
    return "\n".join(lines) + "\n"


def actor_table(a: dict[str, Any]) -> list[str]:
    """Part 1 and 2 as one markdown table: a column per precision, then each one's ratio vs fp32."""
    tp, up = a["throughput"], a["update"]
    cols = [p for p in PRECISIONS if p in tp]
    others = cols[1:]
    blank = " |" * len(others)

    def row(label: str, values: list[str], ratios: list[str] | None = None, target: str = "") -> str:
        return f"| {label} | {' | '.join(values)} |{' ' + ' | '.join(ratios) + ' |' if ratios else blank} {target} |"

    tr, matched = a["throughput_ratio_vs_fp32"], a["throughput_ratio_env_matched_vs_fp32"]
    return [
        f"| | {' | '.join(cols)} | {' | '.join(f'{p} vs fp32' for p in others)} | target |",
        "|---|" + "---:|" * (len(cols) + len(others) + 1),
        row("env steps/s", [f"{tp[p]['steps_per_s']:.0f}" for p in cols], [f"**{tr[p]:.2f}x**" for p in others],
            f">= {TARGET_RATIO:g}x"),
        row("env steps/s, env time matched (pair's mean)", [""] * len(cols), [f"{matched[p]:.2f}x" for p in others],
            f">= {TARGET_RATIO:g}x"),
        row("policy us/step", [f"{tp[p]['policy_us']:.0f}" for p in cols],
            [f"{tp['fp32']['policy_us'] / tp[p]['policy_us']:.2f}x" for p in others]),
        row(f"env us/step ({a['env_implementation']}; same state sequence)", [f"{tp[p]['env_us']:.0f}" for p in cols]),
        row("pull ms/update", [f"{up[p]['pull_ms']:.2f}" for p in cols]),
        row("deserialize ms/update", [f"{up[p]['deserialize_ms']:.2f}" for p in cols]),
        row("load ms/update", [f"{up[p]['load_ms']:.2f}" for p in cols]),
        row("pull+deserialize+load ms", [f"{up[p]['total_ms']:.2f}" for p in cols],
            [f"**{a['update_ratio_fp32_vs'][p]:.2f}x cheaper**" for p in others], ">= 5x"),
        row("payload bytes", [f"{up[p]['payload_bytes']:,}" for p in cols],
            [f"{a['payload_ratio_fp32_vs'][p]:.2f}x smaller" for p in others]),
        row("quantize+encode ms/version (once, learner)", [f"{up[p]['quantize_ms_per_version']:.1f}" for p in cols]),
        row("backend (auto)", [str(up[p]["backend"]) for p in cols]),
        *([row("auto's candidates, us/call at batch 1", [_candidates(a["auto"].get(p)) for p in cols])]
          if a.get("auto") else []),
    ]


def _candidates(choice: dict[str, Any] | None) -> str:
    """`auto`'s timings for one precision, fastest first (its pick in bold)."""
    if not choice or not isinstance(choice.get("us_per_call"), dict):
        return ""
    timed = sorted(choice["us_per_call"].items(), key=lambda kv: kv[1])
    return ", ".join(f"**{name} {us:.0f}**" if name == choice["backend"] else f"{name} {us:.0f}"
                     for name, us in timed)


def target_lines(a: dict[str, Any], cpu_class: str) -> list[str]:
    """Which precision meets the one-actor target on this CPU class, and what bounds the others."""
    tp = a["throughput"]
    env_us = statistics.mean(tp[p]["env_us"] for p in tp)
    lines = []
    for p, ratio in a["throughput_ratio_vs_fp32"].items():
        verdict = "meets" if ratio >= TARGET_RATIO else "misses"
        ceiling = tp["fp32"]["policy_us"] / tp[p]["policy_us"]  # the ratio with a free environment
        lines.append(f"- {p}: **{ratio:.2f}x** fp32 env steps/s, {verdict} the >= {TARGET_RATIO:g}x target on this "
                     f"CPU ({cpu_class}); its policy alone is {ceiling:.2f}x faster, and the env step "
                     f"(~{env_us:.0f} us, the same for every precision) is charged to both sides of the ratio.")
    return lines


def _num(v: Any) -> str:
    if v is None:
        return "—"
    return f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"


def run(quick: bool, out: Path, seeds: list[int], e2e: bool, allow_busy: bool = False,
        sweep: bool = True) -> dict[str, Any]:
    from launch.program.ray_runner import init_ray  # pylint: disable=import-outside-toplevel

    budget = QUICK if quick else FULL
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": machine_info(allow_busy), "quick": quick, "budget": dataclasses.asdict(budget),
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
    write_json(out / "actorq.json", jsonable(result))
    plot(result, out / "actorq.png")
    (out / "actorq.md").write_text(markdown(result), encoding="utf-8")
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
