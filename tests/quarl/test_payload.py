"""The weight payload codec: exact round trips, size, and refusal of every kind of bad input."""
from __future__ import annotations

import dataclasses

import hashlib
import pickle
import struct

import haiku as hk
import jax
import jax.numpy as jnp
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quarl.nets.haiku import haiku_forward
from quarl.policy.spec import layer_norm_mlp_policy, mlp_q_network
from quarl.quant.payload import (
    FORMAT_VERSION, HEADER_SIZE, MAGIC, Payload, PayloadError, decode_payload, encode_payload, fp32_payload_nbytes,
)
from quarl.quant.quantization import QTensor, QuantizedParams, quantize, quantize_params, tree_items

PRECISIONS = ["fp32", "fp16", "bf16", "int8", "int4"]


def _init(spec) -> dict:
    net = hk.without_apply_rng(hk.transform(lambda x: haiku_forward(spec)(x)))
    return net.init(jax.random.PRNGKey(0), jnp.zeros((1, spec.input_dim), jnp.float32))


def _d4pg_spec(obs: int, hidden: list[int], act: int):
    return layer_norm_mlp_policy(obs, hidden, [-1.0] * act, [1.0] * act)


def _frame(body: bytes, *, magic: bytes = MAGIC, fmt: int = FORMAT_VERSION) -> bytes:
    """Independent re-implementation of the documented header, to craft payloads with valid checksums."""
    return struct.pack("<4sHQ32s", magic, fmt, len(body), hashlib.sha256(body).digest()) + body


def _body(data: bytes) -> dict:
    return msgpack.unpackb(data[HEADER_SIZE:], raw=False)


def _reframe(body: dict) -> bytes:
    return _frame(msgpack.packb(body, use_bin_type=True))


def _assert_same_tree(a: dict, b: dict) -> None:
    items_a, items_b = list(tree_items(a)), list(tree_items(b))
    assert [p for p, _ in items_a] == [p for p, _ in items_b]
    for (path, x), (_, y) in zip(items_a, items_b):
        assert type(x) is type(y), path
        if isinstance(x, QTensor):
            assert (x.bits, x.axis, x.symmetric) == (y.bits, y.axis, y.symmetric)
            for field in ("values", "scale", "zero_point"):
                u, v = getattr(x, field), getattr(y, field)
                assert u.dtype == v.dtype and u.shape == v.shape, (path, field)
                np.testing.assert_array_equal(u, v)
        else:
            assert x.dtype == y.dtype and x.shape == y.shape, path
            np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def small():
    spec = _d4pg_spec(3, [4], 2)
    return spec, _init(spec)


@pytest.fixture(scope="module")
def small_payload(small) -> bytes:
    spec, params = small
    return encode_payload(quantize_params(params, "int8"), version=7, spec=spec)


# ---------------------------------------------------------------------------------------------- round trip


@pytest.fixture(scope="module")
def medium():
    spec = _d4pg_spec(11, [32, 16], 3)
    return spec, _init(spec)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("per_channel", [True, False])
def test_round_trip_is_exact(medium, precision, per_channel):
    spec, params = medium
    qp = quantize_params(params, precision, per_channel=per_channel)
    data = encode_payload(qp, version=12345, spec=spec)
    p = decode_payload(data)
    assert isinstance(p, Payload)
    assert (p.version, p.precision, p.spec, p.nbytes) == (12345, precision, spec, len(data))
    assert p.params.precision == precision and p.params.per_channel == per_channel
    _assert_same_tree(qp.tree, p.params.tree)


def test_round_trip_without_spec_affine_qtensor_and_bytearray():
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    tree = {"layer": {"w": quantize(x, 4, symmetric=False, axis=0), "b": np.zeros(3, np.float32)}}
    qp = QuantizedParams(tree, "int4", per_channel=True)
    p = decode_payload(bytearray(encode_payload(qp, version=0)))
    assert p.spec is None and p.version == 0
    _assert_same_tree(tree, p.params.tree)


def test_decoded_arrays_are_read_only_views(small_payload):
    w = decode_payload(small_payload).params.tree["linear_0"]["w"]
    assert not w.values.flags.writeable
    with pytest.raises(ValueError):
        w.values[0, 0] = 1


