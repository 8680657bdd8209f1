"""Integer kernel forms: the NumPy emulation the self-check trusts, the per-CPU preference order, and the
self-check refusing a kernel that saturates like MLAS's AVX2 u8 x s8 path (a real ORT graph emulating
pmaddubsw's int16 pair sums), so the refusal path is exercised on every CPU, VNNI or not."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from quarl.policy.reference import reference_apply
from quarl.policy.spec import layer_norm_mlp_policy
from quarl.quant.quantization import quantize_params
from quarl.runtimes import make_executor
from quarl.runtimes.base import DenseWeights
from quarl.runtimes.kernel_check import check_form, select_form
from quarl.runtimes.kernel_forms import (
    FALLBACK_FORM, Graph, KernelForm, candidates, dynamic_quantize, emit_row_quantize, exact_int_reference, forms,
    register_form, rowwise_quantize, unregister_form,
)
from tests.quarl.helpers import random_params

SATURATING = "test_pmaddubsw"


def test_dynamic_quantize_matches_onnx_runtime():
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"])
    graph = helper.make_graph([node], "dql", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None])],
                              [helper.make_tensor_value_info("q", TensorProto.UINT8, [None, None]),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info("z", TensorProto.UINT8, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for x in (rng.normal(size=(8, 300)), rng.uniform(0.1, 3, (2, 50)), -rng.uniform(0.1, 3, (1, 7))):
        x = x.astype(np.float32)
        q, s, z = sess.run(None, {"x": x})
        q_np, s_np, z_np = dynamic_quantize(x)
        assert s == s_np and z == z_np
        assert np.abs(q.astype(int) - q_np.astype(int)).max() <= 1 and np.mean(q != q_np) < 1e-3


def test_exact_reference_is_exact_integer_arithmetic():
    rng = np.random.default_rng(1)
    codes = rng.integers(-127, 128, (64, 16)).astype(np.int8)
    dense = DenseWeights("int", codes, np.zeros(16, np.float32), np.full(16, 0.5, np.float32))
    x = rng.normal(size=(3, 64)).astype(np.float32)
    q, s, z = rowwise_quantize(x)
    manual = np.array([[sum((int(q[b, k]) - int(z[b, 0])) * int(codes[k, n]) for k in range(64)) * float(s[b, 0])
                        for n in range(16)] for b in range(3)]) * 0.5
    np.testing.assert_array_equal(exact_int_reference(x, dense), manual)


@pytest.mark.parametrize("flags,arch,first", [
    (["avx2", "avx512f", "avx512_vnni"], "x86_64", "u8s8"),
    (["avx2", "avx_vnni"], "x86_64", "u8s8"),
    (["avx2", "fma"], "x86_64", "u8u8"),  # AVX2 without VNNI: u8 x s8 saturates
    (["asimd", "asimddp"], "aarch64", "u8u8"),
])
def test_candidates_follow_the_cpu(flags, arch, first):
    cpu = {"cpu_model": "x", "cores": 2, "flags": flags, "arch": arch}
    for bits in (8, 4):
        order = candidates(bits, cpu)
        assert order[0] == first and order[-1] == FALLBACK_FORM and set(order) >= {"u8s8", "u8u8"}


@pytest.mark.parametrize("name", ["u8s8", "u8u8", FALLBACK_FORM])
@pytest.mark.parametrize("bits", [8, 4])
def test_every_builtin_form_is_exact_here_or_refused(name, bits):
    """On any CPU each form either reproduces its exact reference or the check says it does not, and the
    form `select_form` settles on always passed."""
    result = check_form(name, bits, [(24, 256), (256, 6)])
    assert result["ok"] == (result["max_rel_err"] is not None and result["max_rel_err"] <= result["tolerance"])
    chosen = select_form(bits, [(24, 256), (256, 6)], name)
    assert chosen["checks"][-1]["ok"] and chosen["form"] == chosen["checks"][-1]["form"]
    assert chosen["fallback"] == (not result["ok"])


def test_unknown_or_too_narrow_forms_are_rejected():
    with pytest.raises(ValueError, match="unknown kernel form"):
        select_form(8, [(4, 4)], "nope")
    narrow = KernelForm("test_int4_only", "", 4, forms()["u8s8"].initializers, forms()["u8s8"].emit,
                        lambda cpu, bits: None, exact_int_reference)
    register_form(narrow)
    try:
        with pytest.raises(ValueError, match="at most int4"):
            select_form(8, [(4, 4)], "test_int4_only")
        with pytest.raises(ValueError, match="already registered"):
            register_form(narrow)
    finally:
        unregister_form("test_int4_only")


# ------------------------------------------------- a kernel that saturates like AVX2's pmaddubsw

def _pair_codes(name: str, d: DenseWeights) -> dict[str, np.ndarray]:
    k, n = d.w.shape
    codes = np.zeros((k + k % 2, n), np.int32)
    codes[:k] = d.w
    return {f"{name}.pairs": codes.reshape(-1, 2, n), f"{name}.colsum": codes.sum(0).astype(np.int32),
            f"{name}.scale": d.scale.astype(np.float32)}


def emit_zero_point_correction(graph: Graph, acc: str, neg_zp: str, colsum: str) -> str:
    """acc[B, N] int32 - zp[B, 1] x colsum[N] (given -zp), in int32 (exact), then Cast to float."""
    from onnx import TensorProto

    (zi,) = graph.op("Cast", [neg_zp], to=TensorProto.INT32)
    (corr,) = graph.op("Mul", [zi, colsum])
    (acc,) = graph.op("Add", [acc, corr])
    return graph.op("Cast", [acc], to=TensorProto.FLOAT)[0]


def _emit_saturating(g: Graph, x: str, name: str) -> str:
    """u8 x s8 like MLAS on AVX2: raw uint8 codes times weights, adjacent pairs summed and clipped to int16
    (pmaddubsw), pairs accumulated in int32, then the activation zero point corrected with column sums."""
    from onnx import TensorProto

    xq, xs, xz = emit_row_quantize(g, x, name)
    (xi,) = g.op("Cast", [xq], to=TensorProto.INT32)
    (xi,) = g.op("Pad", [xi, g.const(f"{name}.pad", np.array([0, 0, 0, 0], np.int64))])
    (xr,) = g.op("Reshape", [xi, g.const(f"{name}.shape", np.array([0, -1, 2, 1], np.int64))])
    (prod,) = g.op("Mul", [xr, f"{name}.pairs"])
    (pair,) = g.op("ReduceSum", [prod, g.const(f"{name}.ax2", np.array([2], np.int64))], keepdims=0)
    (pair,) = g.op("Clip", [pair, g.const(f"{name}.lo", np.int32(-32768)), g.const(f"{name}.hi", np.int32(32767))])
    (acc,) = g.op("ReduceSum", [pair, g.const(f"{name}.ax1", np.array([1], np.int64))], keepdims=0)
    accf = emit_zero_point_correction(g, acc, xz, f"{name}.colsum")
    (y,) = g.op("Mul", [accf, xs])
    return g.op("Mul", [y, f"{name}.scale"])[0]


@pytest.fixture
def saturating_form():
    register_form(KernelForm(SATURATING, "pmaddubsw emulation", 8, _pair_codes, _emit_saturating,
                             lambda cpu, bits: None, exact_int_reference))
    yield SATURATING
    unregister_form(SATURATING)


def _odd_free(shapes):  # the emulation pads K to even; keep K even so the reference matches exactly
    return [(k + k % 2, n) for k, n in shapes]


def test_self_check_refuses_a_saturating_int8_kernel(saturating_form):
    shapes = _odd_free([(24, 256), (256, 256)])
    int8 = check_form(saturating_form, 8, shapes)
    assert not int8["ok"] and int8["max_rel_err"] > 1e-2  # saturation is a large error, not float noise
    # With |codes| <= 63 two products never pass int16: the same kernel is exact, so the check passes.
    int7 = check_form(saturating_form, 7, shapes)
    assert int7["ok"] and int7["max_rel_err"] < 1e-5


def test_executor_falls_back_from_a_refused_form_and_says_so(saturating_form, caplog):
    spec = layer_norm_mlp_policy(12, [64, 64], [-1.0], [1.0])
    rng = np.random.default_rng(3)
    params = random_params(spec, 3, bias_std=0.0)
    obs = rng.normal(size=(32, 12)).astype(np.float32)
    with caplog.at_level(logging.WARNING, logger="quarl.runtimes.kernel_check"):
        ex = make_executor(spec, quantize_params(params, "int8"), "onnx", batch_size=32, kernel_form=saturating_form)
    check = ex.kernel_check
    assert check["requested"] == saturating_form and check["fallback"]
    assert check["checks"][0]["form"] == saturating_form and not check["checks"][0]["ok"]
    assert ex.kernel_form == check["form"] != saturating_form and check["checks"][-1]["ok"]
    assert any(saturating_form in r.getMessage() and "refused" in r.getMessage() for r in caplog.records)
    ref = reference_apply(spec, params, obs)
    assert np.abs(ex(obs) - ref).max() / np.ptp(ref) < 3e-2


# ------------------------------------------------- lifted inputs (after ReLU, ELU, tanh)

def test_the_self_check_covers_the_lifted_path():
    """A form whose lifted bias forgets the column sums (floor x colsum) is right on plain inputs and wrong on
    lifted ones: the check must refuse it, since the executor's batched graphs feed most layers lifted."""
    u8u8 = forms()["u8u8"]
    bad = KernelForm("test_bad_lift", "", 8,
                     lambda n, d: {**u8u8.initializers(n, d), f"{n}.b_lift": d.b.astype(np.float32)},
                     u8u8.emit, lambda cpu, bits: None, exact_int_reference, lifted_inputs=True)
    register_form(bad)
    try:
        good, refused = check_form("u8u8", 8, [(24, 256), (256, 6)]), check_form(bad.name, 8, [(24, 256), (256, 6)])
    finally:
        unregister_form(bad.name)
    assert good["ok"] and not refused["ok"] and refused["max_rel_err"] > 1e-2


@pytest.mark.parametrize("policy", ["d4pg", "dqn"])
def test_batched_graphs_quantize_every_layer_after_an_activation_without_a_row_minimum(policy):
    """D4PG (tanh, ELU) and DQN (ReLU): only the first layer, fed raw observations, needs the row minimum and
    the zero-point correction; the batch-1 graph keeps DynamicQuantizeLinear for every layer."""
    from quarl.policy.spec import mlp_q_network

    spec = (layer_norm_mlp_policy(12, [64, 64, 64], [-1.0] * 2, [1.0] * 2) if policy == "d4pg"
            else mlp_q_network(12, [64, 64, 64], 3))
    ex = make_executor(spec, quantize_params(random_params(spec, 0), "int8"), "onnx", batch_size=4)
    ops = [n.op_type for n in ex.model("row").graph.node]
    assert ops.count("ReduceMin") == 1 and ops.count("QuantizeLinear") == 4 and ops.count("Elu") == 0
    assert ops.count("MatMulIntegerToFloat") == 4
    one = [n.op_type for n in ex.model("one").graph.node]
    assert one.count("DynamicQuantizeLinear") == 4 and "ReduceMin" not in one
