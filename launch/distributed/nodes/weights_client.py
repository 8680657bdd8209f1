"""An actor's (or the evaluator's) side of the weight channel (its stages are timed in a
`launch.experiments.stages.StageTimes`)."""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Callable

from launch.distributed.nodes.base import log_event
from launch.distributed.nodes.shared_blob import Blob
from launch.experiments.stages import StageTimes
from launch.distributed.clients import WeightServerClient
from launch.program.graph import NodeHandle, connect, result_as
from quarl.policy.spec import PolicySpec
from quarl.quant.payload import Payload, decode_payload
from quarl.quant.precision import Precision, parse_precision

# What an actor does with a valid payload before taking it (build or update its policy executor); its result is
# not used, and a ValueError from it rejects the payload.
ApplyFn = Callable[[Payload], object]


class PolicyClient:
    """An actor's side of the weight channel: fetch only when the version changed, timing each stage, and
    refuse anything that is not a usable policy.

    A payload is accepted only if it decodes (checksum, format version, structure, finite values: see
    `quarl.quant.payload`), is newer than the current version, has the expected precision and policy spec, and
    `apply` (building or updating the policy executor) accepts its tree. Anything else is rejected: counted,
    logged (once per distinct payload: the weight server hands out the same bytes again at every pull until a
    newer version exists), and the caller keeps acting with its last good policy. This is the one place a
    payload is validated: the learner that made it does not check it again.

    `precision`: what the actor runs (a name still parses: `parse_precision` takes both), None to accept any."""

    def __init__(self, weights: NodeHandle, times: StageTimes, *, spec: PolicySpec | None = None,
                 precision: Precision | None = None, logdir: str | None = None, node: str = "actor"):
        self._weights = connect(weights, WeightServerClient)
        self._times = times
        self._spec_hash = None if spec is None else spec.digest()
        self._precision = None if precision is None else parse_precision(precision).name
        self._logdir, self._node = logdir, node
        self.version = -1
        self.waited_s = 0.0  # long polls (`fetch(wait_s > 0)`): waiting for the learner to publish, not pulling
        self.rejected = 0
        self.last_rejection: str | None = None
        self._last_rejected_digest = b""

    @property
    def times(self) -> StageTimes:
        """The stage times this client adds to (shared with the actor that owns it)."""
        return self._times

    def fetch(self, apply: ApplyFn | None = None, wait_s: float = 0.0) -> Payload | None:
        """The newest payload if it is newer than ours and valid (decoded, and `apply(payload)` done), else
        None (nothing new, or rejected). `wait_s` > 0: the server waits that long for a newer version; that call
        (a reference, no bytes) is time spent waiting for the learner (`waited_s`), reading the bytes is the pull."""
        t0 = time.perf_counter()
        if wait_s > 0:
            blob = self._weights.get_payload(self.version, wait_s)
            waited = time.perf_counter()
            self.waited_s += waited - t0
        else:
            blob, waited = self._weights.get_payload(self.version), t0
        data = None if blob is None else result_as(Blob, blob, "weights.get_payload").get()
        t1 = time.perf_counter()
        self._times.pull_s += t1 - waited
        self._times.pulls += 1
        if data is None:
            return None
        try:
            payload = decode_payload(data)
            self._check(payload)
        except ValueError as e:  # PayloadError is a ValueError
            self._times.deserialize_s += time.perf_counter() - t1
            self._reject(str(e), data)
            return None
        t2 = time.perf_counter()
        self._times.deserialize_s += t2 - t1
        if apply is not None:
            try:
                apply(payload)
            except ValueError as e:  # the tree does not fit the spec/executor (quarl.runtimes validates it)
                self._times.load_s += time.perf_counter() - t2
                self._reject(f"payload version {payload.version} does not fit the policy: {e}", data)
                return None
            self._times.load_s += time.perf_counter() - t2
        self._times.payload_bytes += len(data)
        self._times.updates += 1
        self.version = payload.version
        return payload

    def _check(self, payload: Payload) -> None:
        if payload.version <= self.version:
            raise ValueError(f"stale payload: version {payload.version} is not newer than the current "
                             f"version {self.version}")
        if self._precision is not None and payload.precision != self._precision:
            raise ValueError(f"payload version {payload.version} holds {payload.precision} weights, this actor "
                             f"runs {self._precision}")
        if self._spec_hash is not None and payload.spec_hash is not None and payload.spec_hash != self._spec_hash:
            raise ValueError(f"payload version {payload.version} is for another policy spec")

    def _reject(self, reason: str, data: bytes) -> None:
        self.rejected += 1
        first_line = str(reason).splitlines()[0] if str(reason) else "invalid payload"
        self.last_rejection = first_line
        digest = hashlib.sha256(data).digest()
        if digest != self._last_rejected_digest:
            self._last_rejected_digest = digest
            log_event(self._logdir, self._node, f"rejected a weight payload ({first_line}); keeps acting with "
                                                f"weights version {self.version}", logging.WARNING)

    def first(self, stop: threading.Event, apply: ApplyFn | None = None) -> Payload | None:
        """Waits for the first valid published weights (the learner publishes version 0 when it starts)."""
        while not stop.is_set():
            payload = self.fetch(apply=apply)
            if payload is not None:
                return payload
            stop.wait(0.05)
        return None
