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
policies need calibrated activation ranges"), so a format-3 payload cannot drive an int conv actor.
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
from typing import Any

import ml_dtypes
import msgpack
import numpy as np

from quarl.policy.spec import PolicySpec
from quarl.quant.bitpack import MAX_PACKED_BITS, pack_bits, packed_nbytes, signed_offset, unpack_bits
from quarl.quant.precision import parse_precision
from quarl.quant.quantization import (
    QTensor, QuantizedParams, is_quantized_leaf, path_str, qrange, storage_dtype, tree_items,
)

MAGIC = b"QRLP"
FORMAT_VERSION = 4  # 2: sub-byte QTensor codes are bit-packed; 3: `spec_hash`; 4: `activation_ranges`
# Versions 1 (one byte per code) to 3 are still read: saved policies (`policy_fp32.qrlp`) of older runs stay usable.
READABLE_FORMATS = (1, 2, 3, 4)
_HEADER = struct.Struct("<4sHQ32s")  # magic, format version, body length, sha256(body)
HEADER_SIZE = _HEADER.size
_MAX_NDIM = 8

# Storage dtypes a payload may carry, by wire name. Explicit little-endian so payloads are host-independent.
DTYPES: dict[str, np.dtype] = {
    "int8": np.dtype("<i1"),
    "uint8": np.dtype("<u1"),
    "int16": np.dtype("<i2"),
    "uint16": np.dtype("<u2"),
    "int32": np.dtype("<i4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype("<f4"),
}
_FLOAT_NAMES = ("float16", "bfloat16", "float32")


class PayloadError(ValueError):
    """A payload that must not be used: truncated, corrupted, wrong format, malformed or non-finite."""


@dataclasses.dataclass(frozen=True)
class Payload:
    """A decoded payload. `params` arrays are read-only views of the received bytes (zero-copy)."""

    version: int
    precision: str
    params: QuantizedParams
    spec: PolicySpec | None
    nbytes: int
    spec_hash: str | None = None  # the policy spec's digest (also set when the payload carries the whole spec)


# --------------------------------------------------------------------------------------------------- encode


def _wire_name(arr: np.ndarray, where: str) -> str:
    name = arr.dtype.name  # byte-order free ('>f4' is 'float32'); encoding converts to little-endian
    if name not in DTYPES:
        raise ValueError(f"{where}: dtype {arr.dtype} cannot go in a payload (allowed: {', '.join(DTYPES)})")
    return name


def _encode_array(value: Any, where: str, *, floats_only: bool = False) -> dict:
    arr = np.asarray(value)
    name = _wire_name(arr, where)
    if floats_only and name not in _FLOAT_NAMES:
        raise ValueError(f"{where}: parameter leaves must be float16/bfloat16/float32, got {name}")
    if name in _FLOAT_NAMES and not np.all(np.isfinite(arr.astype(np.float32))):
        raise ValueError(f"{where} contains NaN or inf")
    data = np.ascontiguousarray(arr, dtype=DTYPES[name]).tobytes()
    return {"dtype": name, "shape": list(arr.shape), "data": data}


def _packs(bits: int) -> bool:
    """Codes narrower than a byte travel bit-packed; 8- and 16-bit codes are already their storage dtype."""
    return bits <= MAX_PACKED_BITS


def _encode_values(q: QTensor, where: str) -> dict:
    if not _packs(q.bits):
        return _encode_array(q.values, where)
    arr = np.asarray(q.values)
    name = _wire_name(arr, where)
    expected = storage_dtype(q.bits, q.symmetric)
    if arr.dtype != expected:  # the decoder would rebuild a different dtype
        raise ValueError(f"{where}: dtype {arr.dtype} does not match bits={q.bits} symmetric={q.symmetric}")
    lo, hi = qrange(q.bits, q.symmetric)
    if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
        raise ValueError(f"{where} outside the {q.bits}-bit code range [{lo}, {hi}]")
    offset = signed_offset(q.bits) if q.symmetric else 0
    data = pack_bits(arr.astype(np.int16) + offset, q.bits).tobytes()
    return {"dtype": name, "shape": list(arr.shape), "data": data}


def _encode_leaf(path: tuple[str, ...], leaf: Any) -> dict:
    where = f"param {path_str(path)!r}"
    if isinstance(leaf, QTensor):
        if leaf.symmetric and np.any(np.asarray(leaf.zero_point) != 0):
            raise ValueError(f"{where}: symmetric QTensor with a non-zero zero point")
        q = {
            "values": _encode_values(leaf, f"{where} values"),
            "scale": _encode_array(leaf.scale, f"{where} scale"),
            # Symmetric zero points are all 0 by definition: nil on the wire saves 4 bytes per channel.
            "zero_point": None if leaf.symmetric else _encode_array(leaf.zero_point, f"{where} zero_point"),
            "bits": int(leaf.bits),
            "axis": None if leaf.axis is None else int(leaf.axis),
            "symmetric": bool(leaf.symmetric),
        }
        try:  # a hand-built QTensor (wrong dtype, shape, code range) must fail here, not on every actor
            _decode_qtensor(q, where)
        except PayloadError as e:
            raise ValueError(f"cannot encode {str(e).removeprefix('malformed payload: ')}") from None
        return {"path": list(path), "qtensor": q}
    return {"path": list(path), "array": _encode_array(leaf, where, floats_only=True)}


def encode_payload(qp: QuantizedParams, *, version: int, spec: PolicySpec | None = None,
                   spec_hash: str | None = None) -> bytes:
    """Serialise `qp` (plus the learner step `version`, and the policy spec or only its digest) for actors.
    Raises ValueError on arguments that would not decode (bad types, non-finite leaves, odd dtypes)."""
    if not isinstance(qp, QuantizedParams):
        raise ValueError(f"encode_payload expects QuantizedParams, got {type(qp).__name__}")
    body = _body(qp.precision, qp.per_channel, version, spec, spec_hash)
    body["activation_ranges"] = _encode_ranges(qp.activation_ranges)
    body["leaves"] = [_encode_leaf(path, leaf) for path, leaf in tree_items(qp.tree)]
    packed = msgpack.packb(body, use_bin_type=True)
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(packed), hashlib.sha256(packed).digest()) + packed


