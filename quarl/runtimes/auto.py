"""`backend="auto"`: pick the backend measured fastest for (layer sizes, batch, precision, threads) here.

Which runtime wins depends on the machine (ORT's int8 GEMM needs VNNI to shine; XLA's int8 dot is slower
than its fp32 one on CPU) and on the shape (at tiny sizes per-call overhead dominates), so the choice is
measured, not hard-coded. For int2..int8 one candidate is the int weights dequantized through fp32 MatMuls
(`quarl.runtimes.DEQUANTIZED_CANDIDATE`, simulated), so a quantized actor never runs slower than fp32 would.
The first executor for a key builds every candidate, times them interleaved
for a few dozen calls (budget ~1 s in total), keeps the fastest and records the decision in-process and in
a JSON file ($QUARL_CACHE_DIR or ~/.cache/quarl, `auto_backend.json`), keyed by a machine fingerprint, so
later processes (every actor of a run) reuse it without measuring.

One decision per machine: the actors of a run start together, and each timing its own candidates on a busy
machine made them disagree (7 of 12 actors chose JAX, 5 ONNX, in one run). So a process that finds no
decision takes an exclusive lock (`fcntl.flock` on `auto_backend.lock` beside the cache file), reads the file
again, and measures only if it is still missing; the others wait on the lock and read its decision.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import platform
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Hashable, Iterator, Mapping, TypedDict, TypeVar, cast

import numpy as np

from quarl.ops.io import JSONObject, write_text_atomic
from quarl.policy.spec import Linear, PolicySpec
from quarl.quant.precision import parse_precision
from quarl.quant.quantization import QuantizedParams
from quarl.runtimes.base import PolicyExecutor, layer_widths
from quarl.runtimes.cpu import cpu_info
from quarl.runtimes.kernel_check import select_form
from quarl.runtimes.onnx_static import select_static_form

CACHE_ENV = "QUARL_CACHE_DIR"
CACHE_FILE = "auto_backend.json"
LOCK_FILE = "auto_backend.lock"
_LOCK_WAIT_S = 300.0  # a measuring process that holds the lock longer is stuck: measure without it
_FORMAT_VERSION = 1
_MEASURE_BUDGET_S = 0.8  # all candidates together, after warm-up
_MAX_CALLS = 40
_MIN_CALLS = 5
_WARMUP_CALLS = 3
_ROUNDS = 6

# Bumped whenever the graphs the backends build change speed (e.g. the ONNX per-row int graph): timings cached
# against older graphs would otherwise keep choosing for code that no longer runs.
GRAPHS_VERSION = 3

# A backend's executor factory (`make_executor`'s per-backend makers): (spec, qparams, batch_size=, threads=).
BackendFactory = Callable[..., PolicyExecutor]


class Decision(TypedDict, total=False):
    """One decision: the backend chosen, each candidate's µs per call, when and by which process it was measured,
    and where this process has it from ("measured", "file"; not stored in the file)."""

    backend: str
    us_per_call: dict[str, float]
    measured_at: str
    measured_by_pid: int
    source: str


_lock = threading.Lock()
_decisions: dict[str, Decision] = {}


def cache_path() -> Path:
    base = os.environ.get(CACHE_ENV)
    root = Path(base) if base else Path.home() / ".cache" / "quarl"
    return root / CACHE_FILE


@functools.lru_cache(maxsize=1)
def machine_fingerprint() -> str:
    """Short hash of what makes a timing transferable: CPU, cores, SIMD flags, runtime versions and the version
    of the graphs this code builds (`GRAPHS_VERSION`)."""
    import jax
    import onnxruntime

    info = cpu_info()
    text = json.dumps([info, jax.__version__, onnxruntime.__version__, platform.machine(), GRAPHS_VERSION],
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def onnx_kernel_form(spec: PolicySpec, precision: str, kernel_form: str | None = None) -> str:
    """The (self-checked, cached) ONNX integer kernel form this CPU uses for `spec` at `precision`; "-" for
    precisions without an integer kernel."""
    prec = parse_precision(precision)
    if not prec.has_int_kernel:
        return "-"
    if spec.conv_layers:  # conv policies run static int8 graphs with their own forms
        return select_static_form(prec.bits, kernel_form)["form"]
    shapes = [(k, n) for layer, k, n in layer_widths(spec) if isinstance(layer, Linear)]
    return select_form(prec.bits, shapes, kernel_form)["form"]


def decision_key(spec: PolicySpec, precision: str, batch_size: int, threads: int,
                 kernel_form: str | None = None) -> str:
    """Machine, layer widths, batch, precision, threads and the ONNX kernel form: the form is part of the
    key because a forced (or, after a self-check refusal, a fallback) form changes the onnx timing."""
    layer_widths(spec)  # unknown layers fail here, before any measuring
    shape = "-".join(str(w) for w in (spec.input_dim, *(layer.out for layer in spec.linear_layers)))
    if spec.conv_layers:  # e.g. "c16k3s1" per conv, before the Linear widths
        shape = "".join(f"c{c.out}k{c.kernel}s{c.stride}" for c in spec.conv_layers) + "-" + shape
    form = onnx_kernel_form(spec, precision, kernel_form)
    return f"{machine_fingerprint()}|{shape}|b{batch_size}|{precision}|t{threads}|k{form}"


KEY_FIELDS = ("machine", "shape", "batch", "precision", "threads", "form")


def parse_decision_key(key: str) -> dict[str, str]:
    """`decision_key`'s fields by name (batch, threads and form without their one-letter prefixes), so readers
    of `auto_decisions()` do not depend on the field order. Raises ValueError on a key of another layout."""
    parts = key.split("|")
    if len(parts) != len(KEY_FIELDS) or not (parts[2][:1] == "b" and parts[4][:1] == "t" and parts[5][:1] == "k"):
        raise ValueError(f"not an auto decision key: {key!r}")
    fields = dict(zip(KEY_FIELDS, parts))
    for name in ("batch", "threads", "form"):
        fields[name] = fields[name][1:]
    return fields


def auto_decisions() -> dict[str, Decision]:
    """The decisions made or loaded in this process: key -> {backend, us_per_call, source}."""
    with _lock:
        return {k: Decision(**v) for k, v in _decisions.items()}


def clear_auto_decisions() -> None:
    """Forget in-process decisions (the file cache is untouched); for tests and benchmarks."""
    with _lock:
        _decisions.clear()


def _read_file() -> JSONObject:
    """The cache file's decisions by key, as JSON (unchecked: `_stored_decision` checks the one it uses)."""
    path = cache_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"ignoring unreadable auto-backend cache {path}: {e}", stacklevel=3)
        return {}
    if not isinstance(data, dict) or data.get("version") != _FORMAT_VERSION or not isinstance(
            data.get("decisions"), dict):
        warnings.warn(f"ignoring auto-backend cache {path} with an unknown format", stacklevel=3)
        return {}
    return data["decisions"]


