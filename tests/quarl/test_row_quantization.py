"""Batched int actors must not couple rows: a vectorized actor runs K environments' observations as one
[K, d] batch, and each environment's action has to be the one it would get alone. Checked per integer kernel
form on real ORT graphs (rows 100x apart in magnitude, the case a per-tensor activation scale gets wrong),
for the NumPy emulation the self-check trusts, and for the JAX/AQT int8 backend."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from quarl.policy.reference import reference_apply
from quarl.policy.spec import layer_norm_mlp_policy, mlp_q_network
from quarl.quant.quantization import dequantize_params, quantize_params
from quarl.runtimes import make_executor
from quarl.runtimes.kernel_check import _check_graph, _random_dense, check_form
from quarl.runtimes.kernel_forms import (
    exact_int_reference, get_form, lifted_int_reference, lifted_row_quantize, rowwise_quantize,
)
from quarl.runtimes.onnx_nbits import FORM_NAME as NBITS_FORM
from tests.quarl.helpers import random_params


def _mixed_rows(rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Rows whose magnitudes differ by 100x (every other row small), some one-signed, one all zero."""
    x = rng.normal(size=(rows, k)).astype(np.float32)
    x[1::2] *= np.float32(0.01)
    x[2] = np.abs(x[2])  # ReLU-like row: zero point 0
    x[3] = -np.abs(x[3]) * 3
    x[4] = 0
    return x


# Forms whose op MLAS may run as another kernel for one row than for a batch: MatMulNBits has a one-row
# (M = 1) kernel on AVX2 without VNNI, which adds the block products up in another float order (ORT 1.32:
# ~2e-7 of the row's scale apart; its M >= 2 kernel gives every row the same bits at any batch size). There a
# row alone matches the batched row to float rounding, not bit for bit; coupled rows (a per-tensor activation
# scale) are whole code steps apart, ~1e-2 of the scale, so the bound below still catches them.
ONE_ROW_KERNEL_FORMS = {NBITS_FORM}
ONE_ROW_ROUNDING = 1e-5  # of the row's max |output|


# u8s8 with |codes| <= 63: no CPU saturates it (AVX2's pmaddubsw only does past 63), so the row test below
# holds on every CPU class; saturation itself is the self-check's business (test_kernel_forms).
# floor -1: the lifted path (an input known to be >= -1, after ELU or tanh, arrives as x + 1 >= 0).
@pytest.mark.parametrize("form, bits, floor", [("u8s8", 7, None), ("u8u8", 8, None), (NBITS_FORM, 4, None),
                                               ("u8s8", 7, -1.0), ("u8u8", 8, -1.0)])