def _encode_ranges(ranges: Any) -> dict | None:
    if ranges is None:
        return None
    if not isinstance(ranges, dict) or not all(isinstance(k, str) for k in ranges):
        raise ValueError("activation_ranges must be a dict {layer name: [lo, hi]}")
    out = {}
    for name, r in sorted(ranges.items()):
        arr = np.asarray(r, np.float32)
        if arr.shape != (2,) or not np.isfinite(arr).all() or not arr[0] <= 0.0 <= arr[1]:
            raise ValueError(f"activation range of {name!r} must be finite [lo, hi] with lo <= 0 <= hi, got {r!r}")
        out[name] = _encode_array(arr, f"activation range {name!r}")
    return out


def _decode_ranges(d: Any) -> dict[str, np.ndarray] | None:
    if d is None:
        return None
    _expect(isinstance(d, dict) and all(isinstance(k, str) for k in d), "activation_ranges is not a map")
    out = {}
    for name, entry in d.items():
        where = f"activation range {_short(name)}"
        arr = _decode_array(entry, where)
        _expect(arr.dtype == np.float32 and arr.shape == (2,), f"{where} is not float32 [lo, hi]")
        _expect(bool(arr[0] <= 0.0 <= arr[1]), f"{where} does not satisfy lo <= 0 <= hi")
        out[name] = arr
    return out


def _body(precision: str, per_channel: bool, version: int, spec: PolicySpec | None,
          spec_hash: str | None) -> dict:
    """The body's fields other than `leaves`, checked."""
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or not 0 <= version < 2**63:
        raise ValueError(f"version must be an int in [0, 2^63), got {_short(version)}")
    if spec is not None and not isinstance(spec, PolicySpec):
        raise ValueError(f"spec must be a PolicySpec or None, got {type(spec).__name__}")
    if spec_hash is not None and not (isinstance(spec_hash, str) and _is_digest(spec_hash)):
        raise ValueError(f"spec_hash must be a hex SHA-256 digest, got {_short(spec_hash)}")
    if spec is not None and spec_hash is not None and spec.digest() != spec_hash:
        raise ValueError("spec_hash is not the digest of spec")
    return {"precision": parse_precision(precision).name, "per_channel": bool(per_channel), "version": int(version),
            "spec": None if spec is None else spec.to_dict(),
            "spec_hash": spec_hash if spec_hash is not None else (None if spec is None else spec.digest())}


