"""Energy and carbon accounting per process, with codecarbon's offline tracker (no network).

Why per process: QuaRL's claim is that quantized actors save energy, so every actor and the learner track
their own consumption and the launcher adds the reports up (`combine`).

Honesty about the numbers: each report says which parts were *measured* (hardware counters: RAPL for CPUs,
NVML for NVIDIA GPUs) and which were *modelled*, with the kWh of each (`measured_kwh`, `modelled_kwh`) and the
share of the total that codecarbon's RAM model contributes (`ram_model_share`: on machines without counters
it is most of the figure, so energy ratios there are mostly run-time ratios).

- CPU with RAPL: the package counter covers the whole CPU package (every process on it), so a per-process
  report that copied it would count the package once per process when reports are summed. The tracker
  samples the package counter itself and attributes to its process the share of each interval's package
  energy equal to the process's share of the machine's busy CPU time; summing those shares never counts
  the package twice. `package_kwh` keeps the whole-package reading of the span for reference; `combine`
  reports it once per host (the longest span), never summed.
- CPU without RAPL: codecarbon's model, TDP x the process's CPU time share. When codecarbon does not know
  the CPU, its TDP is a default of 4 W per thread; the method line says "default", never "this CPU's TDP".
- Grid intensity: codecarbon's offline figure for the country. Without codecarbon's data it is
  "unavailable" (None, and no emissions), never a world average under the country's label.

If codecarbon cannot start, the tracker still measures CPU energy with RAPL where readable, else models it
as process CPU time x `FALLBACK_WATTS_PER_THREAD` (a default, and the method line says so).

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
import socket
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import psutil

from quarl.ops.codecarbon_parts import (
    FALLBACK_WATTS_PER_THREAD, codecarbon_components, prime_tdp_cache, store_tdp_cache,
)
from quarl.ops.io import JSONValue, write_json_atomic
from quarl.ops.rapl import RAPL_SAMPLE_S, RaplAttribution, process_cpu_seconds

if TYPE_CHECKING:  # codecarbon is optional and imported lazily: its types are for the checker only
    from codecarbon import OfflineEmissionsTracker
    from codecarbon.output_methods.emissions_data import EmissionsData

# Where the run's electricity comes from, for the grid intensity (ISO 3166-1 alpha-3; default USA). An
# environment variable rather than a flag so that every process of a distributed run (Ray workers inherit the
# driver's environment) uses the same grid without threading it through each node.
COUNTRY_ENV = "QUARL_CARBON_COUNTRY"
DEFAULT_COUNTRY = "USA"
UNAVAILABLE = "unavailable"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@dataclasses.dataclass(frozen=True)
class EnergyReport:
    """Energy and emissions of one tracked span (or a sum of spans, see `combine`).

    `cpu_kwh` is this process's attributed CPU energy; `measured_kwh` + `modelled_kwh` = `energy_kwh`.
    `emissions_kg_co2eq` and `grid_intensity_g_per_kwh` are None when the grid intensity is unavailable.
    """

    name: str
    duration_s: float
    energy_kwh: float
    cpu_kwh: float
    gpu_kwh: float
    ram_kwh: float
    emissions_kg_co2eq: float | None
    grid_intensity_g_per_kwh: float | None
    country: str
    method: str
    measured_kwh: float = 0.0
    modelled_kwh: float = 0.0
    package_kwh: float | None = None  # whole CPU package over the span (RAPL), for reference; never summed
    host: str = ""

    @property
    def ram_model_share(self) -> float | None:
        """Fraction of the energy that comes from the RAM power model (None for zero energy)."""
        return self.ram_kwh / self.energy_kwh if self.energy_kwh > 0 else None

    def to_dict(self) -> dict[str, JSONValue]:
        return {**dataclasses.asdict(self), "ram_model_share": self.ram_model_share}

    @classmethod
    def from_dict(cls, data: dict[str, JSONValue]) -> "EnergyReport":
        """Reads `to_dict`'s output back (unknown keys, e.g. ram_model_share, are derived and ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _emissions(energy_kwh: float, intensity: float | None) -> float | None:
    return None if intensity is None else energy_kwh * intensity / 1000.0


