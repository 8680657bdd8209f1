"""int8 conv (the static QLinearConv graph) on the other CPU classes the suite emulates: AVX2 without VNNI
(`qemu-x86_64 -cpu Haswell`, where MLAS's u8 x s8 kernels saturate int16 pair sums) and Arm. Each must end on a
static form its own self-check passed, within the int8 tolerance of the dequantized reference; a refused form
is refused because it is off the exact emulation. Skips, saying why, without qemu-user (or the Arm sysroot); in
CI, whose set-up installs them, fails instead."""
from __future__ import annotations

import json

import pytest

from bench.harness.emulation import ARM_CPUS, run_under_arm
from tests.quarl.helpers import run_under_qemu

SCRIPT = """
import json, numpy as np
from quarl.quant.calibration import quantize_for_actors
from quarl.policy.reference import reference_apply
from quarl.policy.spec import minatar_q_network
from quarl.quant.quantization import dequantize_params
from quarl.runtimes import make_executor
from tests.quarl.helpers import random_params
spec = minatar_q_network((10, 10, 4), 6)
params = random_params(spec, 0)
rng = np.random.default_rng(1)
obs = rng.integers(0, 2, (72, spec.input_dim)).astype(np.float32)
qp = quantize_for_actors(spec, params, "int8", obs[:64])
ref = reference_apply(spec, dequantize_params(qp), obs[64:])
out = {}
for form in (None, "u8s8"):
    ex = make_executor(spec, qp, "onnx", batch_size=8, kernel_form=form)
    err = float(np.abs(ex(obs[64:]) - ref).max() / np.ptp(ref))
    out[str(form)] = {"form": ex.kernel_form, "checks": ex.kernel_check["checks"], "rel_err": err}
print(json.dumps(out))
"""


def _check(out: dict) -> None:
    for run in out.values():
        last = run["checks"][-1]
        assert last["ok"] and last["form"] == run["form"]
        assert run["rel_err"] < 3e-2  # the int8 tolerance of tests/quarl/test_runtimes.py
        for check in run["checks"]:
            if check["form"] != "fp32" and check.get("max_rel_err") is not None:
                assert check["ok"] == (check["max_rel_err"] <= check["tolerance"])


@pytest.mark.usefixtures("x86_emulation")
def test_avx2_int8_conv_runs_a_self_checked_form_within_tolerance():
    _check(run_under_qemu("Haswell", SCRIPT, timeout=900))


@pytest.mark.usefixtures("arm_emulation")
@pytest.mark.parametrize("cpu", sorted(ARM_CPUS))
def test_arm_int8_conv_runs_a_self_checked_form_within_tolerance(cpu):
    proc = run_under_arm(cpu, ["-c", SCRIPT], timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _check(json.loads(proc.stdout.strip().splitlines()[-1]))
