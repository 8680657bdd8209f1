"""What machine produced a number: CPU model, class and SIMD flags, cores, memory, load and library versions.

One home for the facts every results file records (the grid's machine.json, launch.ptq's, each benchmark's record,
the energy tracker's TDP cache key), so two files never describe the same machine differently: `machine_info`
returns one typed `MachineRecord`, written with `to_json` under one set of keys (`MACHINE_KEYS`). This module is
also the one reader of /proc/cpuinfo (`read_cpuinfo`; `quarl.runtimes.cpu` asks it). Files written before the
record had one format (a benchmark's "cpu", "cores" and flags as one string; machine.json's "logical_cpus") are
read through `machine_fields`, which gives any stored record the current keys.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import platform
import time
from typing import Iterable, Mapping

from quarl.ops.io import JSONObject, JSONValue

# The libraries whose versions decide the numbers a report shows.
REPORT_PACKAGES = ("jax", "jaxlib", "numpy", "onnxruntime", "onnx", "aqtp", "dm-control", "mujoco", "gymnasium",
                   "ray", "codecarbon")
# The CPU flags that decide which integer GEMM kernels exist. x86: VNNI/AMX make MLAS's u8 x s8 kernel exact and
# fast; without them (AVX2 only) it uses pmaddubsw, whose int16 pair sums saturate. Arm: dot-product and i8mm.
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "amx_bf16", "fma",
             "asimd", "asimddp", "i8mm")
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    """/proc/cpuinfo's first CPU: its model line (None where there is none), every flag it lists (x86 "flags",
    Arm "Features"), and the architecture (`platform.machine()`, lower case)."""

    model: str | None
    flags: frozenset[str]
    arch: str


@functools.lru_cache(maxsize=1)
def read_cpuinfo() -> CpuInfo:
    """The one reader of /proc/cpuinfo (cheap, no subprocess; cached: the CPU does not change under a process).
    Off Linux: no model and no flags."""
    model, flags = None, frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and model is None:
                    model = value.strip() or None
                elif key in ("flags", "Features") and not flags:
                    flags = frozenset(value.split())
    except OSError:
        pass
    return CpuInfo(model, flags, platform.machine().lower())


def cpu_model_name() -> str | None:
    """The CPU model as /proc/cpuinfo names it, or None off Linux (the energy tracker's TDP cache key)."""
    return read_cpuinfo().model


def cpu_model() -> str:
    """The CPU model for a record: /proc/cpuinfo's, else the platform's processor string, else 'unknown'."""
    return cpu_model_name() or platform.processor() or "unknown"


def kernel_flags(info: CpuInfo | None = None) -> list[str]:
    """The flags of `CPU_FLAGS` this CPU has, in `CPU_FLAGS` order (what decides int8 against fp32 speed)."""
    info = read_cpuinfo() if info is None else info
    return [f for f in CPU_FLAGS if f in info.flags]


def cpu_class_of(flags: Iterable[str], arch: str) -> str:
    """A coarse name for the integer-kernel class of a CPU: "x86-vnni", "x86-avx2", "x86", "arm", "other"."""
    flags, arch = set(flags), arch.lower()
    if arch in ("x86_64", "amd64", "i686", "x86"):
        if flags & set(VNNI_FLAGS):
            return "x86-vnni"
        return "x86-avx2" if "avx2" in flags else "x86"
    if arch in ("aarch64", "arm64") or arch.startswith("arm"):
        return "arm"
    return "other"


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


@dataclasses.dataclass(frozen=True)
class MachineRecord:
    """The machine a result was measured on, as every results file records it (`to_json`)."""

    cpu_model: str
    cpu_class: str  # "x86-vnni", "x86-avx2", "x86", "arm", "other": the integer kernels this CPU has
    cpu_flags: tuple[str, ...]  # the `CPU_FLAGS` present
    arch: str
    cores: int  # logical CPUs
    physical_cores: int | None
    memory_gib: float | None
    load_start: tuple[float, ...] | None  # the load average (1, 5, 15 min) as the work starts
    platform: str
    python: str
    versions: dict[str, str]  # {distribution: version} of the `REPORT_PACKAGES` installed
    date: str  # local time, ISO 8601 to the second

    def to_json(self) -> JSONObject:
        """The record as JSON: one key per field (`MACHINE_KEYS`), lists for tuples."""
        out = dataclasses.asdict(self)
        out["cpu_flags"] = list(self.cpu_flags)
        out["load_start"] = None if self.load_start is None else list(self.load_start)
        return out


MACHINE_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(MachineRecord))


def machine_info(packages: Iterable[str] = REPORT_PACKAGES) -> MachineRecord:
    """This machine now: CPU, class and kernel flags, cores, memory, load average, Python, the versions of
    `packages`. The one function every benchmark, launch.reproduce and launch.ptq records the machine with."""
    info = read_cpuinfo()
    physical, memory = None, None
    try:
        import psutil  # pylint: disable=import-outside-toplevel
        memory = round(psutil.virtual_memory().total / 2**30, 1)
        physical = psutil.cpu_count(logical=False)
    except Exception:  # pylint: disable=broad-except  # psutil absent or unable to read this OS: left unknown
        pass
    load = load_average()
    return MachineRecord(
        cpu_model=cpu_model(), cpu_class=cpu_class_of(info.flags, info.arch), cpu_flags=tuple(kernel_flags(info)),
        arch=info.arch, cores=os.cpu_count() or 1, physical_cores=physical, memory_gib=memory,
        load_start=None if load is None else tuple(load), platform=platform.platform(),
        python=platform.python_version(), versions=package_versions(packages),
        date=time.strftime("%Y-%m-%dT%H:%M:%S"))


# Keys of records written before `MachineRecord` -> the current key.
_OLD_KEYS = {"cpu": "cpu_model", "logical_cpus": "cores", "physical_cpus": "physical_cores", "machine": "arch",
             "load_average_start": "load_start", "load_average_end": "load_end"}


def machine_fields(stored: Mapping[str, JSONValue] | None) -> JSONObject:
    """A stored machine record under the current keys, whatever format wrote it: old keys renamed (`_OLD_KEYS`),
    flags given as one string split into a list, package versions stored at the top level moved under
    "versions" (with a bench record's "packages"). Keys a writer added on top (a benchmark's `load_end`,
    `allow_busy`, `jax_backend`) are kept; facts an old record lacks stay absent. The compatibility reader for every report that reads a machine."""
    out: JSONObject = {}
    versions: JSONObject = {}
    for key, value in (stored or {}).items():
        if key in REPORT_PACKAGES:
            versions[key] = value
        elif key == "packages" and isinstance(value, Mapping):
            versions.update(value)
        else:
            out.setdefault(_OLD_KEYS.get(key, key), value)
    flags = out.get("cpu_flags")
    if isinstance(flags, str):
        out["cpu_flags"] = list(flags.split())
    if versions:
        stored_versions = out.get("versions")
        out["versions"] = {**versions, **(stored_versions if isinstance(stored_versions, dict) else {})}
    return out
