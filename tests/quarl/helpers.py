"""Shared helpers for the runtime tests: NumPy policy params without a haiku init (an init compiles for
seconds per new shape), and running a script under an emulated CPU (qemu-user)."""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from quarl.policy import LayerNorm, PolicySpec
from quarl.runtimes.base import layer_widths

REPO = Path(__file__).resolve().parents[2]
QEMU = shutil.which("qemu-x86_64")
QEMU_SKIP_REASON = "needs qemu-user on an x86_64 host (Debian: apt-get install qemu-user) to emulate another CPU"


def qemu_available() -> bool:
    return QEMU is not None and platform.machine() == "x86_64"


def random_params(spec: PolicySpec, seed: int = 0, bias_std: float = 0.1) -> dict[str, dict[str, np.ndarray]]:
    """Params for `spec`: Linear w ~ N(0, 1/fan_in), b ~ N(0, bias_std); LayerNorm scale 1, offset 0."""
    rng = np.random.default_rng(seed)
    params: dict[str, dict[str, np.ndarray]] = {}
    for layer, k, n in layer_widths(spec):
        if isinstance(layer, LayerNorm):
            params[layer.name] = {"scale": np.ones(k, np.float32), "offset": np.zeros(k, np.float32)}
        elif hasattr(layer, "out"):
            params[layer.name] = {"w": rng.normal(0, 1 / np.sqrt(k), (k, n)).astype(np.float32),
                                  "b": rng.normal(0, bias_std, n).astype(np.float32)}
    return params


def run_under_qemu(cpu: str, script: str, timeout: float = 900) -> Any:
    """Run `script` with this venv's Python under `qemu-x86_64 -cpu cpu` (so MLAS dispatches on that CPU's
    CPUID) and return the JSON its last stdout line prints."""
    proc = subprocess.run([QEMU, "-cpu", cpu, sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, "\n".join(ln for ln in proc.stderr.splitlines() if "TCG" not in ln)[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
