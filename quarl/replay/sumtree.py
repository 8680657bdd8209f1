"""Prioritized sampling's data structure (a sum tree over item priorities) and its importance weights."""
from __future__ import annotations

import math

import numpy as np


def importance_weights(probabilities: np.ndarray, size: int, beta: float) -> np.ndarray:
    """PER importance weights (size * P(i))^-beta, normalised by the batch maximum (as Acme's DQN does)."""
    p = np.asarray(probabilities, dtype=np.float64)
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be a non-negative finite number, got {beta!r}")
    if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or np.any(p <= 0) or np.any(p > 1):
        raise ValueError("probabilities must be a non-empty 1-D array in (0, 1]")
    w = (size * p) ** (-beta)
    return (w / w.max()).astype(np.float32)


class SumTree:
    """Binary sum tree over `capacity` leaves, updated and searched for whole batches at once.

    Each internal node is recomputed as the exact float sum of its two children (never by adding deltas),
    so the tree cannot drift and a positive node always has a positive child to descend into.
    """

    def __init__(self, capacity: int):
        self._leaves = 1 << max(0, (int(capacity) - 1).bit_length())
        self._depth = self._leaves.bit_length() - 1
        self._tree = np.zeros(2 * self._leaves, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self._tree[1])

    def get(self, index: np.ndarray) -> np.ndarray:
        return self._tree[np.asarray(index, dtype=np.int64) + self._leaves]

    def set(self, index: np.ndarray, values: np.ndarray) -> None:
        """Sets leaves (indices must be unique) and recomputes their ancestors, one level per NumPy op."""
        pos = np.asarray(index, dtype=np.int64) + self._leaves
        self._tree[pos] = values
        pos = np.sort(pos)  # sorted once: each level's parents are then sorted, and deduplicated by a neighbour test
        for _ in range(self._depth):
            pos >>= 1
            if pos.size > 1:
                pos = pos[np.concatenate(([True], pos[1:] != pos[:-1]))]
            self._tree[pos] = self._tree[2 * pos] + self._tree[2 * pos + 1]

    def clear(self) -> None:
        self._tree[:] = 0.0

    def find(self, mass: np.ndarray) -> np.ndarray:
        """Leaf index whose prefix-sum interval contains each value of `mass` (values in [0, total))."""
        u = np.asarray(mass, dtype=np.float64).copy()
        idx = np.ones(u.shape, dtype=np.int64)
        for _ in range(self._depth):
            left = self._tree[2 * idx]
            right = self._tree[2 * idx + 1]
            go_right = ((u >= left) & (right > 0)) | (left <= 0)
            u = np.where(go_right, u - left, u)
            idx = 2 * idx + go_right
        return idx - self._leaves

