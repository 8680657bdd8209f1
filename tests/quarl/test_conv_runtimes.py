"""Conv policies: the spec (shapes, JSON, digests), the float runtimes against the float64 reference, int8 conv
(ONNX static graph, JAX im2col) against the dequantized reference, calibration, payload transport, self-check."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto

from quarl.policy.reference import reference_apply
from quarl.policy.spec import (
    Activation, Conv2D, Flatten, Linear, PolicySpec, minatar_q_network, mlp_q_network, nature_q_network,
)
from quarl.quant.calibration import activation_ranges, needs_calibration, quantize_for_actors
from quarl.quant.payload import decode_payload, encode_payload
from quarl.quant.quantization import dequantize_params, quantize_params
from quarl.runtimes import make_executor
from quarl.runtimes.onnx_backend import build_static_model
from quarl.runtimes.onnx_static import (
    STATIC_FORMS, activation_qparams, check_static_form, fused_convs, select_static_form,
)
from tests.quarl.helpers import random_params

TOLERANCE = {"fp32": 1e-5, "int8": 3e-2}  # as tests/quarl/test_runtimes.py


def _rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out.astype(np.float64) - ref).max() / max(np.ptp(ref), 1e-12))


def _two_convs() -> PolicySpec:
    """A small net with every feature the torsos use: two convs (one strided), ReLUs, Flatten, two Linears."""
    layers = (Conv2D("conv_0", 8, 3, 2), Activation("relu"), Conv2D("conv_1", 16, 2, 1), Activation("relu"),
              Flatten(), Linear("linear_0", 32), Activation("relu"), Linear("linear_1", 5))
    return PolicySpec(12 * 12 * 3, layers, (12, 12, 3))


@pytest.fixture(scope="module")
def cases():
    out = {}
    rng = np.random.default_rng(0)
    for name, spec in (("minatar", minatar_q_network((10, 10, 4), 6)), ("two_convs", _two_convs())):
        params = random_params(spec, 1)
        # MinAtar-like observations: 0/1 cells; the calibration set and the test set are different draws.
        calib = rng.integers(0, 2, (128, spec.input_dim)).astype(np.float32)
        obs = rng.integers(0, 2, (8, spec.input_dim)).astype(np.float32)
        out[name] = (spec, params, calib, obs)
    return out


def test_spec_shapes_json_and_digest():
    spec = nature_q_network((84, 84, 4), 6)
    shapes = [s for _, _, s in spec.layer_shapes()]
    assert (20, 20, 32) in shapes and (9, 9, 64) in shapes and (7, 7, 64) in shapes and (3136,) in shapes
    assert spec.output_dim == 6 and PolicySpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["input_shape"] == [84, 84, 4]
    mlp = mlp_q_network(4, (8,), 2)  # vector policies keep their JSON (and so their digest) as before
    assert "input_shape" not in mlp.to_dict()


@pytest.mark.parametrize("layers, shape, match", [
    ((Linear("l", 4),), (4, 4, 1), "vector input"),
    ((Conv2D("c", 4, 5),), (4, 4, 1), "larger than its input"),
    ((Conv2D("c", 4, 3), Activation("relu")), (4, 4, 1), "must end in a vector"),
    ((Flatten(), Conv2D("c", 4, 1)), (4, 4, 1), "image input"),
    ((Conv2D("c", 0, 1), Flatten()), (4, 4, 1), "positive int"),
])
def test_bad_conv_specs_raise(layers, shape, match):
    with pytest.raises(ValueError, match=match):
        PolicySpec(int(np.prod(shape)), layers, shape)


def test_input_shape_must_match_input_dim():
    with pytest.raises(ValueError, match="input_shape"):
        PolicySpec(10, (Flatten(), Linear("l", 2)), (2, 2, 2))


@pytest.mark.parametrize("backend", ["jax", "onnx"])
@pytest.mark.parametrize("name", ["minatar", "two_convs"])
def test_fp32_matches_reference(cases, backend, name):
    spec, params, _, obs = cases[name]
    ex = make_executor(spec, quantize_params(params, "fp32"), backend, batch_size=len(obs))
    assert _rel_err(ex(obs), reference_apply(spec, params, obs)) < TOLERANCE["fp32"]


@pytest.mark.parametrize("backend, form", [("onnx", None), ("onnx", "u8s8"), ("onnx", "u8u8"), ("onnx", "fp32"),
                                           ("jax", None)])
@pytest.mark.parametrize("name", ["minatar", "two_convs"])
def test_int8_matches_dequantized_reference(cases, backend, form, name):
    spec, params, calib, obs = cases[name]
    qp = quantize_for_actors(spec, params, "int8", calib)
    deq = reference_apply(spec, dequantize_params(qp), obs)
    for batch in (1, len(obs)):
        ex = make_executor(spec, qp, backend, batch_size=batch, **({"kernel_form": form} if form else {}))
        out = np.concatenate([ex(obs[i:i + batch]) for i in range(0, len(obs), batch)])
        assert _rel_err(out, deq) < TOLERANCE["int8"], (backend, ex.kernel_form, batch)
        # Rows are independent (static scales): one row alone gives what it gives inside a batch.
        np.testing.assert_allclose(ex(obs[:1])[0], out[0], rtol=1e-5, atol=1e-6)
    if backend == "onnx":
        _assert_static_form_in_use(ex, form)
        assert ex.simulated == (ex.kernel_form == "fp32")


def _assert_static_form_in_use(ex, requested: str | None) -> None:
    """The executor runs the form its self-check settled on, and a requested form unless this CPU refused it.
    Which forms are exact is per CPU class (u8s8 saturates int16 pair sums on AVX2 without VNNI), so a refusal
    is allowed on any class, but only as the self-check's: the requested form's check comes first and failed,
    the form in use passed its own, and `fallback` says so."""
    info = ex.kernel_check
    checks = info["checks"]
    assert ex.kernel_form == info["form"] == checks[-1]["form"] and checks[-1]["ok"], info
    assert not any(c["ok"] for c in checks[:-1]) and info["fallback"] == (len(checks) > 1), info
    for c in checks:  # a refusal is a measured one: off the exact emulation, or ORT could not run the form
        assert c["ok"] == (c.get("error") is None and c["max_rel_err"] <= c["tolerance"]), c
    if requested is not None:
        assert info["requested"] == requested and checks[0]["form"] == requested, info
        assert (ex.kernel_form == requested) == (not info["fallback"]), info


def _assert_static_graph(model, weight_type: int) -> None:
    """The static int8 graph of `_two_convs`: both convs are QLinearConvs with their ReLU folded, the Linears
    integer GEMMs, the weights integer codes of `weight_type` in the graph."""
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QLinearConv") == 2 and ops.count("MatMulIntegerToFloat") == 2
    assert "Conv" not in ops and ops.count("Relu") == 1  # only the Linear's ReLU runs as an op
    assert ops.count("QuantizeLinear") == 2  # the observation, and the Linear after the float ReLU
    codes = {i.name: i for i in model.graph.initializer}
    assert {codes[f"{n}.wq"].data_type for n in ("conv_0", "conv_1", "linear_0", "linear_1")} == {weight_type}


@pytest.mark.parametrize("form", sorted(STATIC_FORMS))
def test_onnx_int8_runs_qlinearconv_with_the_relu_folded(cases, form):
    """Each static form's graph, built directly (the same on every CPU): INT8 codes for u8s8, codes + 128 as
    UINT8 for u8u8. The executor asked for the form runs it, or the exact form this CPU's self-check fell
    back to (u8s8 -> u8u8 on AVX2 without VNNI): still the integer graph, never the float one."""
    weight_types = {np.dtype(np.int8): TensorProto.INT8, np.dtype(np.uint8): TensorProto.UINT8}
    spec, params, calib, _ = cases["two_convs"]
    qp = quantize_for_actors(spec, params, "int8", calib)
    static = STATIC_FORMS[form]
    _assert_static_graph(build_static_model(spec, ex_lowered(spec, qp), static),
                         weight_types[np.dtype(static.weight_dtype)])
    ex = make_executor(spec, qp, "onnx", kernel_form=form)
    _assert_static_form_in_use(ex, form)
    assert ex.kernel_form in STATIC_FORMS and not ex.simulated, ex.kernel_check
    _assert_static_graph(ex.model(), weight_types[np.dtype(STATIC_FORMS[ex.kernel_form].weight_dtype)])


def test_int_conv_params_without_calibration_are_refused(cases):
    spec, params, _, _ = cases["minatar"]
    with pytest.raises(ValueError, match="calibrated activation ranges"):
        make_executor(spec, quantize_params(params, "int8"), "onnx")
    qp = quantize_for_actors(spec, params, "int8", np.zeros((4, spec.input_dim), np.float32))
    bad = dataclasses.replace(qp, activation_ranges={"conv_0": np.array([0.0, 1.0], np.float32)})
    with pytest.raises(ValueError, match="lack layer 'linear_0'"):
        make_executor(spec, bad, "jax")


def test_calibration_ranges(cases):
    spec, params, calib, _ = cases["two_convs"]
    assert needs_calibration(spec, "int8") and not needs_calibration(spec, "fp32")
    assert not needs_calibration(mlp_q_network(4, (8,), 2), "int8")
    ranges = activation_ranges(spec, params, calib)
    assert set(ranges) == {"conv_0", "conv_1", "linear_0", "linear_1"}
    np.testing.assert_array_equal(ranges["conv_0"], [0.0, 1.0])  # the 0/1 observations themselves
    assert all(r[0] == 0.0 and r[1] > 0 for n, r in ranges.items() if n != "conv_0")  # after ReLUs
    assert activation_qparams(*ranges["conv_1"])[1] == 0
    with pytest.raises(ValueError, match="observations"):
        activation_ranges(spec, params, np.zeros((3, 7), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        activation_ranges(spec, params, np.full((2, spec.input_dim), np.nan, np.float32))


def test_payload_carries_the_ranges_to_an_actor_and_update_swaps_them(cases):
    spec, params, calib, obs = cases["minatar"]
    qp = quantize_for_actors(spec, params, "int8", calib)
    decoded = decode_payload(encode_payload(qp, version=7, spec_hash=spec.digest())).params
    ex = make_executor(spec, decoded, "onnx", batch_size=len(obs))
    assert _rel_err(ex(obs), reference_apply(spec, dequantize_params(qp), obs)) < TOLERANCE["int8"]
    params_b = random_params(spec, 2)
    qp_b = quantize_for_actors(spec, params_b, "int8", calib)
    ex.update(decode_payload(encode_payload(qp_b, version=8)).params)
    assert _rel_err(ex(obs), reference_apply(spec, dequantize_params(qp_b), obs)) < TOLERANCE["int8"]


@pytest.mark.parametrize("backend", ["onnx", "jax"])
@pytest.mark.parametrize("batch_size", [1, 8])
def test_fp32_conv_update_runs_the_new_weights(cases, backend, batch_size):
    """An fp32 conv actor acts on the weights of its latest update. ONNX Runtime at ORT_ENABLE_ALL lays Conv
    weights out from the serialized graph and ignored the session's initializer overrides, so the ONNX actor
    kept its first conv weights (0.98 off after one update; fp32 DQN did not learn MinAtar)."""
    spec, params, _, obs = cases["minatar"]
    ex = make_executor(spec, quantize_params(params, "fp32"), backend, batch_size=batch_size)
    for seed in (2, 3):  # two updates: each one's weights, not the first's nor the previous one's
        params_b = random_params(spec, seed)
        ex.update(quantize_params(params_b, "fp32"), wait=seed == 2)
        ex.wait_for_update()
        out = np.concatenate([ex(obs[i:i + batch_size]) for i in range(0, len(obs), batch_size)])
        assert _rel_err(out, reference_apply(spec, params_b, obs)) < TOLERANCE["fp32"]


def test_int8_conv_policy_with_a_float_conv_updates_it_too():
    """An int conv policy's unfused conv runs dequantized weights in a float Conv: its updates reach it too."""
    layers = (Conv2D("conv_0", 4, 3), Activation("tanh"), Flatten(), Linear("linear_0", 3))
    spec = PolicySpec(6 * 6 * 2, layers, (6, 6, 2))
    obs = np.random.default_rng(3).random((4, spec.input_dim)).astype(np.float32)
    ex = make_executor(spec, quantize_for_actors(spec, random_params(spec, 3), "int8", obs), "onnx", batch_size=4,
                       kernel_form="u8s8")
    qp_b = quantize_for_actors(spec, random_params(spec, 4), "int8", obs)
    ex.update(qp_b)
    assert _rel_err(ex(obs), reference_apply(spec, dequantize_params(qp_b), obs)) < TOLERANCE["int8"]


