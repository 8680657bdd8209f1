"""The `nbits4` kernel form: int2..int4 Linear layers on ONNX Runtime's `MatMulNBits` (com.microsoft), the
weights kept 4-bit packed in memory. Registered in `quarl.runtimes.kernel_forms` on import; never chosen by
rank (the `onnx` backend keeps its int8 forms), but requested by the `onnx-nbits` backend, which `auto`
measures against the others for int2..int4.

Contract (onnxruntime docs/ContribOperators.md): `Y = A @ dequant(B) (+ bias)` with A float [M, K];
B uint8 [N, k_blocks, blob] holding the codes of each output column along K, block-wise, packed two a byte
low nibble first (`quarl.quant.bitpack` order), k_blocks = ceil(K / block_size), blob = block_size * bits / 8;
scales float [N, k_blocks]; zero points optional (default 2^(bits-1) = 8); bias float [N];
attributes K, N, bits, block_size (a power of two >= 16) and accuracy_level.

Our weights are symmetric per-output-channel codes in [-(2^(b-1)-1), 2^(b-1)-1] (within [-7, 7] for b <= 4),
so every int<=4 precision maps onto the 4-bit form exactly: code + 8 is the stored nibble with the default
zero point 8, and the channel's scale repeated in each of its blocks. K need not be a multiple of the block:
the tail of the last block is padded with nibble 8 (weight 0) and never multiplied anyway.

Block size and accuracy level were measured on this project's 2-core Xeon (avx_vnni), one 2048x2048 layer at
batch 1: MatMulInteger (our int8 path) 165 us; MatMulNBits accuracy_level 0 (fp32 compute) 317 us at any
block size; accuracy_level 4 (activations quantized to int8 per block, integer dot) 117 / 74 / 66 us at
block 32 / 128 / 256. Level 4 keeps the project's W4A8 meaning of "int4" (as the int8 kernels and the JAX
backend do) and its error stays within the int4 tolerance; block 128 is the largest block ORT's own
quantizer defaults to, capped by K so small inputs are not padded far. At batch 16 MatMulInteger is faster
again (195 vs 662 us), which is why `auto` measures both forms instead of assuming one.

Rows: each row's block scales are its own, so a row's output never depends on the other rows. On AVX2
without VNNI MLAS runs one row (M = 1) through its own kernel, which adds the block products in another
float order: a row alone is float rounding (~1e-7 relative) apart from the same row in a batch, not bit for
bit as with VNNI; every batch of two or more gives a row the same bits.
"""
from __future__ import annotations

import numpy as np

from quarl.quant.bitpack import signed_offset
from quarl.runtimes.base import DenseWeights
from quarl.runtimes.cpu import CPUInfo
from quarl.runtimes.kernel_forms import Graph, KernelForm, register_form

FORM_NAME = "nbits4"
NBITS_DOMAIN = "com.microsoft"
NBITS_BITS = 4  # every int2..int4 code fits a nibble; MLAS's 4-bit kernels are its fast ones
MAX_NBITS_PRECISION = 4
ACCURACY_LEVEL = 4  # int8 activations per block (see the module docstring for the measurement)
MAX_BLOCK, MIN_BLOCK = 128, 16


def block_size(k: int) -> int:
    """The smallest power of two >= K, clamped to [16, 128]: MatMulNBits needs a power of two >= 16."""
    if k < 1:
        raise ValueError(f"MatMulNBits needs K >= 1, got {k}")
    return int(min(MAX_BLOCK, max(MIN_BLOCK, 1 << (k - 1).bit_length())))


