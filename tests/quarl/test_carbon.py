"""Tests for quarl.carbon: energy/emissions reports from codecarbon and from the fallback estimate."""
from __future__ import annotations

import json
import os
import time
from importlib import resources

import pytest

from quarl import carbon


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
    assert report.method.startswith("codecarbon offline") and "cpu=" in report.method
    if not _has_rapl():
        assert "cpu=measured" not in report.method and "cpu=estimated" in report.method
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
    tracker = carbon.EnergyTracker("fallback", use_codecarbon=False).start()
    _busy(0.3)
    report = tracker.stop()
    cpu_s = report.cpu_kwh * 3.6e6 / carbon.FALLBACK_WATTS_PER_THREAD
    assert 0.25 <= cpu_s <= 2.0
    assert report.energy_kwh == report.cpu_kwh and report.gpu_kwh == 0 and report.ram_kwh == 0
    assert report.emissions_kg_co2eq == pytest.approx(report.energy_kwh * report.grid_intensity_g_per_kwh / 1000)
    assert "fallback" in report.method and "estimated" in report.method and "measured" not in report.method


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

    if carbon._cpu_model_line() is None:
        pytest.skip("no /proc/cpuinfo model line on this machine")

    class FakeTDP:
        model, tdp = "Test CPU 9000", 123

    monkeypatch.setattr(hardware_cache, "_tdp", FakeTDP())
    carbon._store_tdp_cache()
    monkeypatch.setattr(hardware_cache, "_tdp", None)
    assert carbon._prime_tdp_cache()
    assert (hardware_cache._tdp.model, hardware_cache._tdp.tdp) == ("Test CPU 9000", 123.0)
    assert not carbon._prime_tdp_cache()  # already primed: leaves codecarbon's value alone


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
