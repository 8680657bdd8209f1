"""The value checks every config shares (agent configs, `launch.experiments.config`, the CLIs' flags), with one
error type: a `ConfigError` is a one-line ValueError that names its field, so a CLI can name the flag instead.
Plain Python: importing it costs nothing (the CLIs check flags before JAX loads)."""
from __future__ import annotations

import math
import numbers
from typing import Mapping, TypeGuard

import numpy as np


class ConfigError(ValueError):
    """A bad config value, as one line `<field> <problem>`; `field` names it so a CLI can say which flag was wrong."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem

    def message(self, flags: Mapping[str, str] | None = None) -> str:
        """The message with the field named by its flag (`--max-actor-steps must be ...`) where one is given."""
        return f"{(flags or {}).get(self.field, self.field)} {self.problem}"


def is_int(value: object) -> TypeGuard[int | np.integer]:
    """An integer that is not a bool (NumPy integers included)."""
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_finite(value: object) -> TypeGuard[float]:
    """A finite real number that is not a bool (a float to the type checker: any `numbers.Real` compares like one)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)


def check_int(field: str, value: object, *, minimum: int = 1) -> int:
    """`value` as an int >= `minimum` (1: "a positive integer", 0: "a non-negative integer")."""
    if not is_int(value) or value < minimum:
        what = {1: "a positive integer", 0: "a non-negative integer"}.get(minimum, f"an integer >= {minimum}")
        raise ConfigError(field, f"must be {what}, got {value!r}")
    return int(value)


def check_number(field: str, value: object, *, low: float = -math.inf, high: float = math.inf,
                 low_open: bool = False) -> float:
    """`value` as a finite float in [low, high] ((low, high] with `low_open`)."""
    if not is_finite(value) or value > high or value < low or (low_open and value == low):
        if low == -math.inf and high == math.inf:
            what = "a finite number"
        elif high == math.inf:
            what = f"a finite number {'>' if low_open else '>='} {low:g}"
        else:
            what = f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"
        raise ConfigError(field, f"must be {what}, got {value!r}")
    return float(value)


def check_bool(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(field, f"must be true or false, got {value!r}")
    return value


def check_sizes(field: str, value: object) -> tuple[int, ...]:
    """Layer sizes: a non-empty tuple (or list, from JSON and flags) of positive ints, returned as a tuple."""
    if not isinstance(value, (tuple, list)) or not value or not all(is_int(v) and v > 0 for v in value):
        raise ConfigError(field, f"must be a non-empty tuple of positive ints, got {value!r}")
    return tuple(int(v) for v in value)