def combine(reports: Iterable[EnergyReport], name: str = "total") -> EnergyReport:
    """Sums reports (e.g. learner + actors). `duration_s` is the sum of tracked durations (process-seconds,
    not wall time); the grid intensity is the energy-weighted mean (None if any report lacks one);
    distinct countries/methods are joined. Attributed parts add up; the RAPL package reading does not (it
    is the same package seen from each process): per host, the longest span's reading is kept, once.
    """
    reports = list(reports)
    if not reports:
        raise ValueError("combine needs at least one EnergyReport")
    energy = sum(r.energy_kwh for r in reports)
    if any(r.emissions_kg_co2eq is None or r.grid_intensity_g_per_kwh is None for r in reports):
        emissions, intensity = None, None
    else:
        emissions = sum(r.emissions_kg_co2eq for r in reports)  # type: ignore[misc]
        intensity = (emissions * 1000.0 / energy if energy > 0
                     else sum(r.grid_intensity_g_per_kwh for r in reports) / len(reports))  # type: ignore[misc]
    packages: dict[str, tuple[float, float]] = {}  # host -> (duration, package kWh) of its longest span
    for r in reports:
        if r.package_kwh is not None and r.duration_s >= packages.get(r.host, (-1.0, 0.0))[0]:
            packages[r.host] = (r.duration_s, r.package_kwh)
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
        measured_kwh=sum(r.measured_kwh for r in reports),
        modelled_kwh=sum(r.modelled_kwh for r in reports),
        package_kwh=sum(kwh for _, kwh in packages.values()) if packages else None,
        host=",".join(dict.fromkeys(r.host for r in reports)),
    )


def grid_intensity(country_iso_code: str) -> float | None:
    """Grid carbon intensity (g CO2eq/kWh) codecarbon uses offline for a country (ISO 3166-1 alpha-3).

    None when codecarbon's data cannot be read (unavailable, never a stand-in figure); ValueError for a
    code codecarbon does not know."""
    code = country_iso_code.upper()
    try:
        from codecarbon.input import DataSource  # pylint: disable=import-outside-toplevel
        from codecarbon.core.emissions import Emissions  # pylint: disable=import-outside-toplevel

        mix = DataSource().get_global_energy_mix_data()
    except Exception:  # codecarbon missing or broken  # pylint: disable=broad-except
        return None
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


def _method_line(source: str, parts: dict[str, tuple[str, str]], kwh: dict[str, float], total: float,
                 country: str, intensity: float | None) -> str:
    """The report's method: what was measured, what modelled (with the RAM model's share), the grid source."""
    def listed(kind: str) -> str:
        names = [f"{c} ({how})" for c, (k, how) in parts.items() if k == kind]
        return ", ".join(names) or "nothing"
    ram_share = f"{100 * kwh['ram'] / total:.0f}%" if total > 0 and parts["ram"][0] == "modelled" else "0%"
    grid = (f"{country} {intensity:.0f} g/kWh (codecarbon offline data)" if intensity is not None
            else f"{UNAVAILABLE} (codecarbon's data could not be read; no emissions reported)")
    untracked = [c for c, (k, _) in parts.items() if k == "none"]
    return (f"{source}. measured: {listed('measured')}; modelled: {listed('modelled')}; RAM model share of the "
            f"energy: {ram_share}" + (f"; not tracked: {', '.join(untracked)}" if untracked else "")
            + f"; grid intensity: {grid}")


