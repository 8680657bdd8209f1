"""Cost of an actor's weight update (`executor.update`) by strategy, and what acting sees meanwhile.

    python -m bench.micro.update [--hidden 2048] [--precision int8] [--repeats 10] [--out FILE.json]

Strategies, measured alternately on the D4PG policy 24 -> H -> H -> H -> 6 (batch 1, one ORT thread):
* `rewrite`: the previous ONNX path, kept here for comparison: rewrite the initializers in the ModelProto,
  serialise it, open a new session.
* `initializers` (what `OnnxExecutor.update()` does): a new session over the graph serialized once, the new
  weights passed as session initializers.
* `background` (`update(wait=False)`): the same build on a background thread; the acting thread keeps
  calling the policy. Reported: how long `update()` blocked the caller, the build's wall time, and the
  policy calls served meanwhile (median and max latency; their slowdown is the cost of sharing the core).
* `jax fp32` (`JaxExecutor.update()`, a device_put): the cheapest fp32 update path the project has.
Plus the per-call latency after each update, to show that inference speed is kept. Prints a table and a
JSON line (and writes --out). Timings on a shared machine are noisy: compare ratios within one run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bench.micro.inference import OBS_DIM, make_params
from bench.harness.machine import add_allow_busy, refuse_if_busy
from bench.harness.results_io import write_json
from quarl.quant.precision import precision_name_arg


def _call_us(fn: Callable[[], Any], n: int = 200) -> float:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return float(np.percentile(samples, 25) * 1e6)


def _rewrite_update(ex: Any, model: Any, qparams: Any) -> Any:
    """The pre-initializer path: rewrite raw bytes in `model` (ex's graph as a ModelProto, parsed once
    outside the timing, as that path kept one), serialise, new session."""
    import onnxruntime as ort

    from quarl.runtimes.base import lower_params
    from quarl.runtimes.onnx_backend import _initializers

    arrays = _initializers(ex.spec, lower_params(ex.spec, qparams, ex.native_floats), ex._form)
    for tensor in model.graph.initializer:
        if tensor.name in arrays:
            tensor.raw_data = arrays[tensor.name].tobytes()
    return ort.InferenceSession(model.SerializeToString(), ex._session_options(),
                                providers=["CPUExecutionProvider"])


def measure(hidden: int, precision: str, repeats: int) -> dict[str, Any]:
    from quarl.quant.quantization import quantize_params
    from quarl.runtimes import make_executor

    spec, params_a = make_params(hidden)
    _, params_b = make_params(hidden, seed=1)
    qps = [quantize_params(p, precision) for p in (params_a, params_b)]
    fp32 = [quantize_params(p, "fp32") for p in (params_a, params_b)]
    obs = np.random.default_rng(0).standard_normal((1, OBS_DIM)).astype(np.float32)
    ex = make_executor(spec, qps[0], "onnx")
    ref_ex = make_executor(spec, qps[0], "onnx")  # a separate one for the rewrite path
    ref_model = ref_ex.model()  # the ModelProto that path rewrites in place
    jax_ex = make_executor(spec, fp32[0], "jax")
    out: dict[str, list[float]] = {k: [] for k in ("rewrite_ms", "initializers_ms", "background_block_ms",
                                                    "background_build_ms", "jax_fp32_ms")}
    during: list[float] = []
    for i in range(repeats):
        qp = qps[(i + 1) % 2]
        t = time.perf_counter()
        _rewrite_update(ref_ex, ref_model, qp)
        out["rewrite_ms"].append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        ex.update(qp)
        out["initializers_ms"].append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        ex.update(qps[i % 2], wait=False)
        out["background_block_ms"].append((time.perf_counter() - t) * 1e3)
        while ex.update_pending:
            c = time.perf_counter()
            ex(obs)
            during.append((time.perf_counter() - c) * 1e6)
        ex.wait_for_update()
        out["background_build_ms"].append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        jax_ex.update(fp32[(i + 1) % 2])
        out["jax_fp32_ms"].append((time.perf_counter() - t) * 1e3)
    result: dict[str, Any] = {"hidden": hidden, "precision": precision, "repeats": repeats,
                              "kernel_form": ex.kernel_form}
    for key, values in out.items():
        result[key] = round(float(np.median(values)), 2)
    result["calls_during_background_build"] = len(during)
    result["call_us_during_build_median"] = round(float(np.median(during)), 1) if during else None
    result["call_us_during_build_max"] = round(float(np.max(during)), 1) if during else None
    result["call_us_after_updates"] = round(_call_us(lambda: ex(obs)), 1)
    fresh = make_executor(spec, qps[0], "onnx")
    result["call_us_fresh_executor"] = round(_call_us(lambda: fresh(obs)), 1)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.micro.update", description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--precision", default="int8", type=precision_name_arg())
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", type=Path)
    add_allow_busy(p)
    args = p.parse_args(argv)
    if args.hidden < 1 or args.repeats < 1:
        p.exit(2, f"{p.prog}: error: --hidden and --repeats must be positive\n")
    refuse_if_busy(p, args.allow_busy)
    result = measure(args.hidden, args.precision, args.repeats)
    for key, value in result.items():
        print(f"{key:34s} {value}")
    print(json.dumps(result))
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
