"""Bit-packing of sub-byte integer codes (2..7 bits), shared by the payload codec and the int4 kernel.

Codes are unsigned `b`-bit integers packed densely and low-bit first: code i occupies bits [i*b, (i+1)*b) of
the little-endian bit stream, so two 4-bit codes share a byte with the first in the low nibble (also the
order ONNX Runtime's `MatMulNBits` reads along K, see `quarl.runtimes.onnx_nbits`). Signed (symmetric)
codes are stored with an offset of 2^(b-1) (`signed_offset`): the same "zero point 8" convention
MatMulNBits uses by default for 4 bits.

Why pack at all: an int4 weight stored one code per byte is an int8 payload; packing makes a 2048x3 policy's
int4 payload ~8x smaller than fp32 instead of ~4x.
"""
from __future__ import annotations

import numpy as np

MIN_PACKED_BITS, MAX_PACKED_BITS = 1, 7


def _check(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) \
            or not MIN_PACKED_BITS <= bits <= MAX_PACKED_BITS:
        raise ValueError(f"packed codes need {MIN_PACKED_BITS}..{MAX_PACKED_BITS} bits, got {bits!r}")


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes holding `count` codes of `bits` bits (the last byte zero-padded)."""
    _check(bits)
    return (count * bits + 7) // 8


def signed_offset(bits: int) -> int:
    """What is added to a signed code to store it unsigned: 2^(bits-1)."""
    return 1 << (bits - 1)


def pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """Flat uint8 array of `codes` (any shape, read in C order; unsigned, each < 2^bits) packed low-bit first.
    Raises ValueError if a code does not fit: silent masking would turn a bad code into a different weight."""
    _check(bits)
    u = np.ascontiguousarray(codes).reshape(-1)
    if u.dtype.kind not in "ui":
        raise ValueError(f"codes must be integers, got dtype {u.dtype}")
    if u.size and (int(u.min()) < 0 or int(u.max()) >= 1 << bits):
        raise ValueError(f"codes outside the unsigned {bits}-bit range [0, {(1 << bits) - 1}]")
    if bits == 4:  # the common case, two codes a byte: a strided OR is ~10x faster than the general path
        u8 = np.zeros(u.size + (u.size & 1), np.uint8)
        u8[:u.size] = u
        return u8[0::2] | (u8[1::2] << np.uint8(4))
    # Eight codes of b bits fill exactly b bytes: build each group as one little-endian uint64 word.
    groups = np.zeros((-(-u.size // 8), 8), np.uint64)
    groups.reshape(-1)[:u.size] = u
    words = np.zeros(len(groups), np.uint64)
    for j in range(8):
        words |= groups[:, j] << np.uint64(j * bits)
    packed = words.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :bits].reshape(-1)
    return packed[:packed_nbytes(u.size, bits)].copy()


def unpack_bits(data: bytes | np.ndarray, count: int, bits: int) -> np.ndarray:
    """The `count` unsigned codes (uint8) packed in `data` by `pack_bits`.
    Raises ValueError on a wrong byte length or non-zero padding bits (the encoding is canonical)."""
    _check(bits)
    buf = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else \
        np.ascontiguousarray(data, np.uint8).reshape(-1)
    need = packed_nbytes(count, bits)
    if buf.size != need:
        raise ValueError(f"{count} codes of {bits} bits need {need} bytes, got {buf.size}")
    pad = need * 8 - count * bits
    if pad and int(buf[-1]) >> (8 - pad):
        raise ValueError("non-zero padding bits after the last code")
    if bits == 4:  # two codes a byte, low nibble first: two strided writes (~10x the general path)
        codes = np.empty(2 * buf.size, np.uint8)
        np.bitwise_and(buf, np.uint8(0x0F), out=codes[0::2])
        np.right_shift(buf, np.uint8(4), out=codes[1::2])
        return codes[:count]
    flat = np.zeros(-(-buf.size // bits) * bits, np.uint8)
    flat[:buf.size] = buf
    groups = np.zeros((flat.size // bits, 8), np.uint8)  # b bytes hold 8 codes: widen each group to a word
    groups[:, :bits] = flat.reshape(-1, bits)
    words = groups.view("<u8").reshape(-1)
    mask = np.uint64((1 << bits) - 1)
    codes = np.empty((len(words), 8), np.uint8)
    for j in range(8):
        codes[:, j] = (words >> np.uint64(j * bits)) & mask
    return codes.reshape(-1)[:count]
