"""What codecarbon measured or modelled in a process, in words, and a cache of its CPU detection.

codecarbon spends ~1.5 s per process detecting the CPU model (a `cpuinfo` subprocess) and fuzzy-matching it
against its TDP table. The result is cached in a small JSON file (keyed by the CPU model line of /proc/cpuinfo)
and fed back to codecarbon's per-process TDP cache, so later processes skip it. The cache touches a codecarbon
internal; if that moves, tracking still works, only the start is slower.
"""
from __future__ import annotations

import os
from pathlib import Path

import psutil

from quarl.ops.io import write_json_atomic
from quarl.ops.machine import cpu_model_name

# Watts per busy CPU thread for the fallback model: codecarbon's own default for CPUs it cannot match
# (codecarbon.core.cpu.DEFAULT_POWER_PER_CORE, 4 W per thread). A default, not any CPU's TDP.
FALLBACK_WATTS_PER_THREAD = 4.0

_TDP_CACHE_VERSION = 1


cpu_model_line = cpu_model_name  # the TDP cache key



def _tdp_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "quarl" / "codecarbon_tdp.json"


class _CachedTDP:
    """Stands in for codecarbon's `cpu.TDP` (which exposes `.model` and `.tdp`)."""

    def __init__(self, model: str, tdp: float | None):
        self.model = model
        self.tdp = tdp


def prime_tdp_cache() -> bool:
    """Feeds a cached CPU model/TDP into codecarbon's per-process cache. Returns whether it did."""
    try:
        from codecarbon.core import hardware_cache  # pylint: disable=import-outside-toplevel

        key = cpu_model_line()
        if key is None or getattr(hardware_cache, "_tdp", "missing") is not None:
            return False
        import json  # pylint: disable=import-outside-toplevel

        data = json.loads(_tdp_cache_path().read_text(encoding="utf-8"))
        if data.get("version") != _TDP_CACHE_VERSION or key not in data.get("cpus", {}):
            return False
        entry = data["cpus"][key]
        tdp = entry["tdp"]
        if not isinstance(entry["model"], str) or not (tdp is None or isinstance(tdp, (int, float))):
            return False
        hardware_cache._tdp = _CachedTDP(entry["model"], tdp)  # pylint: disable=protected-access
        return True
    except (ImportError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def store_tdp_cache() -> None:
    """Saves codecarbon's detected CPU model/TDP for the next process (best effort)."""
    try:
        from codecarbon.core import hardware_cache  # pylint: disable=import-outside-toplevel
        import json  # pylint: disable=import-outside-toplevel

        tdp = getattr(hardware_cache, "_tdp", None)
        key = cpu_model_line()
        if tdp is None or key is None or isinstance(tdp, _CachedTDP):
            return
        path = _tdp_cache_path()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("version") != _TDP_CACHE_VERSION:
                data = {}
        except (OSError, ValueError):
            data = {}
        cpus = data.get("cpus", {}) if isinstance(data.get("cpus"), dict) else {}
        entry = {"model": str(tdp.model), "tdp": None if tdp.tdp is None else float(tdp.tdp)}
        if cpus.get(key) == entry:
            return
        cpus[key] = entry
        write_json_atomic(path, {"version": _TDP_CACHE_VERSION, "cpus": cpus})
    except (ImportError, OSError, ValueError, TypeError, AttributeError):
        return


_DEFAULT_TDP_CACHE: dict[tuple[str, float], bool] = {}


def _tdp_is_default(model: str | None, tdp: float | None) -> bool:
    """Whether codecarbon's TDP is its default for a CPU it does not know (4 W per thread), not a table value.

    codecarbon returns threads x 4 W for an unknown model; only that value needs the (slow, cached) table check."""
    try:
        from codecarbon.core.cpu import DEFAULT_POWER_PER_CORE, TDP  # pylint: disable=import-outside-toplevel
    except ImportError:
        return False
    if tdp is None or not model:
        return True
    if abs(float(tdp) - (psutil.cpu_count() or 1) * DEFAULT_POWER_PER_CORE) > 1e-6:
        return False
    key = (model, float(tdp))
    if key not in _DEFAULT_TDP_CACHE:
        try:
            _DEFAULT_TDP_CACHE[key] = TDP._get_cpu_power_from_registry(TDP.__new__(TDP), model) is None  # pylint: disable=protected-access
        except Exception:  # pylint: disable=broad-except
            _DEFAULT_TDP_CACHE[key] = True  # cannot confirm a table match: do not call it this CPU's TDP
    return _DEFAULT_TDP_CACHE[key]


def codecarbon_components(tracker: object) -> dict[str, tuple[str, str]]:
    """Per component (cpu, gpu, ram): ("measured" | "modelled" | "none", how) from codecarbon's hardware
    (its private `_hardware` list, read through getattr: a tracker without one reports nothing tracked)."""
    parts = {"cpu": ("none", "not tracked"), "gpu": ("none", "none detected"), "ram": ("none", "not tracked")}
    for hw in getattr(tracker, "_hardware", []):
        kind = type(hw).__name__
        if kind == "CPU":
            mode = getattr(hw, "_mode", "unknown")
            tdp = getattr(hw, "_tdp", None)
            default = getattr(hw, "_is_generic_tdp", False) or _tdp_is_default(getattr(hw, "_model", None), tdp)
            tdp_text = (f"TDP {tdp} W = codecarbon's default for a CPU it does not know "
                        f"({FALLBACK_WATTS_PER_THREAD:g} W per thread), not this CPU's TDP" if default
                        else f"TDP {tdp} W from codecarbon's CPU table")
            if mode == "intel_rapl":
                parts["cpu"] = ("measured", "RAPL (codecarbon)")
            elif mode == "windows_emi":
                parts["cpu"] = ("measured", "Windows Energy Meter (RAPL)")
            elif mode == "intel_power_gadget":
                parts["cpu"] = ("measured", "Intel Power Gadget")
            elif mode == "cpu_load":
                parts["cpu"] = ("modelled", f"{tdp_text} x process CPU time share")
            elif mode == "constant":
                parts["cpu"] = ("modelled", f"constant fraction of the {tdp_text}")
            else:
                parts["cpu"] = ("modelled", f"codecarbon mode {mode}")
        elif kind == "GPU":
            parts["gpu"] = ("measured", "NVML/AMD SMI energy counters (whole device)")
        elif kind == "RAM":
            forced = getattr(hw, "_force_ram_power", None)
            parts["ram"] = ("modelled", f"user constant {forced} W" if forced is not None
                            else "codecarbon RAM power model (process memory)")
        elif kind in ("AppleSiliconChip", "Raspberry"):
            parts["cpu"] = ("measured", f"{kind} power interface")
    return parts

