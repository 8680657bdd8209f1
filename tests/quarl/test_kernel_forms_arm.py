"""int8 on Arm's integer kernels: an aarch64 Python with the pinned ONNX Runtime runs under
`qemu-aarch64 -cpu MODEL` (`bench.harness.emulation`), so MLAS dispatches its Arm kernels: plain NEON (cortex-a72),
dot product (neoverse-n1) and int8 matrix multiply (max). On each, the executor must end on a form its
self-check passed and stay within the int8 tolerance; a forced u8s8 is either exact there or refused.
Skips, saying why, without qemu-user, root or the sysroot (`python -m bench.harness.emulation build-arm`); in CI,
whose set-up builds it, fails instead."""
from __future__ import annotations

import json

import pytest

from bench.harness.emulation import ARM_CPUS, run_under_arm
from tests.quarl.test_kernel_forms_avx2 import SCRIPT

pytestmark = pytest.mark.usefixtures("arm_emulation")


@pytest.mark.parametrize("cpu", sorted(ARM_CPUS))
def test_arm_int8_runs_a_self_checked_form_within_tolerance(cpu):
    proc = run_under_arm(cpu, ["-c", SCRIPT], timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for run in out.values():
        last = run["checks"][-1]
        assert last["ok"] and last["form"] == run["form"] and run["form"] != "fp32"  # an integer form, not the fallback
        assert run["rel_err"] < 3e-2  # the int8 tolerance of tests/quarl/test_runtimes.py
        for check in run["checks"]:
            assert check["ok"] == (check["max_rel_err"] <= check["tolerance"])  # refused iff off the exact emulation
    assert out["None"]["form"] == "u8u8"  # Arm's preferred form, confirmed by its own self-check