def test_encoding_is_deterministic(small):
    spec, params = small
    qp = quantize_params(params, "int8")
    assert encode_payload(qp, version=1, spec=spec) == encode_payload(qp, version=1, spec=spec)


# -------------------------------------------------------------------------------------------------- size


@pytest.fixture(scope="module")
def paper_policy():
    """The paper's D4PG policy size (walker: 24 observations, 6 actions), initialised once for the size tests."""
    spec = _d4pg_spec(24, [2048, 2048, 2048], 6)
    return spec, _init(spec)


def test_int8_payload_of_large_mlp_is_at_least_3_9x_smaller(paper_policy):
    _, params = paper_policy
    fp32 = fp32_payload_nbytes(params)
    int8 = len(encode_payload(quantize_params(params, "int8"), version=1))
    fp16 = len(encode_payload(quantize_params(params, "fp16"), version=1))
    assert fp32 / int8 >= 3.9
    assert fp32 / fp16 >= 1.99


def test_int8_payload_of_256x3_mlp_is_close_to_the_ideal():
    """24 -> 256 -> 256 -> 256 -> 6 with fp32 biases/LayerNorm. The fp32-kept leaves alone cap the ratio
    at (4W + 4B) / (W + 4B) = 3.89x here, so the check is: >= 3.8x and < 1% framing/scale overhead."""
    params = _init(_d4pg_spec(24, [256, 256, 256], 6))
    weights = sum(np.size(l) for p, l in tree_items(params) if p[-1] == "w")
    others = sum(np.size(l) for p, l in tree_items(params) if p[-1] != "w")
    fp32 = fp32_payload_nbytes(params)
    int8 = len(encode_payload(quantize_params(params, "int8"), version=1))
    ideal = weights + 4 * others
    assert fp32 <= 4 * (weights + others) * 1.002
    assert int8 <= ideal * 1.03
    assert fp32 / int8 >= 3.75


def test_int4_payload_of_2048x3_policy_is_at_least_7x_smaller_than_fp32(paper_policy):
    """Packed nibbles make the weights 8x smaller; per-channel scales, fp32 biases/LayerNorm, the spec and
    framing keep the whole payload above 7x."""
    spec, params = paper_policy
    fp32 = fp32_payload_nbytes(params)
    int4 = encode_payload(quantize_params(params, "int4"), version=1, spec=spec)
    int8 = encode_payload(quantize_params(params, "int8"), version=1, spec=spec)
    weights = sum(np.size(l) for p, l in tree_items(params) if p[-1] == "w")
    assert fp32 / len(int4) >= 7.0
    assert len(int8) - len(int4) >= weights // 2  # the saving is the packing: half a byte per weight
    p = decode_payload(int4)  # and it decodes to the very codes that were quantized
    for name in ("linear_0", "linear_1", "linear_2", "linear_3"):
        np.testing.assert_array_equal(p.params.tree[name]["w"].values,
                                      quantize_params(params, "int4").tree[name]["w"].values)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7, 3), (4, 8)])  # odd counts leave padding bits
