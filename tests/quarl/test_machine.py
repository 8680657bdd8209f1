"""quarl.ops.machine: the one machine record the reports and benchmarks share, the one reader of /proc/cpuinfo, and
the compatibility reader for records written before the record had one format."""
from __future__ import annotations

import ast
import builtins
import json
import os
from pathlib import Path

import pytest

from quarl.ops import machine

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_cpuinfo(monkeypatch, tmp_path):
    """Writes a /proc/cpuinfo of the test's choosing (read through `read_cpuinfo`'s cache, cleared around it)."""
    fake = tmp_path / "cpuinfo"
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: real_open(fake if p == "/proc/cpuinfo" else p, *a, **k))
    machine.read_cpuinfo.cache_clear()
    yield fake
    machine.read_cpuinfo.cache_clear()


def test_machine_info_is_one_typed_record_with_one_set_of_keys():
    from importlib import metadata

    from quarl.runtimes.cpu import cpu_class, cpu_info

    record = machine.machine_info(["numpy", "surely-not-an-installed-dist"])
    data = record.to_json()
    assert isinstance(record, machine.MachineRecord) and tuple(data) == machine.MACHINE_KEYS
    assert set(machine.MACHINE_KEYS) >= {"cpu_model", "cpu_class", "cpu_flags", "cores", "memory_gib", "load_start",
                                         "python", "versions"}
    assert json.loads(json.dumps(data)) == data  # plain JSON: lists, not tuples
    assert data["cores"] == os.cpu_count() and data["versions"] == {"numpy": metadata.version("numpy")}
    assert data["cpu_class"] == cpu_class() and data["cpu_flags"] == cpu_info()["flags"]  # the runtimes' facts
    assert data["cpu_model"] == cpu_info()["cpu_model"] and isinstance(data["cpu_flags"], list)


@pytest.mark.parametrize("text, model, flags, arch, klass", [
    ("processor\t: 0\nmodel name\t: Test CPU @ 1.00GHz\nflags\t: fpu avx2 fma avx512_vnni\n", "Test CPU @ 1.00GHz",
     ["avx2", "avx512_vnni", "fma"], "x86_64", "x86-vnni"),
    ("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd asimddp\nModel\t: Test Arm board\n", "Test Arm board",
     ["asimd", "asimddp"], "aarch64", "arm"),
    ("processor\t: 0\n", None, [], "x86_64", "x86"),
])
def test_read_cpuinfo_reads_x86_and_arm_and_survives_a_bare_file(fake_cpuinfo, monkeypatch, text, model, flags, arch,
                                                                   klass):
    import platform

    monkeypatch.setattr(platform, "machine", lambda: arch)
    fake_cpuinfo.write_text(text)
    info = machine.read_cpuinfo()
    assert info.model == model == machine.cpu_model_name() and info.arch == arch
    assert machine.kernel_flags(info) == flags and machine.cpu_class_of(info.flags, info.arch) == klass
    assert machine.cpu_model() == (model or platform.processor() or "unknown")


def test_load_average_rounds_and_survives_a_missing_one(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (1.234, 0.5, 0.0))
    assert machine.load_average() == [1.23, 0.5, 0.0]

    def missing():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", missing)
    assert machine.load_average() is None and machine.machine_info([]).load_start is None


def test_machine_fields_reads_the_committed_machine_json_and_old_bench_records():
    grid = machine.machine_fields(json.loads((REPO / "results/small/machine.json").read_text()))
    assert grid["cpu_model"] == "AMD EPYC" and grid["cores"] == 2 and grid["physical_cores"] == 2
    assert grid["arch"] == "x86_64" and grid["cpu_flags"] == ["avx2", "fma"] and grid["load_end"][0] == 0.73
    assert grid["versions"]["jax"] == "0.10.2" and "jax" not in grid and "logical_cpus" not in grid
    bench = machine.machine_fields({"cpu": "Xeon", "cpu_flags": "avx2 fma", "cores": 16, "jax": "0.11.2",
                                    "load_average_start": [0.2], "load_average_end": [0.3], "jax_backend": "gpu",
                                    "packages": {"mujoco": "3.3.0"}})
    assert bench == {"cpu_model": "Xeon", "cpu_flags": ["avx2", "fma"], "cores": 16, "load_start": [0.2],
                     "load_end": [0.3], "jax_backend": "gpu", "versions": {"jax": "0.11.2", "mujoco": "3.3.0"}}
    current = machine.machine_info(["numpy"]).to_json()
    assert machine.machine_fields(current) == current and machine.machine_fields(None) == {}


def _defines(path: Path, name: str) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in ast.walk(ast.parse(path.read_text())))


def test_one_machine_info_and_one_reader_of_proc_cpuinfo():
    """Structural: no other module defines a `machine_info` of its own, and only quarl.ops.machine opens
    /proc/cpuinfo (bench.harness.emulation only bind-mounts a fake one for emulated CPUs)."""
    home = REPO / "quarl" / "ops" / "machine.py"
    own, readers = [], []
    for package in ("quarl", "agents", "launch", "analysis", "bench"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path == home:
                continue
            if _defines(path, "machine_info"):
                own.append(str(path.relative_to(REPO)))
            if 'open("/proc/cpuinfo"' in path.read_text(encoding="utf-8"):
                readers.append(str(path.relative_to(REPO)))
    assert not own, f"modules with their own machine_info (use quarl.ops.machine / bench_machine): {own}"
    assert not readers, f"modules reading /proc/cpuinfo themselves (use quarl.ops.machine.read_cpuinfo): {readers}"
    assert _defines(home, "machine_info") and 'open("/proc/cpuinfo"' in home.read_text(encoding="utf-8")


def test_benchmarks_take_machine_facts_only_from_the_record():
    """Structural: no bench, launch or analysis module reads the facts the record holds (load average, Python and
    platform strings, the CPU's flags) by itself, so every results file states them the same way."""
    facts = ("os.getloadavg", "platform.python_version", "platform.platform(", "platform.processor")
    found = [f"{path.relative_to(REPO)}: {fact}" for package in ("bench", "launch", "analysis")
             for path in sorted((REPO / package).rglob("*.py")) for fact in facts
             if fact in path.read_text(encoding="utf-8")]
    assert not found, f"read these through quarl.ops.machine: {found}"
