"""uint8 pixel policies (`PolicySpec.pixels`): every runtime takes the env's uint8 frames as they are, the static
int8 graph uses the pixels themselves as its first layer's codes (no float copy, no QuantizeLinear over the frame),
and observations that are not pixels are refused with a clear error."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from agents.dqn.actor import DQNActor, EpsilonSchedule
from quarl.policy.reference import reference_apply
from quarl.policy.spec import PolicySpec, minatar_q_network, mlp_q_network, nature_q_network
from quarl.quant.calibration import quantize_for_actors
from quarl.quant.quantization import dequantize_params, quantize_params
from quarl.runtimes import make_executor
from tests.quarl.helpers import random_params

INT8_TOLERANCE = 3e-2  # as tests/quarl/test_conv_runtimes.py


def _rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out.astype(np.float64) - ref).max() / max(np.ptp(ref), 1e-12))


@pytest.fixture(scope="module", params=["minatar", "nature"])
def case(request):
    """(spec, fp32 params, int8 params calibrated on pixels, test frames as uint8)."""
    rng = np.random.default_rng(0)
    if request.param == "minatar":
        spec, high = minatar_q_network((10, 10, 4), 6), 2
    else:
        spec, high = nature_q_network((84, 84, 4), 6), 256
    params = random_params(spec, 3)
    frames = rng.integers(0, high, (40, spec.input_dim), dtype=np.uint8)
    return spec, params, quantize_for_actors(spec, params, "int8", frames[:32]), frames[32:]


def test_spec_flag_json_and_validation():
    spec = nature_q_network((84, 84, 4), 6)
    assert spec.pixels and minatar_q_network((10, 10, 4), 3).pixels
    assert spec.to_dict()["pixels"] is True and PolicySpec.from_dict(spec.to_dict()) == spec
    assert "pixels" not in mlp_q_network(4, (8,), 2).to_dict()  # float policies keep their digests
    assert "pixels" not in dataclasses.replace(spec, pixels=False).to_dict()
    with pytest.raises(ValueError, match="image input_shape"):
        PolicySpec(4, mlp_q_network(4, (8,), 2).layers, pixels=True)
    with pytest.raises(ValueError, match="must be a bool"):
        dataclasses.replace(spec, pixels="yes")


def test_static_int8_graph_takes_the_pixels_as_codes(case):
    spec, _, qp, _ = case
    model = make_executor(spec, qp, "onnx", kernel_form="u8s8").model()
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.UINT8
    ops = [n.op_type for n in model.graph.node]
    first = ops.index("QLinearConv")
    assert ops[:first] == ["Reshape", "Transpose"]  # no Cast, Mul or QuantizeLinear over the frame
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert inits["conv_0.x_scale"] == np.float32(spec.input_scale or 1.0) and inits["conv_0.x_zp"] == 0
    # The float graphs cast the pixels in-graph (no host copy per step).
    fp32 = make_executor(spec, quantize_params(random_params(spec, 3), "fp32"), "onnx").model()
    assert fp32.graph.input[0].type.tensor_type.elem_type == TensorProto.UINT8
    assert fp32.graph.node[0].op_type == "Cast"


@pytest.mark.parametrize("backend", ["onnx", "jax"])
def test_uint8_and_float_pixels_give_the_same_outputs_within_tolerance(case, backend):
    spec, params, qp, frames = case
    floats = frames.astype(np.float32)
    for q, ref in ((quantize_params(params, "fp32"), reference_apply(spec, params, floats)),
                   (qp, reference_apply(spec, dequantize_params(qp), floats))):
        ex = make_executor(spec, q, backend, batch_size=len(frames))
        out = ex(frames)
        np.testing.assert_array_equal(out, ex(floats))  # integral floats are converted to the same uint8
        assert _rel_err(out, ref) < (1e-5 if q.precision == "fp32" else INT8_TOLERANCE), (backend, q.precision)


@pytest.mark.parametrize("bad, match", [(0.5, "integers in"), (256.0, "integers in"), (-1.0, "integers in"),
                                        (np.nan, "NaN or inf")])
def test_values_that_are_not_pixels_are_refused(case, bad, match):
    spec, _, qp, frames = case
    ex = make_executor(spec, qp, "onnx")
    obs = frames[:1].astype(np.float32)
    obs[0, 3] = bad
    with pytest.raises(ValueError, match=match):
        ex(obs)


def test_dqn_actor_acts_on_uint8_frames(case):
    spec, _, qp, frames = case
    images = frames.reshape(-1, *spec.input_shape)
    actor = DQNActor(spec, qp, num_actions=spec.output_dim, schedule=EpsilonSchedule.constant(0.0),
                     eval_epsilon=0.0, seed=0, backend="onnx", batch_size=len(images))
    actions = actor.act(images)[0]
    np.testing.assert_array_equal(actions, actor.act(images.astype(np.float32))[0])
    np.testing.assert_array_equal(actions, np.argmax(actor._executor(frames), axis=1))
    bad = images[:1].astype(np.int32)
    bad[0, 0, 0, 0] = 300
    with pytest.raises(ValueError, match="integers in"):
        actor.act(bad[:1])
