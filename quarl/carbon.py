"""Energy and carbon accounting per process, with codecarbon's offline tracker (no network).

Why per process: QuaRL's claim is that quantized actors save energy, so every actor and the learner track
their own consumption and the launcher adds the reports up (`combine`).

Honesty about the numbers: codecarbon measures only where the hardware exposes counters (RAPL for CPUs,
NVML for NVIDIA GPUs). Elsewhere (these sandboxes have no RAPL) it estimates CPU power as the CPU's TDP x
the process's share of CPU time, and RAM power from a memory-size model. `EnergyReport.method` says, per
component, which one was used, and an estimate is never called a measurement. If codecarbon cannot start,
the tracker estimates CPU energy itself as process CPU time x `FALLBACK_WATTS_PER_THREAD` (and says so).

Startup cost: codecarbon spends ~1.5 s per process detecting the CPU model (a `cpuinfo` subprocess) and
fuzzy-matching it against its TDP table. The result is cached in a small JSON file (keyed by the CPU model
line of /proc/cpuinfo) and fed back to codecarbon's per-process TDP cache, so later processes skip it.
The cache touches a codecarbon internal; if that moves, tracking still works, only the start is slower.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

import psutil

from quarl.logs import write_json_atomic

# Watts per busy CPU thread for the fallback estimate: codecarbon's own default for CPUs it cannot match
# (codecarbon.core.cpu.DEFAULT_POWER_PER_CORE, 4 W per thread).
FALLBACK_WATTS_PER_THREAD = 4.0
# World-average grid intensity (g CO2eq/kWh) when codecarbon's country data cannot be read
# (codecarbon's carbon_intensity_per_source.json "world_average").
FALLBACK_GRID_INTENSITY = 475.0
# Where the run's electricity comes from, for the grid intensity (ISO 3166-1 alpha-3; default USA). An
# environment variable rather than a flag so that every process of a distributed run (Ray workers inherit the
# driver's environment) uses the same grid without threading it through each node.
COUNTRY_ENV = "QUARL_CARBON_COUNTRY"
DEFAULT_COUNTRY = "USA"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_TDP_CACHE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class EnergyReport:
    """Energy and emissions of one tracked span (or a sum of spans, see `combine`)."""

    name: str
    duration_s: float
    energy_kwh: float
    cpu_kwh: float
    gpu_kwh: float
    ram_kwh: float
    emissions_kg_co2eq: float
    grid_intensity_g_per_kwh: float
    country: str
    method: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def combine(reports: Iterable[EnergyReport], name: str = "total") -> EnergyReport:
    """Sums reports (e.g. learner + actors). `duration_s` is the sum of tracked durations (process-seconds,
    not wall time); the grid intensity is the energy-weighted mean; distinct countries/methods are joined.
    """
    reports = list(reports)
    if not reports:
        raise ValueError("combine needs at least one EnergyReport")
    energy = sum(r.energy_kwh for r in reports)
    emissions = sum(r.emissions_kg_co2eq for r in reports)
    if energy > 0:
        intensity = emissions * 1000.0 / energy
    else:
        intensity = sum(r.grid_intensity_g_per_kwh for r in reports) / len(reports)
    return EnergyReport(
        name=name,
        duration_s=sum(r.duration_s for r in reports),
        energy_kwh=energy,
        cpu_kwh=sum(r.cpu_kwh for r in reports),
        gpu_kwh=sum(r.gpu_kwh for r in reports),
        ram_kwh=sum(r.ram_kwh for r in reports),
        emissions_kg_co2eq=emissions,
        grid_intensity_g_per_kwh=intensity,
        country=",".join(dict.fromkeys(r.country for r in reports)),
        method=" | ".join(dict.fromkeys(r.method for r in reports)),
    )


def grid_intensity(country_iso_code: str) -> float:
    """Grid carbon intensity (g CO2eq/kWh) codecarbon uses offline for a country (ISO 3166-1 alpha-3)."""
    code = country_iso_code.upper()
    try:
        from codecarbon.input import DataSource  # pylint: disable=import-outside-toplevel
        from codecarbon.core.emissions import Emissions  # pylint: disable=import-outside-toplevel

        mix = DataSource().get_global_energy_mix_data()
    except Exception:  # codecarbon missing or broken: documented world average  # pylint: disable=broad-except
        return FALLBACK_GRID_INTENSITY
    if code not in mix:
        raise ValueError(f"unknown country ISO code {country_iso_code!r}: expected an ISO 3166-1 alpha-3 code "
                         f"such as USA, FRA or DEU")
    return float(Emissions._global_energy_mix_to_emissions_rate(mix[code]).kgs_per_kWh * 1000.0)  # pylint: disable=protected-access


def default_country() -> str:
    """The grid country for energy trackers: $QUARL_CARBON_COUNTRY if set, else USA (ValueError if unknown)."""
    code = os.environ.get(COUNTRY_ENV, "").strip() or DEFAULT_COUNTRY
    if not re.fullmatch(r"[A-Za-z]{3}", code):
        raise ValueError(f"{COUNTRY_ENV} must be a 3-letter ISO 3166-1 alpha-3 code such as USA or FRA, got {code!r}")
    try:
        grid_intensity(code)
    except ValueError:
        raise ValueError(f"{COUNTRY_ENV}={code!r} is not a country codecarbon knows (ISO 3166-1 alpha-3, "
                         "e.g. USA, FRA, DEU)") from None
    return code.upper()


def _process_cpu_seconds(process: psutil.Process) -> float:
    """CPU time (user + system) of this process and its live children."""
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return float(total)


def _cpu_model_line() -> str | None:
    """The CPU model as /proc/cpuinfo names it (cheap; no subprocess), or None off Linux."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _tdp_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "quarl" / "codecarbon_tdp.json"


