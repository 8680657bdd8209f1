"""Bytes published once and read by many nodes: on Ray, one object in the object store (actors on the same
machine read it from shared memory, no copy per request goes through the publisher); elsewhere, the bytes.

Why not plain return values: a weight payload returned by a service call is serialized again for every caller,
so N actors cost N copies through the service's process; `Blob.put` happens once, in the process that made the
bytes (the learner), and the service only hands out the small reference.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Ray is never imported here (see `Blob.put`)
    import ray


@dataclasses.dataclass(frozen=True)
class Blob:
    """A published byte string: `ref` is a Ray ObjectRef when published inside a Ray process, else the bytes."""

    ref: bytes | ray.ObjectRef
    nbytes: int

    @classmethod
    def put(cls, data: bytes) -> "Blob":
        ray = sys.modules.get("ray")  # never imported here: a process that has not loaded Ray is not on Ray
        if ray is not None and ray.is_initialized():
            return cls(ray.put(data), len(data))
        return cls(bytes(data), len(data))

    def get(self) -> bytes:
        if isinstance(self.ref, (bytes, bytearray, memoryview)):
            return bytes(self.ref)
        return sys.modules["ray"].get(self.ref)
