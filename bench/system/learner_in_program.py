"""The learner in the program vs. the learner alone: SGD steps per second, side by side, in one run.

    python -m bench.system.learner_in_program [--quick] [--no-paper] [--steps-per-call K] [--out DIR]

K defaults to the program's own choice for this device (`launch.distributed.nodes.learner_feed.default_steps_per_call`: 4 on CPU),
so (c) and (d) are the learner as `launch.actorq` runs it; `--steps-per-call 1` measures the one-step node.

Issue 20's learner targets, measured on one machine in one run, for D4PG at walker:stand shapes (obs 24,
action 6; critic 256x3, batch 256, as `bench.micro.learner_throughput`), at 256x3 and (unless --no-paper) the paper's
2048x3 policy:

- (a) `learner.step`: `bench.micro.learner_throughput`'s host-batch-per-step loop (the reference; both time it with
  `bench.harness.learner_timing`);
- (b) `scan`: `bench.micro.learner_throughput`'s K device-resident batches per jit call (the device's ceiling);
- (c) `node`: `launch.distributed.nodes.learner.LearnerNode` running in this process as in the program — a replay server
  pre-filled with random transitions whose rate limiter never holds it back (no actors), the counter and the
  weight server as local nodes, prefetch threads, int8 weights published every `publish_period` steps;
- (d) `node, no publishing`: the same with publishing off.

Targets: (c) >= 0.9 x (a) ("the learner alone in the program") and (c) >= 0.9 x (d) ("publishing costs the
learner <= 10%"), at both sizes; the publisher's handoff cost on the training thread is reported per version.
Node rates are steps completed on the device over a timed window after a warm-up (`LearnerNode.synced_steps`).
Writes DIR/learner_in_program.{json,md} with the machine record (bench.harness.machine); DIR defaults to results/bench,
--quick writes under runs/bench. Run it alone: the ratios mean nothing on a loaded machine.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from bench.harness.learner_timing import learner_machine, measure
from bench.harness.machine import add_allow_busy, finish, refuse_if_busy
from quarl.ops.machine import machine_fields
from bench.harness.results_io import write_report

REPO = Path(__file__).resolve().parents[2]
TASK = "walker:stand"
CRITIC, BATCH = (256, 256, 256), 256


def fill_replay(replay: Any, signature: Mapping[str, Any], items: int, seed: int = 0) -> None:
    """`items` random transitions of the table's signature (speed does not depend on the values)."""
    rng = np.random.default_rng(seed)
    data = {}
    for name, (shape, dtype) in signature.items():
        dtype = np.dtype(dtype)
        if dtype.kind in "iu":
            data[name] = rng.integers(0, 2, (items, *shape)).astype(dtype)
        elif name == "discount":
            data[name] = np.full((items, *shape), 0.95, dtype)
        else:
            data[name] = rng.uniform(-1, 1, (items, *shape)).astype(dtype)
    replay.insert(data, force=True)


def make_node(agent: str, task: str, overrides: Mapping[str, Any], logdir: str, *, steps_per_call: int | None = 1,
              publish: bool = True, publish_period: int = 10, precision: str = "int8", prefill: int | None = None,
              seed: int = 0) -> tuple[Any, Any, dict[str, Any]]:
    """A `LearnerNode` wired to local service nodes (replay pre-filled, no rate limiting, no actors).
    Returns (node, pool, services); `pool.shutdown()` when done."""
    # pylint: disable=import-outside-toplevel
    from launch.experiments.agent_spec import AgentSpec, table_spec
    from launch.distributed.nodes.learner import LearnerNode
    from launch.program.local_runner import DaemonPool, LocalNodeHandle
    from launch.distributed.nodes.services import Counter, ReplayServer, WeightServer

    spec = AgentSpec(agent, task, dict(overrides))
    builder = spec.builder()
    table = table_spec(builder, spec.env_spec())
    # No actors insert while the learner samples: a huge error buffer keeps the rate limiter from ever waiting.
    table["config"] = {**table["config"], "error_buffer": 1e15}
    replay = ReplayServer(table, seed=seed)
    fill_replay(replay, {k: (tuple(s), d) for k, (s, d) in table["signature"].items()},
                prefill or max(int(builder.config.min_replay_size), 4 * int(builder.config.batch_size)), seed)
    services = {"replay": replay, "counter": Counter(), "weights": WeightServer(precision)}
    pool = DaemonPool(32, thread_name_prefix="bench-node")
    handles = {k: LocalNodeHandle(v, pool) for k, v in services.items()}
    node = LearnerNode(spec, seed, handles["replay"], handles["counter"], handles["weights"], logdir,
                       precision=precision, publish_period=publish_period, steps_per_call=steps_per_call,
                       publish=publish)
    return node, pool, services