class _CachedTDP:
    """Stands in for codecarbon's `cpu.TDP` (which exposes `.model` and `.tdp`)."""

    def __init__(self, model: str, tdp: float | None):
        self.model = model
        self.tdp = tdp


def _prime_tdp_cache() -> bool:
    """Feeds a cached CPU model/TDP into codecarbon's per-process cache. Returns whether it did."""
    try:
        from codecarbon.core import hardware_cache  # pylint: disable=import-outside-toplevel

        key = _cpu_model_line()
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


def _store_tdp_cache() -> None:
    """Saves codecarbon's detected CPU model/TDP for the next process (best effort)."""
    try:
        from codecarbon.core import hardware_cache  # pylint: disable=import-outside-toplevel
        import json  # pylint: disable=import-outside-toplevel

        tdp = getattr(hardware_cache, "_tdp", None)
        key = _cpu_model_line()
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


def _describe_methods(tracker: Any) -> str:
    """Names, per component, how codecarbon got its numbers: measured (counters) or estimated (models)."""
    parts = {"cpu": "cpu=not tracked", "gpu": "gpu=none detected", "ram": "ram=not tracked"}
    for hw in getattr(tracker, "_hardware", []):
        kind = type(hw).__name__
        if kind == "CPU":
            mode = getattr(hw, "_mode", "unknown")
            tdp = getattr(hw, "_tdp", None)
            if mode == "intel_rapl":
                parts["cpu"] = "cpu=measured: RAPL"
            elif mode == "windows_emi":
                parts["cpu"] = "cpu=measured: Windows Energy Meter (RAPL)"
            elif mode == "intel_power_gadget":
                parts["cpu"] = "cpu=measured: Intel Power Gadget"
            elif mode == "cpu_load":
                parts["cpu"] = f"cpu=estimated: CPU TDP power model ({tdp} W) x process CPU time share"
            elif mode == "constant":
                parts["cpu"] = f"cpu=estimated: constant fraction of CPU TDP ({tdp} W)"
            else:
                parts["cpu"] = f"cpu=codecarbon mode {mode}"
        elif kind == "GPU":
            parts["gpu"] = "gpu=measured: NVML/AMD SMI energy counters (whole device)"
        elif kind == "RAM":
            forced = getattr(hw, "_force_ram_power", None)
            parts["ram"] = (f"ram=estimated: user constant {forced} W" if forced is not None
                            else "ram=estimated: codecarbon RAM power model (process memory)")
        elif kind in ("AppleSiliconChip", "Raspberry"):
            parts["cpu"] = f"cpu=measured: {kind} power interface"
    return "; ".join(parts.values())


