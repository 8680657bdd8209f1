"""Tests for quarl.ops.carbon: energy/emissions reports from codecarbon and from the fallback estimate."""
from __future__ import annotations

import dataclasses
import json
import sys
import os
import time
from importlib import resources

import pytest

from quarl.ops import carbon, codecarbon_parts, rapl as rapl_counters


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _busy(seconds: float = 0.3) -> int:
    x, end = 0, time.process_time() + seconds
    while time.process_time() < end:
        x += 1
    return x


def _has_rapl() -> bool:
    return os.path.isdir("/sys/class/powercap/intel-rapl")


def test_codecarbon_report_is_consistent(tmp_path):
    with carbon.EnergyTracker("busy", country_iso_code="usa", output_dir=tmp_path) as tracker:
        _busy()
    report = tracker.report
    assert report is not None and report.name == "busy" and report.country == "USA"
    assert report.energy_kwh > 0 and report.cpu_kwh > 0
    assert report.energy_kwh == pytest.approx(report.cpu_kwh + report.gpu_kwh + report.ram_kwh, rel=1e-9)
    assert report.grid_intensity_g_per_kwh == pytest.approx(carbon.grid_intensity("USA"))
    assert report.emissions_kg_co2eq == pytest.approx(
        report.energy_kwh * report.grid_intensity_g_per_kwh / 1000.0, rel=1e-6)
    assert report.duration_s >= 0.3
    assert report.method.startswith("codecarbon offline") and "measured:" in report.method
    assert report.measured_kwh + report.modelled_kwh == pytest.approx(report.energy_kwh, rel=1e-9)
    assert report.ram_model_share == pytest.approx(report.ram_kwh / report.energy_kwh)
    assert f"RAM model share of the energy: {100 * report.ram_model_share:.0f}%" in report.method
    if not _has_rapl():  # no counters: everything is modelled, and said to be
        assert report.measured_kwh == 0 and report.package_kwh is None
        assert "measured: nothing" in report.method and "modelled: cpu (" in report.method
    saved = json.loads((tmp_path / "energy-busy.json").read_text())
    assert saved == report.to_dict()


def test_grid_intensity_matches_codecarbon_data():
    path = resources.files("codecarbon") / "data" / "private_infra" / "global_energy_mix.json"
    mix = json.loads(path.read_text())
    assert carbon.grid_intensity("FRA") == pytest.approx(mix["FRA"]["carbon_intensity"])
    assert carbon.grid_intensity("USA") != carbon.grid_intensity("FRA")
    with pytest.raises(ValueError, match="ISO"):
        carbon.grid_intensity("XYZ")


def test_fallback_estimate_is_labelled_and_scales_with_cpu_time():
    outer0 = time.process_time()
    tracker = carbon.EnergyTracker("fallback", use_codecarbon=False).start()
    inner0 = time.process_time()
    _busy(0.3)
    inner = time.process_time() - inner0
    report = tracker.stop()
    outer = time.process_time() - outer0
    cpu_s = report.cpu_kwh * 3.6e6 / carbon.FALLBACK_WATTS_PER_THREAD
    # The process CPU time the tracker saw lies between what this process spent inside its start/stop and around
    # them (CPU time, not wall time: a loaded machine stretches neither; 20 ms for /proc's 10 ms ticks).
    assert inner >= 0.3 and inner - 0.02 <= cpu_s <= outer + 0.02, (inner, cpu_s, outer)
    assert report.energy_kwh == report.cpu_kwh and report.gpu_kwh == 0 and report.ram_kwh == 0
    assert report.emissions_kg_co2eq == pytest.approx(report.energy_kwh * report.grid_intensity_g_per_kwh / 1000)
    assert "fallback" in report.method and "modelled: cpu (a default of 4 W per busy thread (not this CPU's TDP)" \
        in report.method and "measured: nothing" in report.method
    assert report.modelled_kwh == report.energy_kwh and report.ram_model_share == 0


def test_codecarbon_start_failure_falls_back(monkeypatch):
    import codecarbon

    class Broken:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("no hardware access")

    monkeypatch.setattr(codecarbon, "OfflineEmissionsTracker", Broken)
    with carbon.EnergyTracker("broken") as tracker:
        _busy(0.1)
    assert "codecarbon failed to start (RuntimeError)" in tracker.report.method
    assert tracker.report.cpu_kwh > 0


