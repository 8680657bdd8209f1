"""The nbits4 kernel form: MatMulNBits weight layout decoded independently of ONNX Runtime (nibble order,
block padding, per-block scales), its exact reference, and the self-check that holds ORT to it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from quarl.runtimes.base import DenseWeights
from quarl.runtimes.kernel_check import check_form
from quarl.runtimes.kernel_forms import candidates, register_form, unregister_form
from quarl.runtimes.onnx_nbits import FORM_NAME, NBITS4, block_int8_reference, block_size, pack_weights


def _dequant_blob(b: np.ndarray, scales: np.ndarray, k: int, block: int) -> np.ndarray:
    """[K, N] weights from MatMulNBits' inputs, read as its contract says: per column n, blocks along K,
    two codes a byte low nibble first, default zero point 8."""
    n, k_blocks, blob = b.shape
    assert blob == block // 2 and k_blocks == -(-k // block)
    nibbles = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(n, k_blocks * block).astype(np.float64)
    w = (nibbles - 8).reshape(n, k_blocks, block) * scales[:, :, None]
    return w.reshape(n, -1)[:, :k].T


@pytest.mark.parametrize("k, n", [(1, 1), (24, 6), (16, 3), (129, 5), (256, 2), (200, 17)])
def test_pack_weights_matches_the_contract(k, n):
    rng = np.random.default_rng(k * 31 + n)
    codes = rng.integers(-7, 8, (k, n)).astype(np.int8)
    scale = rng.uniform(0.01, 1.0, n).astype(np.float32)
    b, scales, block = pack_weights(codes, scale)
    assert block == block_size(k) and b.dtype == np.uint8 and scales.dtype == np.float32
    assert scales.shape == b.shape[:2]
    np.testing.assert_array_equal(_dequant_blob(b, scales, k, block), codes * scale.astype(np.float64))
    # the padded tail of the last block is nibble 8, i.e. weight 0
    pad = b.shape[1] * block - k
    if pad:
        tail = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(n, -1)[:, k:]
        assert np.all(tail == 8)


def test_block_size_is_a_power_of_two_between_16_and_128():
    assert [block_size(k) for k in (1, 16, 17, 24, 64, 65, 128, 129, 2048)] == [16, 16, 32, 32, 64, 128, 128,
                                                                               128, 128]
    with pytest.raises(ValueError, match="K >= 1"):
        block_size(0)


def test_codes_beyond_a_nibble_are_refused():
    with pytest.raises(ValueError, match="range"):
        pack_weights(np.full((4, 2), 8, np.int8), np.ones(2, np.float32))
    with pytest.raises(ValueError, match=r"\[K, N\]"):
        pack_weights(np.zeros(4, np.int8), np.ones(1, np.float32))


def test_self_check_accepts_nbits4_and_refuses_a_wrong_layout():
    """ORT's MatMulNBits matches the exact block-int8 emulation; the same op fed with the nibbles of each
    byte swapped (a layout misunderstanding) is caught by the self-check instead of acting on garbage."""
    shapes = [(24, 64), (200, 17), (64, 6)]
    check = check_form(FORM_NAME, 4, shapes)
    assert check["ok"] and check["max_rel_err"] < 1e-4, check
    assert FORM_NAME not in candidates(4)  # never picked by rank: auto measures it as onnx-nbits

    def swapped(name, dense):
        arrays = NBITS4.initializers(name, dense)
        b = arrays[f"{name}.nbits"]
        arrays[f"{name}.nbits"] = ((b & 0x0F) << 4) | (b >> 4)
        return arrays

    register_form(dataclasses.replace(NBITS4, name="test_nbits_swapped", initializers=swapped))
    try:
        bad = check_form("test_nbits_swapped", 4, shapes)
        assert not bad["ok"] and bad["max_rel_err"] > 0.05, bad
    finally:
        unregister_form("test_nbits_swapped")


def test_block_int8_reference_is_the_dequantized_product_up_to_activation_rounding():
    rng = np.random.default_rng(5)
    codes = rng.integers(-7, 8, (200, 9)).astype(np.int8)
    dense = DenseWeights("int", codes, np.zeros(9, np.float32), rng.uniform(0.1, 1, 9).astype(np.float32))
    x = rng.uniform(-1, 1, (4, 200)).astype(np.float32)
    exact = x.astype(np.float64) @ (codes * dense.scale.astype(np.float64))
    ref = block_int8_reference(x, dense)
    err = np.abs(ref - exact).max() / np.abs(exact).max()
    assert 1e-5 < err < 1e-2  # int8 activations per 128-block: visible, small
    np.testing.assert_array_equal(block_int8_reference(np.zeros((2, 200), np.float32), dense), 0.0)
