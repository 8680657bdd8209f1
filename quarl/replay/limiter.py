"""Reverb's rate limiters, and the waiting a blocked insert or sample does under them.

A limiter bounds `inserts * samples_per_insert - samples` once the table holds `min_size_to_sample` items, so
Acme's settings (samples_per_insert, min_replay_size, error_buffer) mean here what they mean in Reverb
(rate_limiter.cc). The table asks it per item; `_WaitClock` adds the time a call spends blocked to the table's
counters (what the program's end table reports as "held by the rate limiter").
"""
from __future__ import annotations

import math
import numbers
import threading
import time
from typing import Callable

import numpy as np


class RateLimiterTimeout(TimeoutError):
    """The rate limiter did not allow the insert/sample before the timeout expired."""

    inserted: int = 0  # for an insert: how many leading items of the batch went in before the timeout


class RateLimiter:
    """Reverb's rate limiter: a bound on `inserts * samples_per_insert - samples` once `min_size` is reached.

    With diff = inserts * spi - samples (counters over the table's life):
    - one more insert is allowed if size + 1 <= min_size_to_sample, or (inserts + 1) * spi - samples <= max_diff;
    - one more sample is allowed if size >= min_size_to_sample and diff - 1 >= min_diff.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, min_diff: float, max_diff: float):
        if not (isinstance(samples_per_insert, numbers.Real) and math.isfinite(samples_per_insert)
                and samples_per_insert > 0):
            raise ValueError(f"samples_per_insert must be a positive finite number, got {samples_per_insert!r}")
        if not isinstance(min_size_to_sample, (int, np.integer)) or min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be a positive int, got {min_size_to_sample!r}")
        if math.isnan(min_diff) or math.isnan(max_diff) or min_diff > max_diff:
            raise ValueError(f"need min_diff <= max_diff, got {min_diff!r} > {max_diff!r}")
        self._spi = float(samples_per_insert)
        self._min_size = int(min_size_to_sample)
        self._min_diff = float(min_diff)
        self._max_diff = float(max_diff)

    samples_per_insert = property(lambda self: self._spi)
    min_size_to_sample = property(lambda self: self._min_size)
    min_diff = property(lambda self: self._min_diff)
    max_diff = property(lambda self: self._max_diff)

    def can_insert(self, size: int, inserts: int, samples: int, n: int = 1) -> bool:
        """Whether the n-th next insert (n >= 1) may proceed, counting the n - 1 before it."""
        if size + n <= self._min_size:
            return True
        return (inserts + n) * self._spi - samples <= self._max_diff

    def can_sample(self, size: int, inserts: int, samples: int, n: int = 1) -> bool:
        """Whether the n-th next sampled item (n >= 1) may proceed, counting the n - 1 before it."""
        if size < self._min_size:
            return False
        return inserts * self._spi - samples - n >= self._min_diff

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(samples_per_insert={self._spi}, min_size_to_sample={self._min_size}, "
                f"min_diff={self._min_diff}, max_diff={self._max_diff})")


class MinSize(RateLimiter):
    """Blocks sampling until the table holds `min_size_to_sample` items; never limits otherwise."""

    def __init__(self, min_size_to_sample: int):
        super().__init__(1.0, min_size_to_sample, -math.inf, math.inf)


class SampleToInsertRatio(RateLimiter):
    """Keeps samples/inserts near `samples_per_insert` after `min_size_to_sample` items.

    A number `error_buffer` gives min_diff/max_diff = spi * min_size -/+ error_buffer (so only operations
    after the warm-up count); a (min_diff, max_diff) pair is used as is. As in Reverb, a range narrower than
    2 * max(1, spi) is refused because it could block both sides forever.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int,
                 error_buffer: float | tuple[float, float]):
        if isinstance(error_buffer, numbers.Real) and not isinstance(error_buffer, bool):
            offset = float(samples_per_insert) * float(min_size_to_sample)
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        elif isinstance(error_buffer, (tuple, list)) and len(error_buffer) == 2:
            min_diff, max_diff = (float(v) for v in error_buffer)
        else:
            raise ValueError(f"error_buffer must be a number or a (min_diff, max_diff) pair, got {error_buffer!r}")
        if max_diff - min_diff < 2 * max(1.0, float(samples_per_insert)):
            raise ValueError("error_buffer range must be >= 2 * max(1, samples_per_insert); "
                             "a smaller one can block inserts and samples forever")
        if min_diff > float(samples_per_insert) * float(min_size_to_sample):
            raise ValueError("error_buffer range lies above samples_per_insert * min_size_to_sample; "
                             "sampling would deadlock once min_size_to_sample items are inserted")
        super().__init__(samples_per_insert, min_size_to_sample, min_diff, max_diff)


class WaitClock:
    """Accumulates the time one insert/sample call spends blocked into the table's counters."""

    def __init__(self, counters: list[float]):
        self._counters = counters
        self._start: float | None = None

    def wait(self, cond: threading.Condition, deadline: float | None, what: str) -> None:
        now = time.monotonic()
        if self._start is None:
            self._start = now
            self._counters[0] += 1
        if deadline is None:
            cond.wait()
            return
        if now >= deadline:
            raise RateLimiterTimeout(f"rate limiter timeout: could not {what}")
        cond.wait(deadline - now)

    def stop(self) -> None:
        if self._start is not None:
            self._counters[1] += time.monotonic() - self._start
            self._start = None


def deadline_after(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if not (isinstance(timeout, numbers.Real) and timeout >= 0):
        raise ValueError(f"timeout must be None or a non-negative number of seconds, got {timeout!r}")
    return time.monotonic() + float(timeout)


def largest_allowed(limit: int, allowed: Callable[[int], bool]) -> int:
    """Largest j in [0, limit] with allowed(1..j) all true, for a predicate that is monotone in j."""
    if allowed(limit):
        return limit
    lo, hi = 0, limit  # allowed(lo) holds (vacuously for 0), allowed(hi) fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if allowed(mid):
            lo = mid
        else:
            hi = mid
    return lo