def test_sub_byte_codes_pack_exactly(bits, symmetric, shape):
    rng = np.random.default_rng(bits * 100 + shape[0])
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 0] = 3.0  # the extreme codes appear (the per-tensor maximum maps to the top code)
    x[-1, -1] = -3.0
    q = quantize(x, bits, symmetric=symmetric, axis=-1)
    tree = {"l": {"w": q, "b": np.zeros(shape[1], np.float32)}}
    data = encode_payload(QuantizedParams(tree, f"int{bits}", True), version=1)
    body = _body(data)
    values = _leaf(body, ["l", "w"])["qtensor"]["values"]
    assert len(values["data"]) == -(-q.values.size * bits // 8)
    out = decode_payload(data).params.tree["l"]["w"]
    assert out.values.dtype == q.values.dtype and not out.values.flags.writeable
    np.testing.assert_array_equal(out.values, q.values)


def test_format_version_1_payloads_with_one_byte_per_code_still_decode(small):
    """Policies saved by older builds (format 1: sub-byte codes one per byte) stay readable."""
    spec, params = small
    qp = quantize_params(params, "int4")
    body = _body(encode_payload(qp, version=3, spec=spec))
    del body["spec_hash"], body["activation_ranges"], body["extras"]  # formats 1 and 2 had none of them
    for path, leaf in tree_items(qp.tree):
        if isinstance(leaf, QTensor):
            _leaf(body, list(path))["qtensor"]["values"]["data"] = np.asarray(leaf.values).tobytes()
    old = _frame(msgpack.packb(body, use_bin_type=True), fmt=1)
    p = decode_payload(old)
    assert p.version == 3 and p.spec == spec
    _assert_same_tree(qp.tree, p.params.tree)
    with pytest.raises(PayloadError, match="needs 6 bytes, got 12"):  # the same body read as format 2
        decode_payload(_frame(msgpack.packb(body, use_bin_type=True), fmt=2))


def test_packed_codes_with_bad_length_or_padding_are_refused(small):
    _, params = small
    body = _body(encode_payload(quantize_params(params, "int3"), version=1))  # linear_0/w: 3x4 -> 36 bits
    v = _leaf(body, ["linear_0", "w"])["qtensor"]["values"]
    good = v["data"]
    assert len(good) == 5
    for data, match in ((good[:-1], "needs 5 bytes, got 4"), (good + b"\x00", "needs 5 bytes, got 6"),
                        (good[:-1] + bytes([good[-1] | 0x80]), "padding")):
        v["data"] = data
        with pytest.raises(PayloadError, match=match):
            decode_payload(_reframe(body))
    v.update(data=good, dtype="float32")
    with pytest.raises(PayloadError, match="cannot decode to float32"):
        decode_payload(_reframe(body))


def test_encode_refuses_codes_that_would_not_fit_their_bits():
    q = quantize(np.ones((2, 3), np.float32), 4)
    for values, match in ((np.full((2, 3), 8, np.int8), "code range"),  # would wrap to -8 -> wrong weight
                          (np.full((2, 3), 1, np.int32), "does not match bits")):
        bad = QTensor(values, q.scale, q.zero_point, 4, None, True)
        with pytest.raises(ValueError, match=match):
            encode_payload(QuantizedParams({"l": {"w": bad}}, "int4", False), version=1)


# ------------------------------------------------------------------------------------------- bad payloads


def test_truncated_payloads_are_refused(small_payload):
    n = len(small_payload)
    for cut in sorted({0, 1, 3, 4, 5, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 1, n // 2, n - 1}):
        with pytest.raises(PayloadError, match="truncated"):
            decode_payload(small_payload[:cut])


def test_trailing_bytes_are_refused(small_payload):
    with pytest.raises(PayloadError, match="trailing"):
        decode_payload(small_payload + b"\x00")


def test_every_byte_bit_flip_is_refused(small_payload):
    rng = np.random.default_rng(0)
    for i in range(len(small_payload)):  # every byte, one random bit each
        corrupted = bytearray(small_payload)
        corrupted[i] ^= 1 << int(rng.integers(8))
        with pytest.raises(PayloadError):
            decode_payload(bytes(corrupted))


def test_wrong_magic_and_format_version(small_payload):
    body = small_payload[HEADER_SIZE:]
    with pytest.raises(PayloadError, match="magic"):
        decode_payload(_frame(body, magic=b"PKL\x00"))
    for fmt in (0, FORMAT_VERSION + 1):
        with pytest.raises(PayloadError, match=f"format version {fmt} \\(this build reads 1, 2, 3, 4, 5\\)"):
            decode_payload(_frame(body, fmt=fmt))
    with pytest.raises(PayloadError, match="checksum"):
        decode_payload(small_payload[:HEADER_SIZE - 1] + bytes([small_payload[HEADER_SIZE - 1] ^ 1]) + body)
    with pytest.raises(PayloadError, match="bytes"):
        decode_payload("not bytes")


def _leaf(body: dict, path: list[str]) -> dict:
    return next(e for e in body["leaves"] if e["path"] == path)


def _f32(values) -> bytes:
    return np.asarray(values, np.float32).tobytes()


def _mutations():
    """(name, mutate(body) in place, expected message) for crafted bodies with a valid checksum."""

    def scale_to(value):
        def mutate(body):
            a = _leaf(body, ["linear_0", "w"])["qtensor"]["scale"]
            a["data"] = _f32(np.full(a["shape"], value))
        return mutate

    def bias_to(value):
        def mutate(body):
            a = _leaf(body, ["linear_0", "b"])["array"]
            a["data"] = _f32(np.full(a["shape"], value))
        return mutate

    def set_in(path, key, value, sub):
        def mutate(body):
            _leaf(body, path)[sub][key] = value
        return mutate

    def rename_kind(body):
        entry = body["leaves"][0]
        entry["blob"] = entry.pop("array")

    def float_weight(body):
        entry = _leaf(body, ["linear_0", "w"])
        del entry["qtensor"]
        entry["array"] = {"dtype": "float32", "shape": [3, 4], "data": _f32(np.zeros((3, 4)))}

    return [
        ("nan scale", scale_to(np.nan), "NaN or inf"),
        ("inf scale", scale_to(np.inf), "NaN or inf"),
        ("zero scale", scale_to(0.0), "positive"),
        ("nan bias", bias_to(np.nan), "NaN or inf"),
        ("inf bias", bias_to(-np.inf), "NaN or inf"),
        ("unknown dtype", set_in(["linear_0", "b"], "dtype", "float64", "array"), "unknown dtype"),
        ("object dtype", set_in(["linear_0", "b"], "dtype", "object", "array"), "unknown dtype"),
        ("short data", set_in(["linear_0", "b"], "data", b"\x00" * 3, "array"), "needs 16 bytes"),
        ("shape mismatch", set_in(["linear_0", "b"], "shape", [5], "array"), "needs 20 bytes"),
        ("negative dim", set_in(["linear_0", "b"], "shape", [-4], "array"), "bad shape"),
        ("huge dim", set_in(["linear_0", "b"], "shape", [2**62, 2**62], "array"), "needs"),
        ("data not bytes", set_in(["linear_0", "b"], "data", "abcd" * 4, "array"), "raw bytes"),
        ("bits mismatch", set_in(["linear_0", "w"], "bits", 16, "qtensor"), "does not match bits"),
        ("bits narrower", set_in(["linear_0", "w"], "bits", 4, "qtensor"), "packed 4-bit codes needs 6 bytes"),
        ("symmetric zero point", set_in(["linear_0", "w"], "zero_point", {}, "qtensor"), "zero point"),
        ("bad axis", set_in(["linear_0", "w"], "axis", 5, "qtensor"), "bad axis"),
        ("bool bits", set_in(["linear_0", "w"], "bits", True, "qtensor"), "bad bits"),
        ("values dtype", lambda b: _leaf(b, ["linear_0", "w"])["qtensor"]["values"].update(dtype="uint8"),
         "does not match"),
        ("precision", lambda b: b.update(precision="int9"), "int9 payload"),
        ("unknown precision", lambda b: b.update(precision="fp64"), "unknown precision"),
        ("alias precision", lambda b: b.update(precision="8"), "unknown precision"),
        ("version type", lambda b: b.update(version="7"), "bad version"),
        ("negative version", lambda b: b.update(version=-1), "bad version"),
        ("spec", lambda b: b.update(spec={"input_dim": 3}), "policy spec"),
        ("spec layers", lambda b: b.update(spec={"input_dim": 3, "layers": [{"kind": "conv"}]}), "policy spec"),
        ("spec inf dim", lambda b: b.update(spec={"input_dim": float("inf"), "layers": []}), "malformed"),
        ("extra key", lambda b: b.update(pickle=b"\x80"), "body has keys"),
        ("missing key", lambda b: b.pop("leaves"), "body has keys"),
        ("leaves type", lambda b: b.update(leaves={"a": 1}), "leaves is not a list"),
        ("empty path", lambda b: b["leaves"][0].update(path=[]), "bad path"),
        ("path type", lambda b: b["leaves"][0].update(path=["a", 3]), "bad path"),
        ("duplicate path", lambda b: b["leaves"].append(b["leaves"][0]), "duplicate"),
        ("through leaf", lambda b: b["leaves"].append({**b["leaves"][0], "path": ["linear_0", "b", "x"]}),
         "runs through a leaf"),
        ("neither", rename_kind, "neither"),
        ("unquantized weight", float_weight, "unquantized"),
        ("int map key", lambda b: b.update({0: 1}), "msgpack"),
    ]


@pytest.mark.parametrize("name, mutate, match", _mutations(), ids=[m[0] for m in _mutations()])
def test_crafted_bodies_with_valid_checksum_are_refused(small_payload, name, mutate, match):
    body = _body(small_payload)
    mutate(body)
    with pytest.raises(PayloadError, match=match):
        decode_payload(_reframe(body))


def test_values_outside_code_range_are_refused(small):
    _, params = small
    body = _body(encode_payload(quantize_params(params, "int8"), version=1))
    v = _leaf(body, ["linear_0", "w"])["qtensor"]["values"]
    v["data"] = np.full(v["shape"], -128, np.int8).tobytes()
    with pytest.raises(PayloadError, match="code range"):
        decode_payload(_reframe(body))
    # int4: the packed nibble 0 stands for code -8, outside the symmetric range [-7, 7].
    body = _body(encode_payload(quantize_params(params, "int4"), version=1))
    v = _leaf(body, ["linear_0", "w"])["qtensor"]["values"]
    v["data"] = bytes(len(v["data"]))
    with pytest.raises(PayloadError, match="code range"):
        decode_payload(_reframe(body))


def test_non_msgpack_body_is_refused():
    with pytest.raises(PayloadError, match="msgpack"):
        decode_payload(_frame(b"\xc1garbage"))
    with pytest.raises(PayloadError, match="msgpack"):
        decode_payload(_frame(msgpack.packb({"a": 1}) + b"\x01"))
    with pytest.raises(PayloadError, match="not a map"):
        decode_payload(_frame(msgpack.packb([1, 2, 3])))


def test_decoder_never_unpickles(monkeypatch, small_payload):
    def forbidden(*args, **kwargs):
        raise AssertionError("pickle used while decoding a payload")

    for name in ("loads", "load", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(np, "load", forbidden)
    p = decode_payload(small_payload)
    assert p.version == 7 and isinstance(p.params.tree["linear_0"]["w"], QTensor)
    # A pickle smuggled into a leaf's bytes is just an unknown dtype / wrong-length buffer, never executed.
    body = _body(small_payload)
    _leaf(body, ["linear_0", "b"])["array"].update(dtype="pickle", data=pickle.dumps(object))
    with pytest.raises(PayloadError, match="unknown dtype"):
        decode_payload(_reframe(body))


# ------------------------------------------------------------------------------------------------ encode


def test_encode_rejects_bad_arguments(small):
    spec, params = small
    qp = quantize_params(params, "int8")
    with pytest.raises(ValueError, match="QuantizedParams"):
        encode_payload(params, version=1)
    for bad in (-1, 1.5, True, "3", 2**63):
        with pytest.raises(ValueError, match="version"):
            encode_payload(qp, version=bad)
    with pytest.raises(ValueError, match="spec"):
        encode_payload(qp, version=1, spec=spec.to_dict())
    with pytest.raises(ValueError, match="l/b.*float64"):
        encode_payload(QuantizedParams({"l": {"b": np.zeros(2)}}, "fp32", True), version=1)
    with pytest.raises(ValueError, match="l/b.*NaN"):
        encode_payload(QuantizedParams({"l": {"b": np.array([np.nan], np.float32)}}, "fp32", True), version=1)
    with pytest.raises(ValueError, match="must be float"):
        encode_payload(QuantizedParams({"l": {"b": np.zeros(2, np.int8)}}, "fp32", True), version=1)
    w = quantize(np.ones((2, 2), np.float32), 8)
    bad_q = QTensor(w.values.astype(np.int32), w.scale, w.zero_point, 8, None, True)
    with pytest.raises(ValueError, match="cannot encode.*l/w"):
        encode_payload(QuantizedParams({"l": {"w": bad_q}}, "int8", False), version=1)


def test_dqn_payload_with_big_endian_input_round_trips():
    params = _init(mlp_q_network(4, [8], 2))
    params = jax.tree.map(lambda a: np.asarray(a).astype(">f4"), params)
    qp = quantize_params(params, "fp32")
    p = decode_payload(encode_payload(qp, version=3))
    np.testing.assert_array_equal(p.params.tree["linear_0"]["w"], np.asarray(params["linear_0"]["w"]))


# -------------------------------------------------------------------------------------------------- fuzz


def _mutate_bytes(data: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    buf = bytearray(data)
    for kind, pos, val in ops:
        if not buf:
            break
        pos %= len(buf)
        if kind == 0:
            buf[pos] = val
        elif kind == 1:
            del buf[pos:]
        elif kind == 2:
            buf.insert(pos, val)
        else:
            del buf[pos]
    return bytes(buf)


_ops = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**16), st.integers(0, 255)), min_size=1, max_size=6)
_msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=16)
    | st.sampled_from(["int8", "float32", "bfloat16", "linear_0", "w", "fp32", "linear", "tanh_to_spec", "elu"]),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["precision", "per_channel", "version", "spec", "leaves", "path", "array",
                                     "qtensor", "dtype", "shape", "data", "values", "scale", "zero_point",
                                     "bits", "axis", "symmetric", "input_dim", "layers", "kind", "name",
                                     "out", "fn", "minimum", "maximum", "init_scale"]), children, max_size=6),
    max_leaves=20,
)


