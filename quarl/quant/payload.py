"""The weight payload: the bytes a learner broadcasts to actors (and nothing else crosses that boundary).

Layout (all integers little-endian):

    MAGIC b"QRLP" | format version: uint16 | body length: uint64 | SHA-256(body): 32 bytes | body

The body is msgpack (bin type for raw bytes, never pickle): a map with `precision`, `per_channel`,
`version` (the learner step the weights come from), `spec` (`PolicySpec.to_dict()` or nil), `spec_hash`
(`PolicySpec.digest()` or nil; format 3: actor payloads carry only this, saved policies the whole spec) and `leaves`,
a list of `{"path": [keys...], "array": A}` or `{"path": [...], "qtensor": {"values": A, "scale": A,
"zero_point": A or nil (symmetric), "bits", "axis", "symmetric"}}` where
`A = {"dtype": name, "shape": [...], "data": bytes}`; format 4 adds `activation_ranges`: nil, or a map
{layer name: A float32 [lo, hi]} of the calibrated input ranges int conv actors quantize activations with
(`quarl.quant.calibration`). A conv policy's int weights without them are refused by every runtime ("int conv
policies need calibrated activation ranges"), so a format-3 payload cannot drive an int conv actor. Format 5 adds
`extras`: nil, or a map {name: A float32, 1-D, finite} of what an agent's actors need beside the network's weights
(PPO's Gaussian log-std on continuous tasks: `BuilderBase.payload_extras`), never quantized.
QTensor `values` of fewer than 8 bits are bit-packed (format version 2): `data` holds the codes in C order, `bits` bits each, low-bit first (`quarl.quant.bitpack`),
signed codes offset by 2^(bits-1); `dtype` names the decoded dtype (int8 / uint8). An int4 policy thus costs
half a byte per weight, not a byte. Version-1 payloads (one byte per code), version-2 payloads (no
`spec_hash`) and version-3 payloads (no `activation_ranges`), otherwise identical, still decode.

Why this shape: actors may run on other hosts and must be able to refuse anything that is not a valid
policy (a corrupted, truncated, stale-format or hostile payload) with a clear error instead of acting on
garbage. The checksum catches corruption, the format version catches mismatched deployments, the dtype
allowlist plus shape/length checks keep decoding to `np.frombuffer` views (fast, no code execution), and
NaN/inf checks keep non-finite weights out of the policy.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
from typing import Mapping

import msgpack
import numpy as np

from quarl.policy.spec import ParamTree, PolicySpec
from quarl.quant.precision import parse_precision
from quarl.quant.quantization import ParamLeaf, QTensor, QuantizedParams, is_quantized_leaf, path_str, tree_items
from quarl.quant.wire import (
    FLOAT_NAMES, PayloadError, Unpacked, decode_array, decode_qtensor, encode_array, encode_values, exact_keys, expect,
    is_int, short,
)

MAGIC = b"QRLP"
FORMAT_VERSION = 5  # 2: sub-byte codes bit-packed; 3: `spec_hash`; 4: `activation_ranges`; 5: `extras`
# Versions 1 (one byte per code) to 4 are still read: saved policies (`policy_fp32.qrlp`) of older runs stay usable.
READABLE_FORMATS = (1, 2, 3, 4, 5)
_HEADER = struct.Struct("<4sHQ32s")  # magic, format version, body length, sha256(body)
HEADER_SIZE = _HEADER.size


@dataclasses.dataclass(frozen=True)
class Payload:
    """A decoded payload. `params` arrays are read-only views of the received bytes (zero-copy)."""

    version: int
    precision: str
    params: QuantizedParams
    spec: PolicySpec | None
    nbytes: int
    spec_hash: str | None = None  # the policy spec's digest (also set when the payload carries the whole spec)
    extras: dict[str, np.ndarray] | None = None  # beside the weights, e.g. {"log_std": ...} (format 5)


# --------------------------------------------------------------------------------------------------- encode


def _encode_leaf(path: tuple[str, ...], leaf: ParamLeaf) -> dict:
    where = f"param {path_str(path)!r}"
    if isinstance(leaf, QTensor):
        if leaf.symmetric and np.any(np.asarray(leaf.zero_point) != 0):
            raise ValueError(f"{where}: symmetric QTensor with a non-zero zero point")
        q = {
            "values": encode_values(leaf, f"{where} values"),
            "scale": encode_array(leaf.scale, f"{where} scale"),
            # Symmetric zero points are all 0 by definition: nil on the wire saves 4 bytes per channel.
            "zero_point": None if leaf.symmetric else encode_array(leaf.zero_point, f"{where} zero_point"),
            "bits": int(leaf.bits),
            "axis": None if leaf.axis is None else int(leaf.axis),
            "symmetric": bool(leaf.symmetric),
        }
        try:  # a hand-built QTensor (wrong dtype, shape, code range) must fail here, not on every actor
            decode_qtensor(q, where)
        except PayloadError as e:
            raise ValueError(f"cannot encode {str(e).removeprefix('malformed payload: ')}") from None
        return {"path": list(path), "qtensor": q}
    return {"path": list(path), "array": encode_array(leaf, where, floats_only=True)}


def encode_payload(qp: QuantizedParams, *, version: int, spec: PolicySpec | None = None,
                   spec_hash: str | None = None, extras: Mapping[str, np.ndarray] | None = None) -> bytes:
    """Serialise `qp` (plus the learner step `version`, the policy spec or only its digest, and the agent's
    `extras`) for actors. Raises ValueError on arguments that would not decode (bad types, non-finite leaves or
    extras, odd dtypes)."""
    if not isinstance(qp, QuantizedParams):
        raise ValueError(f"encode_payload expects QuantizedParams, got {type(qp).__name__}")
    body = _body(qp.precision, qp.per_channel, version, spec, spec_hash)
    body["activation_ranges"] = _encode_ranges(qp.activation_ranges)
    body["extras"] = _encode_extras(extras)
    body["leaves"] = [_encode_leaf(path, leaf) for path, leaf in tree_items(qp.tree)]
    packed = msgpack.packb(body, use_bin_type=True)
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(packed), hashlib.sha256(packed).digest()) + packed


def _encode_ranges(ranges: object) -> dict | None:
    if ranges is None:
        return None
    if not isinstance(ranges, dict) or not all(isinstance(k, str) for k in ranges):
        raise ValueError("activation_ranges must be a dict {layer name: [lo, hi]}")
    out = {}
    for name, r in sorted(ranges.items()):
        arr = np.asarray(r, np.float32)
        if arr.shape != (2,) or not np.isfinite(arr).all() or not arr[0] <= 0.0 <= arr[1]:
            raise ValueError(f"activation range of {name!r} must be finite [lo, hi] with lo <= 0 <= hi, got {r!r}")
        out[name] = encode_array(arr, f"activation range {name!r}")
    return out


def _encode_extras(extras: Mapping[str, np.ndarray] | None) -> dict | None:
    if not extras:
        return None
    out = {}
    for name, value in sorted(extras.items()):
        arr = np.asarray(value, np.float32)
        if not isinstance(name, str) or not name or arr.ndim != 1 or not np.isfinite(arr).all():
            raise ValueError(f"payload extra {name!r} must be a named 1-D array of finite values, got {value!r}")
        out[name] = encode_array(arr, f"extra {name!r}")
    return out


def _decode_extras(d: Unpacked) -> dict[str, np.ndarray] | None:
    if d is None:
        return None
    expect(isinstance(d, dict) and all(isinstance(k, str) and k for k in d), "extras is not a map of names")
    out = {}
    for name, entry in d.items():
        where = f"extra {short(name)}"
        arr = decode_array(entry, where)
        expect(arr.dtype == np.float32 and arr.ndim == 1, f"{where} is not a 1-D float32 array")
        expect(bool(np.isfinite(arr).all()), f"{where} has non-finite values")
        out[name] = arr
    return out


def _decode_ranges(d: Unpacked) -> dict[str, np.ndarray] | None:
    if d is None:
        return None
    expect(isinstance(d, dict) and all(isinstance(k, str) for k in d), "activation_ranges is not a map")
    out = {}
    for name, entry in d.items():
        where = f"activation range {short(name)}"
        arr = decode_array(entry, where)
        expect(arr.dtype == np.float32 and arr.shape == (2,), f"{where} is not float32 [lo, hi]")
        expect(bool(arr[0] <= 0.0 <= arr[1]), f"{where} does not satisfy lo <= 0 <= hi")
        out[name] = arr
    return out


def _body(precision: str, per_channel: bool, version: int, spec: PolicySpec | None,
          spec_hash: str | None) -> dict:
    """The body's fields other than `leaves`, checked."""
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or not 0 <= version < 2**63:
        raise ValueError(f"version must be an int in [0, 2^63), got {short(version)}")
    if spec is not None and not isinstance(spec, PolicySpec):
        raise ValueError(f"spec must be a PolicySpec or None, got {type(spec).__name__}")
    if spec_hash is not None and not (isinstance(spec_hash, str) and _is_digest(spec_hash)):
        raise ValueError(f"spec_hash must be a hex SHA-256 digest, got {short(spec_hash)}")
    if spec is not None and spec_hash is not None and spec.digest() != spec_hash:
        raise ValueError("spec_hash is not the digest of spec")
    return {"precision": parse_precision(precision).name, "per_channel": bool(per_channel), "version": int(version),
            "spec": None if spec is None else spec.to_dict(),
            "spec_hash": spec_hash if spec_hash is not None else (None if spec is None else spec.digest())}


