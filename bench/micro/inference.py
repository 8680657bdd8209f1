"""Actor inference speed: every runtime backend x precision on the D4PG policy 24 -> H -> H -> H -> 6.

    python -m bench.micro.inference [--quick] [--out DIR]

Measures microseconds per policy call (median) for jax fp32/fp16/bf16/int8, onnx fp32/int8 and auto
fp32/int8, int4 on onnx (the int8 kernel forms), onnx-nbits (MatMulNBits, 4-bit packed) and auto, plus onnx int8 in every integer kernel form this CPU's self-check accepts (`onnx int8 u8u8`, ...;
forms it refuses are listed, not timed), with H in {256, 1024, 2048} and batch 1 and 16, plus the cost of
one `update()` (the actor's load step). Every row records the CPU's class and SIMD flags and the kernel form
the executor ran, so a reader sees what their CPU class gets. "best fp32" is the minimum over every fp32
executor (auto included); int8's update cost is compared with the cheapest fp32 update of any backend. Backends take turns in short blocks over several rounds, so a burst of load from other
processes hits all of them alike; the first call of each block is dropped (it runs with another backend's
weights in the cache, which is not how an actor calls its policy). Prints a table with the int8/fp32
speed-ups and writes DIR/inference.json + DIR/inference.png (summary, tables and figure:
`bench.micro.inference_report`). Speed targets (int8 >= 6x fp32 at H=2048
batch 1, >= 2x at H=1024, auto never slower than fp32) are reported, never asserted: timing depends on the
machine and its load.

Defaults: the full run writes to results/bench (committed); --quick (< 1 min: fewer calls, no H=1024 at
batch 16) writes to runs/bench/inference-quick so `make run` never overwrites the committed results.
The auto backend measures afresh into a temporary cache directory, so its row reflects this run.
XLA runs single-threaded unless XLA_FLAGS is already set (see SINGLE_THREAD_XLA), like ORT's threads=1.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.machine import add_allow_busy, bench_machine, finish, refuse_if_busy
from bench.harness.results_io import out_folder, write_json
from bench.micro.inference_report import plot, print_table, summarize, target_lines

# (backend, precision, forced ONNX kernel form or None); `variants()` adds one onnx int8 row per form the
# CPU's self-check accepts. A variant's label is "backend precision[ form]".
BASE_VARIANTS: tuple[tuple[str, str, str | None], ...] = (
    ("jax", "fp32", None), ("jax", "fp16", None), ("jax", "bf16", None), ("jax", "int8", None),
    ("onnx", "fp32", None), ("onnx", "int8", None), ("auto", "fp32", None), ("auto", "int8", None),
    ("onnx", "int4", None), ("onnx-nbits", "int4", None), ("jax", "int4", None), ("auto", "int4", None),
    # The int weights dequantized in fp32 (ONNX's `fp32` form, simulated): one of auto's candidates.
    ("onnx", "int8", "fp32"), ("onnx", "int4", "fp32"),
)
Variant = tuple[str, str, "str | None"]
HIDDEN = (256, 1024, 2048)
BATCHES = (1, 16)
OBS_DIM, ACT_DIM = 24, 6
# One XLA CPU thread, like the ONNX sessions (threads=1): an ActorQ actor owns one core, and a comparison
# of a 2-thread XLA against a 1-thread ORT would measure thread counts, not kernels. Must be set before JAX
# initialises its backend; an XLA_FLAGS already in the environment wins (and is recorded in the JSON).
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


@dataclasses.dataclass(frozen=True)
class Budget:
    """How long to time each variant per configuration (seconds) and the call-count bounds."""

    seconds: float
    min_calls: int
    max_calls: int
    rounds: int
    warmup: int
    time_updates: bool  # also time one update() per variant (an extra weight load: ONNX fp32 ~0.2 s at H=2048)


FULL = Budget(seconds=1.5, min_calls=20, max_calls=600, rounds=10, warmup=5, time_updates=True)
QUICK = Budget(seconds=0.2, min_calls=4, max_calls=60, rounds=2, warmup=1, time_updates=False)


def label(variant: Variant) -> str:
    backend, precision, form = variant
    return f"{backend} {precision}" + (f" {form}" if form else "")


def form_checks(hidden: int) -> dict[str, dict[str, Any]]:
    """Each registered integer form's int8 self-check at the policy's layer shapes (cached per process)."""
    from quarl.runtimes.kernel_check import check_form
    from quarl.runtimes.kernel_forms import forms

    shapes = [(OBS_DIM, hidden), (hidden, hidden), (hidden, ACT_DIM)]
    return {name: check_form(name, 8, shapes) for name, form in forms().items() if form.integer
            and form.max_bits >= 8}


def variants(hidden: int) -> list[Variant]:
    """The base variants plus onnx int8 forced to each integer form this CPU's self-check accepts."""
    accepted = [name for name, check in form_checks(hidden).items() if check["ok"]]
    return [*BASE_VARIANTS, *(("onnx", "int8", name) for name in accepted)]