def test_static_self_check_and_selection():
    for name in STATIC_FORMS:
        check = check_static_form(name, 8)
        assert set(check) >= {"form", "ok", "max_rel_err", "tolerance"} and check["form"] == name
    info = select_static_form(8)
    assert info["checks"][-1]["ok"] and info["form"] == info["checks"][-1]["form"]
    assert select_static_form(8, "u8u8")["checks"][0]["form"] == "u8u8"
    assert select_static_form(8, "nbits4")["requested"] == "nbits4"  # no static form: the ranked order


def test_unfused_int_conv_runs_its_dequantized_weights(cases):
    """An int conv whose output does not go through ReLU into another int layer has no static requantization
    target: it runs its dequantized weights in a float Conv, still within the int8 tolerance."""
    layers = (Conv2D("conv_0", 4, 3), Activation("tanh"), Flatten(), Linear("linear_0", 3))
    spec = PolicySpec(6 * 6 * 2, layers, (6, 6, 2))
    params = random_params(spec, 3)
    obs = np.random.default_rng(3).random((4, spec.input_dim)).astype(np.float32)
    qp = quantize_for_actors(spec, params, "int8", obs)
    ex = make_executor(spec, qp, "onnx", batch_size=4, kernel_form="u8s8")
    assert "QLinearConv" not in [n.op_type for n in ex.model().graph.node]
    assert _rel_err(ex(obs), reference_apply(spec, dequantize_params(qp), obs)) < TOLERANCE["int8"]
    assert fused_convs(spec, ex_lowered(spec, qp)) == {}


