"""bench.micro.inference's report: the per-shape summary of its timed rows (`summarize`: int8/fp32 speed-ups, auto's
choices judged on the same measurement, int4 against int8, the update cost), the speed targets as measured
(`target_lines`), the console tables (`print_table`) and the figure (`plot`, also redrawn from inference.json by
--report-only).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.results_io import save_figure
from quarl.ops.machine import machine_fields


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
    fields = machine_fields(machine)
    cpu, cores = fields.get("cpu_model") or "CPU not recorded", fields.get("cores")
    ax.set_title("D4PG policy 24-H-H-H-6: inference latency by backend and precision\n"
                 f"{cpu}{f', {cores} cores' if cores else ''}, one thread; bars: median over timed calls (no spread "
                 "shown: see inference.json)", fontsize=10)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(ncol=4, fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
