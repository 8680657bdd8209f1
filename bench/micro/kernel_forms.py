"""Per-form numerics of the ONNX integer kernel forms on this CPU and, with `--qemu-cpus`, on emulated CPU
models (qemu-user runs the same Python and ORT; MLAS dispatches on the emulated CPUID, so `Haswell` gets its
AVX2 kernels). Prints, per CPU and weight bit width, each form's max relative error against the exact
integer emulation, whether the self-check accepts it, and the form an executor would use.

    python -m bench.micro.kernel_forms                                  # this CPU
    python -m bench.micro.kernel_forms --qemu-cpus Haswell,Skylake-Client --out /tmp/forms.md
    python -m bench.micro.kernel_forms --qemu-arm-cpus cortex-a72,neoverse-n1,max   # after bench.harness.emulation build-arm

Errors only (no timings: emulated CPUs run ~100x slower and say nothing about speed).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.harness.results_io import write_text
from quarl.quant.precision import parse_bit_list


def measure(bits: list[int], width: int) -> dict[str, Any]:
    """Check every registered form at each bit width on one [width, width] layer, in this process."""
    from quarl.runtimes.cpu import cpu_class, cpu_info
    from quarl.runtimes.kernel_check import check_form, select_form
    from quarl.runtimes.kernel_forms import forms

    shapes = [(width, width)]
    rows = []
    for b in bits:
        chosen = select_form(b, shapes)["form"]
        for name, form in forms().items():
            if form.max_bits < b:
                continue
            r = check_form(name, b, shapes)
            rows.append({"bits": b, "form": name, "ok": r["ok"], "max_rel_err": r["max_rel_err"],
                         "error": r.get("error"), "chosen": name == chosen})
    return {"cpu_class": cpu_class(), "flags": cpu_info()["flags"], "rows": rows}


def _under_qemu(model: str, bits: list[int], width: int) -> dict[str, Any]:
    from bench.harness.emulation import run_under_x86, stderr_tail  # pylint: disable=import-outside-toplevel

    try:
        proc = run_under_x86(model, ["-m", "bench.micro.kernel_forms", "--inner", "--bits", ",".join(map(str, bits)),
                                     "--width", str(width)])
    except RuntimeError as e:
        raise SystemExit(f"bench.micro.kernel_forms: error: qemu-x86_64 -cpu {model}: {e}") from None
    if proc.returncode != 0:
        raise SystemExit(f"qemu -cpu {model} failed: {stderr_tail(proc)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _under_arm(model: str, bits: list[int], width: int) -> dict[str, Any]:
    from bench.harness.emulation import run_under_arm, stderr_tail  # pylint: disable=import-outside-toplevel

    try:
        proc = run_under_arm(model, ["-m", "bench.micro.kernel_forms", "--inner", "--bits", ",".join(map(str, bits)),
                                     "--width", str(width)])
    except (RuntimeError, ValueError) as e:
        raise SystemExit(f"bench.micro.kernel_forms: error: qemu-aarch64 -cpu {model}: {e}") from None
    if proc.returncode != 0:
        raise SystemExit(f"qemu-aarch64 -cpu {model} failed: {stderr_tail(proc)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def header(argv: list[str], host: dict[str, Any], width: int, emulated: bool) -> str:
    """What was run, where, and how to read the table (written with it, so the file explains itself)."""
    import datetime  # pylint: disable=import-outside-toplevel

    from quarl.ops.machine import machine_info  # pylint: disable=import-outside-toplevel

    record = machine_info(())
    lines = ["# int8/int4 kernel forms: numerics per CPU class", "",
             f"`python -m bench.micro.kernel_forms {' '.join(argv)}`, {datetime.date.today().isoformat()}. Host: "
             f"{record.cpu_model} ({record.cores} cores; class {host['cpu_class']}; "
             f"{', '.join(host['flags'])}). Errors only, no timings. Error: max |form - exact NumPy emulation| / "
             f"max |emulation| on random layers of width {width} at batch 1 and 8; the self-check refuses above "
             "1e-3. \"used\": the form an executor ends with on that CPU after the self-check."]
    if emulated:
        lines += ["", "Emulated rows run the same code under qemu-user (`qemu-x86_64 -cpu MODEL` with this venv; "
                  "`qemu-aarch64 -cpu MODEL` with an aarch64 Python and the pinned aarch64 wheels, "
                  "`bench.harness.emulation`), where ONNX Runtime's MLAS dispatches on the emulated CPU's features: "
                  "AVX2 kernels for x86 models (qemu's TCG emulates no AVX-512), NEON for cortex-a72, dot product "
                  "for neoverse-n1, int8 matrix multiply (i8mm) for max. An emulator can be wrong itself, so "
                  "these rows are evidence about a CPU class, not a run on its hardware."]
    return "\n".join(lines) + "\n\n"


def summary(results: dict[str, dict[str, Any]]) -> str:
    """One line per CPU: the form each bit width ends on, and every form the self-check refused there."""
    lines = []
    for cpu, res in results.items():
        used = ", ".join(f"int{r['bits']} {r['form']}" for r in res["rows"] if r["chosen"])
        refused = ", ".join(f"{r['form']} at int{r['bits']} ({r['max_rel_err']:.2g})" if r["max_rel_err"] is not None
                            else f"{r['form']} at int{r['bits']}" for r in res["rows"] if not r["ok"])
        lines.append(f"- {cpu}: uses {used}; refused: {refused or 'none'}.")
    return "\n".join(lines) + "\n\n"


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| CPU | bits | form | max rel error vs exact | self-check | used |", "|---|---|---|---|---|---|"]
    for cpu, res in results.items():
        for r in res["rows"]:
            err = r["error"] or (f"{r['max_rel_err']:.2e}" if r["max_rel_err"] is not None else "-")
            lines.append(f"| {cpu} | int{r['bits']} | {r['form']} | {err} | {'pass' if r['ok'] else 'refused'} | "
                         f"{'yes' if r['chosen'] else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bits", default="8,7,4", help="weight bit widths (default 8,7,4)")
    p.add_argument("--width", type=int, default=512, help="layer width of the check (default 512)")
    p.add_argument("--qemu-cpus", default="", help="comma-separated qemu CPU models, e.g. Haswell,Skylake-Client")
    p.add_argument("--qemu-arm-cpus", default="", help="comma-separated qemu-aarch64 CPU models (cortex-a72, "
                   "neoverse-n1, max); needs `python -m bench.harness.emulation build-arm` first")
    p.add_argument("--out", help="also write the markdown page (header and table) here")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        bits = sorted(parse_bit_list(args.bits, "kernel"), reverse=True)
    except ValueError as e:
        p.exit(2, f"{p.prog}: error: --bits: {e}\n")
    if args.width < 2:
        p.exit(2, f"{p.prog}: error: --width must be at least 2\n")
    from bench.harness.emulation import ARM_CPUS  # pylint: disable=import-outside-toplevel

    unknown = [m for m in args.qemu_arm_cpus.split(",") if m and m not in ARM_CPUS]
    if unknown:
        p.exit(2, f"{p.prog}: error: unknown --qemu-arm-cpus model {unknown[0]!r} (known: {', '.join(ARM_CPUS)})\n")
    if args.inner:
        print(json.dumps(measure(bits, args.width)))
        return 0
    host = measure(bits, args.width)
    results = {f"this CPU ({host['cpu_class']})": host}
    for model in [m for m in args.qemu_cpus.split(",") if m]:
        results[f"qemu {model}"] = _under_qemu(model, bits, args.width)
    for model in [m for m in args.qemu_arm_cpus.split(",") if m]:
        results[f"qemu aarch64 {model}"] = _under_arm(model, bits, args.width)
    text = table(results)
    print(text)
    if args.out:
        emulated = len(results) > 1
        write_text(Path(args.out), header(list(argv if argv is not None else sys.argv[1:]), host, args.width,
                                          emulated) + summary(results) + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
