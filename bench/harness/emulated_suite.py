"""The int8 runtime tests on an emulated CPU: pytest itself runs under `qemu-x86_64 -cpu MODEL`, so every
executor in those tests (and its self-check) meets the emulated CPU's ONNX Runtime kernels. The default
selection is the tests that failed on an AVX2-only AMD EPYC before kernel forms existed. Writes a page with the
command, the host, the emulated model and pytest's summary.

    python -m bench.harness.emulated_suite                      # Haswell (AVX2, no AVX-512, no VNNI), ~5 minutes
    python -m bench.harness.emulated_suite --cpu Skylake-Client --out /tmp/suite.md
"""
from __future__ import annotations

import argparse
import datetime
import re
import shlex
import sys
import time
from pathlib import Path

from bench.harness.results_io import write_text

DEFAULT_TESTS = (
    "tests/quarl/test_runtimes.py",
    "-k", "matches_reference or update_swaps or other_batch or per_tensor or auto_picks",
    "tests/agents/test_d4pg.py::test_actor_runs_the_learners_policy_through_an_int8_runtime",
)


def run(cpu: str, tests: list[str], timeout: float) -> dict[str, object]:
    """pytest under qemu; returns the command, exit code, summary line and seconds."""
    from bench.harness.emulation import run_under_x86  # pylint: disable=import-outside-toplevel

    start = time.perf_counter()
    try:
        proc = run_under_x86(cpu, ["-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], timeout=timeout)
    except RuntimeError as e:
        raise SystemExit(f"bench.harness.emulated_suite: error: {e}") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    summary = next((ln.strip("= ") for ln in reversed(lines) if re.search(r"\d+ (passed|failed|error)", ln)), "")
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    return {"returncode": proc.returncode, "summary": summary, "failed": failed,
            "seconds": round(time.perf_counter() - start, 1)}


def page(argv: list[str], cpu: str, tests: list[str], result: dict[str, object]) -> str:
    from quarl.runtimes.cpu import cpu_class, cpu_info  # pylint: disable=import-outside-toplevel

    info = cpu_info()
    lines = ["# The int8 runtime tests on an emulated CPU", "",
             f"`{shlex.join(['python', '-m', 'bench.harness.emulated_suite', *argv])}`, "
             f"{datetime.date.today().isoformat()}. Host: "
             f"{info['cpu_model']} (class {cpu_class()}); emulated: `qemu-x86_64 -cpu {cpu}` (qemu-user; ONNX "
             "Runtime's MLAS dispatches on the emulated CPUID, so an AVX2-only model gets the AVX2 kernels whose "
             "u8 x s8 sums saturate). /proc/cpuinfo under qemu-user is the host's, so the CPU-based first choice "
             "is u8s8 and the self-check has to refuse it.", "",
             f"Tests: `{shlex.join(tests)}`", "",
             f"Result: **{result['summary'] or 'no summary line'}** (exit code {result['returncode']}, "
             f"{result['seconds']} s)."]
    if result["failed"]:
        lines += ["", "Failed:", "", *[f"- `{ln}`" for ln in result["failed"]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="bench.harness.emulated_suite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", default="Haswell", help="qemu-x86_64 CPU model (default Haswell)")
    parser.add_argument("--out", default="results/bench/emulated_suite.md", help="page to write")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before pytest is stopped")
    parser.add_argument("tests", nargs="*", help="pytest arguments (default: the int8 runtime tests)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.cpu):
        parser.error(f"--cpu must be a qemu CPU model name, got {args.cpu!r}")
    tests = args.tests or list(DEFAULT_TESTS)
    result = run(args.cpu, tests, args.timeout)
    text = page(argv, args.cpu, tests, result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text(Path(args.out), text)
    print(text, end="")
    return 0 if result["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
