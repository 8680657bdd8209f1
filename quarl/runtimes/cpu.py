"""What the host CPU can do, as far as policy runtimes care: model, cores, and the SIMD flags that decide
which integer GEMM kernels exist. The facts come from `quarl.ops.machine` (the one reader of /proc/cpuinfo, the
one machine record); this module gives them the dict form the runtimes' kernel checks and caches take, so a
test can hand a runtime another CPU's."""
from __future__ import annotations

import functools
import os
from typing import NotRequired, TypedDict

from quarl.ops.machine import CPU_FLAGS, VNNI_FLAGS, cpu_class_of, cpu_model, kernel_flags, read_cpuinfo

__all__ = ["CPU_FLAGS", "VNNI_FLAGS", "CPUInfo", "cpu_class", "cpu_info"]


class CPUInfo(TypedDict):
    """A CPU as the kernel checks and caches see it: "flags" (the subset of CPU_FLAGS present) decides which
    integer kernels exist; a test hands in another CPU's flags (and "arch") alone."""

    flags: list[str]
    arch: NotRequired[str]  # platform.machine()
    cpu_model: NotRequired[str]
    cores: NotRequired[int]


@functools.lru_cache(maxsize=1)
def cpu_info() -> CPUInfo:
    """{"cpu_model", "cores", "flags" (the subset of CPU_FLAGS present), "arch" (platform.machine())}."""
    return {"cpu_model": cpu_model(), "cores": os.cpu_count() or 1, "flags": kernel_flags(),
            "arch": read_cpuinfo().arch}


def cpu_class(info: CPUInfo | None = None) -> str:
    """A coarse name for the integer-kernel class of this CPU: "x86-vnni", "x86-avx2", "x86", "arm", "other"."""
    info = cpu_info() if info is None else info
    return cpu_class_of(info["flags"], info.get("arch", ""))
