"""A run in a process of its own: a peer's interpreter (Acme, SB3) or this checkout's own training CLI.

The peer comparisons and the studies that train through `launch.train` all start their runs the same way: in a
new process group (Launchpad starts several processes, and a hung run must not outlive its timeout), output to
a log file, and an environment without this project's Python settings, so a peer's interpreter imports its own
packages and never these.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Sequence


def peer_env() -> dict[str, str]:
    """The peer's environment: ours minus what would make its interpreter import this project's packages."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def run_subprocess(cmd: Sequence[str], log: Path, timeout_s: float, cwd: Path) -> tuple[int | None, str, float]:
    """Runs a peer in its own process group (Launchpad starts several); kills the group at the timeout.
    Returns (exit code, None at the timeout; the log's text; wall-clock seconds)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=peer_env(),
                                start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:  # also ends stragglers of a process that exited on its own
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return code, log.read_text(encoding="utf-8", errors="replace"), time.perf_counter() - t0
