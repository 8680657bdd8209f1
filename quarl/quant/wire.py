"""Arrays and QTensors as msgpack-able maps, checked both ways: the leaves of a weight payload (`quarl.quant.payload`).

`A = {"dtype": name, "shape": [...], "data": bytes}`, with an allowlist of little-endian dtypes, so decoding is an
`np.frombuffer` view after shape, length and NaN/inf checks, never code execution. QTensor codes narrower than a
byte travel bit-packed (`quarl.quant.bitpack`). Every decode problem is a `PayloadError` naming what is wrong.
"""
from __future__ import annotations

import math
from typing import TypeAlias, TypeGuard

import ml_dtypes
import numpy as np
import numpy.typing as npt

from quarl.quant.bitpack import MAX_PACKED_BITS, pack_bits, packed_nbytes, signed_offset, unpack_bits
from quarl.quant.quantization import QTensor, qrange, storage_dtype

MAX_NDIM = 8

# What msgpack decoded from a peer's bytes (`raw=False, strict_map_key=True`): maps with str or bytes keys, lists,
# bytes, str, numbers, bools and None, nested, in any shape a corrupted or hostile payload gives. Untrusted: every
# decoder checks it field by field (`exact_keys` hands back the map it checked, `expect`, isinstance) before use.
Unpacked: TypeAlias = None | bool | int | float | str | bytes | list["Unpacked"] | dict[str | bytes, "Unpacked"]
UnpackedMap: TypeAlias = dict[str | bytes, Unpacked]


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


FLOAT_NAMES = ("float16", "bfloat16", "float32")


class PayloadError(ValueError):
    """A payload that must not be used: truncated, corrupted, wrong format, malformed or non-finite."""


def wire_name(arr: np.ndarray, where: str) -> str:
    name = arr.dtype.name  # byte-order free ('>f4' is 'float32'); encoding converts to little-endian
    if name not in DTYPES:
        raise ValueError(f"{where}: dtype {arr.dtype} cannot go in a payload (allowed: {', '.join(DTYPES)})")
    return name


def encode_array(value: npt.ArrayLike, where: str, *, floats_only: bool = False) -> dict:
    arr = np.asarray(value)
    name = wire_name(arr, where)
    if floats_only and name not in FLOAT_NAMES:
        raise ValueError(f"{where}: parameter leaves must be float16/bfloat16/float32, got {name}")
    if name in FLOAT_NAMES and not np.all(np.isfinite(arr.astype(np.float32))):
        raise ValueError(f"{where} contains NaN or inf")
    data = np.ascontiguousarray(arr, dtype=DTYPES[name]).tobytes()
    return {"dtype": name, "shape": list(arr.shape), "data": data}


def packs(bits: int) -> bool:
    """Codes narrower than a byte travel bit-packed; 8- and 16-bit codes are already their storage dtype."""
    return bits <= MAX_PACKED_BITS


def encode_values(q: QTensor, where: str) -> dict:
    if not packs(q.bits):
        return encode_array(q.values, where)
    arr = np.asarray(q.values)
    name = wire_name(arr, where)
    expected = storage_dtype(q.bits, q.symmetric)
    if arr.dtype != expected:  # the decoder would rebuild a different dtype
        raise ValueError(f"{where}: dtype {arr.dtype} does not match bits={q.bits} symmetric={q.symmetric}")
    lo, hi = qrange(q.bits, q.symmetric)
    if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
        raise ValueError(f"{where} outside the {q.bits}-bit code range [{lo}, {hi}]")
    offset = signed_offset(q.bits) if q.symmetric else 0
    data = pack_bits(arr.astype(np.int16) + offset, q.bits).tobytes()
    return {"dtype": name, "shape": list(arr.shape), "data": data}


def expect(cond: bool, msg: str) -> None:
    if not cond:
        raise PayloadError(f"malformed payload: {msg}")


def is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def short(value: object) -> str:
    """repr capped in length: error messages must stay one readable line even for hostile input."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def exact_keys(d: Unpacked, required: set[str], what: str) -> UnpackedMap:
    """`d`, checked to be a map with exactly the `required` keys."""
    if not isinstance(d, dict):
        raise PayloadError(f"malformed payload: {what} is not a map")
    expect(set(d) == required, f"{what} has keys {short(sorted(map(str, d)))}, expected {sorted(required)}")
    return d


def decode_array(d: Unpacked, where: str, *, packed_bits: int | None = None, signed: bool = False) -> np.ndarray:
    """One array; with `packed_bits`, `data` holds bit-packed codes (offset by 2^(bits-1) when `signed`)."""
    fields = exact_keys(d, {"dtype", "shape", "data"}, where)
    name, shape, data = fields["dtype"], fields["shape"], fields["data"]
    if not isinstance(name, str) or name not in DTYPES:
        raise PayloadError(f"{where}: unknown dtype {short(name)} (allowed: {', '.join(DTYPES)})")
    expect(isinstance(shape, list) and len(shape) <= MAX_NDIM and all(is_int(s) and s >= 0 for s in shape),
            f"{where}: bad shape {short(shape)}")
    expect(isinstance(data, bytes), f"{where}: data is not raw bytes")
    dtype = DTYPES[name]
    count = math.prod(shape)  # Python ints: a hostile shape cannot overflow
    if packed_bits is not None:
        expect(name in ("int8", "uint8"), f"{where}: packed {packed_bits}-bit codes cannot decode to {name}")
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
    if name in FLOAT_NAMES and not np.all(np.isfinite(arr.astype(np.float32))):
        raise PayloadError(f"{where} contains NaN or inf")
    return arr


def decode_qtensor(d: Unpacked, where: str, *, packed: bool = True) -> QTensor:
    d = exact_keys(d, {"values", "scale", "zero_point", "bits", "axis", "symmetric"}, where)
    bits, axis, symmetric = d["bits"], d["axis"], d["symmetric"]
    expect(is_int(bits) and 2 <= bits <= 16, f"{where}: bad bits {short(bits)}")
    expect(isinstance(symmetric, bool), f"{where}: symmetric is not a bool")
    values = decode_array(d["values"], f"{where} values", packed_bits=bits if packed and packs(bits) else None,
                           signed=symmetric)
    scale = decode_array(d["scale"], f"{where} scale")
    ndim = values.ndim
    if symmetric:
        expect(d["zero_point"] is None, f"{where}: symmetric tensor with a zero point")
        zero_point = np.zeros(scale.shape, np.int32)
    else:
        zero_point = decode_array(d["zero_point"], f"{where} zero_point")
    expect(axis is None or (is_int(axis) and 0 <= axis < ndim), f"{where}: bad axis {short(axis)}")
    expect(values.dtype == storage_dtype(bits, symmetric),
            f"{where}: values dtype {values.dtype} does not match bits={bits} symmetric={symmetric}")
    expect(scale.dtype == np.float32 and zero_point.dtype == np.int32, f"{where}: scale/zero_point dtypes")
    expected = tuple(values.shape[i] if i == axis else 1 for i in range(ndim))
    expect(scale.shape == expected == zero_point.shape,
            f"{where}: scale/zero_point shapes {scale.shape}/{zero_point.shape}, expected {expected}")
    if not np.all(scale > 0):
        raise PayloadError(f"{where}: scales must be positive")
    lo, hi = qrange(bits, symmetric)
    for name, arr in (("values", values), ("zero_point", zero_point)):
        if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
            raise PayloadError(f"{where}: {name} outside the {bits}-bit code range [{lo}, {hi}]")
    return QTensor(values, scale, zero_point, bits, axis, symmetric)

