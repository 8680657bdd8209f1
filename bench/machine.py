"""What machine a benchmark ran on, recorded with its results (these boxes are shared, so the load matters)."""
from __future__ import annotations

import os
import platform
from typing import Any


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's processor string elsewhere)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        return cpu


def machine_info() -> dict[str, Any]:
    """CPU, core count, Python, platform and the load average (1, 5, 15 min) when called."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "load_start": list(os.getloadavg())}