def _write_file(key: str, entry: Decision) -> None:
    """Merge one decision into the cache file atomically (write a temp file, then rename)."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        decisions = _read_file()
        decisions[key] = cast(JSONObject, entry)
        write_text_atomic(path, json.dumps({"version": _FORMAT_VERSION, "decisions": decisions}, indent=1,
                                           sort_keys=True))
    except OSError as e:  # a read-only home must not stop an actor from acting
        warnings.warn(f"could not write auto-backend cache {path}: {e}", stacklevel=3)


@contextlib.contextmanager
def _machine_lock() -> Iterator[bool]:
    """Holds the cache directory's exclusive lock (True), or yields False where it cannot be had (a read-only
    home, or `_LOCK_WAIT_S` passed): then this process decides alone, as before the lock. flock belongs to the
    open file, so threads of one process exclude each other too, and a process that dies releases it."""
    path = cache_path().with_name(LOCK_FILE)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        warnings.warn(f"no auto-backend lock {path}: {e}; this process decides alone", stacklevel=4)
        yield False
        return
    locked = False
    try:
        deadline = time.monotonic() + _LOCK_WAIT_S
        while not locked:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    warnings.warn(f"auto-backend lock {path} held for over {_LOCK_WAIT_S:.0f} s; this process "
                                  f"decides alone", stacklevel=4)
                    break
                time.sleep(0.02)
        yield locked
    finally:
        if locked:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


_Key = TypeVar("_Key", bound=Hashable)


def interleaved_samples(executors: Mapping[_Key, Callable[[np.ndarray], object]], obs: np.ndarray, rounds: int,
                        block: int | Mapping[_Key, int]) -> dict[_Key, list[float]]:
    """Seconds per call of each executor, timed in turns: `rounds` rounds of a block of `block` (or
    `block[key]`) calls per executor, so load drift from other processes hits all alike. Each block's first
    call is dropped: it runs with another executor's weights in the cache (an actor calls the same policy back
    to back, so warm-cache time is the relevant one). Warm-up is the caller's. What auto decides on; the
    inference benchmarks time the same way."""
    samples: dict[_Key, list[float]] = {key: [] for key in executors}
    for _ in range(rounds):
        for key, ex in executors.items():
            for i in range((block if isinstance(block, int) else block[key]) + 1):
                t = time.perf_counter()
                ex(obs)
                if i:
                    samples[key].append(time.perf_counter() - t)
    return samples


def _time_interleaved(executors: dict[str, PolicyExecutor], obs: np.ndarray) -> dict[str, float]:
    """Microseconds per call (25th percentile) for each executor.

    Candidates take turns in short blocks, several rounds each (`interleaved_samples`), sized from one probe
    call each to fit the measurement budget.
    """
    for ex in executors.values():
        for _ in range(_WARMUP_CALLS):
            ex(obs)
    probe = {}
    for name, ex in executors.items():
        t = time.perf_counter()
        ex(obs)
        probe[name] = time.perf_counter() - t
    per_call = max(sum(probe.values()), 1e-6)
    calls = int(min(_MAX_CALLS, max(_MIN_CALLS, _MEASURE_BUDGET_S / per_call)))
    samples = interleaved_samples(executors, obs, _ROUNDS, max(2, calls // _ROUNDS))
    # The 25th percentile, not the median: a short window on a shared machine is often preempted, and a
    # low percentile tracks each candidate's unloaded speed (what decides the ranking) more stably.
    return {name: float(np.percentile(s, 25) * 1e6) for name, s in samples.items()}


def _measured_all(entry: Mapping[str, object], factories: Mapping[str, BackendFactory]) -> bool:
    """A decision is reused only if it timed exactly today's candidates: one cached before a candidate
    existed (e.g. the dequantized fp32 path for int weights) would otherwise pin a slower backend forever."""
    timed = entry.get("us_per_call")
    return entry.get("backend") in factories and isinstance(timed, dict) and set(timed) == set(factories)


def jax_platform() -> str:
    """The platform of this process's default JAX device ("cpu", "gpu", ...)."""
    import jax  # pylint: disable=import-outside-toplevel

    return jax.default_backend()


