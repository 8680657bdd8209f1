"""The learner's feed: prefetch threads that sample K batches per replay call and prepare them for the device.

Why: a learner running at device speed must never wait for a replay round trip, a NumPy check or a host-to-device
copy. Each thread keeps one `sample_stacked(batch_size, K)` call in flight (K batches as [K, B, ...] arrays whose
values the table checked at insert), then checks their dtypes and shapes and copies them to the learner's device
(`learner.prepare`, thread-safe) while the training thread runs the current block. Every sampled batch goes into
exactly one block and every block is taken once; the blocks still queued at a stop are dropped with the queue
(their samples were never trained on).
"""
from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Callable

import numpy as np

from launch.distributed.nodes.base import POLL_S, wait_or_stop
from launch.distributed.clients import ReplayClient
from launch.program.graph import CallFuture, NodeHandle, connect, submit
from quarl.replay.items import StackedSample
from quarl.replay.table import TableClosed

if TYPE_CHECKING:  # the learner's JAX side: its node has loaded JAX before it starts a feed
    from agents.learner_base import Block


# SGD steps per learner call when the run does not set K (`steps_per_call=None`), by the learner's JAX platform.
# CPU: K = 4. On the 2-core EPYC, D4PG 256x3 at batch 256, interleaved arms under the same load: `run_block`
# at K = 2, 4, 8 took 4-6% less process CPU per step than K = 1 (14.5 vs 15.3 ms), and the node at K = 4 used
# 15.5 ms of CPU per step against 17.3 ms at K = 1 and 16.8 ms for `learner.step` (the feed, the dispatch and
# the training thread's bookkeeping are paid once per block); K = 8 gained no more. On a CPU the "device" is the
# same cores, so every per-call cost is a cost to training. Other platforms: 8, the low end of the range the
# GPU scan figures suggest (issue 20); not yet measured per K there.
STEPS_PER_CALL_BY_PLATFORM = {"cpu": 4}
STEPS_PER_CALL_OTHER = 8


def default_steps_per_call(platform: str | None = None) -> int:
    """K for a learner on `platform` (default: JAX's default backend, where the learner's state lives)."""
    import jax  # pylint: disable=import-outside-toplevel  (loaded already in a learner's process)

    return STEPS_PER_CALL_BY_PLATFORM.get(platform or jax.default_backend(), STEPS_PER_CALL_OTHER)


class BlockFeed:
    """`threads` prefetch threads filling a queue of at most `depth` prepared blocks of `steps_per_call` batches."""

    def __init__(self, replay: NodeHandle, prepare: Callable[[StackedSample], Block], batch_size: int,
                 steps_per_call: int, threads: int = 2, depth: int | None = None):
        self._replay = submit(connect(replay, ReplayClient))
        self._prepare = prepare
        self._batch_size = int(batch_size)
        self._k = int(steps_per_call)
        self._blocks: queue.Queue[Block] = queue.Queue(maxsize=max(1, depth if depth is not None else threads))
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._loop, name=f"prefetch-{i}", daemon=True)
                         for i in range(max(1, int(threads)))]

    def start(self) -> "BlockFeed":
        for t in self._threads:
            t.start()
        return self

    def get(self, timeout: float = POLL_S) -> Block | None:
        """The next prepared block, or None after `timeout` seconds without one. Raises a prefetch thread's error."""
        if self._errors:
            raise self._errors[0]
        try:
            return self._blocks.get(timeout=timeout)
        except queue.Empty:
            if self._errors:
                raise self._errors[0] from None
            return None

    def close(self, timeout: float = 5.0) -> bool:
        """Stops the threads (a replay call in flight is abandoned) and drops the queued blocks; True if every
        thread has ended within `timeout` seconds."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        while True:
            try:
                self._blocks.get_nowait()
            except queue.Empty:
                break
        return not any(t.is_alive() for t in self._threads)

    def _sample(self) -> tuple[bool, StackedSample | None]:
        # One StackedSample ([K, B, ...]): `prepare` neither stacks it nor re-scans what the table checked at insert.
        return wait_or_stop(self._replay.sample_stacked(self._batch_size, self._k), self._stop)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                finished, samples = self._sample()
                if not finished:
                    return
                block = self._prepare(samples)
                while not self._stop.is_set():
                    try:
                        self._blocks.put(block, timeout=POLL_S)
                        break
                    except queue.Full:
                        continue
        except TableClosed:
            return
        except BaseException as e:  # pylint: disable=broad-except  (raised on the training thread by get)
            if not self._stop.is_set():
                self._errors.append(e)


class PriorityUpdates:
    """The learner's PER priority updates, applied by the replay server in the order the blocks trained.

    Why: the server runs calls on several threads (a threaded Ray actor, the local runner's pool), so two updates
    in flight at once may apply in either order, and a key sampled in both blocks would keep the older priority.
    One update is in flight at a time; blocks trained meanwhile wait here and go as one concatenated update
    (same order, later wins), so the training thread never waits for the server.
    """

    def __init__(self, replay: NodeHandle):
        self._replay = submit(connect(replay, ReplayClient))
        self._queued: list[tuple[np.ndarray, np.ndarray]] = []
        self._in_flight: CallFuture | None = None

    def add(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        self._queued.append((np.asarray(keys), np.asarray(priorities)))

    def poll(self) -> None:
        """Non-blocking: collects a finished update (raising its error) and sends what has queued since."""
        if self._in_flight is not None and self._in_flight.done():
            self._in_flight, done = None, self._in_flight
            done.result()
        if self._in_flight is None and self._queued:
            keys = np.concatenate([k for k, _ in self._queued])
            prios = np.concatenate([p for _, p in self._queued])
            self._queued = []
            self._in_flight = self._replay.update_priorities(keys, prios)

    def flush(self, timeout: float) -> None:
        """Waits until every added update has been applied (at a stop: none is dropped)."""
        while self._in_flight is not None or self._queued:
            if self._in_flight is not None:
                self._in_flight.result(timeout=timeout)
                self._in_flight = None
            self.poll()
