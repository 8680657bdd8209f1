"""What the host CPU can do, as far as policy runtimes care: model, cores, and the SIMD flags that decide
which integer GEMM kernels exist (x86 "flags", Arm "Features" in /proc/cpuinfo)."""
from __future__ import annotations

import functools
import os
import platform
from typing import Any

# x86: VNNI/AMX make MLAS's u8 x s8 kernel exact and fast; without them (AVX2 only) it uses pmaddubsw,
# whose int16 pair sums saturate. Arm: dot-product and i8mm instructions.
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "amx_bf16", "fma",
             "asimd", "asimddp", "i8mm")
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict[str, Any]:
    """{"cpu_model", "cores", "flags" (the subset of CPU_FLAGS present), "arch" (platform.machine())}."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"cpu_model": model or platform.processor() or "unknown", "cores": os.cpu_count() or 1,
            "flags": [f for f in CPU_FLAGS if f in flags], "arch": platform.machine().lower()}


def cpu_class(info: dict[str, Any] | None = None) -> str:
    """A coarse name for the integer-kernel class of this CPU: "x86-vnni", "x86-avx2", "x86", "arm", "other"."""
    info = cpu_info() if info is None else info
    flags, arch = set(info["flags"]), info.get("arch", "")
    if arch in ("x86_64", "amd64", "i686", "x86"):
        if flags & set(VNNI_FLAGS):
            return "x86-vnni"
        return "x86-avx2" if "avx2" in flags else "x86"
    if arch in ("aarch64", "arm64") or arch.startswith("arm"):
        return "arm"
    return "other"
