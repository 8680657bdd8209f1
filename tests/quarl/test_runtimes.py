"""Policy runtimes against the float64 NumPy reference, for every backend x precision, plus the
load/update, input-validation and auto-selection contracts."""
from __future__ import annotations

import json
import threading
import warnings

import haiku as hk
import jax
import numpy as np
import pytest

from quarl.nets.haiku import haiku_forward
from quarl.policy.reference import reference_apply
from quarl.policy.spec import PolicySpec, layer_norm_mlp_policy, mlp_q_network
from quarl.quant.quantization import dequantize_params, quantize, quantize_params
from quarl.runtimes import (
    DEQUANTIZED_CANDIDATE, auto_decisions, cache_path, clear_auto_decisions, make_executor, make_executor_from_params,
    select_form,
)
from tests.quarl.helpers import random_params

BACKENDS = ("jax", "onnx", "onnx-nbits")
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int4")
# ONNX int runs once per kernel form (None: the CPU's own choice). Each forced form must be within tolerance
# on this CPU or be refused by the self-check and fall back (see `_check_form`), so the int tests mean
# something on AVX2-only and on VNNI machines alike.
FORMS = (None, "u8s8", "u8u8", "fp32")
BATCH = 64
# Max |error| over the batch as a fraction of the reference outputs' range, per precision, against the
# fp32 reference. Low-float errors come from weight/activation rounding (bf16 has 8 mantissa bits);
# int8 from per-channel weight + per-row/per-tensor activation quantization. int4 is compared with the
# reference of its *dequantized* weights, so only the int8 activation error remains.
TOLERANCE = {"fp32": 1e-5, "fp16": 3e-3, "bf16": 1.5e-2, "int8": 3e-2, "int4": 2e-2}


def _init(spec: PolicySpec, seed: int) -> dict:
    """haiku-initialised params with a unit-scale output layer: D4PG's near-zero init would make every
    action the middle of the spec, which any runtime gets "right"."""
    net = hk.without_apply_rng(hk.transform(lambda x: haiku_forward(spec)(x)))
    params = jax.tree.map(np.asarray, net.init(jax.random.PRNGKey(seed), np.zeros((1, spec.input_dim), np.float32)))
    rng = np.random.default_rng(seed)
    for layer in spec.linear_layers:
        params[layer.name]["b"] = rng.normal(0, 0.1, params[layer.name]["b"].shape).astype(np.float32)
    last = spec.linear_layers[-1].name
    fan_in = params[last]["w"].shape[0]
    params[last]["w"] = (rng.normal(size=params[last]["w"].shape) / np.sqrt(fan_in)).astype(np.float32)
    for module in params.values():
        if "scale" in module:
            module["scale"] = (1 + rng.normal(0, 0.1, module["scale"].shape)).astype(np.float32)
    return params


SPECS = {
    "d4pg": layer_norm_mlp_policy(12, [64, 64], [-2.0, -1.0, 0.0], [2.0, 1.0, 3.0]),
    "dqn": mlp_q_network(8, [64, 64], 5),
    # per-feature observation bounds of very different widths, mapped onto [-1, 1] by every runtime first
    "dqn_bounds": mlp_q_network(8, [64, 64], 5, ([-0.07, -1.2, 0.0, -3.0, -0.5, -10.0, 1.0, -0.01],
                                                 [0.07, 0.6, 2.0, 3.0, 0.5, 10.0, 4.0, 0.01])),
}


@pytest.fixture(scope="module")
def cases() -> dict:
    out = {}
    for i, (name, spec) in enumerate(SPECS.items()):
        obs = np.random.default_rng(100 + i).normal(size=(BATCH, spec.input_dim)).astype(np.float32)
        out[name] = (spec, _init(spec, i), _init(spec, 10 + i), obs)
    return out


def _rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out.astype(np.float64) - ref).max() / max(np.ptp(ref), 1e-12))