def test_combine_sums_reports():
    a = carbon.EnergyReport("a", 2.0, 3.0, 1.0, 1.5, 0.5, 3.0 * 0.1, 100.0, "USA", "m1")
    b = carbon.EnergyReport("b", 1.0, 1.0, 1.0, 0.0, 0.0, 1.0 * 0.5, 500.0, "FRA", "m2")
    total = carbon.combine([a, b, a])
    assert total.name == "total"
    assert total.duration_s == pytest.approx(5.0)
    assert total.energy_kwh == pytest.approx(7.0)
    assert (total.cpu_kwh, total.gpu_kwh, total.ram_kwh) == pytest.approx((3.0, 3.0, 1.0))
    assert total.emissions_kg_co2eq == pytest.approx(1.1)
    assert total.grid_intensity_g_per_kwh == pytest.approx(1.1 * 1000 / 7.0)
    assert total.country == "USA,FRA" and total.method == "m1 | m2"
    missing = dataclasses.replace(b, emissions_kg_co2eq=None, grid_intensity_g_per_kwh=None)
    partial = carbon.combine([a, missing])  # one report without a grid intensity: no emissions total at all
    assert partial.emissions_kg_co2eq is None and partial.grid_intensity_g_per_kwh is None
    with pytest.raises(ValueError, match="at least one"):
        carbon.combine([])


def test_tracker_validates_inputs_and_state():
    with pytest.raises(ValueError, match="name"):
        carbon.EnergyTracker("bad name/..")
    with pytest.raises(ValueError, match="ISO"):
        carbon.EnergyTracker("x", country_iso_code="US")
    with pytest.raises(ValueError, match="cpu_power_w"):
        carbon.EnergyTracker("x", cpu_power_w=-1)
    with pytest.raises(ValueError, match="one name"):
        carbon.EnergyTracker("a", node="b")
    assert carbon.EnergyTracker(node="actor_1", use_codecarbon=False).name == "actor_1"
    assert carbon.EnergyTracker(use_codecarbon=False).name == "run"
    tracker = carbon.EnergyTracker("x", use_codecarbon=False)
    with pytest.raises(ValueError, match="not started"):
        tracker.stop()
    tracker.start()
    with pytest.raises(ValueError, match="already running"):
        tracker.start()
    tracker.stop()


def test_tdp_cache_round_trip(monkeypatch):
    from codecarbon.core import hardware_cache

    if codecarbon_parts.cpu_model_line() is None:
        pytest.skip("no /proc/cpuinfo model line on this machine")

    class FakeTDP:
        model, tdp = "Test CPU 9000", 123

    monkeypatch.setattr(hardware_cache, "_tdp", FakeTDP())
    codecarbon_parts.store_tdp_cache()
    monkeypatch.setattr(hardware_cache, "_tdp", None)
    assert codecarbon_parts.prime_tdp_cache()
    assert (hardware_cache._tdp.model, hardware_cache._tdp.tdp) == ("Test CPU 9000", 123.0)
    assert not codecarbon_parts.prime_tdp_cache()  # already primed: leaves codecarbon's value alone


def test_grid_country_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(carbon.COUNTRY_ENV, raising=False)
    assert carbon.EnergyTracker(use_codecarbon=False).country == "USA"
    monkeypatch.setenv(carbon.COUNTRY_ENV, "fra")
    tracker = carbon.EnergyTracker(use_codecarbon=False)
    assert tracker.country == "FRA" and tracker.intensity < carbon.grid_intensity("USA")  # nuclear-heavy grid
    assert carbon.EnergyTracker(country_iso_code="DEU", use_codecarbon=False).country == "DEU"  # explicit wins
    for bad in ("US", "QQQ"):
        monkeypatch.setenv(carbon.COUNTRY_ENV, bad)
        with pytest.raises(ValueError, match="QUARL_CARBON_COUNTRY"):
            carbon.default_country()


