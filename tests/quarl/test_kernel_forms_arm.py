"""int8 on Arm's integer kernels: an aarch64 Python with the pinned ONNX Runtime runs under
`qemu-aarch64 -cpu MODEL` (`bench.harness.emulation`), so MLAS dispatches its Arm kernels: plain NEON (cortex-a72),
dot product (neoverse-n1) and int8 matrix multiply (max). On each, the executor must end on a form its
self-check passed and stay within the int8 tolerance; a forced u8s8 is either exact there or refused.
Skips, saying why, without qemu-user, root or the sysroot (`python -m bench.harness.emulation build-arm`); in CI,
whose set-up builds it, fails instead. The default suite emulates dot product (neoverse-n1); the other two run under
`slow`. Each model's interpreter is launched once per session (`tests.quarl.emulated`, shared with test_conv_cpus)."""
from __future__ import annotations

import pytest

from tests.quarl.emulated import arm_cpu_params, part

pytestmark = pytest.mark.usefixtures("arm_emulation")


@pytest.mark.parametrize("cpu", arm_cpu_params())  # tests.quarl.emulated.DEFAULT_ARM_CPU; the others slow
def test_arm_int8_runs_a_self_checked_form_within_tolerance(arm_run):
    out = part(arm_run, "mlp")
    for run in out.values():
        last = run["checks"][-1]
        assert last["ok"] and last["form"] == run["form"] and run["form"] != "fp32"  # an integer form, not the fallback
        assert run["rel_err"] < 3e-2  # the int8 tolerance of tests/quarl/test_runtimes.py
        for check in run["checks"]:
            assert check["ok"] == (check["max_rel_err"] <= check["tolerance"])  # refused iff off the exact emulation
    assert out["None"]["form"] == "u8u8"  # Arm's preferred form, confirmed by its own self-check
