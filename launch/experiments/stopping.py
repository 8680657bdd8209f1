"""How every runner stops: SIGINT (Ctrl-C) and SIGTERM (`kill`, a batch scheduler's time limit, a container stop)
ask the run to end, the same way for `launch.train` (every agent) and `launch.actorq`.

The run then stops acting, flushes its logs, saves the final policy and writes summary.json with status
"interrupted" (no data it already has is dropped: the learner's steps are counted and its last weights saved),
and the CLI exits 128 + the signal's number (130 after SIGINT, 143 after SIGTERM). A handler only records the
signal (or, once asked with `raise_with`, raises an exception in the main thread, where the distributed driver
waits in polls that may block); the run checks `requested()` between steps. Outside the main thread (a run
started from a worker thread) Python cannot install handlers, and nothing is changed.
"""
from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Callable, TypeAlias

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# What `signal.signal` takes and `signal.getsignal` returns (None: a handler not installed from Python).
SignalHandler: TypeAlias = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


class StopSignals:
    """`with StopSignals() as signals: run(should_stop=signals.requested)`: SIGINT and SIGTERM are recorded
    while the block runs; the previous handlers come back when it ends."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, SignalHandler] = {}
        self._raise: Callable[[int], BaseException] | None = None

    @property
    def active(self) -> bool:
        """Whether the handlers are installed (only in the main thread)."""
        return bool(self._previous)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
            self._install(self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _install(self, handler: SignalHandler) -> None:
        if self.active:
            for s in STOP_SIGNALS:
                signal.signal(s, handler)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        # Recorded as well as raised: raised inside a C extension (Ray's), the exception can come out wrapped,
        # and the run must still count as stopped.
        self.received.append(signum)
        if self._raise is not None:
            raise self._raise(signum)

    def requested(self) -> bool:
        """Whether a stop signal arrived."""
        return bool(self.received)

    @property
    def signum(self) -> int | None:
        """The last stop signal received (None: none)."""
        return self.received[-1] if self.received else None

    def raise_with(self, make_error: Callable[[int], BaseException]) -> None:
        """From now on a stop signal also raises `make_error(signum)` in the main thread; the handlers are
        installed again (a library started meanwhile, e.g. `ray.init`, may have put its own in place)."""
        self._raise = make_error
        self._install(self._handle)

    def ignore(self) -> None:
        """Ignore further signals while the run shuts down (bounded): a second Ctrl-C must not cut short the
        writing of its logs, policy and summary."""
        self._raise = None
        self._install(signal.SIG_IGN)


def exit_code(status: str, signum: int | None) -> int:
    """A CLI's exit status for a run that ended with `status`: 128 + the signal for an interrupted run
    (130 for SIGINT, 143 for SIGTERM), 1 for a failed one, 0 otherwise."""
    if status == "interrupted":
        return 128 + int(signum or signal.SIGINT)
    return 1 if status == "failed" else 0
