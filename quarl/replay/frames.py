"""A replay table that stores each frame of stacked image observations once.

Why: an ALE transition carries two [84, 84, 4] uint8 stacks (observation and next_observation), 8 frames of which
7 are already in the table (the stacks of consecutive steps share 3 frames, and next_observation is a later
observation). Stored as is, 1M transitions take ~53 GiB; stored once per frame, ~6.6 GiB.

How: frames are content-addressed. An inserted stack [H, W, K] is split into its K frames ([H, W] slices along the
last axis); each frame is looked up by a 128-bit BLAKE2b digest of its bytes (and compared byte for byte on a hit,
so a digest collision can only cost a duplicate, never a wrong frame). A new frame is copied into a frame store
that grows in chunks of ~64 MiB; an item keeps K frame indices per image column; a frame is freed when the last
item that refers to it is evicted (reference counts). Sampling gathers the K frames of each item back into its
stack, so every sampled stack is bit-identical to the one inserted, whatever the episode boundaries (an episode's
first stack repeats its frame: stored once), n-step windows, truncations, or how several actors' inserts
interleave: nothing here relies on the order of inserts. The table's API and semantics (keys, FIFO eviction,
samplers, rate limiter, checkpoints) are `quarl.replay.table.Table`'s; `table_from_config` picks this table for
observation columns that are uint8 [H, W, K] with H * W >= `MIN_FRAME_PIXELS`.
"""
from __future__ import annotations

import hashlib
from typing import Iterator, Mapping, Unpack

import numpy as np

from quarl.replay.items import Signature, TableState
from quarl.replay.table import STATE_FORMAT_VERSION, Table, TableOptions

FRAME_COLUMNS = ("observation", "next_observation")
# Below this many pixels a frame is cheaper to copy than to hash and look up (MinAtar's 10x10 planes).
MIN_FRAME_PIXELS = 1024
CHUNK_BYTES = 64 << 20
RESTORE_BATCH = 1024  # items expanded at a time when a compact checkpoint is loaded


def frame_columns(signature: Signature) -> tuple[str, ...]:
    """The columns a `FrameTable` stores by frame for this signature (empty: a plain `Table` is as good)."""
    cols = tuple(c for c in FRAME_COLUMNS if c in signature)
    if not cols:
        return ()
    shapes = {(tuple(signature[c][0]), np.dtype(signature[c][1])) for c in cols}
    if len(shapes) != 1:
        return ()
    shape, dtype = shapes.pop()
    if dtype != np.uint8 or len(shape) != 3 or shape[0] * shape[1] < MIN_FRAME_PIXELS:
        return ()
    return cols


