"""The ActorQ service nodes (they only answer calls): the run-wide counter, the replay server and the quantizer."""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Mapping

import numpy as np

from launch import checkpoint as ckpt
from launch.node_base import NodeBase
from quarl.payload import encode_payload, fp32_payload_nbytes
from quarl.policy import PolicySpec
from quarl.quantization import parse_precision, quantize_params
from quarl.replay import RateLimiterTimeout, table_from_config


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
    until `close()`, which makes every waiting and later call raise `quarl.replay.TableClosed`."""

    def __init__(self, table: Mapping[str, Any], seed: int | None = None, resume: str | None = None,
                 logdir: str | None = None):
        signature = {k: (tuple(shape), np.dtype(dtype)) for k, (shape, dtype) in table["signature"].items()}
        self._table = table_from_config(signature, table["config"], seed=seed)
        if resume:
            directory = ckpt.find_checkpoint(resume)
            manifest = ckpt.read_manifest(directory, verify=False)
            state = ckpt.load_replay(directory / ckpt.REPLAY_FILE, manifest["checksums"][ckpt.REPLAY_FILE])
            self._table.load_state_dict(state)
        self._track_energy(logdir, "replay")

    def insert(self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None,
               timeout: float | None = None, force: bool = False) -> int:
        """Inserts the batch; returns how many of its leading items went in (fewer only after `timeout`
        seconds held back by the rate limiter). `force` bypasses the limiter (an actor's flush at a stop)."""
        try:
            return self._table.insert(batch, priorities, timeout=timeout, force=force)
        except RateLimiterTimeout as e:
            return int(e.inserted)

    def sample(self, batch_size: int) -> Any:
        return self._table.sample(batch_size)

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        return self._table.update_priorities(keys, priorities)

    def info(self) -> dict[str, Any]:
        return self._table.info()

    def save(self, path: str) -> dict[str, Any]:
        """Snapshot of the table as npz at `path` (see launch.checkpoint); returns its checksum and size."""
        return ckpt.save_replay(path, self._table.state_dict())

    def close(self) -> None:
        self._table.close()


# ------------------------------------------------------------------------------------------------------
# Quantizer (variable source for actors)
# ------------------------------------------------------------------------------------------------------


class Quantizer(NodeBase):
    """Learner weights in, actor payloads out: quantize + encode at most once per weights version.

    `publish(version, params)` replaces the latest fp32 weights (the learner pushes them every
    `publish_period` steps). `get_payload(have_version)` returns the payload bytes of the latest version, or
    None when the caller already has it (or nothing was published yet). Quantization happens lazily on the
    first request for a version, under a lock, so N actors asking at once share one quantization and versions
    no one asked for cost nothing."""

    def __init__(self, policy_spec: Mapping[str, Any], precision: str, logdir: str | None = None):
        self._policy_spec = PolicySpec.from_dict(policy_spec)
        self._precision = parse_precision(precision).name
        self._lock = threading.Lock()
        self._latest: tuple[int, dict] | None = None
        self._cached: tuple[int, bytes] | None = None
        self._stats: collections.Counter = collections.Counter()
        self._quantize_s = 0.0
        self._versions_quantized: list[int] = []
        self._payload_nbytes = 0
        self._fp32_nbytes = 0
        self._track_energy(logdir, "quantizer")

    def publish(self, version: int, params: Mapping[str, Any]) -> int:
        """Stores `params` as weights version `version` (older versions than the latest are ignored)."""
        for leaf in _leaves(params):
            if not np.all(np.isfinite(leaf)):
                raise ValueError(f"learner published non-finite weights (version {version})")
        with self._lock:
            if self._latest is None or version > self._latest[0]:
                self._latest = (int(version), params)
            self._stats["published"] += 1
            return self._latest[0]

    def latest_version(self) -> int:
        with self._lock:
            return -1 if self._latest is None else self._latest[0]

    def get_payload(self, have_version: int = -1) -> bytes | None:
        with self._lock:
            self._stats["requests"] += 1
            if self._latest is None or self._latest[0] <= have_version:
                self._stats["not_modified"] += 1
                return None
            version, params = self._latest
            if self._cached is None or self._cached[0] != version:
                t0 = time.perf_counter()
                data = encode_payload(quantize_params(params, self._precision), version=version,
                                      spec=self._policy_spec)
                self._quantize_s += time.perf_counter() - t0
                self._cached = (version, data)
                self._versions_quantized.append(version)
                self._payload_nbytes = len(data)
                if not self._fp32_nbytes:
                    self._fp32_nbytes = fp32_payload_nbytes(params)
            self._stats["served"] += 1
            return self._cached[1]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            quantized = len(self._versions_quantized)
            return {
                "precision": self._precision,
                "published": self._stats["published"],
                "requests": self._stats["requests"],
                "not_modified": self._stats["not_modified"],
                "payloads_served": self._stats["served"],
                "quantize_calls": quantized,
                "distinct_versions_quantized": len(set(self._versions_quantized)),
                "quantize_s_per_version": self._quantize_s / quantized if quantized else 0.0,
                "payload_bytes": self._payload_nbytes,
                "fp32_payload_bytes": self._fp32_nbytes,
            }


def _leaves(tree: Any) -> list[np.ndarray]:
    if isinstance(tree, Mapping):
        return [leaf for v in tree.values() for leaf in _leaves(v)]
    return [np.asarray(tree)]