def _decode_only_payload_errors(data: bytes) -> None:
    try:
        decode_payload(data)
    except PayloadError:
        pass


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=400), ops=_ops, reframe=st.booleans())
def test_fuzz_random_and_mutated_bytes_only_raise_payload_error(small_payload, raw, ops, reframe):
    _decode_only_payload_errors(raw)
    _decode_only_payload_errors(MAGIC + raw)
    mutated = _mutate_bytes(small_payload, ops)
    _decode_only_payload_errors(mutated)
    if reframe:  # mutate the body and fix the checksum, so the body parser itself is exercised
        _decode_only_payload_errors(_frame(_mutate_bytes(small_payload[HEADER_SIZE:], ops)))


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=_msgpack_values, leaf=_msgpack_values, key=st.sampled_from(["leaves", "spec", "precision", "version"]))
def test_fuzz_structured_bodies_only_raise_payload_error(small_payload, obj, leaf, key):
    _decode_only_payload_errors(_frame(msgpack.packb(obj, use_bin_type=True)))
    body = _body(small_payload)
    body[key] = obj
    _decode_only_payload_errors(_reframe(body))
    body = _body(small_payload)
    body["leaves"][0]["array" if "array" in body["leaves"][0] else "qtensor"] = leaf
    _decode_only_payload_errors(_reframe(body))