def cpu_candidates(factories: dict[str, BackendFactory]) -> dict[str, BackendFactory]:
    """`factories` without the jax backend when JAX's default device here is not the CPU.

    Actors act on the CPU: an actor's JAX on a GPU (its environment hides the GPU, `launch.program.devices`; this is
    the second line of defence) would take GPU memory from the learner and time a device the policy must
    not use. ONNX Runtime (the CPU package) is always a CPU candidate."""
    if "jax" in factories and jax_platform() != "cpu":
        return {name: make for name, make in factories.items() if name != "jax"}
    return factories


def make_auto_executor(spec: PolicySpec, qparams: QuantizedParams, factories: dict[str, BackendFactory], *,
                       batch_size: int, threads: int, kernel_form: str | None = None) -> PolicyExecutor:
    """Return a concrete executor of the fastest CPU backend for this key, measuring on first use."""
    factories = cpu_candidates(factories)
    key = decision_key(spec, str(qparams.precision), batch_size, threads, kernel_form)
    with _lock:
        entry = _decisions.get(key)
    if entry is not None and not _measured_all(entry, factories):
        entry = None
    if entry is None:
        entry = _stored_decision(key, factories)
    if entry is None:
        with _machine_lock():
            # Whoever held the lock before us may have decided this key meanwhile: read again under it.
            entry = _stored_decision(key, factories)
            if entry is None:
                return _measure_and_store(key, spec, qparams, factories, batch_size=batch_size, threads=threads)
    return factories[entry["backend"]](spec, qparams, batch_size=batch_size, threads=threads)


def _stored_decision(key: str, factories: dict[str, BackendFactory]) -> Decision | None:
    """The cache file's decision for `key` (also kept in-process), if it timed today's candidates."""
    stored = _read_file().get(key)
    if not (isinstance(stored, dict) and _measured_all(stored, factories)):
        return None
    entry = cast(Decision, {**stored, "source": "file"})
    with _lock:
        _decisions[key] = entry
    return entry


def _measure_and_store(key: str, spec: PolicySpec, qparams: QuantizedParams,
                       factories: dict[str, BackendFactory], *, batch_size: int, threads: int) -> PolicyExecutor:
    """Builds and times every candidate, records the decision (in-process and in the file), returns the winner."""
    candidates = {name: make(spec, qparams, batch_size=batch_size, threads=threads)
                  for name, make in factories.items()}
    rng = np.random.default_rng(0)
    obs = (rng.integers(0, 256, (batch_size, spec.input_dim), dtype=np.uint8) if spec.pixels
           else rng.standard_normal((batch_size, spec.input_dim)).astype(np.float32))
    timings = _time_interleaved(candidates, obs)
    best = min(timings, key=timings.get)
    entry: Decision = {"backend": best, "us_per_call": {k: round(v, 2) for k, v in timings.items()},
                       "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "measured_by_pid": os.getpid(),
                       "source": "measured"}
    with _lock:
        _decisions[key] = entry
    _write_file(key, cast(Decision, {k: v for k, v in entry.items() if k != "source"}))
    return candidates[best]
