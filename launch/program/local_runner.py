"""Runs a `launch.program.graph.Program` in this process: every node an object, every worker's `run()` a thread.

Same program description and node code as on Ray, without processes or serialisation, so a run can be
stepped through in a debugger and tests can inspect node objects directly. What it does not model: node
restarts (a crashed worker's `run()` just fails), per-process thread pinning and resource requests.

Every thread it starts is a daemon thread, including the pool that serves `submit` calls: a node call can
block for as long as the call it serves (a replay insert held back by the rate limiter), and Python joins
non-daemon threads (concurrent.futures' pool workers among them) at exit, so one call left blocked would
hang the process after the run has ended. `shutdown` still stops workers and waits for them (bounded).
"""
from __future__ import annotations

import concurrent.futures
import os
import queue
import threading
import time
from typing import Callable

from launch.program.graph import CallFuture, CallResult, NodeHandle, Program, resolve_handles


class ThreadFuture(CallFuture):
    def __init__(self, future: concurrent.futures.Future):
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> CallResult:
        try:
            return self._future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"no result within {timeout} s") from None


class DaemonPool:
    """A minimal thread pool of daemon threads (see the module docstring for why not ThreadPoolExecutor).

    Threads are started on demand, up to `max_workers`, when no idle one can take a new call."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "pool"):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self._max_workers = int(max_workers)
        self._prefix = thread_name_prefix
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._shutdown = False

    def submit(self, fn: Callable[..., object], *args: object, **kwargs: object) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit a call after the pool was shut down")
            self._queue.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_workers:
                thread = threading.Thread(target=self._work, name=f"{self._prefix}_{len(self._threads)}",
                                          daemon=True)
                thread.start()
                self._threads.append(thread)
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:  # pylint: disable=broad-except
                    future.set_exception(e)
            del item, future, fn, args, kwargs
            self._idle.release()

    def shutdown(self, cancel_futures: bool = True) -> None:
        """No new calls; queued ones are cancelled; idle threads end (busy ones end with their call)."""
        with self._lock:
            self._shutdown = True
            while cancel_futures:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            for _ in self._threads:
                self._queue.put(None)


class LocalNodeHandle(NodeHandle):
    """Direct method calls; `submit` runs the call on the launch's thread pool."""

    def __init__(self, obj: object, pool: DaemonPool | None):
        self.obj = obj
        self._pool = pool

    def submit(self, method: str, *args: object, **kwargs: object) -> ThreadFuture:
        return ThreadFuture(self._pool.submit(getattr(self.obj, method), *args, **kwargs))

    def call(self, method: str, *args: object, **kwargs: object) -> CallResult:
        return getattr(self.obj, method)(*args, **kwargs)


class LocalLaunch:
    """A running program in this process (a `launch.program.graph.Launch`, as `launch.program.ray_runner.RayLaunch`)."""

    def __init__(self, program: Program):
        self.program = program
        # Enough threads for every blocking call the nodes may have in flight at once.
        workers = 4 + sum(n.max_concurrency for n in program.nodes)
        self._pool = DaemonPool(workers, thread_name_prefix="node-call")
        self.handles: dict[str, LocalNodeHandle] = {}
        self._threads: list[threading.Thread] = []
        for node in program.nodes:
            obj = node.cls(**resolve_handles(dict(node.kwargs), self.handles))
            self.handles[node.name] = LocalNodeHandle(obj, self._pool)

    def wait_ready(self, timeout: float = 0.0) -> None:
        """Nodes are built synchronously in the constructor; nothing to wait for."""

    def run(self, name: str) -> ThreadFuture:
        future: concurrent.futures.Future = concurrent.futures.Future()
        obj = self.handles[name].obj

        def target() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(obj.run())
            except BaseException as e:  # pylint: disable=broad-except
                future.set_exception(e)

        thread = threading.Thread(target=target, name=f"run-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)
        return ThreadFuture(future)

    def pid(self, name: str) -> int:
        return os.getpid()

    def placement(self) -> dict[str, str]:
        """One machine: no cluster node ids to report."""
        return {}

    def lost_hosts(self) -> dict[str, list[str]]:
        """This process's machine cannot be lost while it runs the supervisor."""
        return {}

    def can_host(self, name: str) -> bool:
        return name in self.handles

    def shutdown(self) -> None:
        """Ask every worker to stop, give their threads a moment, and release the call pool."""
        for node in self.program.nodes:
            if node.kind == "worker":
                try:
                    self.handles[node.name].obj.stop()
                except Exception:  # pylint: disable=broad-except
                    pass
        deadline = time.monotonic() + 5.0  # shared: the workers were all told to stop at once
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._pool.shutdown(cancel_futures=True)


class LocalRunner:
    name = "local"

    def launch(self, program: Program) -> LocalLaunch:
        return LocalLaunch(program)

    def close(self) -> None:
        """Nothing outlives a local launch."""