def _check_form(ex, form) -> None:
    """The executor runs the forced form, or the self-check refused it and says which passing form replaced it."""
    check = ex.kernel_check
    assert check["checks"][-1]["ok"] and ex.kernel_form == check["form"]
    if form is None:  # the CPU's preferred form, or (where the CPU misreports, e.g. under qemu) its refusal on record
        assert check["fallback"] == (len(check["checks"]) > 1)
        assert all(not c["ok"] for c in check["checks"][:-1])
    elif ex.kernel_form == form:
        assert not check["fallback"] and len(check["checks"]) == 1
    else:
        assert check["fallback"] and check["checks"][0]["form"] == form and not check["checks"][0]["ok"]
    assert ex.simulated == (ex.kernel_form == "fp32")


def _int_cases(backends=BACKENDS):
    """(backend, form) pairs: every form on onnx, the single AQT path on jax."""
    return [pytest.param(b, f, id=f"{b}-{f or 'cpu'}") for b in backends for f in (FORMS if b == "onnx" else (None,))]


_MATRIX = [pytest.param(net, p, b, f, id=f"{net}-{p}-{b}" + (f"-{f}" if f else ""))
           for net in sorted(SPECS) for p in PRECISIONS for b in BACKENDS
           for f in (FORMS if b == "onnx" and p.startswith("int") else (None,))]


