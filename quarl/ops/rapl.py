"""RAPL package energy counters, and the share of them one process is charged.

The package counter covers the whole CPU package (every process on it), so a per-process report that copied it
would count the package once per process when reports are summed. `RaplAttribution` samples the counter and charges
its process the share of each interval's energy equal to the process's share of the machine's busy CPU time.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

import psutil

# Linux powercap tree; package domains are its top-level intel-rapl:N entries (AMD CPUs use the same names).
RAPL_ROOT = "/sys/class/powercap"
RAPL_SAMPLE_S = 10.0  # well inside the shortest counter wrap (~60 s at 4 kW for a 262 kJ range)


def read_rapl_packages(root: str | os.PathLike | None = None) -> dict[str, tuple[int, int]]:
    """The RAPL package counters readable here: {domain: (energy_uj, max_energy_range_uj)} ({} if none)."""
    out = {}
    for domain in sorted(Path(root or RAPL_ROOT).glob("intel-rapl:*")):
        if domain.name.count(":") != 1:  # intel-rapl:0:0 etc. are sub-domains (core, dram) of a package
            continue
        try:
            if not (domain / "name").read_text(encoding="utf-8").strip().startswith("package"):
                continue
            out[domain.name] = (int((domain / "energy_uj").read_text(encoding="utf-8")),
                                int((domain / "max_energy_range_uj").read_text(encoding="utf-8")))
        except (OSError, ValueError):  # unreadable (permissions) or malformed: not a usable counter
            continue
    return out


def machine_busy_cpu_seconds() -> float:
    """CPU seconds every process on this machine has spent busy (all cores), from /proc/stat via psutil."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0)
                 - getattr(t, "guest_nice", 0.0))


class RaplAttribution:
    """Samples the RAPL package counters and attributes to one process its CPU-time share of them.

    Each interval: package energy dE (wrap-aware), this process's CPU seconds dp, the machine's busy CPU
    seconds dm; the process is attributed dE x min(1, dp / dm). Sampled on a thread every `interval_s`
    (so a counter cannot wrap unseen) and once more at `stop()`. The readers are parameters for tests.
    """

    def __init__(self, process_cpu: Callable[[], float], *, root: str | os.PathLike | None = None,
                 machine_cpu: Callable[[], float] | None = None, interval_s: float = RAPL_SAMPLE_S):
        self._root, self._process_cpu = root, process_cpu
        self._machine_cpu = machine_cpu or machine_busy_cpu_seconds
        self._last = read_rapl_packages(root)
        if not self._last:
            raise OSError("no readable RAPL package counter")
        self._last_cpu = (process_cpu(), self._machine_cpu())
        self.package_j = 0.0
        self.attributed_j = 0.0
        self._interval = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "RaplAttribution":
        self._thread = threading.Thread(target=self._loop, name="rapl-sampler", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> None:
        """Adds the energy since the previous sample (package total and this process's share)."""
        with self._lock:
            now = read_rapl_packages(self._root)
            cpu = (self._process_cpu(), self._machine_cpu())
            delta_uj = 0
            for domain, (energy, wrap) in now.items():
                if domain in self._last:
                    before = self._last[domain][0]
                    delta_uj += energy - before if energy >= before else energy + wrap - before
            dp, dm = cpu[0] - self._last_cpu[0], cpu[1] - self._last_cpu[1]
            share = min(1.0, max(0.0, dp) / dm) if dm > 0 else 0.0
            self.package_j += delta_uj / 1e6
            self.attributed_j += delta_uj / 1e6 * share
            self._last, self._last_cpu = {**self._last, **now}, cpu

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()


def process_cpu_seconds(process: psutil.Process) -> float:
    """CPU time (user + system) of this process and its live children."""
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return float(total)