def _fake_rapl(root, packages: dict[str, int], max_uj: int = 1_000_000_000) -> None:
    """A powercap tree: package domains intel-rapl:N plus a core sub-domain and a psys domain to be ignored."""
    for i, (name, uj) in enumerate(packages.items()):
        for domain, label, value in ((f"intel-rapl:{i}", name, uj), (f"intel-rapl:{i}:0", "core", uj // 2)):
            d = root / domain
            d.mkdir(parents=True, exist_ok=True)
            (d / "name").write_text(label + "\n")
            (d / "energy_uj").write_text(f"{value}\n")
            (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    psys = root / f"intel-rapl:{len(packages)}"
    psys.mkdir(exist_ok=True)
    for f, v in (("name", "psys"), ("energy_uj", "5"), ("max_energy_range_uj", str(max_uj))):
        (psys / f).write_text(v)


def test_rapl_package_energy_is_split_by_cpu_time_and_survives_wraps(tmp_path):
    _fake_rapl(tmp_path, {"package-0": 900_000_000})
    assert rapl_counters.read_rapl_packages(tmp_path) == {"intel-rapl:0": (900_000_000, 1_000_000_000)}
    cpu = {"proc": 10.0, "machine": 100.0}
    rapl = rapl_counters.RaplAttribution(lambda: cpu["proc"], root=tmp_path, machine_cpu=lambda: cpu["machine"])
    # interval 1: 60 J of package energy (the counter wraps at 1000 J), the process used 1 of 4 busy CPU-s
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("960000000")
    cpu.update(proc=11.0, machine=104.0)
    rapl.sample()
    assert (rapl.package_j, rapl.attributed_j) == pytest.approx((60.0, 15.0))
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("20000000")  # wrapped: 40 J + 20 J = 60 J
    cpu.update(proc=13.0, machine=106.0)  # the process was all the busy CPU time
    rapl.sample()
    assert (rapl.package_j, rapl.attributed_j) == pytest.approx((120.0, 75.0))
    cpu.update(proc=13.0, machine=106.0)
    rapl.sample()  # no energy, no CPU time: nothing added (and no division by zero)
    assert (rapl.package_j, rapl.attributed_j) == pytest.approx((120.0, 75.0))
    with pytest.raises(OSError, match="RAPL"):
        rapl_counters.RaplAttribution(lambda: 0.0, root=tmp_path / "none")


def test_rapl_tracker_reports_measured_cpu_and_combine_counts_the_package_once(tmp_path, monkeypatch):
    _fake_rapl(tmp_path, {"package-0": 0})
    busy = iter(float(x) for x in range(0, 10_000, 10))  # the machine: 10 busy CPU-s between readings
    monkeypatch.setattr(rapl_counters, "machine_busy_cpu_seconds", lambda: next(busy))
    reports = []
    for name in ("learner", "actor_0"):
        tracker = carbon.EnergyTracker(name, use_codecarbon=False, rapl_root=tmp_path, rapl_interval_s=3600).start()
        _busy(0.2)
        (tmp_path / "intel-rapl:0" / "energy_uj").write_text("36000000000" if name == "learner" else "72000000000")
        reports.append(tracker.stop())
    for r in reports:  # 36 kJ = 0.01 kWh of package energy per span; the process got its CPU share of it
        assert r.package_kwh == pytest.approx(0.01)
        assert 0 < r.cpu_kwh < 0.01 * 0.2 and r.measured_kwh == r.cpu_kwh
        assert "measured: cpu (RAPL package counter" in r.method and "modelled: nothing" in r.method
    total = carbon.combine(reports)
    assert total.cpu_kwh == pytest.approx(sum(r.cpu_kwh for r in reports))  # attributed shares add up
    assert total.package_kwh == pytest.approx(0.01)  # the one package, once, not 0.02
    assert carbon.EnergyReport.from_dict(reports[0].to_dict()) == reports[0]


def test_codecarbon_default_tdp_is_named_a_default():
    import psutil

    class CPU:  # codecarbon's hardware object, as _codecarbon_components reads it
        def __init__(self, model, tdp):
            self._mode, self._model, self._tdp = "cpu_load", model, tdp

    class Tracker:
        def __init__(self, *hw):
            self._hardware = hw

    default = (psutil.cpu_count() or 1) * 4
    text = codecarbon_parts.codecarbon_components(Tracker(CPU("Quux Zorb 9 Unknown Processor", default)))["cpu"]
    assert text[0] == "modelled" and "default for a CPU it does not know" in text[1] and "not this CPU's TDP" in text[1]
    text = codecarbon_parts.codecarbon_components(Tracker(CPU("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz", 150)))["cpu"]
    assert "from codecarbon's CPU table" in text[1] and "default" not in text[1]


def test_missing_codecarbon_gives_unavailable_intensity_not_a_default(monkeypatch):
    for mod in [m for m in sys.modules if m == "codecarbon" or m.startswith("codecarbon.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "codecarbon", None)  # import codecarbon -> ImportError
    assert carbon.grid_intensity("FRA") is None
    monkeypatch.setenv(carbon.COUNTRY_ENV, "FRA")
    assert carbon.default_country() == "FRA"
    with carbon.EnergyTracker("no_codecarbon") as tracker:
        _busy(0.1)
    report = tracker.report
    assert report.emissions_kg_co2eq is None and report.grid_intensity_g_per_kwh is None
    assert "quarl fallback (codecarbon not installed)" in report.method
    assert "grid intensity: unavailable" in report.method and report.cpu_kwh > 0
    assert json.loads(json.dumps(report.to_dict()))["emissions_kg_co2eq"] is None
