"""quarl.ops.machine: the one machine record the reports and benchmarks share."""
import os

from quarl.ops import machine


def test_machine_info_reports_this_host_and_installed_versions():
    from importlib import metadata

    info = machine.machine_info(["numpy", "surely-not-an-installed-dist"])
    assert info["logical_cpus"] == os.cpu_count()
    assert info["numpy"] == metadata.version("numpy")
    assert "surely-not-an-installed-dist" not in info
    assert info.get("cpu_model") == machine.cpu_model_name()  # this host's, or absent where /proc/cpuinfo has none


def test_machine_info_records_the_cpu_model_only_where_there_is_one(monkeypatch):
    monkeypatch.setattr(machine, "cpu_model_name", lambda: "Test CPU @ 1.00GHz")
    assert machine.machine_info([])["cpu_model"] == "Test CPU @ 1.00GHz"
    monkeypatch.setattr(machine, "cpu_model_name", lambda: None)
    assert "cpu_model" not in machine.machine_info([])


def test_load_average_rounds_and_survives_a_missing_one(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (1.234, 0.5, 0.0))
    assert machine.load_average() == [1.23, 0.5, 0.0]

    def missing():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", missing)
    assert machine.load_average() is None


def test_cpu_model_name_reads_proc_cpuinfo(monkeypatch, tmp_path):
    import builtins

    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nmodel name\t: Test CPU @ 1.00GHz\nflags\t: avx2\n")
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: real_open(fake if p == "/proc/cpuinfo" else p, *a, **k))
    assert machine.cpu_model_name() == "Test CPU @ 1.00GHz"
    fake.write_text("processor\t: 0\n")
    assert machine.cpu_model_name() is None