def _is_digest(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def fp32_payload_nbytes(params: ParamTree, *, version: int = 0, spec_hash: str | None = None) -> int:
    """Size of the fp32 payload of a params tree (the baseline quantized payloads are compared to), computed
    from the leaves' shapes: the msgpack skeleton with empty data plus each leaf's 4 bytes per value and its
    longer bin header. Exactly `len(encode_payload(quantize_params(params, "fp32"), ...))`, without making
    the 4-bytes-per-weight copy (33 MB for a 2048x3 policy)."""
    body = _body("fp32", True, version, None, spec_hash)
    body["activation_ranges"] = body["extras"] = None
    leaves, sizes = [], []
    for path, leaf in tree_items(params):
        shape = [int(d) for d in np.shape(leaf)]
        leaves.append({"path": list(path), "array": {"dtype": "float32", "shape": shape, "data": b""}})
        sizes.append(4 * math.prod(shape))
    body["leaves"] = leaves
    size = len(msgpack.packb(body, use_bin_type=True))
    return HEADER_SIZE + size + sum(n + _bin_header(n) - _bin_header(0) for n in sizes)


def _bin_header(n: int) -> int:
    """Bytes msgpack spends on the header of an n-byte bin (bin 8 / bin 16 / bin 32)."""
    return 2 if n < 2**8 else 3 if n < 2**16 else 5


# --------------------------------------------------------------------------------------------------- decode


def _insert(tree: dict, path: list[str], leaf: QTensor | np.ndarray) -> None:
    node = tree
    for key in path[:-1]:
        node = node.setdefault(key, {})
        expect(isinstance(node, dict), f"path {short(path_str(tuple(path)))} runs through a leaf")
    expect(path[-1] not in node, f"duplicate or conflicting path {short(path_str(tuple(path)))}")
    node[path[-1]] = leaf


def _decode_body(obj: Unpacked, nbytes: int, packed: bool, fmt: int) -> Payload:
    keys = {"precision", "per_channel", "version", "spec", "leaves"}
    keys |= {"spec_hash"} if fmt >= 3 else set()
    keys |= {"activation_ranges"} if fmt >= 4 else set()
    keys |= {"extras"} if fmt >= 5 else set()
    body = exact_keys(obj, keys, "body")
    try:
        precision = parse_precision(body["precision"]) if isinstance(body["precision"], str) else None
    except ValueError:
        precision = None
    expect(precision is not None and precision.name == body["precision"],
            f"unknown precision {short(body['precision'])}")
    expect(isinstance(body["per_channel"], bool), "per_channel is not a bool")
    version = body["version"]
    expect(is_int(version) and 0 <= version < 2**63, f"bad version {short(version)}")
    spec = None
    if body["spec"] is not None:
        expect(isinstance(body["spec"], dict), "spec is not a map")
        try:
            spec = PolicySpec.from_dict(body["spec"])
        except (ValueError, TypeError, AttributeError) as e:
            raise PayloadError(f"malformed payload: bad policy spec: {e}") from None
    spec_hash = body.get("spec_hash")
    expect(spec_hash is None or (isinstance(spec_hash, str) and _is_digest(spec_hash)),
            f"bad spec_hash {short(spec_hash)}")
    if spec is not None:
        expect(spec_hash is None or spec_hash == spec.digest(), "spec_hash is not the digest of spec")
        spec_hash = spec.digest()
    expect(isinstance(body["leaves"], list), "leaves is not a list")
    tree: dict = {}
    for i, entry in enumerate(body["leaves"]):
        expect(isinstance(entry, dict) and len(entry) == 2 and "path" in entry, f"leaf #{i} is malformed")
        path = entry["path"]
        expect(isinstance(path, list) and path and all(isinstance(k, str) for k in path),
                f"leaf #{i} has a bad path {short(path)}")
        where = f"param {short(path_str(tuple(path)))}"
        leaf: QTensor | np.ndarray
        if "qtensor" in entry:
            leaf = decode_qtensor(entry["qtensor"], where, packed=packed)
            # A layer may be kept wider than the payload's precision (a 16-bit Q head in an int8 policy), never
            # narrower: the precision is what every other layer is quantized to.
            expect(precision.is_int and leaf.bits >= precision.bits,
                    f"{where}: {leaf.bits}-bit QTensor in a {precision.name} payload")
        elif "array" in entry:
            leaf = decode_array(entry["array"], where)
            expect(leaf.dtype.name in FLOAT_NAMES,
                    f"{where}: parameter leaves must be floating point, got {leaf.dtype}")
            expect(not (precision.is_int and is_quantized_leaf(tuple(path), leaf)),
                    f"{where}: unquantized weight matrix in a {precision.name} payload")
        else:
            raise PayloadError(f"malformed payload: leaf #{i} is neither an array nor a qtensor")
        _insert(tree, path, leaf)
    ranges = _decode_ranges(body.get("activation_ranges"))
    expect(ranges is None or precision.is_int, f"activation ranges in a {precision.name} payload")
    params = QuantizedParams(tree, precision.name, body["per_channel"], ranges)
    return Payload(version, precision.name, params, spec, nbytes, spec_hash, _decode_extras(body.get("extras")))


def decode_payload(data: bytes) -> Payload:
    """Verify and decode a payload. Every problem raises `PayloadError` (a ValueError) saying what is wrong;
    nothing else escapes, so an actor can drop a bad payload and keep its current weights."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PayloadError(f"payload must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < HEADER_SIZE:
        raise PayloadError(f"payload truncated: {len(data)} bytes is shorter than the {HEADER_SIZE}-byte header")
    magic, fmt, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise PayloadError(f"not a weight payload: magic {magic!r}, expected {MAGIC!r}")
    if fmt not in READABLE_FORMATS:
        raise PayloadError(f"unsupported payload format version {fmt} (this build reads "
                           f"{', '.join(map(str, READABLE_FORMATS))})")
    body = memoryview(data)[HEADER_SIZE:]
    if len(body) != length:
        what = "truncated" if len(body) < length else "has trailing bytes"
        raise PayloadError(f"payload {what}: header says {length} body bytes, got {len(body)}")
    if hashlib.sha256(body).digest() != digest:
        raise PayloadError("payload checksum mismatch (corrupted in transit or storage)")
    try:
        # raw=False: strings stay str and bin stays bytes; the C unpacker caps lengths at the input size.
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except Exception as e:  # msgpack raises several unrelated types for bad input; all mean "malformed"
        raise PayloadError(f"malformed payload: body is not valid msgpack ({type(e).__name__}: {e})") from None
    try:
        return _decode_body(obj, len(data), packed=fmt >= 2, fmt=fmt)
    except PayloadError:
        raise
    except (TypeError, ValueError, KeyError, OverflowError) as e:  # defensive: a check we did not foresee
        raise PayloadError(f"malformed payload: {type(e).__name__}: {e}") from None
