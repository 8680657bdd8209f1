"""A replay table with Reverb's semantics, in NumPy: FIFO ring storage, uniform or prioritized sampling,
Reverb's rate limiters, blocking inserts/samples with timeouts.

Why not Reverb itself: it has no wheels for this stack. The semantics are kept so that Acme's settings
(samples_per_insert, min_replay_size, error_buffer) mean the same thing here:
- every inserted item gets the next int64 key; at capacity the oldest item is removed (FIFO);
- a rate limiter decides, per item, whether an insert or a sample may proceed (`RateLimiter.can_insert`,
  `RateLimiter.can_sample` follow Reverb's rate_limiter.cc exactly); every sampled item counts as one sample;
- prioritized sampling draws item i with probability p_i^alpha / sum_j p_j^alpha through a sum tree
  (O(log capacity) per draw, vectorised over the batch).
The table is thread-safe (one `threading.Condition`): the single-process runner uses it directly and the
Ray runner wraps it in an actor. Importance weights are the learner's business (`importance_weights`).
"""
from __future__ import annotations

import math
import numbers
import threading
from typing import Iterable, Mapping, TypedDict

import numpy as np
import numpy.typing as npt

from quarl.replay.items import (
    Sample, Signature, StackedSample, TableInfo, TableState, Transition, check_counts, check_priorities,
    check_signature, item_columns,
)
from quarl.replay.limiter import MinSize, RateLimiter, RateLimiterTimeout, WaitClock, deadline_after, largest_allowed
from quarl.replay.sumtree import SumTree

STATE_FORMAT_VERSION = 1
SAMPLERS = ("uniform", "prioritized")


class TableClosed(RuntimeError):
    """The table was closed; blocked and later callers get this instead of waiting forever."""


class TableOptions(TypedDict, total=False):
    """`Table`'s optional settings by keyword, as a subclass (`quarl.replay.frames.FrameTable`) passes them on."""

    sampler: str
    priority_exponent: float
    rate_limiter: RateLimiter | None
    seed: int | None


