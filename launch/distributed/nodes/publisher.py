"""The learner's weight publisher: a thread that quantizes, encodes and publishes weight versions, so that the
training thread only hands over a reference to the current params.

Why: quantizing and encoding a 2048x3 policy took 162 ms per version on the training thread of the H200 machine,
57% of the learner's time. Now `offer(version, params)` stores the version in a one-slot mailbox and returns
(microseconds); the thread takes the newest version when it is free. "Latest wins": a version still waiting when
a newer one is offered is replaced, never queued, so a slow publisher never holds training back and actors always
get the newest weights it can make. `flush` publishes the last offered version at a stop (no lost last version);
an error in the thread (non-finite weights, a lost weight server) is raised on the training thread at its next
`offer`/`check`/`flush`, so it never dies silently.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Generic, TypeVar

Params = TypeVar("Params")  # what the training thread offers and the publish function takes, passed through as is
PublishFn = Callable[[int, Params], None]  # (version, params) -> publishes, raising on failure


@dataclasses.dataclass
class PublishTimes:
    """The weight channel's costs on the publisher thread (seconds quantizing + encoding, and publishing the bytes)
    and on the training thread (`handoff_s` over `offered` versions; offered - versions were replaced).

    `ready_wait_s` is the publisher's wait for the offered params to be computed, kept out of `quantize_encode_s`:
    updates are dispatched asynchronously and XLA keeps tens of them in flight, so a snapshot is ready only when
    the steps queued before it have run (about 200 ms per 256x3 version on the 2-core EPYC at K = 1, which the
    quantize+encode figure used to include). Waiting costs no CPU; only quantize+encode competes with training."""

    versions: int = 0
    ready_wait_s: float = 0.0
    quantize_encode_s: float = 0.0
    put_s: float = 0.0
    payload_bytes: int = 0
    offered: int = 0
    handoff_s: float = 0.0

    def add(self, quantize_encode_s: float, put_s: float, nbytes: int, ready_wait_s: float = 0.0) -> None:
        self.versions += 1
        self.ready_wait_s += ready_wait_s
        self.quantize_encode_s += quantize_encode_s
        self.put_s += put_s
        self.payload_bytes = int(nbytes)

    def summary(self) -> dict[str, float]:
        """The publisher thread's side (summary.json's `learner.publish`)."""
        n = max(self.versions, 1)
        return {"versions": self.versions, "quantize_encode_s": self.quantize_encode_s, "put_s": self.put_s,
                "payload_bytes": self.payload_bytes, "quantize_encode_ms_per_version": 1e3 * self.quantize_encode_s / n,
                "put_ms_per_version": 1e3 * self.put_s / n, "ready_wait_s": self.ready_wait_s,
                "ready_wait_ms_per_version": 1e3 * self.ready_wait_s / n}

    def handoff(self) -> dict[str, float]:
        """The training thread's side (summary.json's `learner.publish_handoff`): what publishing costs training."""
        return {"offered": self.offered, "handoff_s": self.handoff_s,
                "ms_per_version": 1e3 * self.handoff_s / max(self.offered, 1)}


class Publisher(Generic[Params]):
    """One background thread running `publish(version, params)` on the newest offered version ("latest wins"),
    at most once every `min_interval_s` seconds."""

    def __init__(self, publish: PublishFn[Params], min_interval_s: float = 0.0, name: str = "publisher"):
        if not min_interval_s >= 0:
            raise ValueError(f"min_interval_s must be >= 0, got {min_interval_s!r}")
        self._publish = publish
        self._min_interval_s = float(min_interval_s)
        self._cond = threading.Condition()
        self._pending: tuple[int, Params] | None = None
        self._busy = False
        self._closed = False
        self._error: BaseException | None = None
        self._last_start = -float("inf")
        self.published_version = -1
        self.replaced = 0  # versions dropped because a newer one arrived first
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def offer(self, version: int, params: Params) -> None:
        """Hands `params` (device arrays, never copied here) over as weights version `version`; returns at once.
        Raises the publisher thread's error, if it had one."""
        with self._cond:
            self._raise_error()
            if self._pending is not None:
                self.replaced += 1
            self._pending = (int(version), params)
            self._cond.notify_all()

    def due(self) -> bool:
        """Whether a version offered now would be published without waiting for the minimum interval: lets the
        caller skip making a snapshot that would only be replaced."""
        if self._min_interval_s <= 0:
            return True
        with self._cond:
            return time.monotonic() - self._last_start >= self._min_interval_s

    def check(self) -> None:
        """Raises the publisher thread's error, if it had one."""
        with self._cond:
            self._raise_error()

    def flush(self, timeout: float | None = None) -> None:
        """Waits until every offered version is published (the minimum interval does not apply to it); raises
        the thread's error, or TimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._last_start = -float("inf")  # the final version goes out now
            self._cond.notify_all()
            while (self._pending is not None or self._busy) and self._error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("the publisher did not publish the last weights version in time")
                self._cond.wait(left)
            self._raise_error()

    def close(self, timeout: float | None = 10.0) -> None:
        """Stops the thread (a pending version is dropped: `flush` first to keep it)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._pending is None or self._error is not None or
                                            time.monotonic() - self._last_start < self._min_interval_s):
                    wait = None if self._pending is None else \
                        self._min_interval_s - (time.monotonic() - self._last_start)
                    self._cond.wait(None if wait is None else max(wait, 1e-3))
                if self._closed:
                    return
                version, params = self._pending
                self._pending, self._busy = None, True
                self._last_start = time.monotonic()
            try:
                self._publish(version, params)
            except BaseException as e:  # pylint: disable=broad-except  (handed to the training thread)
                with self._cond:
                    self._error = e
            else:
                with self._cond:
                    self.published_version = max(self.published_version, version)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
