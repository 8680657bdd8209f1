"""Sub-byte bit-packing: exact round trips at every width, the documented bit order, canonical padding."""
from __future__ import annotations

import numpy as np
import pytest

from quarl.quant.bitpack import pack_bits, packed_nbytes, signed_offset, unpack_bits


@pytest.mark.parametrize("bits", range(1, 8))
@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 8, 9, 1001])
def test_round_trip_every_width_and_odd_count(bits, count):
    codes = np.random.default_rng(bits * 1000 + count).integers(0, 1 << bits, count).astype(np.uint8)
    packed = pack_bits(codes, bits)
    assert packed.dtype == np.uint8 and packed.size == packed_nbytes(count, bits) == -(-count * bits // 8)
    np.testing.assert_array_equal(unpack_bits(packed.tobytes(), count, bits), codes)


def test_bit_order_is_low_first():
    """Two nibbles a byte, the first code in the low nibble (ONNX Runtime MatMulNBits' order)."""
    assert pack_bits(np.array([0x1, 0x2, 0x3], np.uint8), 4).tolist() == [0x21, 0x03]
    assert pack_bits(np.array([1, 2, 3, 0], np.uint8), 2).tolist() == [0b00111001]
    assert pack_bits(np.array([5, 3, 7], np.uint8), 3).tolist() == [0b11011101, 0b1]  # 101|011|111
    assert signed_offset(4) == 8 and signed_offset(2) == 2


def test_codes_that_do_not_fit_and_bad_widths_are_refused():
    with pytest.raises(ValueError, match="range"):
        pack_bits(np.array([16], np.uint8), 4)
    with pytest.raises(ValueError, match="range"):
        pack_bits(np.array([-1], np.int8), 4)
    with pytest.raises(ValueError, match="integers"):
        pack_bits(np.array([1.0]), 4)
    for bits in (0, 8, True, 2.0):
        with pytest.raises(ValueError, match="bits"):
            pack_bits(np.array([1], np.uint8), bits)


def test_unpack_refuses_wrong_length_and_padding_bits():
    with pytest.raises(ValueError, match="need 2 bytes, got 1"):
        unpack_bits(b"\x21", 3, 4)
    with pytest.raises(ValueError, match="padding"):
        unpack_bits(b"\x21\x13", 3, 4)  # the unused high nibble of the last byte is not zero
    with pytest.raises(ValueError, match="padding"):
        unpack_bits(bytes([0b11011101, 0b11]), 3, 3)
