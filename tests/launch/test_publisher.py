"""The publisher never blocks training: the training thread's handoff returns while a publication is under way,
however long it takes, a busy publisher publishes the newest version ("latest wins"), the last version is never
lost, and a failure in the publisher thread reaches the training thread. The publisher's progress is observed, not
timed: margins are for a loaded machine, where a thread can wait hundreds of milliseconds for a core."""
from __future__ import annotations

import statistics
import threading
import time

import pytest

from launch.distributed.nodes.publisher import Publisher
from tests.launch.tiny import wait_until


class _Sink:
    """A publish function (held until `gate` opens, if given) recording what it published and when each
    publication began (`started`); version `fail_at` fails."""

    def __init__(self, fail_at: int | None = None, gate: threading.Event | None = None):
        self.fail_at, self.gate = fail_at, gate
        self.published: list[int] = []
        self.started: list[float] = []
        self.entered = threading.Event()  # a publication is under way
        self.lock = threading.Lock()

    def __call__(self, version: int, params: object) -> None:
        self.started.append(time.monotonic())
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(120), "the test never opened the gate"
        if version == self.fail_at:
            raise ValueError(f"param 'linear_0/w' contains NaN or inf (version {version})")
        assert params == {"v": version}  # the object handed over, not a copy
        with self.lock:
            self.published.append(version)


def test_the_publisher_never_blocks_training_and_the_latest_version_wins():
    gate = threading.Event()
    sink = _Sink(gate=gate)
    publisher = Publisher(sink)
    handoffs: list[float] = []

    def training() -> None:  # offers every version while the publisher is stuck in a publication
        publisher.offer(1, {"v": 1})
        assert sink.entered.wait(30)  # version 1 is being published, and stays so until the gate opens
        for version in range(2, 201):
            t = time.perf_counter()
            publisher.offer(version, {"v": version})
            handoffs.append(time.perf_counter() - t)

    trainer = threading.Thread(target=training, daemon=True)
    trainer.start()
    trainer.join(30)
    offered_while_publishing = not trainer.is_alive() and len(handoffs) == 199 and sink.published == []
    gate.set()
    publisher.flush(timeout=30)
    publisher.close()
    assert offered_while_publishing, "offer() waited for a publication to end"
    # A handoff is a lock and an assignment; the median leaves out calls whose thread lost its core meanwhile.
    assert statistics.median(handoffs) < 1e-3
    assert sink.published == [1, 200] and publisher.published_version == 200  # the newest, and the last one is kept
    assert publisher.replaced == 198  # versions 2..199 were replaced while waiting, not queued


def test_a_publisher_error_reaches_the_training_thread():
    publisher = Publisher(_Sink(fail_at=3))
    publisher.offer(3, {"v": 3})
    with pytest.raises(ValueError, match="NaN or inf"):
        publisher.flush(timeout=5)
    with pytest.raises(ValueError, match="NaN or inf"):
        publisher.offer(4, {"v": 4})
    with pytest.raises(ValueError, match="NaN or inf"):
        publisher.check()
    publisher.close()


def test_the_minimum_interval_spaces_versions_but_not_the_last_one():
    sink = _Sink()
    publisher = Publisher(sink, min_interval_s=0.3)
    offered_at: dict[int, float] = {}
    for version in range(1, 31):  # offered faster than the interval, for longer than it
        offered_at[version] = time.monotonic()
        publisher.offer(version, {"v": version})
        time.sleep(0.02)
    assert wait_until(lambda: sink.published[-1:] == [30])  # the last offered one comes out after its wait
    publisher.close()
    assert sink.published == sorted(sink.published)
    # A publication starts at least the interval after the previous one did, itself no earlier than its offer:
    # lower bounds, which a loaded machine only makes larger.
    for before, (after, began) in zip(sink.published, zip(sink.published[1:], sink.started[1:])):
        assert began - offered_at[before] >= 0.3, (before, after)

    sink = _Sink()
    publisher = Publisher(sink, min_interval_s=60.0)
    publisher.offer(1, {"v": 1})
    assert wait_until(lambda: sink.published == [1])  # the first version goes out at once
    publisher.offer(2, {"v": 2})
    publisher.flush(timeout=30)  # the final version goes out at once, not 60 s later (TimeoutError)
    assert sink.published == [1, 2]
    assert not publisher.due()  # and the next one waits the interval
    publisher.close()
    with pytest.raises(ValueError, match="min_interval_s"):
        Publisher(sink, min_interval_s=-1.0)
