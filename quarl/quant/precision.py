"""Precisions: the numeric formats an actor can run, parsed once into a typed value.

A precision arrives as text (CLI, JSON config, a payload header, a results file) and is parsed here, once, into a
frozen `Precision`; configs carry that value, and everything downstream reads its fields (`is_int`, `bits`,
`has_int_kernel`, `simulated`, `sort_key`) instead of parsing the name again. This module holds the one list of
valid names (`ALL_PRECISIONS`) and the subsets each role accepts (`precision_names`), so a CLI can list exactly
what it takes. Plain Python, no NumPy or JAX: the analysis layer reads run summaries with it without loading a
numerical stack.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")

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
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def has_int_kernel(self) -> bool:
        """An integer precision that runs on integer kernels (int2..int8); wider ints are simulated in fp32."""
        return self.is_int and self.bits <= MAX_KERNEL_BITS

    @property
    def simulated(self) -> bool:
        """An integer precision wider than every integer kernel (int9..int16): each runtime computes it in fp32.
        (Whether fp16/bf16 compute natively depends on the backend, not on the precision, so floats say False.)"""
        return self.is_int and self.bits > MAX_KERNEL_BITS

    @property
    def sort_key(self) -> tuple[int, int]:
        """Table order: fp32, bf16, fp16, then integer precisions from the widest to the narrowest."""
        return (2, -self.bits) if self.is_int else (0 if self.bits == 32 else 1, FLOAT_PRECISIONS.index(self.name))

    def __str__(self) -> str:
        return self.name


_FLOATS = {"fp32": 32, "bf16": 16, "fp16": 16}
FLOAT_PRECISIONS: tuple[str, ...] = tuple(_FLOATS)
# The one list of valid names; every role below is a subset of it.
ALL_PRECISIONS: tuple[str, ...] = (*_FLOATS, *(f"int{b}" for b in range(MAX_BITS, MIN_BITS - 1, -1)))
_BY_NAME = {
    **{n: Precision(n, "float", b) for n, b in _FLOATS.items()},
    **{f"int{b}": Precision(f"int{b}", "int", b) for b in range(MIN_BITS, MAX_BITS + 1)},
}

# What each role accepts. "actor": what actors run; int2..int8 have integer kernels and int16 is the paper's wide
# baseline, while int9..int15 (kept for PTQ sweeps) send 2 bytes per weight and run no integer kernel, so on a
# command line they are almost surely a typo for int8. "kernel": the integer-kernel widths (QAT trains for them).
ROLES: dict[str, tuple[str, ...]] = {
    "any": ALL_PRECISIONS,
    "actor": (*FLOAT_PRECISIONS, *(f"int{b}" for b in range(MAX_KERNEL_BITS, MIN_BITS - 1, -1)), f"int{MAX_BITS}"),
    "float": FLOAT_PRECISIONS,
    "kernel": tuple(f"int{b}" for b in range(MAX_KERNEL_BITS, MIN_BITS - 1, -1)),
}
_ROLE_WORDS = {"any": "a precision", "float": "a float precision",
               "actor": "an actor precision (int9..int15 have no integer kernel and send 2 bytes per weight)",
               "kernel": "an integer-kernel precision (int2..int8)"}


def precision_names(role: str = "any") -> tuple[str, ...]:
    """The canonical names `role` accepts ('any', 'actor', 'float', 'kernel'), in table order."""
    if role not in ROLES:
        raise ValueError(f"unknown precision role {role!r}: valid are {', '.join(ROLES)}")
    return ROLES[role]


def precision_bits(role: str = "any") -> tuple[int, ...]:
    """The integer widths `role` accepts, ascending ('any': 2..16, 'kernel': 2..8)."""
    return tuple(sorted(_BY_NAME[n].bits for n in precision_names(role) if _BY_NAME[n].is_int))


def valid_text(role: str = "any") -> str:
    """`role`'s names for a help or error line, with the bit-count shorthands it takes:
    'fp32, bf16, fp16, int2..int8, int16 (shorthands 32, 16, 8..2)' for actors."""
    names = precision_names(role)
    floats = [n for n in names if _BY_NAME[n].is_float]
    parts, shorthands = list(floats), [str(_BY_NAME[n].bits) for n in floats if n != "bf16"]
    for lo, hi in _runs(precision_bits(role)):
        parts.append(f"int{lo}..int{hi}" if hi > lo else f"int{lo}")
    for lo, hi in reversed(_runs([b for b in precision_bits(role) if b != MAX_BITS or "fp16" not in floats])):
        shorthands.append(f"{hi}..{lo}" if hi > lo else str(lo))
    return f"{', '.join(parts)} (shorthands {', '.join(shorthands)})"


def _runs(bits: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive runs of ascending `bits` as (first, last)."""
    out: list[tuple[int, int]] = []
    for b in bits:
        if out and out[-1][1] == b - 1:
            out[-1] = (out[-1][0], b)
        else:
            out.append((b, b))
    return out