class EnergyTracker:
    """Tracks the energy of this process from `start()` to `stop()` (or as a context manager).

    `name` (or its alias `node`) labels the report and its file. `cpu_power_w` overrides the CPU TDP codecarbon looks up (its table can be far off for VMs); the
    CPU energy is then still an estimate (TDP x CPU time share), and `method` says so.

    `stop()` returns an `EnergyReport` (also kept in `.report`); with `output_dir`, it is also written
    to `output_dir/energy-<name>.json`. `startup_s` is how long `start()` took.
    """

    def __init__(self, name: str = "run", country_iso_code: str | None = None, output_dir: str | os.PathLike | None = None,
                 use_codecarbon: bool = True, cpu_power_w: float | None = None, *, node: str | None = None):
        if node is not None:  # the launchers name trackers after their node ("learner", "actor_3", ...)
            if name not in ("run", node):
                raise ValueError(f"give the tracker one name: name={name!r} and node={node!r} differ")
            name = node
        if country_iso_code is None:
            country_iso_code = default_country()
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValueError(f"tracker name must match [A-Za-z0-9_.-]{{1,128}}, got {name!r}")
        if not isinstance(country_iso_code, str) or not re.fullmatch(r"[A-Za-z]{3}", country_iso_code):
            raise ValueError(f"country_iso_code must be a 3-letter ISO code, got {country_iso_code!r}")
        self.name = name
        self.country = country_iso_code.upper()
        self.intensity = grid_intensity(self.country)  # validates the code against codecarbon's data
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.use_codecarbon = bool(use_codecarbon)
        if cpu_power_w is not None and not (isinstance(cpu_power_w, (int, float)) and 0 < cpu_power_w < 1e5):
            raise ValueError(f"cpu_power_w must be a positive number of watts, got {cpu_power_w!r}")
        self.cpu_power_w = cpu_power_w  # codecarbon's force_cpu_power: the CPU's known TDP, if you know it
        self.report: EnergyReport | None = None
        self.startup_s = 0.0
        self.fallback_reason: str | None = None
        self._tracker: Any = None
        self._process = psutil.Process()
        self._t0: float | None = None
        self._cpu0 = 0.0

    def start(self) -> "EnergyTracker":
        if self._t0 is not None:
            raise ValueError(f"energy tracker {self.name!r} is already running")
        began = time.perf_counter()
        self.report = None
        self._t0 = began
        self._cpu0 = _process_cpu_seconds(self._process)
        if self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
        if self.use_codecarbon:
            self._tracker = self._start_codecarbon()
        self.startup_s = time.perf_counter() - began
        return self

    def _start_codecarbon(self) -> Any:
        try:
            logging.getLogger("codecarbon").setLevel(logging.ERROR)
            from codecarbon import OfflineEmissionsTracker  # pylint: disable=import-outside-toplevel

            primed = _prime_tdp_cache()
            tracker = OfflineEmissionsTracker(
                project_name=self.name,
                country_iso_code=self.country,
                output_dir=str(self.output_dir) if self.output_dir is not None else tempfile.gettempdir(),
                output_methods=[],
                emissions_endpoint=None,
                log_level="error",
                tracking_mode="process",
                allow_multiple_runs=True,
                **({} if self.cpu_power_w is None else {"force_cpu_power": float(self.cpu_power_w)}),
            )
            tracker.start()
            if not primed:
                _store_tdp_cache()
            return tracker
        except Exception as err:  # any codecarbon failure: fall back, and say why  # pylint: disable=broad-except
            self.fallback_reason = f"codecarbon failed to start ({type(err).__name__})"
            return None

    def stop(self) -> EnergyReport:
        if self._t0 is None:
            raise ValueError(f"energy tracker {self.name!r} was not started")
        duration = time.perf_counter() - self._t0
        report = None
        if self._tracker is not None:
            try:
                self._tracker.stop()
                report = self._report_from_codecarbon(self._tracker.final_emissions_data)
            except Exception as err:  # pylint: disable=broad-except
                self.fallback_reason = f"codecarbon failed to stop ({type(err).__name__})"
        if report is None:
            report = self._fallback_report(duration)
        self._t0, self._tracker = None, None
        self.report = report
        if self.output_dir is not None:
            write_json_atomic(self.output_dir / f"energy-{self.name}.json", report.to_dict())
        return report

    def _report_from_codecarbon(self, data: Any) -> EnergyReport:
        cpu, gpu, ram = float(data.cpu_energy), float(data.gpu_energy), float(data.ram_energy)
        return EnergyReport(
            name=self.name,
            duration_s=float(data.duration),
            energy_kwh=float(data.energy_consumed),
            cpu_kwh=cpu,
            gpu_kwh=gpu,
            ram_kwh=ram,
            emissions_kg_co2eq=float(data.emissions),
            grid_intensity_g_per_kwh=self.intensity,
            country=self.country,
            method="codecarbon offline, process mode: " + _describe_methods(self._tracker),
        )

    def _fallback_report(self, duration: float) -> EnergyReport:
        cpu_s = max(0.0, _process_cpu_seconds(self._process) - self._cpu0)
        cpu_kwh = cpu_s * FALLBACK_WATTS_PER_THREAD / 3.6e6
        reason = self.fallback_reason or "codecarbon disabled"
        return EnergyReport(
            name=self.name,
            duration_s=duration,
            energy_kwh=cpu_kwh,
            cpu_kwh=cpu_kwh,
            gpu_kwh=0.0,
            ram_kwh=0.0,
            emissions_kg_co2eq=cpu_kwh * self.intensity / 1000.0,
            grid_intensity_g_per_kwh=self.intensity,
            country=self.country,
            method=(f"quarl fallback ({reason}): cpu=estimated: {FALLBACK_WATTS_PER_THREAD} W per busy thread "
                    f"x process CPU time ({cpu_s:.3f} s); gpu=not tracked; ram=not tracked"),
        )

    def __enter__(self) -> "EnergyTracker":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        if self._t0 is not None:
            self.stop()


def start_tracking(output_dir: str | os.PathLike, node: str) -> "EnergyTracker | None":
    """A started tracker for `node` writing under `output_dir`, or None if tracking cannot run here.

    For the runners: energy is reported, never a reason to fail a training run (the CLIs check the grid country
    before anything starts, so a None here means the tracker itself could not start)."""
    try:
        return EnergyTracker(output_dir=output_dir, node=node).start()
    except Exception:  # pylint: disable=broad-except
        logging.getLogger(__name__).warning("energy tracking unavailable for %s", node, exc_info=True)
        return None


def stop_tracking(tracker: "EnergyTracker | None") -> dict[str, Any] | None:
    """Stops a tracker from `start_tracking`; its report as a JSON-able dict, or None (no tracker or it failed)."""
    if tracker is None:
        return None
    try:
        return tracker.stop().to_dict()
    except Exception:  # pylint: disable=broad-except
        logging.getLogger(__name__).warning("energy tracker %s failed to stop", tracker.name, exc_info=True)
        return None