def test_fp32_size_is_computed_exactly_without_encoding():
    from quarl.quant.payload import fp32_payload_nbytes
    from quarl.quant.quantization import quantize_params as qp_

    rng = np.random.default_rng(0)
    for widths in ((3, 5), (40, 300), (300, 70000)):  # bin 8, bin 16 and bin 32 leaf sizes
        params = {"linear_0": {"w": rng.normal(size=widths).astype(np.float32),
                               "b": rng.normal(size=widths[1]).astype(np.float32)},
                  "layer_norm": {"scale": np.ones(widths[1], np.float32)}}
        for version, digest in ((0, None), (123456, "ab" * 32)):
            encoded = encode_payload(qp_(params, "fp32"), version=version, spec_hash=digest)
            assert fp32_payload_nbytes(params, version=version, spec_hash=digest) == len(encoded)


def test_actor_payload_carries_the_spec_digest_not_the_spec():
    from quarl.policy.spec import layer_norm_mlp_policy

    spec = layer_norm_mlp_policy(3, (8, 8), [-1.0], [1.0])
    other = layer_norm_mlp_policy(3, (8, 4), [-1.0], [1.0])
    assert spec.digest() == layer_norm_mlp_policy(3, (8, 8), [-1.0], [1.0]).digest() != other.digest()
    params = {"linear_0": {"w": np.ones((3, 8), np.float32), "b": np.zeros(8, np.float32)}}
    light = encode_payload(quantize_params(params, "int8"), version=1, spec_hash=spec.digest())
    full = encode_payload(quantize_params(params, "int8"), version=1, spec=spec)
    assert len(light) < len(full)
    decoded = decode_payload(light)
    assert decoded.spec is None and decoded.spec_hash == spec.digest()
    assert decode_payload(full).spec_hash == spec.digest() and decode_payload(full).spec == spec
    with pytest.raises(ValueError, match="spec_hash"):
        encode_payload(quantize_params(params, "int8"), version=1, spec=spec, spec_hash=other.digest())