class FrameTable(Table):
    """`quarl.replay.table.Table` with the image columns stored as references into a deduplicated frame store."""

    def __init__(self, name: str, capacity: int, signature: Signature, **kwargs: Unpack[TableOptions]):
        self._frame_cols = frame_columns(signature)
        if not self._frame_cols:
            raise ValueError("FrameTable needs uint8 [H, W, K] observation columns of at least "
                             f"{MIN_FRAME_PIXELS} pixels a frame, got {dict(signature)!r}")
        super().__init__(name, capacity, signature, **kwargs)

    # ---------------------------------------------------------------- storage hooks (lock held)

    def _allocate_storage(self) -> dict[str, np.ndarray]:
        shape, dtype = self.signature[self._frame_cols[0]]
        self._frame_shape = tuple(shape[:2])
        self._stack = int(shape[2])
        self._chunk = max(1, CHUNK_BYTES // (shape[0] * shape[1] * np.dtype(dtype).itemsize))
        self._refs = {c: np.zeros((self.capacity, self._stack), np.int64) for c in self._frame_cols}
        self._reset_frames()
        return {k: np.zeros((self.capacity, *s), d) for k, (s, d) in self.signature.items()
                if k not in self._frame_cols}

    def _reset_frames(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._refcount = np.zeros(0, np.int64)
        self._digests: list[bytes | None] = []
        self._index: dict[bytes, int] = {}
        self._free: list[int] = []

    def _clear_storage(self) -> None:
        super()._clear_storage()
        for r in self._refs.values():
            r[...] = 0
        self._reset_frames()

    def _store(self, slots: np.ndarray | slice, columns: Mapping[str, np.ndarray]) -> None:
        if isinstance(slots, slice):
            slots = np.arange(slots.start, slots.stop, dtype=np.int64)
        evicted = slots[self._keys[slots] >= 0]
        old = np.concatenate([self._refs[c][evicted].ravel() for c in self._frame_cols])
        # New references first, so a frame shared by an evicted item and a new one is never freed and re-copied.
        for c in self._frame_cols:
            frames = np.ascontiguousarray(np.moveaxis(columns[c], -1, 1))  # [k, K, H, W]
            self._refs[c][slots] = [[self._acquire(f) for f in stack] for stack in frames]
        self._release(old)
        for c, v in columns.items():
            if c not in self._frame_cols:
                self._data[c][slots] = v

    def _gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        out = {c: v[slots] for c, v in self._data.items()}
        for c in self._frame_cols:
            refs = self._refs[c][slots]  # [k, K]
            frames = self._frames_at(refs.ravel()).reshape(*refs.shape, *self._frame_shape)
            out[c] = np.ascontiguousarray(np.moveaxis(frames, 1, -1))
        return out

    # ---------------------------------------------------------------- the frame store

    def _acquire(self, frame: np.ndarray) -> int:
        """The index of a stored frame equal to `frame` (one more reference to it), storing it if new."""
        digest = hashlib.blake2b(frame, digest_size=16).digest()
        index = self._index.get(digest)
        if index is not None and np.array_equal(self._frame(index), frame):
            self._refcount[index] += 1
            return index
        if not self._free:
            self._grow()
        index = self._free.pop()
        self._frame(index)[...] = frame
        self._refcount[index] = 1
        if digest in self._index:  # a digest collision: keep the frame, unindexed
            digest = None
        else:
            self._index[digest] = index
        self._digests[index] = digest
        return index

    def _release(self, indices: np.ndarray) -> None:
        if indices.size == 0:
            return
        np.subtract.at(self._refcount, indices, 1)
        for index in np.unique(indices[self._refcount[indices] == 0]).tolist():
            digest = self._digests[index]
            if digest is not None:
                del self._index[digest]
                self._digests[index] = None
            self._free.append(index)

    def _grow(self) -> None:
        """One more chunk of frame slots (free list ordered so the lowest index is used first)."""
        base = len(self._chunks) * self._chunk
        self._chunks.append(np.zeros((self._chunk, *self._frame_shape), np.uint8))
        self._refcount = np.concatenate([self._refcount, np.zeros(self._chunk, np.int64)])
        self._digests.extend([None] * self._chunk)
        self._free.extend(range(base + self._chunk - 1, base - 1, -1))

    def _frame(self, index: int) -> np.ndarray:
        return self._chunks[index // self._chunk][index % self._chunk]

    def _frames_at(self, indices: np.ndarray) -> np.ndarray:
        chunk, offset = np.divmod(indices, self._chunk)
        if len(self._chunks) == 1:
            return self._chunks[0][offset]
        out = np.empty((indices.shape[0], *self._frame_shape), np.uint8)
        for c in np.unique(chunk).tolist():
            mask = chunk == c
            out[mask] = self._chunks[c][offset[mask]]
        return out

    # ---------------------------------------------------------------- accounting and checkpoints

    def memory(self) -> dict[str, int]:
        """Bytes held: `frame_store` (allocated chunks), `frames_live` (frames referenced now, and their bytes in
        `frame_bytes_live`), `frame_refs`, `other_columns`, `index` (the digest dict, approximate), `total`."""
        with self._cond:
            live = int(np.count_nonzero(self._refcount))
            frame_bytes = int(np.prod(self._frame_shape))
            out = {"frame_store": sum(c.nbytes for c in self._chunks), "frames_live": live,
                   "frame_bytes_live": live * frame_bytes,
                   "frame_refs": sum(r.nbytes for r in self._refs.values()) + self._refcount.nbytes,
                   "other_columns": sum(v.nbytes for v in self._data.values()),
                   # dict slot (~100 B with its hash table share) + a 16-byte bytes object (49 B) per indexed frame
                   "index": len(self._index) * 150 + len(self._digests) * 8,
                   "table": self._priorities.nbytes + self._keys.nbytes}
        out["total"] = sum(v for k, v in out.items() if k not in ("frames_live", "frame_bytes_live"))
        return out

    def state_dict(self) -> TableState:
        """`Table.state_dict` with the image columns compact: `frames` [F, H, W] (each live frame once) and, in
        `data`, each image column as [N, K] indices into it (`frame_columns` names them)."""
        with self._cond:
            keys = np.arange(self._inserts - self._size, self._inserts, dtype=np.int64)
            slots = keys % self.capacity
            refs = {c: self._refs[c][slots] for c in self._frame_cols}
            used = np.unique(np.concatenate([r.ravel() for r in refs.values()]))
            data = {c: v[slots].copy() for c, v in self._data.items()}
            data.update({c: np.searchsorted(used, r).astype(np.int64) for c, r in refs.items()})
            return {"format_version": STATE_FORMAT_VERSION, "inserts": self._inserts, "samples": self._samples,
                    "deletes": self._deletes, "keys": keys, "priorities": self._priorities[slots].copy(),
                    "frames": self._frames_at(used), "frame_columns": np.array(self._frame_cols), "data": data}

    def load_state_dict(self, state: TableState) -> None:
        """Loads a compact state (from this class) or a plain `Table` one (full stacks)."""
        if "frames" not in state:
            super().load_state_dict(state)
            return
        inserts, samples, deletes, size, prios = self._state_counters(state)
        frames = np.asarray(state["frames"])
        data = state["data"]
        if (frames.dtype != np.uint8 or frames.shape[1:] != self._frame_shape
                or sorted(np.asarray(state.get("frame_columns", [])).tolist()) != sorted(self._frame_cols)):
            raise ValueError(f"replay state frames {frames.shape} {frames.dtype} do not fit this table's "
                             f"{self._frame_cols} of {self._frame_shape} uint8 frames")
        for c in self._frame_cols:
            r = np.asarray(data.get(c))
            if r.shape != (size, self._stack) or not np.issubdtype(r.dtype, np.integer) or (
                    r.size and (r.min() < 0 or r.max() >= frames.shape[0])):
                raise ValueError(f"replay state column {c!r}: bad frame indices")
        plain = {c: np.asarray(data[c]) for c in self.signature if c not in self._frame_cols}

        def parts() -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
            for i in range(0, size, RESTORE_BATCH):
                batch = {c: v[i:i + RESTORE_BATCH] for c, v in plain.items()}
                for c in self._frame_cols:
                    idx = np.asarray(data[c][i:i + RESTORE_BATCH], np.int64)
                    batch[c] = np.moveaxis(frames[idx], 1, -1)
                columns, _ = self._check_batch(batch)
                yield columns, prios[i:i + RESTORE_BATCH]

        self._restore(inserts, samples, deletes, size, parts())
