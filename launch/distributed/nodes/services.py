"""The ActorQ service nodes (they only answer calls): the run-wide counter, the replay server and the weight server."""
from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING, Mapping

import numpy as np

from launch.distributed.nodes.base import NodeBase
from launch.distributed.nodes.shared_blob import Blob
from launch.experiments import checkpoint as ckpt
from quarl.quant.precision import Precision, parse_precision
from quarl.replay import table_from_config
from quarl.replay.items import Sample, StackedSample, TableInfo, Transition
from quarl.replay.limiter import RateLimiterTimeout

if TYPE_CHECKING:
    from launch.experiments.agent_spec import TableSpec
    from launch.experiments.checkpoint import ReplaySnapshot


# ------------------------------------------------------------------------------------------------------
# Counter
# ------------------------------------------------------------------------------------------------------


class Counter(NodeBase):
    """Run-wide counts. `increment` returns the new totals, so a node learns "the run is done" for free.

    `wall_clock_s` is seconds since the run started (continued across `--resume`)."""

    def __init__(self, resume: str | None = None, logdir: str | None = None):
        self._track_energy(logdir, "counter")
        self._lock = threading.Lock()
        self._counts: collections.Counter = collections.Counter()
        elapsed = 0.0
        if resume:
            manifest = ckpt.read_manifest(ckpt.find_checkpoint(resume), verify=False)
            counts = dict(manifest["counts"])
            elapsed = float(counts.pop("wall_clock_s", 0.0))
            self._counts.update({k: int(v) for k, v in counts.items() if not k.endswith("_starts")})
        self._t0 = time.monotonic() - elapsed

    def increment(self, **deltas: int) -> dict[str, float]:
        with self._lock:
            for key, value in deltas.items():
                self._counts[key] += int(value)
            return self._snapshot()

    def get(self) -> dict[str, float]:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, float]:
        out: dict[str, float] = dict(self._counts)
        out.setdefault("actor_steps", 0)
        out.setdefault("learner_steps", 0)
        out.setdefault("episodes", 0)
        out["wall_clock_s"] = time.monotonic() - self._t0
        return out


# ------------------------------------------------------------------------------------------------------
# Replay
# ------------------------------------------------------------------------------------------------------


class ReplayServer(NodeBase):
    """The agent's replay table behind blocking calls (Reverb semantics, incl. the samples-per-insert limiter:
    `insert` waits while actors are too far ahead, `sample` while the learner is). Calls block until done or
    until `close()`, which makes every waiting and later call raise `quarl.replay.table.TableClosed`."""

    def __init__(self, table: TableSpec, seed: int | None = None, resume: str | None = None,
                 logdir: str | None = None):
        signature = {k: (tuple(shape), np.dtype(dtype)) for k, (shape, dtype) in table["signature"].items()}
        self._table = table_from_config(signature, table["config"], seed=seed)
        if resume:
            directory = ckpt.find_checkpoint(resume)
            manifest = ckpt.read_manifest(directory, verify=False)
            state = ckpt.load_replay(directory / ckpt.REPLAY_FILE, manifest["checksums"][ckpt.REPLAY_FILE])
            self._table.load_state_dict(state)
        self._track_energy(logdir, "replay")

    def insert(self, batch: Transition | Mapping[str, np.ndarray], priorities: np.ndarray | None = None,
               timeout: float | None = None, force: bool = False) -> int:
        """Inserts the batch; returns how many of its leading items went in (fewer only after `timeout`
        seconds held back by the rate limiter). `force` bypasses the limiter (an actor's flush at a stop)."""
        try:
            return self._table.insert(batch, priorities, timeout=timeout, force=force)
        except RateLimiterTimeout as e:
            return int(e.inserted)

    def sample(self, batch_size: int) -> Sample:
        return self._table.sample(batch_size)

    def sample_batches(self, batch_size: int, num_batches: int) -> list[Sample]:
        """`num_batches` batches in one call (a learner running K SGD steps per call: one round trip per K)."""
        return self._table.sample_batches(batch_size, num_batches)

    def sample_stacked(self, batch_size: int, num_batches: int) -> StackedSample:
        """The same, as one `quarl.replay.table.StackedSample` ([K, B, ...] arrays): 2 + columns arrays cross the
        process boundary instead of K samples' worth, and the learner's feed stacks nothing."""
        return self._table.sample_stacked(batch_size, num_batches)

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        return self._table.update_priorities(keys, priorities)

    def info(self) -> TableInfo:
        return self._table.info()

    def save(self, path: str) -> ReplaySnapshot:
        """Snapshot of the table as npz at `path` (see launch.experiments.checkpoint); returns its checksum and size."""
        return ckpt.save_replay(path, self._table.state_dict())

    def close(self) -> None:
        self._table.close()


# ------------------------------------------------------------------------------------------------------
# Weight server (variable source for actors)
# ------------------------------------------------------------------------------------------------------


MAX_WAIT_S = 1.0  # the longest a `get_payload` call holds one of the weight server's threads


class WeightServer(NodeBase):
    """The latest published policy payload, for actors and the evaluator to pull.

    The learner quantizes and encodes each version itself, once, and publishes it as a `Blob` (on Ray: one
    object-store object); this node only keeps the newest reference and answers `get_payload(have_version)`
    with it, or None when the caller already has that version (one small round trip, no payload). `precision`
    (the actors', reported in `stats`): a name still parses."""

    def __init__(self, precision: Precision, logdir: str | None = None):
        self._precision = parse_precision(precision).name
        self._lock = threading.Condition()  # notified at every publication (`get_payload`'s wait)
        self._latest: tuple[int, Blob] | None = None
        self._stats: collections.Counter = collections.Counter()
        self._payload_nbytes = 0
        self._fp32_nbytes = 0
        self._track_energy(logdir, "weights")

    def publish(self, version: int, blob: Blob, fp32_nbytes: int = 0) -> int:
        """Stores `blob` as weights version `version` (a version older than the latest is ignored); returns
        the latest version. `fp32_nbytes` is the size the same weights would have as an fp32 payload."""
        with self._lock:
            if self._latest is None or version > self._latest[0]:
                self._latest = (int(version), blob)
                self._payload_nbytes = int(blob.nbytes)
            self._fp32_nbytes = int(fp32_nbytes) or self._fp32_nbytes
            self._stats["published"] += 1
            self._lock.notify_all()
            return self._latest[0]

    def latest_version(self) -> int:
        with self._lock:
            return -1 if self._latest is None else self._latest[0]

    def get_payload(self, have_version: int = -1, wait_s: float = 0.0) -> Blob | None:
        """The latest payload if it is newer than `have_version`, else None, after waiting up to `wait_s` seconds
        for one to be published (a synchronous on-policy actor's long poll: it gets the next version one round
        trip after its publication, with no polling interval)."""
        with self._lock:
            self._stats["requests"] += 1
            if wait_s > 0:
                self._lock.wait_for(lambda: self._latest is not None and self._latest[0] > have_version,
                                    timeout=min(float(wait_s), MAX_WAIT_S))
            if self._latest is None or self._latest[0] <= have_version:
                self._stats["not_modified"] += 1
                return None
            self._stats["served"] += 1
            return self._latest[1]

    def stats(self) -> dict[str, str | int]:
        with self._lock:
            return {
                "precision": self._precision,
                "published": self._stats["published"],
                "requests": self._stats["requests"],
                "not_modified": self._stats["not_modified"],
                "payloads_served": self._stats["served"],
                "payload_bytes": self._payload_nbytes,
                "fp32_payload_bytes": self._fp32_nbytes,
            }
