"""The numerics self-check of integer kernel forms, and the choice of form it drives.

Which form is exact is a property of the CPU *and* the ORT build, so it is measured, not assumed: `select_form`
tries the forms `quarl.runtimes.kernel_forms.candidates` ranks for this CPU, in order, and keeps the first whose
ONNX Runtime outputs match an exact NumPy emulation of the same quantized graph (`check_form`, cached per process).
`kernel_summary` is what a run records about the kernel an executor ended up with.
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Callable, TypedDict

import numpy as np

from quarl.runtimes.base import DenseWeights, FormCheck, FormChoice
from quarl.runtimes.cpu import cpu_class, cpu_info
from quarl.runtimes.kernel_forms import (
    Graph, KernelForm, candidates, get_form, lifted_bias_name, lifted_int_reference, opset_imports,
)

if TYPE_CHECKING:
    import onnx

class KernelFormCheck(TypedDict, total=False):
    """One integer kernel form's self-check as a run records it (`quarl.runtimes.base.FormCheck` without its
    tolerance; `max_rel_err` and `error` only where known)."""

    form: str
    ok: bool
    max_rel_err: float
    error: str


class KernelRecord(TypedDict, total=False):
    """What ran an actor's policy, as summary.json records it (`quarl.runtimes.kernel_summary`): the integer kernel
    form (None for a float precision), this CPU's class and flags, and, where a form was self-checked, the one
    requested, whether it was refused (`fallback`) and every check tried, the last one the form in use."""

    form: str | None
    cpu_class: str
    cpu_flags: list[str]
    requested: str | None
    fallback: bool
    checks: list[KernelFormCheck]


log = logging.getLogger(__name__)
_checks_lock = threading.Lock()

# Max |form - exact emulation| as a fraction of max |emulation| for a form to pass. Float rounding and an
# occasional one-code difference in the activation quantizer stay below 1e-4; int16 saturation gives ~5e-2.
CHECK_TOLERANCE = 1e-3
_CHECK_ROWS = (1, 8)  # batch sizes the self-check runs (one row, and rows quantized side by side)
# Layer widths are capped for the check: saturation is a per-pair property of the micro-kernel, which MLAS
# uses for every width, and the cap keeps a 2048x3 policy's check at tens of milliseconds.
_CHECK_MAX_WIDTH = 512


def _random_dense(bits: int, k: int, n: int, rng: np.random.Generator) -> DenseWeights:
    """Codes over the whole int`bits` range with every column reaching +-max (as per-channel weights do)."""
    limit = 2 ** (bits - 1) - 1
    codes = rng.integers(-limit, limit + 1, size=(k, n)).astype(np.int8)
    codes[rng.integers(0, k, size=n), np.arange(n)] = limit
    codes[rng.integers(0, k, size=n), np.arange(n)] = -limit
    scale = rng.uniform(0.5, 2.0, size=n).astype(np.float32) / max(limit, 1)
    return DenseWeights("int", codes, np.zeros(n, np.float32), scale)


def _check_graph(form: KernelForm, layers: list[DenseWeights], per_row: bool = True,
                 floor: float | None = None) -> onnx.ModelProto:
    """One graph running each of `layers` on its own input x{i} -> y{i}; `floor` (forms with `lifted_inputs`,
    per-row graphs) makes every input a lifted one (>= 0) and adds the lifted bias, as `build_model` does."""
    from onnx import TensorProto, helper, numpy_helper

    graph = Graph()
    graph.per_row = per_row
    inputs, outputs = [], []
    for i, dense in enumerate(layers):
        name = f"l{i}"
        for init_name, arr in form.initializers(name, dense).items():
            graph.const(init_name, arr)
        graph.shapes[name] = tuple(dense.w.shape)
        if floor is not None:
            graph.floors[name] = floor
        y = form.emit(graph, f"x{i}", name)
        if floor is not None:
            graph.const(f"{name}.b", dense.b.astype(np.float32))
            (y,) = graph.op("Add", [y, lifted_bias_name(name, floor)])
        (out,) = graph.op("Identity", [y])
        graph.nodes[-1].output[0] = f"y{i}"
        k, n = dense.w.shape
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, ["batch", k]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["batch", n]))
    del out
    inits = [numpy_helper.from_array(a, name) for name, a in graph.inits.items()]
    model = helper.make_model(helper.make_graph(graph.nodes, "kernel_check", inputs, outputs, initializer=inits),
                              opset_imports=opset_imports(graph.nodes, 17), producer_name="quarl")
    model.ir_version = 8
    return model


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref| in float64 (inf when not finite): how every self-check scores a form."""
    err = float(np.abs(np.asarray(out, np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))
    return err if np.isfinite(err) else float("inf")


def check_result(name: str, worst: float) -> FormCheck:
    """A self-check's record: the form passes when its worst relative error is within CHECK_TOLERANCE."""
    return {"form": name, "ok": bool(worst <= CHECK_TOLERANCE), "max_rel_err": worst, "tolerance": CHECK_TOLERANCE}


def check_refusal(name: str, error: BaseException) -> FormCheck:
    """The record of a form ONNX Runtime could not build or run on this CPU (refused, not fatal)."""
    first = str(error).splitlines()[0] if str(error) else ""
    return {"form": name, "ok": False, "max_rel_err": None, "tolerance": CHECK_TOLERANCE,
            "error": f"{type(error).__name__}: {first}"}


def run_check(name: str, measure: Callable[[], float]) -> FormCheck:
    """The record of form `name`'s self-check: `check_result` of the worst relative error `measure()` returns,
    or `check_refusal` when it raises (a form ORT cannot build or run on this CPU is refused, not fatal)."""
    try:
        return check_result(name, measure())
    except Exception as e:  # pylint: disable=broad-except  # a form ORT cannot run here is refused, not fatal
        return check_refusal(name, e)


def check_form(name: str, bits: int, shapes: list[tuple[int, int]], *, seed: int = 0) -> FormCheck:
    """Run form `name` on random int`bits` layers of these [in, out] shapes (each width capped at 512) through
    ORT and compare with the form's exact reference on uniform inputs at batch 1 and 8, its batch-1 graph
    (`Graph.per_row` False) at batch 1, and, for forms with `lifted_inputs`, the per-row graph again on lifted
    inputs (floor -1, as after ELU/tanh) at batch 1 and 8.
    Returns {"form", "ok", "max_rel_err", "tolerance"} (plus "error" when ORT refused the graph); cached
    per process."""
    import onnxruntime as ort

    form = get_form(name)
    shapes = sorted({(min(k, _CHECK_MAX_WIDTH), min(n, _CHECK_MAX_WIDTH)) for k, n in shapes})
    key = (form, bits, tuple(shapes), seed)  # the form itself: one registered again under its name is checked anew
    with _checks_lock:
        cached = _checks.get(key)
    if cached is not None:
        return cached.copy()
    rng = np.random.default_rng(seed)
    layers = [_random_dense(bits, k, n, rng) for k, n in shapes]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3

    def measure() -> float:
        # (per_row, floor) -> the graph; a batch-1 graph identical to the per-row one is not run twice.
        variants = {(True, None): _check_graph(form, layers, True).SerializeToString()}
        one = _check_graph(form, layers, False).SerializeToString()
        if one != variants[(True, None)]:
            variants[(False, None)] = one
        if form.lifted_inputs:  # per-row graphs only (`build_model` does not lift the batch-1 graph)
            variants[(True, -1.0)] = _check_graph(form, layers, True, -1.0).SerializeToString()
        worst = 0.0
        for (per_row, floor), graph_bytes in variants.items():
            session = ort.InferenceSession(graph_bytes, so, providers=["CPUExecutionProvider"])
            for rows in _CHECK_ROWS if per_row else (1,):
                lo = -1.0 - (floor or 0.0)  # x in [-1, 1]; lifted, it arrives as x - floor
                feeds = {f"x{i}": rng.uniform(lo, lo + 2, (rows, d.w.shape[0])).astype(np.float32)
                         for i, d in enumerate(layers)}
                outs = session.run(None, feeds)
                for i, d in enumerate(layers):
                    x = feeds[f"x{i}"]
                    ref = form.reference(x, d) if floor is None else lifted_int_reference(x, d, floor)
                    worst = max(worst, relative_error(outs[i], ref))
        return worst

    result = run_check(name, measure)
    with _checks_lock:
        _checks[key] = result
    return result.copy()


_checks: dict[tuple, FormCheck] = {}
_warned: set[tuple] = set()


def select_form(bits: int, shapes: list[tuple[int, int]], requested: str | None = None) -> FormChoice:
    """The kernel form to use for int`bits` layers of `shapes` on this CPU, self-checked.

    `requested` None tries `candidates(bits)` in order; a name tries that form first, then the others.
    Returns {"form", "requested", "cpu_class", "checks": [each check tried], "fallback": bool}; `fallback`
    is True when the requested (or most preferred) form was refused. A refusal is logged once per process.
    """
    order = candidates(bits)
    if requested is not None:
        if get_form(requested).max_bits < bits:
            raise ValueError(f"kernel form {requested!r} takes at most int{get_form(requested).max_bits} "
                             f"weights, not int{bits}")
        order = [requested] + [n for n in order if n != requested]
    checks: list[FormCheck] = []
    for name in order:
        result = check_form(name, bits, shapes)
        checks.append(result)
        if result["ok"]:
            break
    else:  # not even fp32 passed: ORT itself is broken here, say so rather than act on garbage
        raise RuntimeError(f"no kernel form passed the int{bits} self-check on this CPU: {checks}")
    chosen = checks[-1]["form"]
    info: FormChoice = {"form": chosen, "requested": requested or "auto", "cpu_class": cpu_class(), "checks": checks,
            "fallback": len(checks) > 1}
    if info["fallback"]:
        key = (bits, tuple(sorted(set(shapes))), requested)
        if key not in _warned:
            _warned.add(key)
            refused = ", ".join(f"{c['form']} (max rel err {c['max_rel_err']})" if c.get("error") is None
                                else f"{c['form']} ({c['error']})" for c in checks[:-1])
            log.warning("int%d kernel self-check refused %s on this CPU (%s); using %s", bits, refused,
                        info["cpu_class"], chosen)
    return info


def kernel_summary(executor: object) -> KernelRecord:
    """What a run records about an executor's integer kernel (summary.json): the form in use, whether the
    self-check refused the preferred/requested one, and this CPU's class and flags. Float precisions: form None."""
    check = getattr(executor, "kernel_check", None) or {}
    out: KernelRecord = {"form": getattr(executor, "kernel_form", None), "cpu_class": cpu_class(),
                         "cpu_flags": cpu_info()["flags"]}
    if check:
        out.update(requested=check.get("requested"), fallback=bool(check.get("fallback")),
                   checks=[{k: c.get(k) for k in ("form", "ok", "max_rel_err", "error") if c.get(k) is not None}
                           for c in check.get("checks", [])])
    return out

