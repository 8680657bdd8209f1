"""The "Q head at 16 bits" actor (`launch.ptq_policy.GridPoint.head_bits`): every layer at the run's int precision but
the output layer, kept at 16 bits and run dequantized. It travels in a payload as it is built, and both runtimes
run the hidden layers on the integer kernel and the head in fp32."""
from __future__ import annotations

import numpy as np
import pytest

from launch.ptq_policy import GridPoint, output_layer, parse_row_name
from quarl.policy.reference import reference_apply
from quarl.policy.spec import mlp_q_network
from quarl.quant.calibration import quantize_for_actors
from quarl.quant.payload import decode_payload, encode_payload
from quarl.quant.quantization import QTensor, dequantize, quantize_params
from quarl.runtimes import make_executor
from quarl.runtimes.base import lower_params
from tests.quarl.helpers import random_params


def test_head_is_16_bit_and_the_other_layers_int8_through_payload_and_runtimes():
    spec = mlp_q_network(4, (32, 32), 3)
    params = random_params(spec, seed=1)
    point = parse_row_name("int8-head16")
    assert point == GridPoint("int8", "per-channel", 16) and point.name == "int8-head16"
    head = output_layer(spec)
    qp = quantize_for_actors(spec, params, point.precision, None, point.per_channel, {head: point.head_bits})
    widths = {name: (m["w"].bits, m["w"].values.dtype) for name, m in qp.tree.items() if isinstance(m["w"], QTensor)}
    assert widths.pop(head) == (16, np.dtype(np.int16))
    assert widths and set(widths.values()) == {(8, np.dtype(np.int8))}
    decoded = decode_payload(encode_payload(qp, version=3, spec=spec)).params  # a wider layer survives the wire
    assert qp.precision == decoded.precision == "int8" and decoded.tree[head]["w"].bits == 16
    lowered = lower_params(spec, decoded, ())
    assert lowered.dense[head].kind == "float" and {d.kind for n, d in lowered.dense.items() if n != head} == {"int"}
    np.testing.assert_array_equal(lowered.dense[head].w, dequantize(qp.tree[head]["w"]))
    obs = np.random.default_rng(2).normal(size=(64, 4)).astype(np.float32)
    fp32 = np.asarray(reference_apply(spec, params, obs))
    int8 = make_executor(spec, quantize_params(params, "int8"), "jax")(obs)
    for backend in ("jax", "onnx"):
        out = make_executor(spec, decoded, backend)(obs)
        assert np.all(np.isfinite(out)) and not np.array_equal(out, int8)  # the head is not the int8 one
        np.testing.assert_allclose(out, fp32, atol=0.05 * np.abs(fp32).max())


def test_bad_wider_heads_are_refused():
    spec = mlp_q_network(4, (8,), 2)
    params = random_params(spec)
    for name in ("fp32-head16", "int8-head8", "int8-head17", "int8-headx"):
        with pytest.raises(ValueError):
            parse_row_name(name)
    with pytest.raises(ValueError, match="not wider"):
        quantize_params(params, "int8", layer_bits={output_layer(spec): 4})
    with pytest.raises(ValueError, match="no module"):
        quantize_params(params, "int8", layer_bits={"nope": 16})


def test_launch_ptq_head_bits_keeps_the_output_layer_wider_in_every_int_row(tmp_path):
    from launch import ptq
    from quarl.quant.policy_io import save_policy
    from tests.quarl.test_evaluation import cartpole_q_network

    spec, params = cartpole_q_network()
    save_policy(tmp_path / "run", spec, params, task="CartPole-v1", agent="dqn", steps=10)
    flags = ["--checkpoint", str(tmp_path / "run"), "--bits", "8", "--include", "", "--episodes", "2", "--no-progress"]
    assert ptq.main([*flags, "--head-bits", "16", "--out", str(tmp_path / "h")]) == 0
    text = (tmp_path / "h" / "ptq.csv").read_text()  # fp32, then int8 per-tensor and per-channel with the head
    assert text.count("int-kernel, head int16 in fp32") == 2 and len(text.splitlines()) == 4
    assert "Every int row keeps the output layer at int16" in (tmp_path / "h" / "ptq.md").read_text()
    for bad in ("8", "17", "12,16"):  # not wider than the kernels, no such width, two widths: one line, exit 2
        with pytest.raises(SystemExit) as exc:
            ptq.main([*flags, "--head-bits", bad, "--out", str(tmp_path / bad)])
        assert exc.value.code == 2
