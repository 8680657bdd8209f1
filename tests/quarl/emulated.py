"""One emulated interpreter per CPU model per session for the emulated-CPU tests (test_kernel_forms_avx2,
test_kernel_forms_arm, test_conv_cpus): importing numpy and ONNX Runtime under qemu-user is most of a launch
(15 s to over a minute on 2 shared cores), so each model's launch runs every probe those tests assert on and
prints one JSON line, and `driver_results` caches it for the session. The probes: int8 executors of an MLP and
of a conv policy with and without a requested u8s8 form, and on x86 the CPU-class-dependent default-suite tests
(`CPU_CLASS_TESTS`), run by pytest in the same interpreter. Each part is caught on its own, so a broken probe
fails only the tests that read it. Nothing the Arm driver runs imports pytest, which its sysroot lacks.

    python -m tests.quarl.emulated [--cpu-class-tests]   # the driver; host-side, `driver_results(cpu)` runs it
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import subprocess
import sys
import traceback
from typing import Any, Callable

from bench.harness.emulation import ARM_CPUS, run_under_arm, run_under_x86, stderr_tail

# The Arm model the default suite emulates: dot product (sdot/udot), the integer kernel of the Arm server CPUs
# most deployed (Neoverse N1: Graviton2, Altra). Plain NEON (cortex-a72) and i8mm (max) run under `slow`.
DEFAULT_ARM_CPU = "neoverse-n1"

# Default-suite tests whose assertions meet the kernels MLAS picks per CPU class: forms a VNNI CPU runs and an
# AVX2-only one refuses (u8s8 saturates int16 pair sums: static conv graphs, requested forms) or runs through
# another kernel (MatMulNBits' one-row kernel). ONNX cases only: the JAX backend's kernels are XLA's.
CPU_CLASS_TESTS = (
    "tests/quarl/test_conv_runtimes.py::test_int8_matches_dequantized_reference",
    "tests/quarl/test_conv_runtimes.py::test_onnx_int8_runs_qlinearconv_with_the_relu_folded",
    "tests/quarl/test_conv_runtimes.py::test_static_self_check_and_selection",
    "tests/quarl/test_row_quantization.py::test_each_row_is_bit_identical_alone_or_in_a_mixed_batch",
    "tests/quarl/test_pixel_inputs.py::test_static_int8_graph_takes_the_pixels_as_codes",
)


def arm_cpu_params() -> list:
    """Every Arm model as a parametrize value (ids unchanged), all but `DEFAULT_ARM_CPU` marked slow."""
    import pytest  # pylint: disable=import-outside-toplevel

    return [cpu if cpu == DEFAULT_ARM_CPU else pytest.param(cpu, marks=pytest.mark.slow) for cpu in sorted(ARM_CPUS)]


def mlp_kernel_forms() -> dict:
    """An int8 MLP executor's form, self-checks and error against the fp32 reference, unrequested and u8s8."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    from quarl.policy.reference import reference_apply  # pylint: disable=import-outside-toplevel
    from quarl.policy.spec import mlp_q_network  # pylint: disable=import-outside-toplevel
    from quarl.quant.quantization import quantize_params  # pylint: disable=import-outside-toplevel
    from tests.quarl.helpers import random_params  # pylint: disable=import-outside-toplevel

    spec = mlp_q_network(8, [256, 256], 5)
    params = random_params(spec, 0)
    obs = np.random.default_rng(1).normal(size=(64, 8)).astype(np.float32)
    return _forms(spec, quantize_params(params, "int8"), obs, reference_apply(spec, params, obs), batch_size=64)


