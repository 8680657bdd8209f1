"""Pinning an acting thread to a core of its own.

An actor is one core's worth of work (one compute thread). Left unpinned, its runtime may use a second core
for free (XLA's fp32 runtime did: its CPU time exceeded its wall time) and envpool's worker thread is woken on
whichever core is idle, a cross-core hand-off on every step. Pinning the acting thread before it builds its
runtime and environments puts them all on one core: threads inherit the CPU mask of the thread that starts
them. `python -m bench.system.actorq` measures actors this way; `launch.actorq --pin-actors` runs them this way.

Actors of one machine must not share a core, so a core is *claimed*: an exclusive `flock` on
`<lock dir>/cpu<N>.lock`, held until the process exits (the kernel drops it then, also after a crash), so a
restarted actor can claim again. Linux only; elsewhere nothing is pinned and the claim returns None.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

LOCK_DIR_ENV = "QUARL_CORE_LOCKS"
_held: list[int] = []  # descriptors of the claims this process holds (kept open: closing one drops its claim)


def default_lock_dir() -> Path:
    """$QUARL_CORE_LOCKS, or a per-user folder in the system temp dir (one machine, all of its actors)."""
    given = os.environ.get(LOCK_DIR_ENV)
    return Path(given) if given else Path(tempfile.gettempdir()) / f"quarl-cores-{os.getuid()}"


def pin_thread(core: int) -> None:
    """Pin the calling thread (and the threads it starts from now on) to CPU `core`."""
    allowed = sorted(os.sched_getaffinity(0))
    if core not in allowed:
        raise ValueError(f"CPU {core} is not one this thread may run on ({allowed})")
    os.sched_setaffinity(0, {core})


def claim_core(lock_dir: str | os.PathLike | None = None) -> int | None:
    """Pin the calling thread to a CPU that no other claimant on this machine holds, and return it.

    Tries the CPUs this thread may run on from the highest down (CPU 0 usually carries the system's
    interrupts); None when CPU affinity is unavailable here or every allowed CPU is already claimed (then
    nothing is pinned: an actor still runs, sharing cores as an unpinned one would)."""
    import fcntl  # pylint: disable=import-outside-toplevel  (POSIX only)

    if not hasattr(os, "sched_setaffinity"):
        return None
    directory = Path(lock_dir) if lock_dir is not None else default_lock_dir()
    directory.mkdir(parents=True, exist_ok=True)
    for core in sorted(os.sched_getaffinity(0), reverse=True):
        fd = os.open(directory / f"cpu{core}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        pin_thread(core)
        _held.append(fd)
        return core
    return None
