"""What machine produced a number: CPU model, cores, memory, load and library versions.

One home for the facts every results file records (the grid's machine.json, each benchmark's record, the
energy tracker's TDP cache key), so two files never describe the same machine differently.
"""
from __future__ import annotations

import os
import platform
from typing import Any, Iterable

# The libraries whose versions decide the numbers a report shows.
REPORT_PACKAGES = ("jax", "jaxlib", "onnxruntime", "dm-control", "gymnasium", "ray", "codecarbon")


def cpu_model_name() -> str | None:
    """The CPU model as /proc/cpuinfo names it ("model name"; cheap, no subprocess), or None off Linux."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (2 decimals), or None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def package_versions(names: Iterable[str]) -> dict[str, str]:
    """{distribution: version} for those of `names` that are installed (a missing one is left out)."""
    from importlib import metadata  # pylint: disable=import-outside-toplevel

    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine_info(packages: Iterable[str] = REPORT_PACKAGES) -> dict[str, Any]:
    """OS, Python, CPU model, logical/physical cores, memory and the versions of `packages`."""
    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(),
                            "machine": platform.machine(), "logical_cpus": os.cpu_count()}
    model = cpu_model_name()
    if model:
        info["cpu_model"] = model
    try:
        import psutil  # pylint: disable=import-outside-toplevel
        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
        info["physical_cpus"] = psutil.cpu_count(logical=False)
    except Exception:  # pylint: disable=broad-except
        pass
    info.update(package_versions(packages))
    return info
