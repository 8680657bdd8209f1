"""Precisions: the numeric formats an actor can run, parsed once into a typed value.

A precision arrives as text (CLI, JSON config, a payload header) and is parsed here, once, into a frozen
`Precision`; configs carry that value, and everything downstream reads its fields (`is_int`, `bits`,
`has_int_kernel`) instead of parsing the name again. Plain Python, no NumPy or JAX: the analysis layer reads
run summaries with it without loading a numerical stack.
"""
from __future__ import annotations

import dataclasses

MIN_BITS, MAX_BITS = 2, 16
# The widest integer code an int8 kernel (AQT's s8 dot, ONNX Runtime's integer GEMMs) takes. Wider integer
# precisions (int9..int16) have no fast kernel on CPU, so runtimes simulate them in fp32.
MAX_KERNEL_BITS = 8


@dataclasses.dataclass(frozen=True)
class Precision:
    """A numeric format an actor can run: `kind` 'float' (fp32/fp16/bf16) or 'int' (uniform, `bits`)."""

    name: str
    kind: str
    bits: int

    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    @property
    def has_int_kernel(self) -> bool:
        """An integer precision that runs on integer kernels (int2..int8); wider ints are simulated in fp32."""
        return self.is_int and self.bits <= MAX_KERNEL_BITS

    def __str__(self) -> str:
        return self.name


_FLOATS = {"fp32": 32, "bf16": 16, "fp16": 16}
ALL_PRECISIONS: tuple[str, ...] = (*_FLOATS, *(f"int{b}" for b in range(MAX_BITS, MIN_BITS - 1, -1)))
_BY_NAME = {
    **{n: Precision(n, "float", b) for n, b in _FLOATS.items()},
    **{f"int{b}": Precision(f"int{b}", "int", b) for b in range(MIN_BITS, MAX_BITS + 1)},
}


def parse_precision(s: str | int | Precision) -> Precision:
    """Parse a CLI/config precision: fp32, bf16, fp16, int2..int16, or a bit count (32 -> fp32,
    16 -> fp16, 2..15 -> int<b>). Case-insensitive. Unknown -> ValueError listing the valid names."""
    if isinstance(s, Precision):
        return s
    key = str(s).strip().lower()
    if key.isdigit():
        b = int(key)
        key = {32: "fp32", 16: "fp16"}.get(b, f"int{b}" if MIN_BITS <= b < MAX_BITS else key)
    if key not in _BY_NAME:
        raise ValueError(
            f"unknown precision {s!r}: valid are {', '.join(ALL_PRECISIONS)} "
            f"(or a bit count: 32, 16, {MIN_BITS}..{MAX_BITS - 1})"
        )
    return _BY_NAME[key]
