"""Shared helpers for the runtime tests: NumPy policy params without a haiku init (an init compiles for
seconds per new shape), running a script under an emulated CPU (qemu-user), and the rule for an emulated-CPU test
that cannot run here (`skip_or_fail`)."""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from bench.harness.emulation import run_under_x86, stderr_tail
from quarl.policy.spec import Conv2D, LayerNorm, PolicySpec
from quarl.runtimes.base import layer_widths, weight_shape


def skip_or_fail(reason: str | None) -> None:
    """Skips the calling test, saying `reason` (why it cannot run here; None: it can run), except in CI (CI=true),
    whose set-up (.ci/run) installs qemu-user and builds the Arm sysroot: there a failed install step fails the
    emulated-CPU tests instead of passing unnoticed as skips. pytest is imported here, not at the top: the emulated
    Arm Python imports this module for `random_params`, and its sysroot has no pytest."""
    if reason is None:
        return
    import pytest  # pylint: disable=import-outside-toplevel
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true, and this emulated-CPU test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def random_params(spec: PolicySpec, seed: int = 0, bias_std: float = 0.1) -> dict[str, dict[str, np.ndarray]]:
    """Params for `spec`: Linear and Conv2D w ~ N(0, 1/fan_in), b ~ N(0, bias_std); LayerNorm scale 1, offset 0."""
    rng = np.random.default_rng(seed)
    params: dict[str, dict[str, np.ndarray]] = {}
    shapes = {id(layer): shape_in for layer, shape_in, _ in spec.layer_shapes()}
    for layer, k, n in layer_widths(spec):
        if isinstance(layer, Conv2D):  # w ~ N(0, 1/fan_in) over the k x k x C_in window
            w_shape = weight_shape(layer, shapes[id(layer)])
            fan_in = int(np.prod(w_shape[:3]))
            params[layer.name] = {"w": rng.normal(0, 1 / np.sqrt(fan_in), w_shape).astype(np.float32),
                                  "b": rng.normal(0, bias_std, layer.out).astype(np.float32)}
        elif isinstance(layer, LayerNorm):
            params[layer.name] = {"scale": np.ones(k, np.float32), "offset": np.zeros(k, np.float32)}
        elif hasattr(layer, "out"):
            params[layer.name] = {"w": rng.normal(0, 1 / np.sqrt(k), (k, n)).astype(np.float32),
                                  "b": rng.normal(0, bias_std, n).astype(np.float32)}
    return params


def run_under_qemu(cpu: str, script: str, timeout: float = 900) -> Any:
    """Run `script` with this venv's Python under `qemu-x86_64 -cpu cpu` (`bench.harness.emulation.run_under_x86`) and
    return the JSON its last stdout line prints."""
    proc = run_under_x86(cpu, ["-c", script], timeout=timeout)
    assert proc.returncode == 0, stderr_tail(proc, 40)[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
