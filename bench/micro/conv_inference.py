"""Conv policy inference: fp32 vs int8 actors on the MinAtar and Nature DQN torsos, batch 1 and 16, one thread.

    python -m bench.micro.conv_inference                # full: both torsos, batch 1 and 16 (a few minutes; run alone)
    python -m bench.micro.conv_inference --quick        # MinAtar only, few calls (seconds: a smoke run, not a figure)

Variants per (torso, batch): ONNX fp32, ONNX int8 (the static graph: QLinearConv, calibrated activation
scales, in the form this CPU's self-check chose), ONNX int8 dequantized through fp32 (what `auto` falls back
to where no integer kernel wins), JAX fp32 and JAX int8 (im2col + AQT), and which backend `auto` picks for int8;
and int4: ONNX int4 (the static graph carrying 4-bit codes: ORT has no 4-bit conv kernel), `onnx-nbits` int4
(MatMulNBits applies to Linear-only policies; a conv policy resolves to the same static forms) and `auto` int4.
Calls alternate between variants in short blocks over several rounds (load drift hits all alike); each
variant's median and 25th percentile microseconds per call are reported, with the max relative error of its
outputs against the float64 reference of the weights it runs (dequantized for int8).
Weights are the learner's initial ones (haiku's), calibration and timing observations are uint8 pixels, as the
envs give them: MinAtar-like 0/1 cells (MinAtar) or uniform 0..255 frames (Nature). Every variant takes them as they
are (`PolicySpec.pixels`): the float graphs cast them in-graph, the static int8 graph uses them as its first
codes. The machine record (CPU, flags, versions, load at start and end) goes with the results: timings taken
with the 1-minute load above the core count are refused unless --allow-busy.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.micro.inference import SINGLE_THREAD_XLA
from bench.harness.machine import add_allow_busy, bench_machine, finish, refuse_if_busy
from bench.harness.results_io import out_folder, write_json

TORSOS = {"minatar": (10, 10, 4), "nature": (84, 84, 4)}
NUM_ACTIONS = 6
FULL = {"torsos": ("minatar", "nature"), "batches": (1, 16), "rounds": 8, "block": 25}
QUICK = {"torsos": ("minatar",), "batches": (1, 4), "rounds": 2, "block": 3}


def make_case(torso: str, seed: int = 0) -> tuple[Any, dict, np.ndarray]:
    """(spec, fp32 params as the learner initialises them, 256 observations) for a torso."""
    import jax

    from agents.dqn.networks import init_params
    from quarl.policy.spec import minatar_q_network, nature_q_network

    shape = TORSOS[torso]
    spec = (minatar_q_network if torso == "minatar" else nature_q_network)(shape, NUM_ACTIONS)
    rng = np.random.default_rng(seed)
    # uint8 pixels, as the envs give them (every runtime takes them as they are: `PolicySpec.pixels`)
    obs = rng.integers(0, 2 if torso == "minatar" else 256, (256, spec.input_dim), dtype=np.uint8)
    return spec, jax.device_get(init_params(spec, jax.random.PRNGKey(seed))), obs


def executors(spec: Any, params: dict, obs: np.ndarray, batch: int) -> dict[str, Any]:
    from quarl.quant.calibration import quantize_for_actors
    from quarl.quant.quantization import quantize_params
    from quarl.runtimes import make_executor

    fp32, int8 = quantize_params(params, "fp32"), quantize_for_actors(spec, params, "int8", obs[:128])
    int4 = quantize_for_actors(spec, params, "int4", obs[:128])
    return {"onnx fp32": make_executor(spec, fp32, "onnx", batch_size=batch),
            "onnx int8": make_executor(spec, int8, "onnx", batch_size=batch),
            "onnx int8 dequantized": make_executor(spec, int8, "onnx", batch_size=batch, kernel_form="fp32"),
            "jax fp32": make_executor(spec, fp32, "jax", batch_size=batch),
            "jax int8": make_executor(spec, int8, "jax", batch_size=batch),
            "auto int8": make_executor(spec, int8, "auto", batch_size=batch),
            # int4: the static graph with 4-bit codes (no 4-bit conv kernel exists in ORT), the onnx-nbits backend
            # (MatMulNBits where it applies; for a conv policy it resolves to the same static forms) and auto.
            "onnx int4": make_executor(spec, int4, "onnx", batch_size=batch),
            "onnx-nbits int4": make_executor(spec, int4, "onnx-nbits", batch_size=batch),
            "auto int4": make_executor(spec, int4, "auto", batch_size=batch)}, {"int8": int8, "int4": int4}


def time_interleaved(exs: dict[str, Any], x: np.ndarray, rounds: int, block: int) -> dict[str, list[float]]:
    """Microseconds per call of each executor, `block` calls a turn, `rounds` turns each (first call of a turn
    dropped: it runs with another variant's weights in the cache)."""
    from quarl.runtimes.auto import interleaved_samples  # pylint: disable=import-outside-toplevel

    for ex in exs.values():
        ex(x)
    return {name: [s * 1e6 for s in seconds] for name, seconds in interleaved_samples(exs, x, rounds, block).items()}


def bench_case(torso: str, batch: int, budget: dict[str, Any]) -> list[dict[str, Any]]:
    from quarl.policy.reference import reference_apply
    from quarl.quant.quantization import dequantize_params
    from quarl.runtimes import kernel_summary

    spec, params, obs = make_case(torso)
    exs, quantized = executors(spec, params, obs, batch)
    x = obs[128:128 + batch]
    refs = {"fp32": reference_apply(spec, params, x),
            **{p: reference_apply(spec, dequantize_params(q), x) for p, q in quantized.items()}}
    samples = time_interleaved(exs, x, budget["rounds"], budget["block"])
    rows = []
    for name, ex in exs.items():
        ref = refs[name.split()[1]]
        err = float(np.abs(ex(x).astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-12))
        rows.append({"torso": torso, "batch": batch, "variant": name, "backend": ex.backend,
                     "kernel": kernel_summary(ex)["form"], "simulated": bool(ex.simulated),
                     "median_us": float(np.median(samples[name])), "p25_us": float(np.percentile(samples[name], 25)),
                     "calls": len(samples[name]), "max_rel_err": err})
    return rows


def speedups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """int8 (and auto's int8 choice) over the fastest fp32 variant (ONNX or JAX), by median, per (torso, batch)."""
    out = []
    for torso, batch in sorted({(r["torso"], r["batch"]) for r in rows}):
        by = {r["variant"]: r for r in rows if (r["torso"], r["batch"]) == (torso, batch)}
        fastest = min((v for v in ("onnx fp32", "jax fp32") if v in by), key=lambda v: by[v]["median_us"])
        base = by[fastest]["median_us"]
        out.append({"torso": torso, "batch": batch, "fp32_us": base, "fp32_variant": fastest,
                    "int8_us": by["onnx int8"]["median_us"], "int8_speedup": base / by["onnx int8"]["median_us"],
                    "auto_backend": by["auto int8"]["backend"], "auto_kernel": by["auto int8"]["kernel"],
                    "auto_speedup": base / by["auto int8"]["median_us"],
                    "int4_us": by["onnx int4"]["median_us"], "int4_speedup": base / by["onnx int4"]["median_us"],
                    "auto_int4_backend": by["auto int4"]["backend"], "auto_int4_kernel": by["auto int4"]["kernel"],
                    "auto_int4_speedup": base / by["auto int4"]["median_us"]})
    return out


def run(quick: bool, out: Path, allow_busy: bool) -> dict[str, Any]:
    from quarl.runtimes import clear_auto_decisions

    budget = QUICK if quick else FULL
    machine = {**bench_machine(allow_busy), "onnx_threads": 1, "quick": quick}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="quarl-auto-") as cache:
        os.environ["QUARL_CACHE_DIR"] = cache  # auto measures afresh here, not from another run's cache
        clear_auto_decisions()
        for torso in budget["torsos"]:
            for batch in budget["batches"]:
                rows += bench_case(torso, batch, budget)
    finish(machine)
    result = {"machine": machine, "rows": rows, "speedups": speedups(rows)}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "conv_inference.json"
    write_json(path, result)
    for s in result["speedups"]:
        print(f"{s['torso']:>8} batch {s['batch']:>2}: fp32 {s['fp32_us']:8.1f} us ({s['fp32_variant']}), "
              f"int8 {s['int8_us']:8.1f} us "
              f"({s['int8_speedup']:.2f}x); auto int8 -> {s['auto_backend']}/{s['auto_kernel']} "
              f"({s['auto_speedup']:.2f}x); int4 {s['int4_us']:8.1f} us ({s['int4_speedup']:.2f}x), auto int4 -> "
              f"{s['auto_int4_backend']}/{s['auto_int4_kernel']} ({s['auto_int4_speedup']:.2f}x)")
    print(f"wrote {path}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.conv_inference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="MinAtar only, a few calls: a smoke run, not figures")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: results/bench, or runs/bench/conv-quick with --quick)")
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    refuse_if_busy(parser, args.allow_busy)
    os.environ.setdefault("XLA_FLAGS", SINGLE_THREAD_XLA)
    out = out_folder(parser, args.out, "runs/bench/conv-quick" if args.quick else "results/bench")
    run(args.quick, out, args.allow_busy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