def configs(quick: bool) -> list[tuple[int, int]]:
    out = [(h, b) for h in HIDDEN for b in BATCHES]
    return [(h, b) for h, b in out if not (quick and (h, b) == (1024, 16))]


def inference_machine(quick: bool, allow_busy: bool = False) -> dict[str, Any]:
    """bench.harness.machine's record (CPU class and flags, versions, load at the start) plus the thread settings
    every executor was timed under."""
    return {**bench_machine(allow_busy), "xla_flags": os.environ.get("XLA_FLAGS", ""), "onnx_threads": 1,
            "quick": quick}


def make_params(hidden: int, seed: int = 0) -> tuple[Any, dict]:
    """The D4PG policy spec at width `hidden` and LeCun-normal-like random weights (speed does not
    depend on the values, but realistic magnitudes keep int8 scales and activations typical)."""
    from quarl.policy.spec import LayerNorm, Linear, layer_norm_mlp_policy

    spec = layer_norm_mlp_policy(OBS_DIM, [hidden] * 3, [-1.0] * ACT_DIM, [1.0] * ACT_DIM)
    rng = np.random.default_rng(seed)
    params: dict[str, dict[str, np.ndarray]] = {}
    width = spec.input_dim
    for layer in spec.layers:
        if isinstance(layer, Linear):
            w = rng.standard_normal((width, layer.out)) / np.sqrt(width)
            params[layer.name] = {"w": w.astype(np.float32), "b": np.zeros(layer.out, np.float32)}
            width = layer.out
        elif isinstance(layer, LayerNorm):
            params[layer.name] = {"scale": np.ones(width, np.float32), "offset": np.zeros(width, np.float32)}
    return spec, params