def pack_weights(codes: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(B uint8 [N, k_blocks, blob], scales float32 [N, k_blocks], block_size) for `x @ (codes * scale)`.

    `codes` are signed int [K, N] within [-7, 7], `scale` float32 [N] (one per output channel).
    Raises ValueError on codes that do not fit 4 bits (they would wrap into other weights)."""
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.dtype.kind not in "iu":
        raise ValueError(f"weight codes must be integers [K, N], got {codes.dtype} {codes.shape}")
    if codes.size and (int(codes.min()) < -8 or int(codes.max()) > 7):
        raise ValueError("weight codes outside the 4-bit range [-8, 7]")
    k, n = codes.shape
    block = block_size(k)
    k_blocks = -(-k // block)
    # Nibble = code + 8 (the default zero point); padding nibble 8 == weight 0. uint8 arithmetic wraps, so
    # int8 codes viewed as uint8 plus 8 give exactly code + 8 for every code in [-8, 7].
    # Pairs of K-rows are packed first and the half-size result transposed: 10x faster than transposing the
    # codes (an actor repacks on every weight update).
    nibbles = np.full((k_blocks * block, n), signed_offset(NBITS_BITS), np.uint8)
    nibbles[:k] = codes.astype(np.int8).view(np.uint8) + np.uint8(signed_offset(NBITS_BITS))
    pairs = nibbles[0::2] | (nibbles[1::2] << np.uint8(4))  # [K_padded / 2, N]
    b = np.ascontiguousarray(pairs.T).reshape(n, k_blocks, block // 2)
    scales = np.repeat(np.asarray(scale, np.float32).reshape(n, 1), k_blocks, axis=1)
    return b, np.ascontiguousarray(scales), block


def block_int8_reference(x: np.ndarray, dense: DenseWeights) -> np.ndarray:
    """What MatMulNBits at accuracy_level 4 computes, exactly (float64): each row of `x` is cut into K-blocks
    of `block_size(K)` (zero-padded), each block quantized to int8 with scale max|x| / 127 (round half to
    even), multiplied by the weight codes in integers, then scaled by block scale x weight scale. Matches
    ORT 1.32's MLAS to ~1e-7 relative here, so the self-check can hold this form to the same tolerance as
    the int8 forms."""
    x = np.asarray(x, np.float32)
    rows, k = x.shape
    block = block_size(k)
    k_blocks = -(-k // block)
    xb = np.zeros((rows, k_blocks * block), np.float32)
    xb[:, :k] = x
    xb = xb.reshape(rows, k_blocks, block)
    step = (np.abs(xb).max(axis=-1) / np.float32(127)).astype(np.float32)  # [rows, k_blocks]
    inv = np.where(step > 0, np.float32(1) / np.where(step > 0, step, np.float32(1)), np.float32(0))
    q = np.clip(np.rint(xb * inv.astype(np.float32)[..., None]), -127, 127)
    w = np.zeros((k_blocks * block, dense.w.shape[1]), np.float64)
    w[:k] = dense.w
    acc = np.einsum("rbk,bkn->rbn", q.astype(np.float64), w.reshape(k_blocks, block, -1))  # exact integers
    return (acc * step.astype(np.float64)[..., None]).sum(axis=1) * dense.scale.astype(np.float64)


def _initializers(name: str, dense: DenseWeights) -> dict[str, np.ndarray]:
    b, scales, _ = pack_weights(dense.w, dense.scale)
    return {f"{name}.nbits": b, f"{name}.nbits_scale": scales}


def _emit(graph: Graph, x: str, name: str) -> str:
    k, n = graph.shapes[name]
    (y,) = graph.op("MatMulNBits", [x, f"{name}.nbits", f"{name}.nbits_scale"], domain=NBITS_DOMAIN, K=k, N=n,
                    bits=NBITS_BITS, block_size=block_size(k), accuracy_level=ACCURACY_LEVEL)
    return y


def _rank(cpu: CPUInfo, bits: int) -> float | None:
    return None  # measured by `auto` (as the onnx-nbits backend), never assumed faster


NBITS4 = KernelForm(
    name=FORM_NAME,
    doc="MatMulNBits: 4-bit packed weight codes (int2..int4), int8 activations per K-block (W4A8)",
    max_bits=MAX_NBITS_PRECISION,
    initializers=_initializers,
    emit=_emit,
    rank=_rank,
    reference=block_int8_reference,
)

register_form(NBITS4, replace=True)  # replace: a module reload must not fail