def conv_kernel_forms() -> dict:
    """The same for a calibrated int8 MinAtar conv policy (the static QLinearConv graph) against its dequantized
    reference."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    from quarl.policy.reference import reference_apply  # pylint: disable=import-outside-toplevel
    from quarl.policy.spec import minatar_q_network  # pylint: disable=import-outside-toplevel
    from quarl.quant.calibration import quantize_for_actors  # pylint: disable=import-outside-toplevel
    from quarl.quant.quantization import dequantize_params  # pylint: disable=import-outside-toplevel
    from tests.quarl.helpers import random_params  # pylint: disable=import-outside-toplevel

    spec = minatar_q_network((10, 10, 4), 6)
    params = random_params(spec, 0)
    obs = np.random.default_rng(1).integers(0, 2, (72, spec.input_dim)).astype(np.float32)
    qp = quantize_for_actors(spec, params, "int8", obs[:64])
    return _forms(spec, qp, obs[64:], reference_apply(spec, dequantize_params(qp), obs[64:]), batch_size=8)


def _forms(spec: Any, qparams: Any, obs: Any, ref: Any, batch_size: int) -> dict:
    """An int8 ONNX executor of `qparams`, unrequested and with u8s8 requested: the form it ended on, its self-checks
    and its error relative to `ref`'s range."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    from quarl.runtimes import make_executor  # pylint: disable=import-outside-toplevel

    out = {}
    for form in (None, "u8s8"):
        ex = make_executor(spec, qparams, "onnx", batch_size=batch_size, kernel_form=form)
        err = float(np.abs(ex(obs) - ref).max() / np.ptp(ref))
        out[str(form)] = {"form": ex.kernel_form, "checks": ex.kernel_check["checks"], "rel_err": err}
    return out


def cpu_class_tests() -> dict:
    """`CPU_CLASS_TESTS` (not slow, not jax) in this interpreter: pytest's exit code, summary line and output tail."""
    import pytest  # pylint: disable=import-outside-toplevel

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = pytest.main(["-q", "-p", "no:cacheprovider", "-m", "not slow", "-k", "not jax", *CPU_CLASS_TESTS])
    lines = buf.getvalue().strip().splitlines()
    return {"exit_code": int(code), "summary": lines[-1] if lines else "", "tail": buf.getvalue()[-3000:]}


def _caught(probe: Callable[[], dict]) -> dict:
    try:
        return probe()
    except Exception:  # pylint: disable=broad-except  # reported in the JSON, failing only this part's tests
        return {"error": traceback.format_exc()[-3000:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.quarl.emulated", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-class-tests", action="store_true", help="also run CPU_CLASS_TESTS with pytest")
    args = parser.parse_args(argv)
    out = {"mlp": _caught(mlp_kernel_forms), "conv": _caught(conv_kernel_forms)}
    if args.cpu_class_tests:
        out["cpu_class_tests"] = _caught(cpu_class_tests)
    print(json.dumps(out), flush=True)
    return 0


@functools.lru_cache(maxsize=None)
def driver_results(cpu: str) -> dict:
    """The driver's JSON from one launch under `qemu-aarch64 -cpu cpu` (an `ARM_CPUS` model) or `qemu-x86_64 -cpu
    cpu` (with the CPU-class tests), cached per model; {"error": ...} when the launch itself failed."""
    arm = cpu in ARM_CPUS
    args = ["-m", "tests.quarl.emulated", *([] if arm else ["--cpu-class-tests"])]
    try:
        proc = run_under_arm(cpu, args, timeout=1200) if arm else run_under_x86(cpu, args, timeout=1800)
    except subprocess.TimeoutExpired as exc:
        return {"error": f"the emulated driver on {cpu} timed out after {exc.timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"the emulated driver on {cpu} exited {proc.returncode}: {stderr_tail(proc, 40)[-2000:]}"}
    return json.loads(lines[-1])


def part(results: dict, name: str) -> Any:
    """`name`'s results from `driver_results`, failing the calling test with the launch's or the probe's error."""
    assert "error" not in results, results["error"]
    assert "error" not in results[name], results[name]["error"]
    return results[name]


if __name__ == "__main__":
    sys.exit(main())