def time_blocks(executors: dict[tuple[str, str], Any], obs: np.ndarray, budget: Budget) -> dict[tuple[str, str],
                                                                                                 list[float]]:
    """Per-call seconds for every executor: `budget.rounds` rounds, each a block per executor."""
    probe = {}
    for key, ex in executors.items():
        for _ in range(budget.warmup):
            ex(obs)
        t = time.perf_counter()
        ex(obs)
        probe[key] = time.perf_counter() - t
    calls = {k: int(np.clip(budget.seconds / max(p, 1e-7), budget.min_calls, budget.max_calls))
             for k, p in probe.items()}
    from quarl.runtimes.auto import interleaved_samples  # pylint: disable=import-outside-toplevel

    return interleaved_samples(executors, obs, budget.rounds,
                               {k: max(2, c // budget.rounds) for k, c in calls.items()})


def bench_config(hidden: int, batch: int, budget: Budget) -> list[dict[str, Any]]:
    from quarl.quant.quantization import quantize_params
    from quarl.runtimes import make_executor
    from quarl.runtimes.cpu import cpu_class, cpu_info

    spec, params = make_params(hidden)
    _, params_b = make_params(hidden, seed=1)
    todo = variants(hidden)
    qps = {p: quantize_params(params, p) for p in {v[1] for v in todo}}
    executors, build_s, update_ms = {}, {}, {}
    for variant in todo:
        backend, precision, form = variant
        t = time.perf_counter()
        ex = make_executor(spec, qps[precision], backend, batch_size=batch, threads=1, kernel_form=form)
        build_s[variant] = time.perf_counter() - t
        update_ms[variant] = None
        if budget.time_updates:
            new = quantize_params(params_b, precision)
            t = time.perf_counter()
            ex.update(new)
            update_ms[variant] = round((time.perf_counter() - t) * 1e3, 2)
        executors[variant] = ex
    obs = np.random.default_rng(hidden + batch).standard_normal((batch, OBS_DIM)).astype(np.float32)
    samples = time_blocks(executors, obs, budget)
    cpu = {"cpu_class": cpu_class(), "cpu_flags": cpu_info()["flags"]}  # flags as a list, as the machine record
    rows = []
    for variant, ex in executors.items():
        backend, precision, form = variant
        s = np.asarray(samples[variant]) * 1e6
        rows.append({
            "variant": label(variant), "backend": backend, "precision": precision, "forced_form": form,
            "hidden": hidden, "batch": batch,
            "us_per_call": round(float(np.median(s)), 2),
            "us_p10": round(float(np.percentile(s, 10)), 2), "us_p90": round(float(np.percentile(s, 90)), 2),
            "calls": int(s.size), "chosen": ex.backend, "kernel_form": ex.kernel_form,
            "simulated": bool(ex.simulated), "update_ms": update_ms[variant],
            "build_s": round(build_s[variant], 3), **cpu,
        })
    return rows


def run(quick: bool, out: Path, allow_busy: bool = False) -> dict[str, Any]:
    from quarl.runtimes import auto_decisions, clear_auto_decisions

    budget = QUICK if quick else FULL
    machine = inference_machine(quick, allow_busy)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="quarl-auto-") as cache:
        os.environ["QUARL_CACHE_DIR"] = cache
        clear_auto_decisions()
        for hidden, batch in configs(quick):
            t = time.perf_counter()
            rows += bench_config(hidden, batch, budget)
            print(f"  H={hidden} batch={batch}: {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
        decisions = auto_decisions()  # auto's own short measurements (25th percentile us), for the record
    machine["kernel_checks"] = {h: form_checks(h) for h, _ in configs(quick)}  # refused forms are not timed
    finish(machine)
    summary = summarize(rows)
    print_table(rows, summary)
    result = {"machine": machine, "rows": rows, "summary": [{k: (round(v, 3) if isinstance(v, float) else v)
                                                             for k, v in s.items()} for s in summary],
              "targets": target_lines(summary),
              "auto_decisions": {k.split("|", 1)[1]: v for k, v in decisions.items()}}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "inference.json", result)
    plot(rows, out / "inference.png", machine)
    print(f"wrote {out / 'inference.json'} and {out / 'inference.png'}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.inference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="under a minute: fewer calls, fewer shapes")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: results/bench, or runs/bench/inference-quick with --quick)")
    parser.add_argument("--report-only", action="store_true",
                        help="redraw inference.png from the folder's inference.json (no timing)")
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    out = out_folder(parser, args.out, "runs/bench/inference-quick" if args.quick else "results/bench")
    if args.report_only:
        try:
            result = json.loads((out / "inference.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            print(f"error: cannot read {out / 'inference.json'}: {e}", file=sys.stderr)
            return 2
        plot(result["rows"], out / "inference.png", result.get("machine"))
        print(f"wrote {out / 'inference.png'}")
        return 0
    refuse_if_busy(parser, args.allow_busy)
    os.environ.setdefault("XLA_FLAGS", SINGLE_THREAD_XLA)
    run(args.quick, out, args.allow_busy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