def time_node(node: Any, warmup_s: float, window_s: float) -> dict[str, Any]:
    """Runs `node` in a thread; steps/s completed on the device over `window_s` after `warmup_s` of training."""
    result: dict[str, Any] = {}
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.update(node.run())
        except BaseException as e:  # pylint: disable=broad-except
            errors.append(e)

    thread = threading.Thread(target=run, name="bench-learner", daemon=True)
    thread.start()
    try:
        while node.steps() == 0 and thread.is_alive():  # compile + first step
            time.sleep(0.05)
        time.sleep(warmup_s)
        s0, t0 = node.synced_steps(), time.perf_counter()
        time.sleep(window_s)
        s1, t1 = node.synced_steps(), time.perf_counter()
    finally:
        node.stop()
        thread.join(600)
    if errors:
        raise errors[0]
    return {"steps_per_s": (s1 - s0) / (t1 - t0), "window_steps": s1 - s0, "window_s": t1 - t0,
            "publish": result.get("publish"), "publish_handoff": result.get("publish_handoff"),
            "sample_wait_s": result.get("sample_wait_s"), "steps_per_call": result.get("steps_per_call")}


def measure_size(policy: Sequence[int], *, steps_per_call: int | None, warmup_s: float, window_s: float,
                 lt_steps: int, lt_rounds: int, publish_period: int) -> dict[str, Any]:
    """(a)..(d) for one policy size."""
    out: dict[str, Any] = {"policy_layer_sizes": list(policy), "critic_layer_sizes": list(CRITIC),
                           "batch_size": BATCH, "steps_per_call": steps_per_call, "publish_period": publish_period}
    alone = measure(policy, CRITIC, BATCH, steps=lt_steps, rounds=lt_rounds, modes=("scan", "learner.step"))
    out["learner.step"] = alone["modes"]["learner.step"]["median_steps_per_s"]
    out["scan"] = alone["modes"]["scan"]["median_steps_per_s"]
    overrides = {"policy_layer_sizes": tuple(policy), "critic_layer_sizes": CRITIC, "batch_size": BATCH,
                 "vmin": -10.0, "vmax": 110.0, "max_replay_size": 20_000, "min_replay_size": 2_000}
    for key, publish in (("node", True), ("node_no_publish", False)):
        with tempfile.TemporaryDirectory() as logdir:
            node, pool, _ = make_node("d4pg", TASK, overrides, logdir, steps_per_call=steps_per_call,
                                      publish=publish, publish_period=publish_period)
            try:
                out[key] = time_node(node, warmup_s, window_s)
            finally:
                pool.shutdown()
    out["steps_per_call"] = out["node"]["steps_per_call"]  # K as the node resolved it (the device's default for None)
    out["ratio_node_vs_learner_step"] = out["node"]["steps_per_s"] / out["learner.step"]
    out["ratio_publish_on_vs_off"] = out["node"]["steps_per_s"] / out["node_no_publish"]["steps_per_s"]
    return out


