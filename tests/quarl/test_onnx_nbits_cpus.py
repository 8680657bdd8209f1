"""The nbits4 form on other CPU classes: the same Python and ONNX Runtime under `qemu-x86_64 -cpu MODEL`, so
MLAS dispatches that CPU's MatMulNBits kernel. Its outputs must still match the exact block-int8 emulation
(the self-check passes, no fallback) and an int4 policy must stay within the int4 tolerance."""
from __future__ import annotations

import pytest

from tests.quarl.helpers import run_under_qemu

pytestmark = [
    pytest.mark.slow,  # ~1-2 min per CPU model under emulation
    pytest.mark.usefixtures("x86_emulation"),  # skips without qemu-user; fails in CI
]

SCRIPT = """
import json, numpy as np
from quarl.policy.reference import reference_apply
from quarl.policy.spec import mlp_q_network
from quarl.quant.quantization import dequantize_params, quantize_params
from quarl.runtimes import make_executor
from tests.quarl.helpers import random_params
spec = mlp_q_network(24, [256, 256], 5)
params = random_params(spec, 0)
rng = np.random.default_rng(1)
obs = rng.normal(size=(64, 24)).astype(np.float32)
qp = quantize_params(params, "int4")
ex = make_executor(spec, qp, "onnx-nbits", batch_size=64)
ref = reference_apply(spec, dequantize_params(qp), obs)
print(json.dumps({"form": ex.kernel_form, "checks": ex.kernel_check["checks"],
                  "rel_err": float(abs(ex(obs) - ref).max() / np.ptp(ref))}))
"""


@pytest.mark.parametrize("cpu", ["Haswell", "Skylake-Server"])  # AVX2 only; AVX-512 without VNNI
def test_nbits4_is_exact_on_other_cpu_classes(cpu):
    out = run_under_qemu(cpu, SCRIPT, timeout=900)
    (check,) = out["checks"]  # nbits4 passed first time: no fallback
    assert out["form"] == check["form"] == "nbits4" and check["ok"] and check["max_rel_err"] < 1e-4, out
    assert out["rel_err"] < 2e-2  # the int4 tolerance of tests/quarl/test_runtimes.py