def parse_precision(s: str | int | Precision, role: str = "any") -> Precision:
    """Parse a CLI/config precision: fp32, bf16, fp16, int2..int16, or a bit count (32 -> fp32, 16 -> fp16,
    2..15 -> int<b>). Case-insensitive. A name unknown, or outside `role` (`precision_names`) -> ValueError
    listing the names valid for that role."""
    names = precision_names(role)
    if isinstance(s, Precision):
        prec = s
    else:
        key = str(s).strip().lower()
        if key.isdigit():
            b = int(key)
            key = {32: "fp32", 16: "fp16"}.get(b, f"int{b}" if MIN_BITS <= b < MAX_BITS else key)
        if key not in _BY_NAME:
            listed = ", ".join(names) if role == "any" else valid_text(role)
            tail = f" (or a bit count: 32, 16, {MIN_BITS}..{MAX_BITS - 1})" if role == "any" else ""
            raise ValueError(f"unknown precision {s!r}: valid are {listed}{tail}")
        prec = _BY_NAME[key]
    if prec.name not in names:
        raise ValueError(f"precision {prec} is not {_ROLE_WORDS[role]}: valid are {valid_text(role)}")
    return prec


def find_precision(name: object) -> Precision | None:
    """The `Precision` a results file's canonical name (exactly as written: 'int8', 'fp16') stands for, or None
    for anything else ('qat-int4', a missing value): how the analysis layer asks what a recorded name is."""
    return _BY_NAME.get(name) if isinstance(name, str) else None


def is_int_name(name: object) -> bool:
    """Whether a recorded name is an integer precision ('int8': True; 'fp16', 'qat-int4', None: False)."""
    prec = find_precision(name)
    return prec is not None and prec.is_int


def int_precision(bits: int) -> Precision:
    """The integer precision of `bits` (2..16) bits; ValueError otherwise."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"no integer precision has {bits!r} bits: valid are {MIN_BITS}..{MAX_BITS}")
    return _BY_NAME[f"int{bits}"]


def parse_precision_list(text: str, role: str = "any") -> tuple[Precision, ...]:
    """'32,int8,fp16' -> each parsed (`parse_precision`), duplicates dropped, order kept; ValueError when empty."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise ValueError(f"needs at least one precision: valid are {valid_text(role)}")
    return tuple(dict.fromkeys(parse_precision(item, role) for item in items))


def parse_bit_list(text: str, role: str = "any") -> tuple[int, ...]:
    """'2,4,8' -> (2, 4, 8): integer widths, sorted and deduplicated, each one `role` takes (`precision_bits`);
    ValueError naming the bad item otherwise."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise ValueError("needs at least one bit width")
    allowed, bits = precision_bits(role), set()
    for item in items:
        try:
            b = int(item)
        except ValueError:
            raise ValueError(f"{item!r} is not an integer") from None
        if b not in allowed:
            raise ValueError(f"{b} is outside {allowed[0]}..{allowed[-1]}")
        bits.add(b)
    return tuple(sorted(bits))


def precision_arg(role: str = "any") -> Callable[[str], Precision]:
    """An argparse `type=` that parses one precision of `role` (a bad one is argparse's one-line error, exit 2)."""
    return _argparse_type(lambda text: parse_precision(text, role))


def precision_name_arg(role: str = "any") -> Callable[[str], str]:
    """`precision_arg`, giving the canonical name: for CLIs that pass it on to a subprocess or key records by it."""
    return _argparse_type(lambda text: parse_precision(text, role).name)


def precision_list_arg(role: str = "any") -> Callable[[str], list[str]]:
    """An argparse `type=` for comma-separated precisions of `role` ('fp32,8' -> ['fp32', 'int8'])."""
    return _argparse_type(lambda text: [p.name for p in parse_precision_list(text, role)])


def _argparse_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    def checked(text: str) -> T:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return checked
