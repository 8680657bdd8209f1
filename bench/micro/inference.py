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
speed-ups and writes DIR/inference.json + DIR/inference.png. Speed targets (int8 >= 6x fp32 at H=2048
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
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.machine import add_allow_busy, refuse_if_busy
from bench.harness.results_io import out_folder, write_json

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


def machine_info(quick: bool) -> dict[str, Any]:
    import jax
    import jaxlib
    import onnx
    import onnxruntime

    from quarl.runtimes.cpu import cpu_class, cpu_info

    info = {**cpu_info(), "cpu_class": cpu_class()}
    from quarl.ops.machine import package_versions

    aqt_version = package_versions(["aqtp"]).get("aqtp", "unknown")
    return {
        **info,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__, "jaxlib": jaxlib.__version__, "aqtp": aqt_version,
        "onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__, "numpy": np.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "onnx_threads": 1,
        "load_average_start": list(os.getloadavg()),
        "quick": quick,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


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
    cpu = {"cpu_class": cpu_class(), "cpu_flags": " ".join(cpu_info()["flags"])}
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


def _field(rows: list[dict], variant: str, hidden: int, batch: int, field: str) -> Any:
    for r in rows:
        if (r["variant"], r["hidden"], r["batch"]) == (variant, hidden, batch):
            return r[field]
    return None


def _us(rows: list[dict], variant: str, hidden: int, batch: int) -> float | None:
    value = _field(rows, variant, hidden, batch, "us_per_call")
    return None if value is None else float(value)


def _ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None where either row is missing (a variant this CPU or runtime did not produce)."""
    return None if num is None or not den else num / den


def _least(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def summarize(rows: list[dict]) -> list[dict[str, Any]]:
    """Per (H, batch): int8/fp32 speed-up per backend, best int8 vs best fp32 (the minimum over *every* fp32
    executor, auto included), auto vs best fp32, and int8's update cost vs the cheapest fp32 update. A ratio
    whose rows are missing (a variant that did not run on this machine) is None, never a crash."""
    out = []
    for hidden, batch in sorted({(r["hidden"], r["batch"]) for r in rows}):
        here = [r for r in rows if (r["hidden"], r["batch"]) == (hidden, batch)]
        get = lambda b, p: _us(rows, f"{b} {p}", hidden, batch)  # noqa: E731
        chosen = lambda p: _field(rows, f"auto {p}", hidden, batch, "chosen")  # noqa: E731

        def choice_us(p: str) -> float | None:
            """Auto's chosen executor for `p` as timed in the shared rounds; its dequantized-fp32 candidate
            is onnx with form fp32 (the `onnx p fp32` variant)."""
            form = _field(rows, f"auto {p}", hidden, batch, "kernel_form")
            if p != "fp32" and chosen(p) == "onnx" and form == "fp32":
                return get("onnx", f"{p} fp32")
            return get(chosen(p), p)

        fp32 = {b: get(b, "fp32") for b in ("jax", "onnx")}
        int8 = {b: get(b, "int8") for b in ("jax", "onnx")}
        best_fp32 = _least(*(r["us_per_call"] for r in here if r["precision"] == "fp32"))
        # Best int8 *kernel*: the dequantized-fp32 runs (simulated) are auto's safety net, not int8 compute.
        int8_rows = [r for r in here if r["precision"] == "int8" and not r["simulated"]]
        best_int8_row = min(int8_rows, key=lambda r: r["us_per_call"]) if int8_rows else {}
        best_int8 = best_int8_row.get("us_per_call")
        best_int4 = _least(get("onnx", "int4"), get("onnx-nbits", "int4"))
        fp32_updates = [r["update_ms"] for r in here if r["precision"] == "fp32" and r["update_ms"] is not None
                        and r["backend"] != "auto"]
        int8_update = _field(rows, "onnx int8", hidden, batch, "update_ms")
        out.append({
            "hidden": hidden, "batch": batch,
            "jax_int8_speedup": _ratio(fp32["jax"], int8["jax"]),
            "onnx_int8_speedup": _ratio(fp32["onnx"], int8["onnx"]),
            "best_int8_vs_best_fp32": _ratio(best_fp32, best_int8),
            # Measured auto executors (separate instances, so they carry instance-to-instance noise) ...
            "auto_int8_vs_best_fp32": _ratio(best_fp32, get("auto", "int8")),
            "auto_fp32_vs_best_fp32": _ratio(best_fp32, get("auto", "fp32")),
            # ... and auto's *decision* judged on the main measurement: the backend it chose, timed in the
            # same interleaved rounds as the alternatives (no instance noise; < 1 means it chose wrong).
            "auto_int8_choice_vs_best_fp32": _ratio(best_fp32, choice_us("int8")),
            "auto_fp32_choice_vs_best_fp32": _ratio(best_fp32, choice_us("fp32")),
            # int4: MatMulNBits (4-bit packed) against the int8 kernel path, and the best int4 overall.
            "nbits_int4_vs_onnx_int8": _ratio(int8["onnx"], get("onnx-nbits", "int4")),
            "best_int4_vs_best_int8": _ratio(best_int8, best_int4),
            "best_int4_vs_best_fp32": _ratio(best_fp32, best_int4),
            "auto_int4_choice_vs_best_int4": _ratio(best_int4, choice_us("int4")),
            "best_int8_variant": best_int8_row.get("variant"),
            "best_int8_kernel_form": best_int8_row.get("kernel_form"),
            "onnx_int8_kernel_form": _field(rows, "onnx int8", hidden, batch, "kernel_form"),
            # The int8 actor's load step against the cheapest fp32 load step the project has (any backend).
            "cheapest_fp32_update_ms": min(fp32_updates) if fp32_updates else None,
            "onnx_int8_update_vs_cheapest_fp32": _ratio(min(fp32_updates) if fp32_updates else None, int8_update),
        })
    return out


def _x(value: float | None, digits: int = 2) -> str:
    """A ratio as the tables print it ("-" where it could not be measured)."""
    return "-" if value is None else f"{value:.{digits}f}x"


def _worst(summary: list[dict], keys: tuple[str, ...]) -> tuple[float, int, int] | None:
    """The lowest measured value of the `keys` ratios over the summary rows, with its width and batch; None
    when none was measured."""
    found = [(v, s["hidden"], s["batch"]) for s in summary for v in (s[k] for k in keys) if v is not None]
    return min(found) if found else None


def target_lines(summary: list[dict]) -> list[str]:
    """The speed targets, stated as measured (PASS/MISS), batch 1; a target whose rows are missing says so."""
    lines = []
    for hidden, need in ((2048, 6.0), (1024, 2.0)):
        for s in summary:
            if s["hidden"] == hidden and s["batch"] == 1:
                got = s["best_int8_vs_best_fp32"]
                verdict = "not measured" if got is None else ("PASS" if got >= need else "MISS")
                lines.append(f"best int8 vs best fp32 at H={hidden} batch 1: {_x(got, 1)} "
                             f"(target >= {need:.0f}x: {verdict})")
    # Judged on auto's choices timed in the main interleaved measurement; 5% slack for block-to-block noise.
    worst = _worst(summary, ("auto_int8_choice_vs_best_fp32", "auto_fp32_choice_vs_best_fp32"))
    if worst is not None:
        lines.append(f"auto's choice vs best fp32, worst case: {worst[0]:.2f}x at H={worst[1]} batch {worst[2]} "
                     f"(target: never slower: {'PASS' if worst[0] >= 0.95 else 'MISS'})")
    raw = _worst(summary, ("auto_int8_vs_best_fp32", "auto_fp32_vs_best_fp32"))
    if raw is not None:
        lines.append(f"auto executors as timed (own instances, includes instance noise), worst case vs best fp32: "
                     f"{raw[0]:.2f}x at H={raw[1]} batch {raw[2]}")
    for s in summary:
        if s["batch"] == 1:
            lines.append(f"int4 at H={s['hidden']} batch 1: MatMulNBits vs onnx int8 "
                         f"{_x(s['nbits_int4_vs_onnx_int8'])}; "
                         f"best int4 vs best int8 {_x(s['best_int4_vs_best_int8'])}, vs best fp32 "
                         f"{_x(s['best_int4_vs_best_fp32'])}; auto's int4 choice vs best int4 "
                         f"{_x(s['auto_int4_choice_vs_best_int4'])}")
    return lines


def print_table(rows: list[dict], summary: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=170)
    table = Table(title="Policy inference, microseconds per call (median; lower is better)")
    table.add_column("H", justify="right")
    table.add_column("batch", justify="right")
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    for name in labels:
        table.add_column(name.replace(" ", "\n"), justify="right")
    for col in ("jax\nint8/fp32", "onnx\nint8/fp32", "best int8\nvs best fp32", "auto int8 choice\nvs best fp32",
                "nbits int4\nvs onnx int8"):
        table.add_column(col, justify="right", style="bold")
    for s in summary:
        cells = []
        for name in labels:
            row = next((r for r in rows if (r["variant"], r["hidden"], r["batch"]) == (name, s["hidden"], s["batch"])),
                       None)
            cell = "-" if row is None else f"{row['us_per_call']:.0f}"
            if row is not None and row["backend"] == "auto":
                cell += f" ({row['chosen']})"
            cells.append(cell)
        cells += [_x(s[k]) for k in ("jax_int8_speedup", "onnx_int8_speedup", "best_int8_vs_best_fp32",
                                      "auto_int8_choice_vs_best_fp32", "nbits_int4_vs_onnx_int8")]
        table.add_row(str(s["hidden"]), str(s["batch"]), *cells)
    console.print(table)
    console.print("speed-up = fp32 us / int8 us (> 1: int8 faster). jax int8 = AQT s8xs8->s32 dot on XLA CPU; "
                  "onnx int8 = per-row activation quantization (batch 1: DynamicQuantizeLinear) + MatMulInteger "
                  "in the self-checked kernel form "
                  f"({', '.join(sorted({str(r['kernel_form']) for r in rows if r['variant'] == 'onnx int8'}))}); "
                  "onnx-nbits int4 = MatMulNBits (4-bit packed weights, int8 activations per 128-block); "
                  f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; ORT 1 intra-op thread.")
    for line in target_lines(summary):
        console.print(line)
    if any(r["update_ms"] is not None for r in rows):
        loads = Table(title="update(): one weight load (the actor's load step), milliseconds")
        loads.add_column("H", justify="right")
        loads.add_column("batch", justify="right")
        concrete = [name for name in labels if not name.startswith("auto")]
        for name in concrete:
            loads.add_column(name.replace(" ", "\n"), justify="right")
        loads.add_column("onnx int8 vs\ncheapest fp32", justify="right", style="bold")
        for s in summary:
            cells = []
            for name in concrete:
                value = _field(rows, name, s["hidden"], s["batch"], "update_ms")
                cells.append("-" if value is None else f"{value:.1f}")
            ratio = s["onnx_int8_update_vs_cheapest_fp32"]
            cells.append(_x(ratio))
            loads.add_row(str(s["hidden"]), str(s["batch"]), *cells)
        console.print(loads)


def plot(rows: list[dict], path: Path, machine: dict | None = None) -> None:
    """Latency bars per (H, batch), one per backend/precision; the title names the CPU the rows were timed on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["hidden"], r["batch"]) for r in rows})
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / len(labels)
    colors = plt.get_cmap("tab20")
    for i, name in enumerate(labels):
        ys = [_us(rows, name, h, b) or np.nan for h, b in groups]
        xs = np.arange(len(groups)) + (i - (len(labels) - 1) / 2) * width
        ax.bar(xs, ys, width, label=name, color=colors(i))
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(groups)), [f"H={h}\nbatch {b}" for h, b in groups])
    ax.set_ylabel("microseconds per call (median, log scale)")
    cpu = (machine or {}).get("cpu_model") or "CPU not recorded"
    cores = (machine or {}).get("cores")
    ax.set_title("D4PG policy 24-H-H-H-6: inference latency by backend and precision\n"
                 f"{cpu}{f', {cores} cores' if cores else ''}, one thread; bars: median over timed calls (no spread "
                 "shown: see inference.json)", fontsize=10)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(quick: bool, out: Path) -> dict[str, Any]:
    from quarl.runtimes import auto_decisions, clear_auto_decisions

    budget = QUICK if quick else FULL
    machine = machine_info(quick)
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
    machine["load_average_end"] = list(os.getloadavg())
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
    run(args.quick, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
