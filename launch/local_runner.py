"""Runs a `launch.program.Program` in this process: every node an object, every worker's `run()` a thread.

Same program description and node code as on Ray, without processes or serialisation, so a run can be
stepped through in a debugger and tests can inspect node objects directly. What it does not model: node
restarts (a crashed worker's `run()` just fails), per-process thread pinning and resource requests.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any

from launch.program import CallFuture, NodeHandle, Program, resolve_handles


class ThreadFuture(CallFuture):
    def __init__(self, future: concurrent.futures.Future):
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> Any:
        try:
            return self._future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"no result within {timeout} s") from None


class LocalNodeHandle(NodeHandle):
    """Direct method calls; `submit` runs the call on the launch's thread pool."""

    def __init__(self, obj: Any, pool: concurrent.futures.ThreadPoolExecutor):
        self.obj = obj
        self._pool = pool

    def submit(self, method: str, *args: Any, **kwargs: Any) -> ThreadFuture:
        return ThreadFuture(self._pool.submit(getattr(self.obj, method), *args, **kwargs))

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.obj, method)(*args, **kwargs)


class LocalLaunch:
    """A running program in this process (same interface as `launch.ray_runner.RayLaunch`)."""

    def __init__(self, program: Program):
        self.program = program
        # Enough threads for every blocking call the nodes may have in flight at once.
        workers = 4 + sum(n.max_concurrency for n in program.nodes)
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="node-call")
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

    def shutdown(self) -> None:
        """Ask every worker to stop, give their threads a moment, and release the call pool."""
        for node in self.program.nodes:
            if node.kind == "worker":
                try:
                    self.handles[node.name].obj.stop()
                except Exception:  # pylint: disable=broad-except
                    pass
        for thread in self._threads:
            thread.join(timeout=5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)


class LocalRunner:
    name = "local"

    def launch(self, program: Program) -> LocalLaunch:
        return LocalLaunch(program)

    def close(self) -> None:
        """Nothing outlives a local launch."""