def test_activation_ranges_round_trip_and_format_3_payloads_still_decode(small):
    """Format 4 carries the calibrated activation ranges of int conv actors; format-3 payloads (MLP policies of
    older runs) still decode, without ranges."""
    spec, params = small
    qp = dataclasses.replace(quantize_params(params, "int8"),
                             activation_ranges={"linear_0": np.array([-1.5, 2.0], np.float32),
                                                "linear_1": np.array([0.0, 3.0], np.float32)})
    data = encode_payload(qp, version=5, spec=spec)
    p = decode_payload(data)
    assert set(p.params.activation_ranges) == {"linear_0", "linear_1"}
    np.testing.assert_array_equal(p.params.activation_ranges["linear_0"], [-1.5, 2.0])
    assert decode_payload(encode_payload(quantize_params(params, "int8"), version=1)).params.activation_ranges is None
    body = _body(data)
    del body["activation_ranges"], body["extras"]
    old = decode_payload(_frame(msgpack.packb(body, use_bin_type=True), fmt=3))
    assert old.params.activation_ranges is None and old.version == 5
    with pytest.raises(PayloadError, match="activation_ranges"):  # a format-4 body must say it has none
        decode_payload(_frame(msgpack.packb(body, use_bin_type=True), fmt=4))


@pytest.mark.parametrize("bad", [np.array([0.5, 2.0]), np.array([-1.0, np.nan]), np.array([0.0, 1.0, 2.0])])
def test_bad_activation_ranges_are_refused_both_ways(small, bad):
    spec, params = small
    qp = dataclasses.replace(quantize_params(params, "int8"), activation_ranges={"linear_0": bad})
    with pytest.raises(ValueError, match="activation range"):
        encode_payload(qp, version=1)
    good = dataclasses.replace(qp, activation_ranges={"linear_0": np.array([0.0, 1.0], np.float32)})
    body = _body(encode_payload(good, version=1))
    arr = np.asarray(bad, np.float32)
    body["activation_ranges"]["linear_0"] = {"dtype": "float32", "shape": list(arr.shape), "data": arr.tobytes()}
    with pytest.raises(PayloadError):
        decode_payload(_frame(msgpack.packb(body, use_bin_type=True)))


