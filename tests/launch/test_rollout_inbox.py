"""The on-policy learner's inbox: slots go to the actors in the order their rollouts became ready, so a slow actor
cannot keep an asynchronous learner's only slot while another actor's rollout waits (it once did, for minutes:
`threading.Semaphore` lets a releasing thread win again), and lost or finished actors are told apart."""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable

from launch.distributed.nodes.rollout_learner import FairSlots, RolloutInbox
from launch.program.graph import NodeLost
from tests.launch.tiny import wait_until


class FakeActor:
    """A rollout actor's `ready` / `take` / `finished`, in process: `every_s` apart it finishes a rollout (None:
    one is always ready), with a one-rollout outbox as the real node has."""

    def __init__(self, actor_id: int, every_s: float | None, lost_after: int | None = None):
        self.id, self.every_s, self.lost_after = actor_id, every_s, lost_after
        self.outbox: queue.Queue[dict] = queue.Queue(maxsize=1)
        self.handed = 0
        self.done = False
        self._last = time.monotonic()

    def _produce(self) -> None:
        if self.every_s is None or time.monotonic() - self._last >= self.every_s:
            try:
                self.outbox.put_nowait({"actor_id": self.id, "weights_version": 0, "rollout": {}, "actor_steps": 0})
                self._last = time.monotonic()
            except queue.Full:
                pass

    def call(self, method: str, *args: object) -> object:
        if self.lost_after is not None and self.handed >= self.lost_after:
            raise NodeLost(f"actor_{self.id} died")
        if method in ("ready", "take"):  # both wait up to their timeout for a rollout
            deadline = time.monotonic() + float(args[0])
            while self.outbox.empty() and time.monotonic() < deadline:
                self._produce()
                time.sleep(0.005)
            self._produce()
        if method == "ready":
            return not self.outbox.empty()
        if method == "take":
            try:
                item = self.outbox.get_nowait()
            except queue.Empty:
                return None
            self.handed += 1
            return item
        if method == "finished":
            return self.done and self.outbox.empty()
        raise AssertionError(method)


def _learner(inbox: RolloutInbox, update_s: float, until: Callable[[dict[int, int]], bool],
             timeout: float = 60.0) -> dict[int, int]:
    """An asynchronous learner: takes rollouts, `update_s` per update, until `until(counts)` holds (or `timeout`
    seconds pass); counts them per actor. Ending on counts, not on a clock, keeps a loaded machine's slower pace
    out of the counts compared."""
    counts: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while not until(counts) and time.monotonic() < deadline:
        item = inbox.get(0.05)
        if item is not None:
            counts[item["actor_id"]] = counts.get(item["actor_id"], 0) + 1
            time.sleep(update_s)
    return counts


def test_a_slow_actor_cannot_starve_a_ready_one_of_the_only_slot():
    fast, slow = FakeActor(0, None), FakeActor(1, every_s=0.5)
    inbox = RolloutInbox([slow, fast], capacity=1).start()  # the slow one's thread first
    try:
        counts = _learner(inbox, update_s=0.02, until=lambda c: c.get(1, 0) >= 4)
    finally:
        inbox.close()
    # The slow actor's 4 rollouts take >= 2 s; meanwhile the ready actor's go through at the learner's pace (~20 ms
    # each: ~90 idle). Starved, it would get one per slow rollout; a slot held by the slow actor's wait, none.
    assert counts.get(1, 0) == 4, counts
    assert counts.get(0, 0) >= 3 * 4, counts


def test_two_ready_actors_share_the_only_slot_evenly():
    actors = [FakeActor(0, None), FakeActor(1, None)]
    inbox = RolloutInbox(actors, capacity=1).start()
    try:
        counts = _learner(inbox, update_s=0.01, until=lambda c: sum(c.values()) >= 40)
    finally:
        inbox.close()
    total = sum(counts.values())
    assert total == 40 and min(counts.get(0, 0), counts.get(1, 0)) >= 0.4 * total, counts


def test_finished_and_lost_actors_leave_the_live_set():
    done, lost, busy = FakeActor(0, 0.1), FakeActor(1, None, lost_after=2), FakeActor(2, 0.1)
    done.done, done.every_s = True, 3600.0
    inbox = RolloutInbox([done, lost, busy], capacity=3).start()
    try:
        _learner(inbox, update_s=0.0, until=lambda c: c.get(1, 0) >= 2 and inbox.lost and inbox.finished)
        assert inbox.lost == {1} and inbox.finished == {0} and inbox.live == {2}
    finally:
        inbox.close()


def test_fair_slots_serve_waiters_in_arrival_order():
    slots = FairSlots(1)
    assert slots.acquire(0.1)
    order: list[int] = []

    def waiter(i: int) -> None:
        if slots.acquire(30.0):
            order.append(i)
            slots.release()

    threads = []
    for i in range(4):
        threads.append(threading.Thread(target=waiter, args=(i,)))
        threads[-1].start()
        # each waiter queued before the next starts
        assert wait_until(lambda n=i + 1: len(slots._waiting) == n)  # pylint: disable=protected-access
    slots.release()
    for t in threads:
        t.join(30.0)
    assert order == [0, 1, 2, 3]
    assert not FairSlots(0).acquire(0.05)