def test_each_row_is_bit_identical_alone_or_in_a_mixed_batch(form, bits, floor):
    """In any batch of two or more, a row's output is the same bits whatever the other rows hold, on every
    CPU class; alone it is the same bits too, except for `ONE_ROW_KERNEL_FORMS` (float rounding apart)."""
    rng = np.random.default_rng(0)
    layers = [_random_dense(bits, k, n, rng) for k, n in [(24, 256), (256, 3)]]
    check = check_form(form, bits, [d.w.shape for d in layers])
    if not check["ok"]:  # e.g. nbits4 on Arm (results/bench/kernel_forms.md): off its exact emulation there
        pytest.skip(f"this CPU's self-check refuses {form} at int{bits} ({check}): no executor runs it here")
    session = ort.InferenceSession(_check_graph(get_form(form), layers, floor=floor).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    feeds = {f"x{i}": _mixed_rows(16, d.w.shape[0], rng) for i, d in enumerate(layers)}
    if floor is not None:
        feeds = {name: np.abs(x) for name, x in feeds.items()}
    batched = session.run(None, feeds)
    for r in range(16):
        alone = session.run(None, {name: x[r:r + 1] for name, x in feeds.items()})
        # Second of a pair, next to a row 100x larger or smaller: the batched kernel, other neighbours.
        pair = session.run(None, {name: x[[(r + 1) % 16, r]] for name, x in feeds.items()})
        for i in range(len(layers)):
            msg = f"{form}: row {r}, layer {i}"
            np.testing.assert_array_equal(pair[i][1], batched[i][r], err_msg=msg)
            if form in ONE_ROW_KERNEL_FORMS:
                bound = ONE_ROW_ROUNDING * np.abs(batched[i][r]).max()
                np.testing.assert_allclose(alone[i][0], batched[i][r], rtol=0, atol=bound, err_msg=msg)
            else:
                np.testing.assert_array_equal(alone[i][0], batched[i][r], err_msg=msg)
    # ...and the batch still matches the form's exact reference (small rows included, each to its own scale).
    for i, d in enumerate(layers):
        x = feeds[f"x{i}"]
        ref = get_form(form).reference(x, d) if floor is None else lifted_int_reference(x, d, floor)
        err = np.abs(batched[i] - ref).max(axis=1) / np.maximum(np.abs(ref).max(axis=1), 1e-30)
        assert err[np.abs(ref).max(axis=1) > 0].max() < 1e-3
        np.testing.assert_allclose(batched[i][4], ref[4], rtol=0, atol=1e-5)  # all-zero row: bias (+ lift) only


def test_row_emulation_is_the_per_row_formula():
    """Each row of `rowwise_quantize` is quantized with that row's own range, zero included; the product
    recovers every row to within half a code step, however small the row is next to the others."""
    x = _mixed_rows(8, 300, np.random.default_rng(1))
    q, scale, zp = rowwise_quantize(x)
    for r in range(8):
        qr, sr, zr = rowwise_quantize(x[r:r + 1])
        assert np.array_equal(qr[0], q[r]) and sr[0, 0] == scale[r, 0] and zr[0, 0] == zp[r, 0]
    recon = (q.astype(np.float64) - zp) * scale
    assert np.all(np.abs(recon - x) <= scale * 0.5 + 1e-12)
    assert zp[2, 0] == 0 and zp[3, 0] == 255 and not q[4].any()


def test_exact_reference_rows_do_not_depend_on_each_other():
    rng = np.random.default_rng(2)
    dense = _random_dense(8, 64, 5, rng)
    x = _mixed_rows(6, 64, rng)
    full = exact_int_reference(x, dense)
    for r in range(6):
        np.testing.assert_array_equal(exact_int_reference(x[r:r + 1], dense)[0], full[r])


def test_lifted_emulation_scales_each_nonnegative_row_to_its_own_max():
    """`lifted_row_quantize`: zero point 0, each row's max at code 255, every value within half a step; and the
    lifted reference (u = x + 1 with the column sums taken back) estimates x @ W as the plain one does."""
    rng = np.random.default_rng(6)
    u = np.abs(_mixed_rows(8, 300, rng))
    q, scale = lifted_row_quantize(u)
    assert (q.max(axis=1)[np.arange(8) != 4] == 255).all() and not q[4].any()
    assert np.all(np.abs(q * scale.astype(np.float64) - u) <= scale * 0.5 + 1e-12)
    dense = _random_dense(8, 300, 7, rng)
    x = rng.uniform(-1, 1, (5, 300)).astype(np.float32)
    exact = x.astype(np.float64) @ (dense.w.astype(np.float64) * dense.scale)
    lifted = lifted_int_reference(x + np.float32(1), dense, -1.0)
    plain = exact_int_reference(x, dense)
    assert np.abs(lifted - exact).max() < 2.5 * max(np.abs(plain - exact).max(), 1e-9)


@pytest.mark.parametrize("policy", ["d4pg", "dqn"])
@pytest.mark.parametrize("backend", ["onnx", "jax"])
def test_int8_executor_actions_do_not_depend_on_the_other_environments(backend, policy):
    """The regression the per-row quantizer fixes: a 256x3 int8 policy, half the observations 100x smaller.
    Batched, each row stays as close to fp32 as it is alone (a per-tensor scale gave the small rows ~75x
    the error). D4PG's (tanh, ELU) and DQN's (ReLU) networks: ONNX's batched graph lifts their inputs."""
    spec = (layer_norm_mlp_policy(24, [256, 256, 256], [-1.0] * 6, [1.0] * 6) if policy == "d4pg"
            else mlp_q_network(24, [256, 256, 256], 6))
    rng = np.random.default_rng(3)
    params = random_params(spec, 3)
    qp = quantize_params(params, "int8")
    obs = _mixed_rows(16, 24, rng)
    ex = make_executor(spec, qp, backend, batch_size=16)
    batched = ex(obs)
    # The other environments change (100x larger): the first eight actions stay the same, bit for bit.
    others = obs.copy()
    others[8:] = rng.normal(size=(8, 24)).astype(np.float32) * 100
    np.testing.assert_array_equal(ex(others)[:8], batched[:8])
    # Per row, batched is as close to fp32 as alone. Batch 1 runs its own graph (a fused per-tensor quantizer,
    # on ONNX without the lifted inputs of the batched graph): the same int8 policy, not bit for bit.
    alone = np.concatenate([ex(obs[r:r + 1]) for r in range(16)])
    ref = reference_apply(spec, dequantize_params(qp), obs)
    err_batched, err_alone = np.abs(batched - ref).max(axis=1), np.abs(alone - ref).max(axis=1)
    assert (err_batched <= err_alone * 1.5 + 5e-3 * np.ptp(ref)).all(), (err_batched, err_alone)
    assert np.abs(batched - ref).max() < 3e-2 * np.ptp(ref)


@pytest.mark.parametrize("wait", [True, False])
def test_batch_one_and_batched_graphs_both_follow_weight_updates(wait):
    """ONNX keeps a fused per-tensor graph for batch-1 calls and the per-row one for larger batches; an
    update must reach both, whichever was built first."""
    spec = layer_norm_mlp_policy(12, [64, 64], [-1.0], [1.0])
    rng = np.random.default_rng(4)

    def params(seed):
        r = np.random.default_rng(seed)
        p = {layer.name: {"w": r.normal(0, 1 / np.sqrt(k), (k, n)).astype(np.float32),
                          "b": r.normal(0, 0.1, n).astype(np.float32)}
             for layer, (k, n) in zip(spec.linear_layers, [(12, 64), (64, 64), (64, 1)])}
        for layer in spec.layers:
            if type(layer).__name__ == "LayerNorm":
                p[layer.name] = {"scale": np.ones(64, np.float32), "offset": np.zeros(64, np.float32)}
        return p

    obs = _mixed_rows(8, 12, rng)
    first, second = quantize_params(params(0), "int8"), quantize_params(params(1), "int8")
    ex = make_executor(spec, first, "onnx", batch_size=1)
    before = ex(obs)
    ex(obs[:1])
    ex.update(second, wait=wait)
    ex.wait_for_update()
    batched, alone = ex(obs), np.concatenate([ex(obs[r:r + 1]) for r in range(8)])
    ref = reference_apply(spec, dequantize_params(second), obs)
    assert np.abs(before - ref).max() > 0.1  # the update changed the policy...
    assert np.abs(batched - ref).max() / np.ptp(ref) < 3e-2  # ...and both graphs run the new weights
    assert np.abs(alone - ref).max() / np.ptp(ref) < 3e-2


@pytest.mark.parametrize("lifted", [False, True])
def test_the_row_quantizer_graph_is_its_numpy_twin_bit_for_bit(lifted):
    """`emit_row_quantize` (row statistics + one per-axis QuantizeLinear) gives `rowwise_quantize`'s codes, scales
    and zero points exactly, half-way ties (round half to even) and all-zero rows included; so does
    `emit_lifted_row_quantize` (non-negative input, zero point 0) with `lifted_row_quantize`."""
    from onnx import TensorProto, helper, numpy_helper

    from quarl.runtimes.kernel_forms import Graph, emit_lifted_row_quantize, emit_row_quantize, opset_imports

    g = Graph()
    outs = emit_lifted_row_quantize(g, "x", "l") if lifted else emit_row_quantize(g, "x", "l")
    if lifted:  # same outputs as the plain quantizer; its zero point is 0
        outs = (*outs, g.const("z0", np.zeros((1, 1), np.float32)))
    for out, name in zip(outs, ("q", "s", "z")):
        g.op("Identity", [out])
        g.nodes[-1].output[0] = name
    outputs = [helper.make_tensor_value_info(n, t, None)
               for n, t in (("q", TensorProto.UINT8), ("s", TensorProto.FLOAT), ("z", TensorProto.FLOAT))]
    model = helper.make_model(
        helper.make_graph(g.nodes, "rq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "k"])], outputs,
                          initializer=[numpy_helper.from_array(a, n) for n, a in g.inits.items()]),
        opset_imports=opset_imports(g.nodes, 17))
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for trial in range(60):
        rows, k = int(rng.integers(1, 20)), int(rng.integers(1, 3000))
        x = (rng.standard_normal((rows, k)) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
        if trial % 3 == 0:
            x = np.round(x * 4) / 4  # many exact half-code ties
        if trial % 5 == 0:
            x[0] = 0
        if lifted:
            x = np.abs(x)
        q, scale, neg_zp = session.run(None, {"x": x})
        if lifted:
            (q_ref, scale_ref), zp_ref = lifted_row_quantize(x), np.zeros((1, 1), np.float32)
        else:
            q_ref, scale_ref, zp_ref = rowwise_quantize(x)
        np.testing.assert_array_equal(q, q_ref)
        np.testing.assert_array_equal(scale, scale_ref)
        np.testing.assert_array_equal(-neg_zp, zp_ref)