class Table:
    """A FIFO replay table with Reverb's rate limiting; see the module docstring."""

    def __init__(self, name: str, capacity: int, signature: Signature, sampler: str = "uniform",
                 priority_exponent: float = 0.6, rate_limiter: RateLimiter | None = None,
                 seed: int | None = None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"table name must be a non-empty string, got {name!r}")
        if not isinstance(capacity, (int, np.integer)) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {sampler!r}; valid samplers: {', '.join(SAMPLERS)}")
        if not (isinstance(priority_exponent, numbers.Real) and math.isfinite(priority_exponent)
                and priority_exponent >= 0):
            raise ValueError(f"priority_exponent must be a non-negative finite number, got {priority_exponent!r}")
        rate_limiter = MinSize(1) if rate_limiter is None else rate_limiter
        if not isinstance(rate_limiter, RateLimiter):
            raise ValueError(f"rate_limiter must be a quarl.replay.limiter.RateLimiter, got {rate_limiter!r}")
        if rate_limiter.min_size_to_sample > capacity:
            raise ValueError(f"min_size_to_sample ({rate_limiter.min_size_to_sample}) exceeds capacity "
                             f"({capacity}): sampling could never start")
        self.name = name
        self.capacity = int(capacity)
        self.sampler = sampler
        self.priority_exponent = float(priority_exponent)
        self.rate_limiter = rate_limiter
        self.signature = check_signature(signature)
        self._data = self._allocate_storage()
        self._priorities = np.zeros(self.capacity, dtype=np.float64)
        self._keys = np.full(self.capacity, -1, dtype=np.int64)
        self._tree = SumTree(self.capacity) if sampler == "prioritized" else None
        self._rng = np.random.default_rng(seed)
        self._cond = threading.Condition()
        self._size = 0
        self._inserts = 0  # also the next key: keys are 0, 1, 2, ... in insertion order
        self._samples = 0
        self._deletes = 0
        self._closed = False
        self._blocked: dict[str, list[float]] = {"insert": [0, 0.0], "sample": [0, 0.0]}  # [calls, seconds]

    # ------------------------------------------------------------------ public API

    @property
    def size(self) -> int:
        with self._cond:
            return self._size

    def can_insert(self, num_items: int = 1) -> bool:
        """Whether `num_items` inserts would proceed now without blocking."""
        with self._cond:
            return self.rate_limiter.can_insert(self._size, self._inserts, self._samples, num_items)

    def can_sample(self, num_items: int = 1) -> bool:
        """Whether a batch of `num_items` could be sampled now without blocking."""
        with self._cond:
            return self.rate_limiter.can_sample(self._size, self._inserts, self._samples, num_items)

    def insert(self, batch: Transition | Mapping[str, npt.ArrayLike], priorities: np.ndarray | None = None,
               timeout: float | None = None, force: bool = False) -> int:
        """Inserts N items (leading axis of every column: a batch of `Transition`s, or a mapping of the signature's
        columns); returns N.

        Blocks while the rate limiter refuses inserts. Items are admitted in order, as many at a time as the
        limiter allows, so a `RateLimiterTimeout` may leave a prefix of the batch inserted (as N separate
        Reverb inserts would); its message and its `inserted` attribute say how many. `priorities` default to
        1.0 (Acme's default). `force` inserts past the rate limiter: an actor's last transitions at a stop,
        when the learner whose samples would release them is stopping too.
        """
        columns, n = self._check_batch(batch)
        prios = check_priorities(np.ones(n) if priorities is None else priorities, n, "priorities")
        deadline = deadline_after(timeout)
        with self._cond:
            done = 0
            waited = WaitClock(self._blocked["insert"])
            try:
                while done < n:
                    self._check_open()
                    k = n - done if force else largest_allowed(
                        n - done, lambda j: self.rate_limiter.can_insert(self._size, self._inserts, self._samples, j))
                    if k == 0:
                        try:
                            waited.wait(self._cond, deadline, f"insert into table {self.name!r} "
                                        f"({done} of {n} items inserted)")
                        except RateLimiterTimeout as e:
                            e.inserted = done
                            raise
                        continue
                    k = min(k, self.capacity)
                    self._write({c: v[done:done + k] for c, v in columns.items()}, prios[done:done + k])
                    done += k
                    self._cond.notify_all()
            finally:
                waited.stop()
        return n

    def sample(self, batch_size: int, timeout: float | None = None) -> Sample:
        """Samples `batch_size` items (with replacement), blocking until the rate limiter allows each one.

        Each sampled item counts as one sample for the rate limiter, including items drawn before a
        `RateLimiterTimeout` (as in Reverb, where each item is its own sample call).
        """
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        deadline = deadline_after(timeout)
        parts: list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]] = []
        with self._cond:
            got = 0
            waited = WaitClock(self._blocked["sample"])
            try:
                while got < batch_size:
                    self._check_open()
                    k = largest_allowed(batch_size - got, lambda j: self.rate_limiter.can_sample(
                        self._size, self._inserts, self._samples, j))
                    if k == 0:
                        waited.wait(self._cond, deadline, f"sample from table {self.name!r} "
                                    f"({got} of {batch_size} items drawn)")
                        continue
                    parts.append(self._draw(k))
                    self._samples += k
                    got += k
                    self._cond.notify_all()
            finally:
                waited.stop()
        if len(parts) == 1:
            return Sample(*parts[0])
        return Sample(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                      {c: np.concatenate([p[2][c] for p in parts]) for c in self.signature})

    def sample_stacked(self, batch_size: int, num_batches: int, timeout: float | None = None) -> StackedSample:
        """`num_batches` batches of `batch_size` items in one call, as [K, B, ...] arrays: one lock hold and one
        vectorised draw of K * B items (the same items, in the same order, as `sample(K * B)` would draw), split
        into K consecutive batches by a reshape (no copy). The rate limiter sees the same items as from K `sample`
        calls. What a learner running K SGD steps per call asks for: one round trip and 2 + columns arrays per K."""
        batch_size, num_batches = check_counts(batch_size, num_batches)
        whole = self.sample(batch_size * num_batches, timeout)
        split = lambda a: a.reshape(num_batches, batch_size, *a.shape[1:])  # noqa: E731
        return StackedSample(split(whole.keys), split(whole.probabilities),
                             {c: split(v) for c, v in whole.data.items()})

    def sample_batches(self, batch_size: int, num_batches: int, timeout: float | None = None) -> list[Sample]:
        """`sample_stacked` as a list of K `Sample`s (views of the stacked arrays)."""
        stacked = self.sample_stacked(batch_size, num_batches, timeout)
        return [Sample(stacked.keys[i], stacked.probabilities[i], {c: v[i] for c, v in stacked.data.items()})
                for i in range(num_batches)]

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Sets new priorities for the items still in the table; evicted keys are ignored.

        Returns how many items were updated. If a key repeats, its last priority wins.
        """
        keys = np.asarray(keys)
        if keys.ndim != 1 or not (np.issubdtype(keys.dtype, np.integer) or keys.size == 0):
            raise ValueError(f"keys must be a 1-D integer array, got shape {keys.shape} dtype {keys.dtype}")
        prios = check_priorities(priorities, keys.shape[0], "priorities")
        keys = keys.astype(np.int64)
        with self._cond:
            self._check_open()
            live = (keys >= self._inserts - self._size) & (keys < self._inserts)
            keys, prios = keys[live], prios[live]
            if keys.size == 0:
                return 0
            # keep the last occurrence of each key
            rev_unique, rev_index = np.unique(keys[::-1], return_index=True)
            last = keys.size - 1 - rev_index
            slots = rev_unique % self.capacity
            self._set_priorities(slots, prios[last])
            return int(slots.size)

    def info(self) -> TableInfo:
        """Counters for monitoring: size, inserts, samples, samples per insert, time spent blocked."""
        with self._cond:
            return {
                "name": self.name,
                "sampler": self.sampler,
                "capacity": self.capacity,
                "size": self._size,
                "inserts": self._inserts,
                "samples": self._samples,
                "deletes": self._deletes,
                "samples_per_insert": self._samples / self._inserts if self._inserts else 0.0,
                "rate_limiter_diff": self._inserts * self.rate_limiter.samples_per_insert - self._samples,
                "insert_blocked_calls": int(self._blocked["insert"][0]),
                "insert_blocked_s": self._blocked["insert"][1],
                "sample_blocked_calls": int(self._blocked["sample"][0]),
                "sample_blocked_s": self._blocked["sample"][1],
                "closed": self._closed,
            }

    def close(self) -> None:
        """Closes the table: blocked and future inserts/samples raise `TableClosed`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def state_dict(self) -> TableState:
        """The table's contents and counters as NumPy arrays and ints (orbax-checkpointable, no pickle).

        Items are ordered oldest first. The sampling RNG state is not included.
        """
        with self._cond:
            keys = np.arange(self._inserts - self._size, self._inserts, dtype=np.int64)
            slots = keys % self.capacity
            return {
                "format_version": STATE_FORMAT_VERSION,
                "inserts": self._inserts,
                "samples": self._samples,
                "deletes": self._deletes,
                "keys": keys,
                "priorities": self._priorities[slots].copy(),
                "data": {c: v.copy() for c, v in self._gather(slots).items()},
            }

    def load_state_dict(self, state: TableState) -> None:
        """Replaces the table's contents with `state` (from `state_dict`; the capacity may differ if it fits)."""
        inserts, samples, deletes, size, prios = self._state_counters(state)
        columns, n = self._check_batch(state["data"])
        if n != size:
            raise ValueError(f"replay state holds {n} data items but {size} keys")
        self._restore(inserts, samples, deletes, size, [(columns, prios)])

    def _state_counters(self, state: TableState) -> tuple[int, int, int, int, np.ndarray]:
        """(inserts, samples, deletes, size, priorities) of a `state_dict`, checked against this table."""
        try:
            version = int(state["format_version"])
            inserts, samples, deletes = int(state["inserts"]), int(state["samples"]), int(state["deletes"])
            keys = np.asarray(state["keys"])
            _ = state["data"]
            prios = state["priorities"]
        except (KeyError, TypeError) as err:
            raise ValueError(f"malformed replay state: missing or bad field {err}") from None
        if version != STATE_FORMAT_VERSION:
            raise ValueError(f"replay state format version {version} is not {STATE_FORMAT_VERSION}")
        size = int(keys.shape[0]) if keys.ndim == 1 else -1
        if size < 0 or size > self.capacity:
            raise ValueError(f"replay state holds {size} items; this table's capacity is {self.capacity}")
        if not np.array_equal(keys, np.arange(inserts - size, inserts)) or min(samples, deletes) < 0:
            raise ValueError("replay state keys/counters are inconsistent")
        return inserts, samples, deletes, size, check_priorities(prios, size, "state priorities")

    def _restore(self, inserts: int, samples: int, deletes: int, size: int,
                 parts: Iterable[tuple[Mapping[str, np.ndarray], np.ndarray]]) -> None:
        """Empties the table, writes `parts` ((columns, priorities) batches of checked items, oldest first, `size`
        in all) and sets the counters: the tail of `load_state_dict`. `parts` may be a generator, so a subclass
        can expand a compact state one batch at a time."""
        with self._cond:
            self._check_open()
            self._clear_storage()
            self._priorities[:] = 0.0
            self._keys[:] = -1
            if self._tree is not None:
                self._tree.clear()
            self._inserts, self._size = inserts - size, 0
            for columns, prios in parts:
                if prios.shape[0]:
                    self._write(columns, prios)
            if self._size != size:
                raise ValueError(f"replay state holds {self._size} data items but {size} keys")
            self._inserts, self._samples, self._deletes = inserts, samples, deletes
            self._cond.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise TableClosed(f"table {self.name!r} is closed")

    def _check_batch(self, batch: Transition | Mapping[str, npt.ArrayLike]) -> tuple[dict[str, np.ndarray], int]:
        batch = item_columns(batch)
        if not isinstance(batch, Mapping):
            raise ValueError(f"batch must be a Transition or a dict of arrays, got {type(batch).__name__}")
        if set(batch) != set(self.signature):
            raise ValueError(f"batch columns {sorted(batch)} do not match the signature {sorted(self.signature)}")
        columns: dict[str, np.ndarray] = {}
        n = None
        for name, (shape, dtype) in self.signature.items():
            value = np.asarray(batch[name])
            if value.ndim == 0 or value.shape[1:] != shape:
                raise ValueError(f"column {name!r}: expected shape [N, {', '.join(map(str, shape))}] got "
                                 f"{list(value.shape)}")
            if n is None:
                n = value.shape[0]
            elif value.shape[0] != n:
                raise ValueError(f"column {name!r} has {value.shape[0]} items, others have {n}")
            if value.dtype != dtype and not np.can_cast(value.dtype, dtype, casting="safe"):
                raise ValueError(f"column {name!r}: dtype {value.dtype} cannot be stored as {np.dtype(dtype)}")
            if np.issubdtype(value.dtype, np.inexact) and not np.all(np.isfinite(value)):
                raise ValueError(f"column {name!r} contains NaN or inf")
            columns[name] = value.astype(dtype, copy=False)
        return columns, int(n or 0)

    def _allocate_storage(self) -> dict[str, np.ndarray]:
        """One [capacity, ...] array per column (subclasses store some columns otherwise)."""
        return {k: np.zeros((self.capacity, *shape), dtype) for k, (shape, dtype) in self.signature.items()}

    def _clear_storage(self) -> None:
        for v in self._data.values():
            v[...] = 0

    def _store(self, slots: np.ndarray | slice, columns: Mapping[str, np.ndarray]) -> None:
        """Writes checked columns into `slots` (unique indices, or a slice for a run that does not wrap); the items
        there before are being evicted. Lock held."""
        for c, v in columns.items():
            self._data[c][slots] = v

    def _gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The columns of the items in `slots`, as new arrays. Lock held."""
        # np.take on axis 0: the same rows as fancy indexing, with less per-row overhead
        return {c: np.take(v, slots, axis=0) for c, v in self._data.items()}

    def _write(self, columns: Mapping[str, np.ndarray], prios: np.ndarray) -> None:
        """Writes k <= capacity items at the next keys, evicting the oldest beyond capacity. Lock held."""
        k = int(prios.shape[0])
        keys = np.arange(self._inserts, self._inserts + k, dtype=np.int64)
        start = self._inserts % self.capacity
        # A run of slots that does not wrap is written as a slice (one memcpy per column, no index array).
        slots = slice(start, start + k) if start + k <= self.capacity else keys % self.capacity
        self._store(slots, columns)
        self._keys[slots] = keys
        self._set_priorities(slots, prios)
        evicted = max(0, self._size + k - self.capacity)
        self._deletes += evicted
        self._size += k - evicted
        self._inserts += k

    def _set_priorities(self, slots: np.ndarray | slice, prios: np.ndarray) -> None:
        self._priorities[slots] = prios
        if self._tree is not None:
            if isinstance(slots, slice):
                slots = np.arange(slots.start, slots.stop, dtype=np.int64)
            self._tree.set(slots, prios ** self.priority_exponent)

    def _draw(self, k: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Draws k items from the current contents (lock held, size >= 1)."""
        total = self._tree.total if self._tree is not None else 0.0
        if self._tree is not None and total > 0:
            slots = self._tree.find(self._rng.random(k) * total)
            probs = self._tree.get(slots) / total
        else:
            # uniform sampler, or a prioritized table whose priorities are all zero (Reverb: uniform)
            keys = self._inserts - self._size + self._rng.integers(0, self._size, size=k)
            slots = keys % self.capacity
            probs = np.full(k, 1.0 / self._size)
        return self._keys[slots], probs, self._gather(slots)