def _is_digest(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def fp32_payload_nbytes(params: dict, *, version: int = 0, spec_hash: str | None = None) -> int:
    """Size of the fp32 payload of a params tree (the baseline quantized payloads are compared to), computed
    from the leaves' shapes: the msgpack skeleton with empty data plus each leaf's 4 bytes per value and its
    longer bin header. Exactly `len(encode_payload(quantize_params(params, "fp32"), ...))`, without making
    the 4-bytes-per-weight copy (33 MB for a 2048x3 policy)."""
    body = _body("fp32", True, version, None, spec_hash)
    body["activation_ranges"] = None
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


def _expect(cond: bool, msg: str) -> None:
    if not cond:
        raise PayloadError(f"malformed payload: {msg}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(value: Any) -> str:
    """repr capped in length: error messages must stay one readable line even for hostile input."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _exact_keys(d: Any, required: set[str], what: str) -> None:
    _expect(isinstance(d, dict), f"{what} is not a map")
    _expect(set(d) == required, f"{what} has keys {_short(sorted(map(str, d)))}, expected {sorted(required)}")


def _decode_array(d: Any, where: str, *, packed_bits: int | None = None, signed: bool = False) -> np.ndarray:
    """One array; with `packed_bits`, `data` holds bit-packed codes (offset by 2^(bits-1) when `signed`)."""
    _exact_keys(d, {"dtype", "shape", "data"}, where)
    name, shape, data = d["dtype"], d["shape"], d["data"]
    if not isinstance(name, str) or name not in DTYPES:
        raise PayloadError(f"{where}: unknown dtype {_short(name)} (allowed: {', '.join(DTYPES)})")
    _expect(isinstance(shape, list) and len(shape) <= _MAX_NDIM and all(_is_int(s) and s >= 0 for s in shape),
            f"{where}: bad shape {_short(shape)}")
    _expect(isinstance(data, bytes), f"{where}: data is not raw bytes")
    dtype = DTYPES[name]
    count = math.prod(shape)  # Python ints: a hostile shape cannot overflow
    if packed_bits is not None:
        _expect(name in ("int8", "uint8"), f"{where}: packed {packed_bits}-bit codes cannot decode to {name}")
        if packed_nbytes(count, packed_bits) != len(data):
            raise PayloadError(f"{where}: shape {tuple(shape)} of packed {packed_bits}-bit codes needs "
                               f"{packed_nbytes(count, packed_bits)} bytes, got {len(data)}")
        try:
            codes = unpack_bits(data, count, packed_bits)
        except ValueError as e:
            raise PayloadError(f"malformed payload: {where}: {e}") from None
        offset = signed_offset(packed_bits) if signed else 0
        if dtype == np.int8:  # codes - offset in uint8 wraps to the int8 bit pattern: one pass, exact
            arr = np.subtract(codes, np.uint8(offset)).view(np.int8).reshape(shape)
        else:
            arr = (codes.astype(np.int16) - offset).astype(dtype).reshape(shape)
        arr.flags.writeable = False  # like the zero-copy views of every other array
        return arr
    if count * dtype.itemsize != len(data):
        raise PayloadError(f"{where}: shape {tuple(shape)} of {name} needs {count * dtype.itemsize} bytes, "
                           f"got {len(data)}")
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    if name in _FLOAT_NAMES and not np.all(np.isfinite(arr.astype(np.float32))):
        raise PayloadError(f"{where} contains NaN or inf")
    return arr


def _decode_qtensor(d: Any, where: str, *, packed: bool = True) -> QTensor:
    _exact_keys(d, {"values", "scale", "zero_point", "bits", "axis", "symmetric"}, where)
    bits, axis, symmetric = d["bits"], d["axis"], d["symmetric"]
    _expect(_is_int(bits) and 2 <= bits <= 16, f"{where}: bad bits {_short(bits)}")
    _expect(isinstance(symmetric, bool), f"{where}: symmetric is not a bool")
    values = _decode_array(d["values"], f"{where} values", packed_bits=bits if packed and _packs(bits) else None,
                           signed=symmetric)
    scale = _decode_array(d["scale"], f"{where} scale")
    ndim = values.ndim
    if symmetric:
        _expect(d["zero_point"] is None, f"{where}: symmetric tensor with a zero point")
        zero_point = np.zeros(scale.shape, np.int32)
    else:
        zero_point = _decode_array(d["zero_point"], f"{where} zero_point")
    _expect(axis is None or (_is_int(axis) and 0 <= axis < ndim), f"{where}: bad axis {_short(axis)}")
    _expect(values.dtype == storage_dtype(bits, symmetric),
            f"{where}: values dtype {values.dtype} does not match bits={bits} symmetric={symmetric}")
    _expect(scale.dtype == np.float32 and zero_point.dtype == np.int32, f"{where}: scale/zero_point dtypes")
    expected = tuple(values.shape[i] if i == axis else 1 for i in range(ndim))
    _expect(scale.shape == expected == zero_point.shape,
            f"{where}: scale/zero_point shapes {scale.shape}/{zero_point.shape}, expected {expected}")
    if not np.all(scale > 0):
        raise PayloadError(f"{where}: scales must be positive")
    lo, hi = qrange(bits, symmetric)
    for name, arr in (("values", values), ("zero_point", zero_point)):
        if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
            raise PayloadError(f"{where}: {name} outside the {bits}-bit code range [{lo}, {hi}]")
    return QTensor(values, scale, zero_point, bits, axis, symmetric)


def _insert(tree: dict, path: list, leaf: Any) -> None:
    node = tree
    for key in path[:-1]:
        node = node.setdefault(key, {})
        _expect(isinstance(node, dict), f"path {_short(path_str(tuple(path)))} runs through a leaf")
    _expect(path[-1] not in node, f"duplicate or conflicting path {_short(path_str(tuple(path)))}")
    node[path[-1]] = leaf


def _decode_body(body: dict, nbytes: int, packed: bool, fmt: int) -> Payload:
    keys = {"precision", "per_channel", "version", "spec", "leaves"}
    keys |= {"spec_hash"} if fmt >= 3 else set()
    keys |= {"activation_ranges"} if fmt >= 4 else set()
    _exact_keys(body, keys, "body")
    try:
        precision = parse_precision(body["precision"]) if isinstance(body["precision"], str) else None
    except ValueError:
        precision = None
    _expect(precision is not None and precision.name == body["precision"],
            f"unknown precision {_short(body['precision'])}")
    _expect(isinstance(body["per_channel"], bool), "per_channel is not a bool")
    version = body["version"]
    _expect(_is_int(version) and 0 <= version < 2**63, f"bad version {_short(version)}")
    spec = None
    if body["spec"] is not None:
        _expect(isinstance(body["spec"], dict), "spec is not a map")
        try:
            spec = PolicySpec.from_dict(body["spec"])
        except (ValueError, TypeError, AttributeError) as e:
            raise PayloadError(f"malformed payload: bad policy spec: {e}") from None
    spec_hash = body.get("spec_hash")
    _expect(spec_hash is None or (isinstance(spec_hash, str) and _is_digest(spec_hash)),
            f"bad spec_hash {_short(spec_hash)}")
    if spec is not None:
        _expect(spec_hash is None or spec_hash == spec.digest(), "spec_hash is not the digest of spec")
        spec_hash = spec.digest()
    _expect(isinstance(body["leaves"], list), "leaves is not a list")
    tree: dict = {}
    for i, entry in enumerate(body["leaves"]):
        _expect(isinstance(entry, dict) and len(entry) == 2 and "path" in entry, f"leaf #{i} is malformed")
        path = entry["path"]
        _expect(isinstance(path, list) and path and all(isinstance(k, str) for k in path),
                f"leaf #{i} has a bad path {_short(path)}")
        where = f"param {_short(path_str(tuple(path)))}"
        if "qtensor" in entry:
            leaf: Any = _decode_qtensor(entry["qtensor"], where, packed=packed)
            _expect(precision.is_int and leaf.bits == precision.bits,
                    f"{where}: {leaf.bits}-bit QTensor in a {precision.name} payload")
        elif "array" in entry:
            leaf = _decode_array(entry["array"], where)
            _expect(leaf.dtype.name in _FLOAT_NAMES,
                    f"{where}: parameter leaves must be floating point, got {leaf.dtype}")
            _expect(not (precision.is_int and is_quantized_leaf(tuple(path), leaf)),
                    f"{where}: unquantized weight matrix in a {precision.name} payload")
        else:
            raise PayloadError(f"malformed payload: leaf #{i} is neither an array nor a qtensor")
        _insert(tree, path, leaf)
    ranges = _decode_ranges(body.get("activation_ranges"))
    _expect(ranges is None or precision.is_int, f"activation ranges in a {precision.name} payload")
    params = QuantizedParams(tree, precision.name, body["per_channel"], ranges)
    return Payload(version, precision.name, params, spec, nbytes, spec_hash)


def decode_payload(data: bytes) -> Payload:
    """Verify and decode a payload. Any problem raises `PayloadError` (a ValueError) saying what is wrong;
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