@pytest.mark.parametrize("net,precision,backend,form", _MATRIX)
def test_matches_reference(cases, net, precision, backend, form):
    spec, params, _, obs = cases[net]
    qp = quantize_params(params, precision)
    ex = make_executor(spec, qp, backend, batch_size=BATCH, kernel_form=form)
    assert (ex.backend, ex.precision) == (backend, precision)
    if backend == "onnx" and precision.startswith("int"):
        _check_form(ex, form)
    out = ex(obs)
    assert out.dtype == np.float32 and out.shape == (BATCH, spec.output_dim)
    ref = reference_apply(spec, params, obs)
    if precision == "int4":
        deq_ref = reference_apply(spec, dequantize_params(qp), obs)
        assert _rel_err(out, deq_ref) < TOLERANCE["int4"]
        # 4-bit weights are visibly worse than 8-bit ones, yet still track the fp32 policy.
        assert 0.02 < _rel_err(out, ref) < 0.5
    else:
        assert _rel_err(out, ref) < TOLERANCE[precision]
    if precision != "fp32":
        assert _rel_err(out, ref) > 1e-6  # the precision really is lower (not silently fp32 weights)
    if net == "dqn" and precision in ("fp32", "fp16", "bf16", "int8"):
        agree = np.mean(out.argmax(1) == ref.argmax(1))
        assert agree >= (1.0 if precision == "fp32" else 0.9)
    if net == "d4pg":
        lo, hi = np.array(spec.layers[-1].minimum), np.array(spec.layers[-1].maximum)
        assert np.all(out >= lo - 1e-6) and np.all(out <= hi + 1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp32_relative_tolerance(cases, backend):
    spec, params, _, obs = cases["d4pg"]
    out = make_executor_from_params(spec, params, "fp32", backend, batch_size=BATCH)(obs)
    np.testing.assert_allclose(out, reference_apply(spec, params, obs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend,precision,form", [
    pytest.param(b, p, f, id=f"{b}-{p}" + (f"-{f}" if f else ""))
    for b in BACKENDS for p in ("fp32", "int8", "bf16") for f in (FORMS if b == "onnx" and p == "int8" else (None,))])
def test_update_swaps_weights(cases, backend, precision, form):
    spec, params_a, params_b, obs = cases["d4pg"]
    ex = make_executor(spec, quantize_params(params_a, precision), backend, batch_size=BATCH, kernel_form=form)
    before = ex(obs)
    ex.update(quantize_params(params_b, precision))
    after = ex(obs)
    ref_a, ref_b = reference_apply(spec, params_a, obs), reference_apply(spec, params_b, obs)
    tol = TOLERANCE[precision]
    assert _rel_err(after, ref_b) < tol and _rel_err(before, ref_a) < tol
    assert _rel_err(after, ref_a) > 10 * tol  # the new weights are really in use
    with pytest.raises(ValueError, match="precision"):
        ex.update(quantize_params(params_b, "int4" if precision != "int4" else "int8"))


@pytest.mark.parametrize("backend,form", _int_cases())
def test_other_batch_sizes_and_writable_output(cases, backend, form):
    spec, params, _, obs = cases["dqn"]
    ex = make_executor(spec, quantize_params(params, "int8"), backend, batch_size=1, kernel_form=form)
    if backend == "onnx":
        _check_form(ex, form)
    one = ex(obs[:1])
    many = ex(obs[:7])
    assert one.shape == (1, spec.output_dim) and many.shape == (7, spec.output_dim)
    one += 1.0  # an actor may add exploration noise in place
    ref = reference_apply(spec, params, obs[:7])
    assert _rel_err(many, ref) < TOLERANCE["int8"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_observation_raises(cases, backend, bad):
    spec, params, _, obs = cases["dqn"]
    ex = make_executor(spec, quantize_params(params, "fp32"), backend)
    x = obs[:4].copy()
    x[2, 3] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        ex(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_observation_shape_raises(cases, backend):
    spec, params, _, obs = cases["dqn"]
    ex = make_executor(spec, quantize_params(params, "fp32"), backend)
    for bad in (obs[:2, :-1], obs[0], obs[:0]):
        with pytest.raises(ValueError, match="observations"):
            ex(bad)


def test_unsupported_layer_raises(cases):
    spec, params, _, _ = cases["dqn"]
    weird = PolicySpec(spec.input_dim, spec.layers)
    object.__setattr__(weird, "layers", (*spec.layers, "softmax"))  # bypass PolicySpec's own check
    for backend in (*BACKENDS, "auto"):
        with pytest.raises(ValueError, match="unsupported layer"):
            make_executor(weird, quantize_params(params, "fp32"), backend)


def test_bad_arguments_raise(cases):
    spec, params, _, _ = cases["dqn"]
    qp = quantize_params(params, "int8")
    with pytest.raises(ValueError, match="unknown backend"):
        make_executor(spec, qp, "tflite")
    with pytest.raises(ValueError, match="batch_size"):
        make_executor(spec, qp, "onnx", batch_size=0)
    with pytest.raises(ValueError, match="threads"):
        make_executor(spec, qp, "onnx", threads=0)
    with pytest.raises(ValueError, match="QuantizedParams"):
        make_executor(spec, params, "jax")


@pytest.mark.parametrize("backend", BACKENDS)
def test_params_that_do_not_fit_raise(cases, backend):
    spec, params, _, _ = cases["dqn"]
    other = mlp_q_network(spec.input_dim, [32, 64], 5)
    with pytest.raises(ValueError, match="shape"):
        make_executor(other, quantize_params(params, "fp32"), backend)
    missing = {k: v for k, v in params.items() if k != "linear_1"}
    with pytest.raises(ValueError, match="linear_1"):
        make_executor(spec, quantize_params(missing, "fp32"), backend)
    nan_bias = quantize_params(params, "int8")
    nan_bias.tree["linear_0"]["b"] = np.full_like(nan_bias.tree["linear_0"]["b"], np.nan)
    with pytest.raises(ValueError, match="NaN or inf"):
        make_executor(spec, nan_bias, backend)
    affine = quantize_params(params, "int8")
    affine.tree["linear_0"]["w"] = quantize(params["linear_0"]["w"], 8, symmetric=False, axis=-1)
    with pytest.raises(ValueError, match="symmetric"):
        make_executor(spec, affine, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_simulated_precisions(cases, backend):
    """int12 has no integer kernel anywhere, fp16/bf16 none in ORT: they run in fp32 with rounded weights,
    which must then match the dequantized reference to fp32 accuracy."""
    spec, params, _, obs = cases["d4pg"]
    for precision in ("int12", "fp16", "bf16"):
        qp = quantize_params(params, precision)
        ex = make_executor(spec, qp, backend, batch_size=BATCH)
        expected_sim = precision == "int12" or backend.startswith("onnx")
        assert ex.simulated == expected_sim
        if expected_sim:
            np.testing.assert_allclose(ex(obs), reference_apply(spec, dequantize_params(qp), obs), rtol=1e-4,
                                       atol=1e-5)


@pytest.mark.parametrize("backend,form", _int_cases())
def test_per_tensor_weights(cases, backend, form):
    spec, params, _, obs = cases["dqn"]
    qp = quantize_params(params, "int8", per_channel=False)
    deq = reference_apply(spec, dequantize_params(qp), obs)
    ex = make_executor(spec, qp, backend, batch_size=BATCH, kernel_form=form)
    if backend == "onnx":
        _check_form(ex, form)
    assert _rel_err(ex(obs), deq) < TOLERANCE["int8"]


@pytest.mark.parametrize("form", FORMS)
def test_auto_picks_a_backend_and_caches(cases, tmp_path, monkeypatch, form):
    monkeypatch.setenv("QUARL_CACHE_DIR", str(tmp_path))
    clear_auto_decisions()
    spec, params, _, obs = cases["dqn"]
    qp = quantize_params(params, "int8")
    ex = make_executor(spec, qp, "auto", batch_size=4, kernel_form=form)
    assert ex.backend in BACKENDS and ex.precision == "int8"
    assert _rel_err(ex(obs), reference_apply(spec, params, obs)) < TOLERANCE["int8"]
    (key, entry), = auto_decisions().items()
    assert entry["source"] == "measured"
    if entry["backend"] == "onnx":
        _check_form(ex, form)
    elif entry["backend"] == DEQUANTIZED_CANDIDATE:
        assert ex.kernel_form == "fp32" and ex.simulated
    # onnx-nbits would build the same graph as onnx; the dequantized candidate is onnx's fp32 form (unless forced).
    assert set(entry["us_per_call"]) == {"jax", "onnx"} | ({DEQUANTIZED_CANDIDATE} if form != "fp32" else set())
    assert entry["backend"] == min(entry["us_per_call"], key=entry["us_per_call"].get)
    assert _concrete(entry["backend"]) == ex.backend
    assert "|b4|int8|t1" in key
    # The key names the ONNX form the CPU settled on (a forced form, or what replaced a refused one).
    assert key.endswith("|k" + select_form(8, [(8, 64), (64, 64), (64, 5)], form)["form"])
    stored = json.loads(cache_path().read_text())
    assert _concrete(stored["decisions"][key]["backend"]) == ex.backend

    # A new process (simulated by clearing the in-process table) reads the decision instead of measuring.
    clear_auto_decisions()
    again = make_executor(spec, qp, "auto", batch_size=4, kernel_form=form)
    assert again.backend == ex.backend and auto_decisions()[key]["source"] == "file"

    # A different batch size or precision is a different decision.
    make_executor(spec, quantize_params(params, "fp32"), "auto", batch_size=4)
    assert len(auto_decisions()) == 2


def _concrete(candidate: str) -> str:
    """The executor backend an auto candidate builds (the dequantized candidate is ONNX's fp32 form)."""
    return "onnx" if candidate == DEQUANTIZED_CANDIDATE else candidate


@pytest.mark.parametrize("fastest", [DEQUANTIZED_CANDIDATE, "onnx", "jax"])
def test_auto_weighs_dequantized_fp32_against_the_int_kernels(cases, tmp_path, monkeypatch, fastest):
    """int8: auto also times the int weights dequantized in fp32 and picks whichever is fastest (fake
    timings); picked, it runs the same int8 weights in fp32 and says so (simulated, form fp32)."""
    import quarl.runtimes.auto as auto

    monkeypatch.setenv("QUARL_CACHE_DIR", str(tmp_path))
    seen = {}

    def fake_timings(executors, obs):
        seen.update(executors)
        return {name: (1.0 if name == fastest else 5.0 + i) for i, name in enumerate(executors)}

    monkeypatch.setattr(auto, "_time_interleaved", fake_timings)
    clear_auto_decisions()
    spec, params, _, obs = cases["dqn"]
    qp = quantize_params(params, "int8")
    ex = make_executor(spec, qp, "auto", batch_size=4)
    (_, entry), = auto_decisions().items()
    assert set(entry["us_per_call"]) == set(seen) == {"jax", "onnx", DEQUANTIZED_CANDIDATE}
    assert seen[DEQUANTIZED_CANDIDATE].kernel_form == "fp32" and seen[DEQUANTIZED_CANDIDATE].simulated
    assert entry["backend"] == fastest and ex is seen[fastest] and ex.precision == "int8"
    deq = reference_apply(spec, dequantize_params(qp), obs)
    if fastest == DEQUANTIZED_CANDIDATE:  # the int8 weights exactly, in fp32 arithmetic
        assert ex.backend == "onnx" and ex.simulated and _rel_err(ex(obs), deq) < TOLERANCE["fp32"]
    # fp32 policies get no such candidate (it would be the onnx one).
    make_executor(spec, quantize_params(params, "fp32"), "auto", batch_size=4)
    fp32_entry = [e for k, e in auto_decisions().items() if "|fp32|" in k][0]
    assert set(fp32_entry["us_per_call"]) == {"jax", "onnx"}
    clear_auto_decisions()


def test_auto_measures_matmulnbits_for_int4_and_narrower(cases, tmp_path, monkeypatch):
    """int2..int4: the onnx-nbits backend (MatMulNBits) is a third candidate, measured like the others."""
    monkeypatch.setenv("QUARL_CACHE_DIR", str(tmp_path))
    clear_auto_decisions()
    spec, params, _, obs = cases["dqn"]
    qp = quantize_params(params, "int4")
    ex = make_executor(spec, qp, "auto", batch_size=4)
    (key, entry), = auto_decisions().items()
    assert "|b4|int4|t1" in key and set(entry["us_per_call"]) == {*BACKENDS, DEQUANTIZED_CANDIDATE}
    assert entry["backend"] == min(entry["us_per_call"], key=entry["us_per_call"].get)
    assert _concrete(entry["backend"]) == ex.backend
    assert _rel_err(ex(obs), reference_apply(spec, dequantize_params(qp), obs)) < TOLERANCE["int4"]
    clear_auto_decisions()


def test_auto_remeasures_a_cached_decision_that_did_not_time_todays_candidates(cases, tmp_path, monkeypatch):
    """A decision stored before a candidate existed (here: without the dequantized fp32 path) is measured
    again, not reused; one that timed every candidate is reused."""
    monkeypatch.setenv("QUARL_CACHE_DIR", str(tmp_path))
    clear_auto_decisions()
    spec, params, _, _ = cases["dqn"]
    qp = quantize_params(params, "int8")
    make_executor(spec, qp, "auto", batch_size=4)
    (key, entry), = auto_decisions().items()
    assert set(entry["us_per_call"]) == {"jax", "onnx", DEQUANTIZED_CANDIDATE}
    stale = {"version": 1, "decisions": {key: {"backend": "jax", "us_per_call": {"jax": 1.0, "onnx": 2.0},
                                               "measured_at": "2026-01-01T00:00:00"}}}
    cache_path().write_text(json.dumps(stale))
    clear_auto_decisions()
    make_executor(spec, qp, "auto", batch_size=4)
    assert auto_decisions()[key]["source"] == "measured"
    assert set(json.loads(cache_path().read_text())["decisions"][key]["us_per_call"]) == set(entry["us_per_call"])
    clear_auto_decisions()
    make_executor(spec, qp, "auto", batch_size=4)
    assert auto_decisions()[key]["source"] == "file"
    clear_auto_decisions()


def test_auto_survives_a_corrupt_cache(cases, tmp_path, monkeypatch):
    monkeypatch.setenv("QUARL_CACHE_DIR", str(tmp_path))
    clear_auto_decisions()
    cache_path().parent.mkdir(parents=True, exist_ok=True)
    cache_path().write_text("{not json")
    spec, params, _, _ = cases["dqn"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ex = make_executor(spec, quantize_params(params, "fp32"), "auto")
    assert ex.backend in BACKENDS
    assert any("cache" in str(w.message) for w in caught)
    assert json.loads(cache_path().read_text())["version"] == 1  # rewritten in the valid format
    clear_auto_decisions()


def test_int8_runs_integer_kernels(cases):
    """The int paths must really multiply integers: integer GEMMs in ONNX (MatMulInteger in the batch-1 graph,
    MatMulIntegerToFloat in the per-row one), an s8 x s8 -> s32 dot in XLA."""
    spec, params, _, obs = cases["d4pg"]
    qp = quantize_params(params, "int8")
    onnx_ex = make_executor(spec, qp, "onnx")
    assert "onnx" in repr(onnx_ex) and "int8" in repr(onnx_ex)
    for kind, int_op in (("one", "MatMulInteger"), ("row", "MatMulIntegerToFloat")):
        ops = [n.op_type for n in onnx_ex.model(kind).graph.node]
        assert ops.count(int_op) == len(spec.linear_layers) and "MatMul" not in ops, (kind, ops)
    jax_ex = make_executor(spec, qp, "jax")
    hlo = jax_ex._jitted.lower(jax_ex._params, obs[:1]).as_text()
    int_dots = [line for line in hlo.splitlines() if "dot_general" in line and "xi8>" in line and "xi32>" in line]
    assert len(int_dots) == len(spec.linear_layers)
    assert all(str(leaf.dtype) in ("int8", "float32") for leaf in jax.tree.leaves(jax_ex._params))


@pytest.mark.parametrize("precision", ["int4", "int3", "int2"])
def test_int4_and_narrower_run_on_matmulnbits_with_packed_weights(cases, precision):
    """onnx-nbits keeps int<=4 weights 4-bit in memory and multiplies them in MatMulNBits (bias fused)."""
    spec, params, params_b, obs = cases["d4pg"]
    qp = quantize_params(params, precision)
    ex = make_executor(spec, qp, "onnx-nbits", batch_size=BATCH)
    assert ex.kernel_form == "nbits4" and make_executor(spec, qp, "onnx").kernel_form != "nbits4"
    # the self-check held MatMulNBits to an exact emulation of its block-wise int8 activations, first try
    assert not ex.kernel_check["fallback"] and ex.kernel_check["checks"][0]["max_rel_err"] < 1e-4
    ops = [n.op_type for n in ex.model().graph.node]
    assert ops.count("MatMulNBits") == len(spec.linear_layers)
    assert not {"MatMul", "MatMulInteger", "DynamicQuantizeLinear"} & set(ops)
    weights = {t.name: t for t in ex.model().graph.initializer if t.name.endswith(".nbits")}
    for layer in spec.linear_layers:
        width_in, width_out = qp.tree[layer.name]["w"].values.shape
        packed = weights[f"{layer.name}.nbits"]
        block = max(16, min(128, 1 << (width_in - 1).bit_length()))
        assert list(packed.dims) == [width_out, -(-width_in // block), block // 2]  # two codes a byte
    assert _rel_err(ex(obs), reference_apply(spec, dequantize_params(qp), obs)) < TOLERANCE["int4"]
    qp_b = quantize_params(params_b, precision)  # update() repacks the new weights into the same graph
    ex.update(qp_b)
    assert _rel_err(ex(obs), reference_apply(spec, dequantize_params(qp_b), obs)) < TOLERANCE["int4"]


def test_matmulnbits_pads_inputs_that_are_not_a_block_multiple():
    """K = 200 is one full 128-block plus a padded one; K = 5 is far below the 16 minimum."""
    spec = mlp_q_network(200, [5, 150], 7)
    rng = np.random.default_rng(3)
    params = random_params(spec, 3)  # plain NumPy params: a haiku init would compile for seconds for new shapes
    obs = rng.normal(size=(9, 200)).astype(np.float32)
    qp = quantize_params(params, "int4")
    ex = make_executor(spec, qp, "onnx-nbits", batch_size=9)
    assert ex.kernel_form == "nbits4"
    assert _rel_err(ex(obs), reference_apply(spec, dequantize_params(qp), obs)) < TOLERANCE["int4"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_background_update_acts_on_old_weights_until_the_swap(cases, backend, monkeypatch):
    """update(wait=False): calls during the build run wholly on the old weights, calls after the swap
    wholly on the new ones (bit-identical to an executor built with them), and bad params still raise."""
    spec, params_a, params_b, obs = cases["d4pg"]
    ex = make_executor(spec, quantize_params(params_a, "int8"), backend, batch_size=BATCH)
    old = ex(obs)
    new = make_executor(spec, quantize_params(params_b, "int8"), backend, batch_size=BATCH,
                        kernel_form=ex.kernel_form if backend == "onnx" else None)(obs)
    assert not np.array_equal(old, new)

    # Held mid-build: acting goes on, on the old weights.
    gate, entered = threading.Event(), threading.Event()
    real_load = ex._load

    def held_load(lowered):
        entered.set()
        assert gate.wait(60)
        real_load(lowered)

    monkeypatch.setattr(ex, "_load", held_load)
    ex.update(quantize_params(params_b, "int8"), wait=False)
    assert entered.wait(60) and ex.update_pending
    for _ in range(3):
        np.testing.assert_array_equal(ex(obs), old)
    gate.set()
    assert ex.wait_for_update(60) and not ex.update_pending
    np.testing.assert_array_equal(ex(obs), new)
    monkeypatch.setattr(ex, "_load", real_load)

    # Real concurrent builds: every call sees exactly one of the two weight sets, never a mix (nor memory a
    # swap has released: the old session's initializers must outlive a call in flight).
    seen = []
    for i in range(12):
        ex.update(quantize_params(params_a if i % 2 == 0 else params_b, "int8"), wait=False)
        while ex.update_pending:
            out = ex(obs)
            seen.append("new" if np.array_equal(out, new) else "old" if np.array_equal(out, old) else "mixed")
        ex.wait_for_update()
    assert "mixed" not in seen
    np.testing.assert_array_equal(ex(obs), new)

    with pytest.raises(ValueError, match="precision"):
        ex.update(quantize_params(params_b, "int4"), wait=False)


def test_failed_background_update_keeps_the_old_weights(cases, monkeypatch):
    spec, params_a, params_b, obs = cases["dqn"]
    ex = make_executor(spec, quantize_params(params_a, "int8"), "onnx", batch_size=BATCH)
    before = ex(obs)

    def broken(lowered):
        raise MemoryError("no room for a new session")

    monkeypatch.setattr(ex, "_load", broken)
    ex.update(quantize_params(params_b, "int8"), wait=False)
    assert ex.wait_for_update(60)
    assert "MemoryError" in ex.update_error
    np.testing.assert_array_equal(ex(obs), before)


def test_onnx_executor_keeps_only_serialized_graphs_and_parses_them_on_request(cases):
    """No parsed ModelProto is kept beside the serialized graphs; `model()` parses a fresh copy per call."""
    spec, params, _, _ = cases["d4pg"]
    ex = make_executor(spec, quantize_params(params, "int8"), "onnx")
    assert not hasattr(ex, "_model")
    first, second = ex.model(), ex.model()
    assert first is not second and first.SerializeToString() == ex._models["row"]
    del first.graph.node[:]  # editing the copy leaves the executor's graph alone
    assert len(ex.model().graph.node) == len(second.graph.node) > 0
    with pytest.raises(ValueError, match="no 'nope' graph"):
        ex.model("nope")


def test_decision_keys_parse_back_into_their_fields(cases):
    from quarl.runtimes.auto import decision_key, parse_decision_key

    spec = cases["dqn"][0]
    fields = parse_decision_key(decision_key(spec, "int8", 16, 1, "u8u8"))
    assert (fields["batch"], fields["precision"], fields["threads"], fields["form"]) == ("16", "int8", "1", "u8u8")
    assert fields["shape"] == "-".join(str(w) for w in (spec.input_dim, *(ly.out for ly in spec.linear_layers)))
    with pytest.raises(ValueError, match="not an auto decision key"):
        parse_decision_key("a|b|c")