def markdown(result: dict[str, Any], command: str) -> str:
    m = machine_fields(result["machine"])
    lines = [f"# The learner in the program vs. alone ({m['jax_backend'].upper()})", "",
             f"`{command}`, {m['date'][:10]}. D4PG, walker:stand shapes, critic 256x3, batch 256. "
             f"{m['cpu_model']}, {m['cores']} logical cores, jax {m['versions'].get('jax', '?')} "
             f"({', '.join(m.get('jax_devices') or ['?'])}); "
             f"load average {m['load_start'][0]:.1f} at the start, {m['load_end'][0]:.1f} at the end.",
             "", "| policy | K | (a) learner.step | (b) scan | (c) node | (d) node, no publishing | (c)/(a) | (c)/(d) "
             "| handoff ms/version | quantize+encode ms/version |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["configs"]:
        pub, handoff = r["node"]["publish"] or {}, r["node"]["publish_handoff"] or {}
        lines.append(f"| {'x'.join(map(str, r['policy_layer_sizes']))} | {r['steps_per_call']} | {r['learner.step']:.1f} "
                     f"| {r['scan']:.1f} | {r['node']['steps_per_s']:.1f} | {r['node_no_publish']['steps_per_s']:.1f} "
                     f"| {r['ratio_node_vs_learner_step']:.2f} | {r['ratio_publish_on_vs_off']:.2f} "
                     f"| {handoff.get('ms_per_version', float('nan')):.3f} "
                     f"| {pub.get('quantize_encode_ms_per_version', float('nan')):.1f} |")
    lines += ["", "Targets: (c)/(a) >= 0.9 and (c)/(d) >= 0.9 (issue 20). Steps/s; node rates are steps completed on "
              "the device over the timed window. Raw data: `learner_in_program.json`.", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.system.learner_in_program", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny networks and short windows (a smoke run)")
    p.add_argument("--no-paper", action="store_true", help="skip the 2048x3 policy")
    p.add_argument("--steps-per-call", type=int, default=None,
                   help="K of the node (c, d); default: the program's choice for this device")
    p.add_argument("--publish-period", type=int, default=10)
    p.add_argument("--window-s", type=float, default=None, help="timed seconds per node measurement")
    p.add_argument("--out", default=None)
    add_allow_busy(p)
    args = p.parse_args(argv)
    bad_k = args.steps_per_call is not None and args.steps_per_call < 1
    if bad_k or args.publish_period < 1 or (args.window_s is not None and not args.window_s > 0):
        p.error("--steps-per-call and --publish-period must be >= 1, --window-s > 0")
    refuse_if_busy(p, args.allow_busy)
    outdir = Path(args.out) if args.out else (REPO / "runs" / "bench" / "learner-in-program-quick" if args.quick
                                              else REPO / "results" / "bench")
    result: dict[str, Any] = {"machine": learner_machine(args.allow_busy), "quick": args.quick, "configs": []}
    sizes = [(16, 16)] if args.quick else [(256, 256, 256)] + ([] if args.no_paper else [(2048, 2048, 2048)])
    window = args.window_s or (1.0 if args.quick else 20.0)
    for policy in sizes:
        r = measure_size(policy, steps_per_call=args.steps_per_call, warmup_s=0.5 if args.quick else 5.0,
                         window_s=window, lt_steps=4 if args.quick else 50, lt_rounds=1 if args.quick else 5,
                         publish_period=args.publish_period)
        result["configs"].append(r)
        print(f"policy {policy}: learner.step {r['learner.step']:.1f}, scan {r['scan']:.1f}, node "
              f"{r['node']['steps_per_s']:.1f}, no publishing {r['node_no_publish']['steps_per_s']:.1f} steps/s; "
              f"ratios {r['ratio_node_vs_learner_step']:.2f} {r['ratio_publish_on_vs_off']:.2f}", flush=True)
    finish(result["machine"])
    write_report(outdir, "bench.system.learner_in_program", argv, result, markdown, newline=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
