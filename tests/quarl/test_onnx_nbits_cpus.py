"""The nbits4 form on other CPU classes: the same Python and ONNX Runtime under `qemu-x86_64 -cpu MODEL`, so
MLAS dispatches that CPU's MatMulNBits kernel. Its outputs must still match the exact block-int8 emulation
(the self-check passes, no fallback) and an int4 policy must stay within the int4 tolerance."""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QEMU = shutil.which("qemu-x86_64")

pytestmark = [
    pytest.mark.slow,  # ~1-2 min per CPU model under emulation
    pytest.mark.skipif(QEMU is None or platform.machine() != "x86_64",
                       reason="needs qemu-user on an x86_64 host (Debian: apt-get install qemu-user)"),
]

SCRIPT = """
import json, numpy as np
from quarl.policy import mlp_q_network, reference_apply
from quarl.quantization import dequantize_params, quantize_params
from quarl.runtimes import make_executor
spec = mlp_q_network(24, [256, 256], 5)
rng = np.random.default_rng(0)
params = {f"linear_{i}": {"w": rng.normal(0, 1 / np.sqrt(k), (k, n)).astype(np.float32),
                          "b": rng.normal(0, 0.1, n).astype(np.float32)}
          for i, (k, n) in enumerate([(24, 256), (256, 256), (256, 5)])}
obs = rng.normal(size=(64, 24)).astype(np.float32)
qp = quantize_params(params, "int4")
ex = make_executor(spec, qp, "onnx-nbits", batch_size=64)
ref = reference_apply(spec, dequantize_params(qp), obs)
print(json.dumps({"form": ex.kernel_form, "checks": ex.kernel_check["checks"],
                  "rel_err": float(abs(ex(obs) - ref).max() / np.ptp(ref))}))
"""


@pytest.mark.parametrize("cpu", ["Haswell", "Skylake-Server"])  # AVX2 only; AVX-512 without VNNI
def test_nbits4_is_exact_on_other_cpu_classes(cpu):
    proc = subprocess.run([QEMU, "-cpu", cpu, sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, "\n".join(ln for ln in proc.stderr.splitlines() if "TCG" not in ln)[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    (check,) = out["checks"]  # nbits4 passed first time: no fallback
    assert out["form"] == check["form"] == "nbits4" and check["ok"] and check["max_rel_err"] < 1e-4, out
    assert out["rel_err"] < 2e-2  # the int4 tolerance of tests/quarl/test_runtimes.py