def test_extras_travel_beside_the_weights_unquantized_and_are_checked(small):
    """Format 5: an agent's extras (PPO's log-std) decode to the same float32 values; a format-4 body has none;
    non-finite or non-1-D extras are refused both ways."""
    spec, params = small
    qp = quantize_params(params, "int8")
    log_std = np.array([-0.5, -1.25], np.float32)
    p = decode_payload(encode_payload(qp, version=2, spec=spec, extras={"log_std": log_std}))
    np.testing.assert_array_equal(p.extras["log_std"], log_std)
    assert p.extras["log_std"].dtype == np.float32
    assert decode_payload(encode_payload(qp, version=2)).extras is None
    body = _body(encode_payload(qp, version=2))
    del body["extras"]
    assert decode_payload(_frame(msgpack.packb(body, use_bin_type=True), fmt=4)).extras is None
    for bad in (np.array([np.nan], np.float32), np.ones((2, 2), np.float32)):
        with pytest.raises(ValueError, match="extra 'log_std'"):
            encode_payload(qp, version=2, extras={"log_std": bad})
    body = _body(encode_payload(qp, version=2, extras={"log_std": log_std}))
    body["extras"]["log_std"]["data"] = np.array([np.inf, 0.0], np.float32).tobytes()
    with pytest.raises(PayloadError, match="extra .log_std. contains NaN or inf"):
        decode_payload(_frame(msgpack.packb(body, use_bin_type=True)))
