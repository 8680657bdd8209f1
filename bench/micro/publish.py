"""The learner's cost of publishing one weights version, before and after the one-way weight path.

    python -m bench.micro.publish [--hidden 2048,2048,2048] [--repeats 7] [--actors 2] [--quick] [--out DIR] [--allow-busy]

Both paths on a private local Ray, with the D4PG policy tree of the given size and its int8 payload:

- before (the removed two-hop path): the learner sends the fp32 tree to a quantizer process (a Ray call puts the
  tree, 4 bytes per weight, in the object store), which quantizes + encodes it there and returns the payload
  bytes to each actor through its own replies;
- after: the learner quantizes + encodes in its own process and puts the bytes once (`launch.distributed.nodes.shared_blob.Blob`);
  the weight server hands out the reference.

Reported per version (median of `--repeats`): the learner thread's time, the quantize+encode time wherever it
runs, and the bytes that cross a process boundary for N actors. Results: publish.{json,md} under --out
(default results/bench).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bench.harness.machine import add_allow_busy, bench_machine, describe_load, finish, refuse_if_busy
from bench.harness.results_io import command_line, write_results
from launch.distributed.nodes.shared_blob import Blob
from launch.program.ray_runner import init_ray
from quarl.policy.spec import layer_norm_mlp_policy
from quarl.quant.payload import encode_payload
from quarl.quant.quantization import quantize_params

REPO = Path(__file__).resolve().parents[2]
OBS_DIM = 5  # cartpole:balance


def policy_tree(hidden: Sequence[int], seed: int = 0) -> tuple[Any, dict]:
    """A D4PG policy spec and random fp32 params of its shapes (what `learner.policy_params()` returns)."""
    rng = np.random.default_rng(seed)
    spec = layer_norm_mlp_policy(OBS_DIM, tuple(hidden), [-1.0], [1.0])
    params, width = {}, OBS_DIM
    for layer in spec.linear_layers:
        params[layer.name] = {"w": rng.normal(0, 0.05, (width, layer.out)).astype(np.float32),
                              "b": np.zeros(layer.out, np.float32)}
        width = layer.out
    params["layer_norm"] = {"scale": np.ones(hidden[0], np.float32), "offset": np.zeros(hidden[0], np.float32)}
    return spec, params


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median of `repeats` timed calls, after one untimed call (first-use costs: Ray's object store, caches)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(1e3 * statistics.median(times), 3)


def measure(hidden: Sequence[int], repeats: int, actors: int) -> dict[str, Any]:
    import ray  # pylint: disable=import-outside-toplevel

    spec, params = policy_tree(hidden)
    digest = spec.digest()
    fp32_bytes = sum(int(np.asarray(leaf).nbytes) for layer in params.values() for leaf in layer.values())

    def quantize_encode(with_spec: bool) -> bytes:
        qp = quantize_params(params, "int8")
        return encode_payload(qp, version=1, spec=spec) if with_spec else encode_payload(qp, version=1,
                                                                                           spec_hash=digest)

    payload_bytes = len(quantize_encode(False))
    refs: list = []

    def before_learner() -> None:  # what `quantizer.publish.remote(version, params)` costs the learner thread
        refs.append(ray.put(params))
        refs.clear()

    def after_learner() -> None:
        refs.append(Blob.put(quantize_encode(False)))
        refs.clear()

    return {
        "hidden": list(hidden),
        "actors": actors,
        "repeats": repeats,
        "fp32_tree_bytes": fp32_bytes,
        "payload_bytes_int8": payload_bytes,
        "before": {"learner_ms": _median_ms(before_learner, repeats),
                   "quantize_encode_ms (quantizer process)": _median_ms(lambda: quantize_encode(True), repeats),
                   "bytes_across_processes": fp32_bytes + actors * payload_bytes},
        "after": {"learner_ms": _median_ms(after_learner, repeats),
                  "quantize_encode_ms (learner)": _median_ms(lambda: quantize_encode(False), repeats),
                  "bytes_across_processes": payload_bytes},
    }


def markdown(result: dict[str, Any], command: str) -> str:
    r = result["result"]
    b, a = r["before"], r["after"]
    size = "x".join(map(str, r["hidden"]))
    return "\n".join([
        f"# Learner publish cost per weights version, {size} D4PG policy, int8 actors",
        "",
        f"`{command}` on {result['machine']['cpu']}, {describe_load(result['machine'])}; medians of "
        f"{r['repeats']} repeats, {r['actors']} actors.",
        "",
        "| path | learner thread ms | quantize+encode ms (where) | bytes across processes per version |",
        "|---|---|---|---|",
        f"| before: fp32 tree to a quantizer process | {b['learner_ms']} | "
        f"{b['quantize_encode_ms (quantizer process)']} (quantizer) | {b['bytes_across_processes']:,} |",
        f"| after: learner quantizes, encodes, puts once | {a['learner_ms']} | "
        f"{a['quantize_encode_ms (learner)']} (learner) | {a['bytes_across_processes']:,} |",
        "",
        f"fp32 tree {r['fp32_tree_bytes']:,} bytes; int8 payload {r['payload_bytes_int8']:,} bytes. Before, the "
        "learner's own cost was putting the fp32 tree, and the quantization ran in a second process; after, the "
        "learner pays for the quantization and one put of the 4x smaller bytes, and no fp32 tree leaves it.",
        "",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.micro.publish", description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", default="2048,2048,2048", help="policy layer sizes")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--actors", type=int, default=2, help="actors pulling each version (bytes accounting)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 256x256 policy, 2 repeats, into "
                                                         "runs/bench/publish-quick unless --out")
    p.add_argument("--out", default=None, help="directory for publish.{json,md} (default results/bench)")
    add_allow_busy(p)
    args = p.parse_args(argv)
    try:
        hidden = [int(h) for h in args.hidden.split(",")]
        if not hidden or min(hidden) < 1 or args.repeats < 1 or args.actors < 1:
            raise ValueError
    except ValueError:
        p.exit(2, f"{p.prog}: error: --hidden must be positive ints, --repeats and --actors positive\n")
    if args.quick:
        hidden, args.repeats = [256, 256], min(args.repeats, 2)
    machine = bench_machine(args.allow_busy)
    machine["load_start"] = refuse_if_busy(p, args.allow_busy)
    started = init_ray(None, num_cpus=1)
    try:
        result = {"machine": machine, "result": measure(hidden, args.repeats, args.actors)}
    finally:
        if started:
            import ray  # pylint: disable=import-outside-toplevel

            ray.shutdown()
    finish(machine)
    outdir = Path(args.out) if args.out else REPO / ("runs/bench/publish-quick" if args.quick else "results/bench")
    command = command_line("bench.micro.publish", argv)
    write_results(outdir, "publish", result, markdown(result, command), newline=False)
    print(markdown(result, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