class EnergyTracker:
    """Tracks the energy of this process from `start()` to `stop()` (or as a context manager).

    `name` (or its alias `node`) labels the report and its file. `cpu_power_w` overrides the CPU TDP codecarbon
    looks up (its table can be far off for VMs); the CPU energy is then still modelled (TDP x CPU time share),
    and `method` says so. Where RAPL package counters are readable (`rapl_root`), CPU energy is measured and
    attributed by CPU time (`RaplAttribution`) instead of codecarbon's per-process figure.

    `stop()` returns an `EnergyReport` (also kept in `.report`); with `output_dir`, it is also written
    to `output_dir/energy-<name>.json`. `startup_s` is how long `start()` took.
    """

    def __init__(self, name: str = "run", country_iso_code: str | None = None, output_dir: str | os.PathLike | None = None,
                 use_codecarbon: bool = True, cpu_power_w: float | None = None, *, node: str | None = None,
                 rapl_root: str | os.PathLike | None = None, rapl_interval_s: float = RAPL_SAMPLE_S):
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
        self.intensity = grid_intensity(self.country)  # validates the code; None when codecarbon's data is missing
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.use_codecarbon = bool(use_codecarbon)
        if cpu_power_w is not None and not (isinstance(cpu_power_w, (int, float)) and 0 < cpu_power_w < 1e5):
            raise ValueError(f"cpu_power_w must be a positive number of watts, got {cpu_power_w!r}")
        self.cpu_power_w = cpu_power_w  # codecarbon's force_cpu_power: the CPU's known TDP, if you know it
        self.rapl_root = rapl_root
        self.rapl_interval_s = float(rapl_interval_s)
        self.report: EnergyReport | None = None
        self.startup_s = 0.0
        self.fallback_reason: str | None = None
        self._tracker: OfflineEmissionsTracker | None = None
        self._rapl: RaplAttribution | None = None
        self._process = psutil.Process()
        self._t0: float | None = None
        self._cpu0 = 0.0

    def start(self) -> "EnergyTracker":
        if self._t0 is not None:
            raise ValueError(f"energy tracker {self.name!r} is already running")
        began = time.perf_counter()
        self.report = None
        self._t0 = began
        self._cpu0 = process_cpu_seconds(self._process)
        if self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._rapl = RaplAttribution(lambda: process_cpu_seconds(self._process), root=self.rapl_root,
                                         interval_s=self.rapl_interval_s).start()
        except OSError:  # no readable package counter: CPU energy comes from a model
            self._rapl = None
        if self.use_codecarbon:
            self._tracker = self._start_codecarbon()
        self.startup_s = time.perf_counter() - began
        return self

    def _start_codecarbon(self) -> OfflineEmissionsTracker | None:
        try:
            logging.getLogger("codecarbon").setLevel(logging.ERROR)
            from codecarbon import OfflineEmissionsTracker  # pylint: disable=import-outside-toplevel

            primed = prime_tdp_cache()
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
                store_tdp_cache()
            return tracker
        except ImportError:
            self.fallback_reason = "codecarbon not installed"
            return None
        except Exception as err:  # any codecarbon failure: fall back, and say why  # pylint: disable=broad-except
            self.fallback_reason = f"codecarbon failed to start ({type(err).__name__})"
            return None

    def stop(self) -> EnergyReport:
        if self._t0 is None:
            raise ValueError(f"energy tracker {self.name!r} was not started")
        duration = time.perf_counter() - self._t0
        if self._rapl is not None:
            self._rapl.stop()
        report = None
        if self._tracker is not None:
            try:
                self._tracker.stop()
                report = self._report_from_codecarbon(self._tracker.final_emissions_data)
            except Exception as err:  # pylint: disable=broad-except
                self.fallback_reason = f"codecarbon failed to stop ({type(err).__name__})"
        if report is None:
            report = self._fallback_report(duration)
        self._t0, self._tracker, self._rapl = None, None, None
        self.report = report
        if self.output_dir is not None:
            write_json_atomic(self.output_dir / f"energy-{self.name}.json", report.to_dict())
        return report

    def _build(self, source: str, duration: float, parts: dict[str, tuple[str, str]],
               kwh: dict[str, float]) -> EnergyReport:
        """A report from per-component kWh, with RAPL's attributed CPU energy replacing any CPU figure."""
        package_kwh = None
        if self._rapl is not None:
            kwh["cpu"] = self._rapl.attributed_j / 3.6e6
            package_kwh = self._rapl.package_j / 3.6e6
            parts["cpu"] = ("measured", "RAPL package counter, this process's share of the machine's busy CPU "
                                        "time; the whole package is reported once per host, never summed")
        total = sum(kwh.values())
        measured = sum(kwh[c] for c, (k, _) in parts.items() if k == "measured")
        return EnergyReport(
            name=self.name, duration_s=duration, energy_kwh=total, cpu_kwh=kwh["cpu"], gpu_kwh=kwh["gpu"],
            ram_kwh=kwh["ram"], emissions_kg_co2eq=_emissions(total, self.intensity),
            grid_intensity_g_per_kwh=self.intensity, country=self.country,
            method=_method_line(source, parts, kwh, total, self.country, self.intensity),
            measured_kwh=measured, modelled_kwh=total - measured, package_kwh=package_kwh,
            host=socket.gethostname())

    def _report_from_codecarbon(self, data: EmissionsData) -> EnergyReport:
        kwh = {"cpu": float(data.cpu_energy), "gpu": float(data.gpu_energy), "ram": float(data.ram_energy)}
        return self._build("codecarbon offline, process mode", float(data.duration),
                           codecarbon_components(self._tracker), kwh)

    def _fallback_report(self, duration: float) -> EnergyReport:
        cpu_s = max(0.0, process_cpu_seconds(self._process) - self._cpu0)
        reason = self.fallback_reason or "codecarbon disabled"
        parts = {"cpu": ("modelled", f"a default of {FALLBACK_WATTS_PER_THREAD:g} W per busy thread (not this "
                                     f"CPU's TDP) x process CPU time ({cpu_s:.3f} s)"),
                 "gpu": ("none", "not tracked"), "ram": ("none", "not tracked")}
        kwh = {"cpu": cpu_s * FALLBACK_WATTS_PER_THREAD / 3.6e6, "gpu": 0.0, "ram": 0.0}
        return self._build(f"quarl fallback ({reason})", duration, parts, kwh)

    def __enter__(self) -> "EnergyTracker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
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


def stop_tracking(tracker: "EnergyTracker | None") -> dict[str, JSONValue] | None:
    """Stops a tracker from `start_tracking`; its report as a JSON-able dict, or None (no tracker or it failed)."""
    if tracker is None:
        return None
    try:
        return tracker.stop().to_dict()
    except Exception:  # pylint: disable=broad-except
        logging.getLogger(__name__).warning("energy tracker %s failed to stop", tracker.name, exc_info=True)
        return None
