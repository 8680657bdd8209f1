"""bench.harness.machine: the busy-machine guard every benchmark runs before it starts, and the load it records."""
from __future__ import annotations

import argparse
import os

import pytest

from bench.harness import machine


def test_check_load_refuses_above_the_core_count_unless_allowed():
    assert machine.check_load(load=[1.9, 3.0, 3.0], cores=2) == [1.9, 3.0, 3.0]  # 5/15-min values do not count
    assert machine.check_load(load=[2.0, 0.0, 0.0], cores=2) == [2.0, 0.0, 0.0]  # "above", not "at"
    with pytest.raises(machine.BusyMachineError, match=r"load average is 9\.5 on 2 cores.*--allow-busy"):
        machine.check_load(load=[9.5, 1.0, 1.0], cores=2)
    assert machine.check_load(True, load=[9.5, 1.0, 1.0], cores=2) == [9.5, 1.0, 1.0]
    assert machine.check_load(load=[9.5, 1.0, 1.0], cores=16) == [9.5, 1.0, 1.0]


def test_cli_guard_exits_2_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    parser = argparse.ArgumentParser(prog="bench.x")
    machine.add_allow_busy(parser)
    with pytest.raises(SystemExit) as info:
        machine.refuse_if_busy(parser, parser.parse_args([]).allow_busy)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench.x: error: the 1-minute load average is 64.0")
    assert machine.refuse_if_busy(parser, parser.parse_args(["--allow-busy"]).allow_busy) == [64.0, 64.0, 64.0]


def test_machine_record_has_the_load_at_start_and_end(monkeypatch):
    loads = iter([(0.5, 0.4, 0.3), (3.25, 1.0, 0.5)])
    monkeypatch.setattr(os, "getloadavg", lambda: next(loads))
    info = machine.bench_machine(allow_busy=True)
    assert info["load_start"] == [0.5, 0.4, 0.3] and info["allow_busy"] is True and info["cores"] == os.cpu_count()
    assert machine.finish(info)["load_end"] == [3.25, 1.0, 0.5]
    assert "0.5 at the start and 3.2 at the end" in machine.describe_load(info)
    assert "--allow-busy" in machine.describe_load(info)


def test_a_benchmark_record_is_the_one_machine_record_plus_its_own_fields(monkeypatch):
    """Every benchmark's machine record carries what decides int8 against fp32 speed on this CPU, under the keys
    of `quarl.ops.machine.MachineRecord`, flags as a list."""
    from quarl.ops import machine as ops_machine

    fake = ops_machine.CpuInfo("Test CPU", frozenset({"fma", "avx512_vnni", "avx2", "sse4_2", "avx512f"}), "x86_64")
    monkeypatch.setattr(ops_machine, "read_cpuinfo", lambda: fake)
    info = machine.bench_machine(allow_busy=True)
    assert set(info) == {*ops_machine.MACHINE_KEYS, "allow_busy"}
    assert info["cpu_flags"] == ["avx2", "avx512f", "avx512_vnni", "fma"] and info["cpu_class"] == "x86-vnni"
    assert machine.describe_cpu(info, flags=True) == f"Test CPU (avx2, avx512f, avx512_vnni, fma), {os.cpu_count()} " \
        "logical cores"


def test_reports_read_records_written_before_the_one_format():
    old = {"cpu": "Old CPU", "cpu_flags": "avx2 fma", "cores": 2, "load_start": [0.5], "load_end": [1.5],
           "allow_busy": False}
    assert machine.describe_cpu(old, flags=True) == "Old CPU (avx2, fma), 2 logical cores"
    assert machine.describe_load(old) == "load average 0.5 at the start and 1.5 at the end on 2 cores"
    learner = {"cpu": "Xeon", "cores": 16, "jax": "0.11.2", "load_average_start": [0.2], "load_average_end": [0.3]}
    assert "0.2 at the start and 0.3 at the end on 16 cores" in machine.describe_load(learner)


@pytest.mark.parametrize("module, extra", [("bench.system.actorq", []), ("bench.micro.inference", []),
                                           ("bench.micro.learner_throughput", []), ("bench.learning.int8_vs_fp32", []),
                                           ("bench.learning.qat", []), ("bench.peers.offpolicy", ["--skip-acme", "--skip-sb3"]),
                                           ("bench.micro.publish", []), ("bench.system.replay_server", [])])
def test_every_benchmark_refuses_a_busy_machine_before_it_starts(module, extra, monkeypatch, tmp_path, capsys):
    import importlib

    monkeypatch.setattr(os, "getloadavg", lambda: (1000.0, 1000.0, 1000.0))
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as info:
        main(["--quick", "--out", str(tmp_path / "out"), *extra])
    assert info.value.code == 2 and "--allow-busy" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing ran, nothing was written


def test_pin_to_one_core_confines_the_calling_thread_and_the_threads_it_starts():
    """Run in a worker thread: pinning affects only the calling thread (and threads it starts), never the
    test process's main thread."""
    import os
    import threading

    from bench.harness.machine import pin_to_one_core

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    before = os.sched_getaffinity(0)
    seen: dict[str, object] = {}

    def worker() -> None:
        seen["core"] = pin_to_one_core()
        child = threading.Thread(target=lambda: seen.setdefault("child", os.sched_getaffinity(0)))
        child.start()
        child.join()
        seen["self"] = os.sched_getaffinity(0)
        try:
            pin_to_one_core(max(before) + 1000)
        except ValueError as e:
            seen["error"] = str(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["core"] == max(before) and seen["self"] == seen["child"] == {max(before)}
    assert "is not one this thread may run on" in seen["error"]
    assert os.sched_getaffinity(0) == before


def test_measuring_actor_env_gives_one_thread_and_a_fresh_auto_cache_then_removes_it():
    from pathlib import Path

    from bench.harness.machine import measuring_actor_env
    from launch.program.graph import SINGLE_THREAD_ENV
    from quarl.runtimes.auto import CACHE_ENV

    with measuring_actor_env("quarl-test-auto-") as env:
        cache = Path(env[CACHE_ENV])
        assert cache.is_dir() and not any(cache.iterdir())  # empty: nothing measured earlier is reused
        assert all(env[k] == v for k, v in SINGLE_THREAD_ENV.items())
        (cache / "auto_backend.json").write_text("{}")
    assert not cache.exists()


def test_run_cli_turns_usage_busy_and_run_errors_into_exit_codes(capsys):
    from launch.cli import UsageError

    def fail(err: Exception):
        def body() -> None:
            raise err
        return body

    assert machine.run_cli("bench.x", lambda: None) == 0
    assert machine.run_cli("bench.x", fail(UsageError("bad --seeds"))) == 2
    assert capsys.readouterr().err == "bench.x: error: bad --seeds\n"
    assert machine.run_cli("bench.x", fail(machine.BusyMachineError("busy"))) == 2
    assert capsys.readouterr().err == "bench.x: error: busy\n"
    assert machine.run_cli("bench.x", fail(RuntimeError("run 3 failed"))) == 1
    assert capsys.readouterr().err == "bench.x: run 3 failed\n"
    assert machine.run_cli("bench.x", fail(KeyboardInterrupt())) == 130  # Ctrl-C: one line, no traceback
    assert capsys.readouterr().err == "bench.x: stopped (Ctrl-C); finished results are kept\n"
