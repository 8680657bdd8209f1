"""int8 conv (the static QLinearConv graph) on the other CPU classes the suite emulates: AVX2 without VNNI
(`qemu-x86_64 -cpu Haswell`, where MLAS's u8 x s8 kernels saturate int16 pair sums) and Arm. Each must end on a
static form its own self-check passed, within the int8 tolerance of the dequantized reference; a refused form
is refused because it is off the exact emulation. Skips, saying why, without qemu-user (or the Arm sysroot); in
CI, whose set-up installs them, fails instead. Each CPU model's emulated interpreter is launched once per session
(`tests.quarl.emulated`, shared with test_kernel_forms_avx2/arm); the default suite emulates one Arm model."""
from __future__ import annotations

import pytest

from tests.quarl.emulated import arm_cpu_params, part


def _check(out: dict) -> None:
    for run in out.values():
        last = run["checks"][-1]
        assert last["ok"] and last["form"] == run["form"]
        assert run["rel_err"] < 3e-2  # the int8 tolerance of tests/quarl/test_runtimes.py
        for check in run["checks"]:
            if check["form"] != "fp32" and check.get("max_rel_err") is not None:
                assert check["ok"] == (check["max_rel_err"] <= check["tolerance"])


@pytest.mark.usefixtures("x86_emulation")
def test_avx2_int8_conv_runs_a_self_checked_form_within_tolerance(haswell_run):
    _check(part(haswell_run, "conv"))


@pytest.mark.usefixtures("arm_emulation")
@pytest.mark.parametrize("cpu", arm_cpu_params())  # tests.quarl.emulated.DEFAULT_ARM_CPU; the others slow
def test_arm_int8_conv_runs_a_self_checked_form_within_tolerance(arm_run):
    _check(part(arm_run, "conv"))
