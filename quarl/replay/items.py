"""What goes into and comes out of a replay table: the column signature, sampled batches, and their checks."""
from __future__ import annotations

from typing import Mapping, NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt


class Sample(NamedTuple):
    """A sampled batch: item keys (for `update_priorities`), sampling probabilities, and the columns."""

    keys: np.ndarray  # int64 [B]
    probabilities: np.ndarray  # float64 [B]
    data: dict[str, np.ndarray]  # each [B, ...]


class StackedSample(NamedTuple):
    """K batches from one `Table.sample_stacked` call, stacked: what a learner running K SGD steps per call feeds
    to its device as is (no per-batch objects to build, ship across a process boundary, or stack again).

    Its float columns are finite: the table refuses NaN and inf at insert (and at `load_state_dict`), so a
    consumer need not scan them again."""

    keys: np.ndarray  # int64 [K, B]
    probabilities: np.ndarray  # float64 [K, B]
    data: dict[str, np.ndarray]  # each [K, B, ...], C-contiguous


# A table's columns: {name: (per-item shape, dtype)}, the dtype as anything np.dtype accepts.
Signature: TypeAlias = Mapping[str, tuple[tuple[int, ...], npt.DTypeLike]]


def check_counts(batch_size: int, num_batches: int) -> tuple[int, int]:
    for name, value in (("num_batches", num_batches), ("batch_size", batch_size)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(batch_size), int(num_batches)


def check_priorities(priorities: npt.ArrayLike, n: int, what: str) -> np.ndarray:
    p = np.asarray(priorities, dtype=np.float64)
    if p.shape != (n,):
        raise ValueError(f"{what} must have shape ({n},), got {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"{what} must be finite and >= 0")
    return p


def check_signature(signature: Signature) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    if not isinstance(signature, Mapping) or not signature:
        raise ValueError("signature must be a non-empty dict {column: (shape, dtype)}")
    checked = {}
    for name, spec in signature.items():
        try:
            shape, dtype = spec
            shape = tuple(int(d) for d in shape)
            dtype = np.dtype(dtype)
        except (TypeError, ValueError):
            raise ValueError(f"signature column {name!r} must be (shape, dtype), got {spec!r}") from None
        if not isinstance(name, str) or any(d < 0 for d in shape):
            raise ValueError(f"bad signature column {name!r}: {spec!r}")
        checked[name] = (shape, dtype)
    return checked