def ex_lowered(spec, qp):
    from quarl.runtimes.base import lower_params  # pylint: disable=import-outside-toplevel
    return lower_params(spec, qp, ())


def test_auto_measures_int8_against_dequantized_fp32_for_conv_policies(cases, tmp_path, monkeypatch):
    """`auto` times the static int8 graph, its dequantized fp32 twin and JAX, and keeps the fastest: an int8 conv
    actor is never slower than the fp32 arithmetic of the same weights would be here."""
    from quarl.runtimes import DEQUANTIZED_CANDIDATE, auto_decisions, clear_auto_decisions
    from quarl.runtimes.auto import parse_decision_key

    monkeypatch.setenv("QUARL_CACHE_DIR", str(tmp_path))
    clear_auto_decisions()
    spec, params, calib, obs = cases["minatar"]
    qp = quantize_for_actors(spec, params, "int8", calib)
    ex = make_executor(spec, qp, "auto", batch_size=len(obs))
    (key, entry), = auto_decisions().items()
    timings = entry["us_per_call"]
    assert set(timings) == {"jax", "onnx", DEQUANTIZED_CANDIDATE} and entry["backend"] == min(timings, key=timings.get)
    fields = parse_decision_key(key)
    assert fields["shape"].startswith("c16k3s1-") and fields["form"] in ("u8s8", "u8u8", "fp32")
    assert _rel_err(ex(obs), reference_apply(spec, dequantize_params(qp), obs)) < TOLERANCE["int8"]


def test_nature_torso_int8_on_uint8_frames():
    """The Nature torso with its 1/255 input scale on 0..255 frames: static int8 ONNX and JAX within tolerance."""
    spec = nature_q_network((84, 84, 4), 6)
    params = random_params(spec, 4)
    rng = np.random.default_rng(4)
    frames = rng.integers(0, 256, (34, spec.input_dim)).astype(np.float32)
    calib, obs = frames[:32], frames[32:]
    qp = quantize_for_actors(spec, params, "int8", calib)
    np.testing.assert_allclose(qp.activation_ranges["conv_0"][1], frames[:32].max() / 255, rtol=1e-6)
    deq = reference_apply(spec, dequantize_params(qp), obs)
    for backend in ("onnx", "jax"):
        ex = make_executor(spec, qp, backend, batch_size=2)
        assert _rel_err(ex(obs), deq) < TOLERANCE["int8"], backend
    fp = make_executor(spec, quantize_params(params, "fp32"), "onnx", batch_size=2)
    assert _rel_err(fp(obs), reference_apply(spec, params, obs)) < TOLERANCE["fp32"]
