"""The publisher never blocks training: the training thread's handoff costs microseconds however slow quantizing
and encoding are, a slow publisher publishes the newest version ("latest wins"), the last version is never
lost, and a failure in the publisher thread reaches the training thread."""
from __future__ import annotations

import threading
import time

import pytest

from launch.distributed.nodes.publisher import Publisher


class _SlowSink:
    """A publish function taking `delay` seconds per version, recording what it published."""

    def __init__(self, delay: float, fail_at: int | None = None):
        self.delay, self.fail_at = delay, fail_at
        self.published: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, version: int, params: object) -> None:
        time.sleep(self.delay)
        if version == self.fail_at:
            raise ValueError(f"param 'linear_0/w' contains NaN or inf (version {version})")
        assert params == {"v": version}  # the object handed over, not a copy
        with self.lock:
            self.published.append(version)


def test_the_publisher_never_blocks_training_and_the_latest_version_wins():
    sink = _SlowSink(delay=0.05)
    publisher = Publisher(sink)
    handoffs = []
    for version in range(1, 201):  # a "training loop" offering a version every ~1 ms
        t = time.perf_counter()
        publisher.offer(version, {"v": version})
        handoffs.append(time.perf_counter() - t)
        time.sleep(0.001)
    publisher.flush(timeout=10)
    publisher.close()
    assert sum(handoffs) / len(handoffs) < 1e-3  # <= 1 ms per version on the training thread
    assert sink.published[-1] == 200 and publisher.published_version == 200  # the last version is not lost
    assert sink.published == sorted(set(sink.published))  # newest first: never an older version after a newer
    assert len(sink.published) < 100 and publisher.replaced == 200 - len(sink.published)  # replaced, not queued


def test_a_publisher_error_reaches_the_training_thread():
    publisher = Publisher(_SlowSink(delay=0.0, fail_at=3))
    publisher.offer(3, {"v": 3})
    with pytest.raises(ValueError, match="NaN or inf"):
        publisher.flush(timeout=5)
    with pytest.raises(ValueError, match="NaN or inf"):
        publisher.offer(4, {"v": 4})
    with pytest.raises(ValueError, match="NaN or inf"):
        publisher.check()
    publisher.close()


def test_the_minimum_interval_spaces_versions_but_not_the_last_one():
    sink = _SlowSink(delay=0.0)
    publisher = Publisher(sink, min_interval_s=0.3)
    t0 = time.monotonic()
    version = 0
    while time.monotonic() - t0 < 0.5:
        version += 1
        publisher.offer(version, {"v": version})
        time.sleep(0.002)
    publisher.flush(timeout=5)  # the final version goes out at once
    assert not publisher.due()  # and the next one waits 0.3 s
    publisher.close()
    assert 2 <= len(sink.published) <= 3 and sink.published[-1] == version
    with pytest.raises(ValueError, match="min_interval_s"):
        Publisher(sink, min_interval_s=-1.0)
