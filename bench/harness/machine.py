"""What machine a benchmark ran on, recorded with its results, and the busy-machine guard every benchmark runs.

The record is `quarl.ops.machine`'s (one format in every results file), plus what only a benchmark knows: whether
it started with --allow-busy, and (`finish`) the load average at its end.

These boxes are shared: a benchmark started while other jobs keep every core busy measures the other jobs as
much as the code. So each benchmark refuses to start when the 1-minute load average is above the number of
cores (unless told `--allow-busy`), and every result records the load average at its start and end.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import sys
from typing import Any, Callable, Iterator, NoReturn, Sequence

from quarl.ops.machine import load_average, machine_fields, machine_info

ALLOW_BUSY_HELP = ("start even when the 1-minute load average exceeds the number of cores (the load at start "
                   "and end is recorded with the results either way)")


class BusyMachineError(RuntimeError):
    """The machine is too busy for a timing to mean anything (and --allow-busy was not given)."""


def check_load(allow_busy: bool = False, *, load: Sequence[float] | None = None,
               cores: int | None = None) -> list[float] | None:
    """The load average now; raises BusyMachineError when its 1-minute value exceeds the core count.

    `load` and `cores` default to this machine's (tests pass fakes). Without a load average (not Linux/BSD)
    nothing can be checked and None is returned.
    """
    load = load_average() if load is None else [float(x) for x in load]
    cores = (os.cpu_count() or 1) if cores is None else int(cores)
    if load and load[0] > cores and not allow_busy:
        raise BusyMachineError(f"the 1-minute load average is {load[0]:.1f} on {cores} cores: other jobs would be "
                               "timed too; wait until the machine is quiet or pass --allow-busy")
    return load


def add_allow_busy(parser: argparse.ArgumentParser) -> None:
    """Adds the `--allow-busy` flag every benchmark takes."""
    parser.add_argument("--allow-busy", action="store_true", help=ALLOW_BUSY_HELP)


def refuse_if_busy(parser: argparse.ArgumentParser, allow_busy: bool) -> list[float] | None:
    """`check_load` for a CLI: a busy machine ends the program with one line on stderr and exit code 2."""
    try:
        return check_load(allow_busy)
    except BusyMachineError as err:
        _exit(parser, str(err))


def _exit(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def run_cli(prog: str, body: Callable[[], object]) -> int:
    """Runs a study CLI's `body` and gives its exit code, so the studies end the same way: a bad command-line
    value (`launch.cli.UsageError`) or a busy machine prints `prog: error: ...` on stderr and gives 2; any
    other RuntimeError (a run that failed) prints `prog: ...` and gives 1; Ctrl-C prints one line and gives 130
    (what a study wrote before it, finished cells and session records, stays); otherwise 0."""
    from launch.cli import UsageError  # pylint: disable=import-outside-toplevel  # it imports the agents

    try:
        body()
    except (UsageError, BusyMachineError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: stopped (Ctrl-C); finished results are kept", file=sys.stderr)
        return 130
    return 0


def bench_machine(allow_busy: bool = False) -> dict[str, Any]:
    """`quarl.ops.machine.machine_info`'s record as JSON (CPU, its class and the SIMD flags that decide int8
    against fp32 speed, cores, memory, the load average now, Python, library versions) plus whether
    --allow-busy was given. Pair with `finish` at the end, which adds `load_end`."""
    return {**machine_info().to_json(), "allow_busy": bool(allow_busy)}


def finish(machine: dict[str, Any]) -> dict[str, Any]:
    """Records the load average at the end of the benchmark into `machine` (returned)."""
    machine["load_end"] = load_average()
    return machine


def describe_cpu(machine: dict[str, Any], flags: bool = False) -> str:
    """One phrase for a report: 'AMD EPYC 7B13 (avx2, fma), 2 logical cores' (the flags only when asked)."""
    fields = machine_fields(machine)  # results files written before the one record format read the same
    shown = f" ({', '.join(fields.get('cpu_flags') or []) or 'flags not recorded'})" if flags else ""
    return f"{fields.get('cpu_model', 'CPU not recorded')}{shown}, {fields.get('cores', '?')} logical cores"


def describe_load(machine: dict[str, Any]) -> str:
    """One phrase for a report: the 1-minute load average at start and end, and the core count."""
    fields = machine_fields(machine)  # results files written before the one record format read the same

    def one(key: str) -> str:
        value = fields.get(key)
        return "n/a" if not value else f"{value[0]:.1f}"
    busy = " (started with --allow-busy)" if fields.get("allow_busy") else ""
    return (f"load average {one('load_start')} at the start and {one('load_end')} at the end on "
            f"{fields.get('cores', '?')} cores{busy}")


def pin_to_one_core(core: int | None = None) -> int | None:
    """Pin the calling thread to one CPU (default: the highest-numbered one it may run on) and return it; None
    where CPU affinity is unavailable (not Linux).

    What an actor benchmark means by "one actor at the limit of one core" (`quarl.ops.affinity` says why): threads
    created afterwards by this thread inherit the mask, so the policy runtime's threads and envpool's worker
    all share that core, and no backend gets a second core for free. Only the calling thread is pinned, so a
    benchmark calls this inside the Ray actor that measures, before it builds anything."""
    from quarl.ops.affinity import pin_thread  # pylint: disable=import-outside-toplevel

    if not hasattr(os, "sched_setaffinity"):
        return None
    chosen = max(os.sched_getaffinity(0)) if core is None else core
    pin_thread(chosen)
    return chosen


@contextlib.contextmanager
def measuring_actor_env(prefix: str) -> Iterator[dict[str, str]]:
    """Env vars for a Ray actor that measures: one compute thread per runtime, and an `auto` backend cache of
    its own (a temporary folder, removed on exit) so the backends it times are chosen in this run, not read
    from an earlier one measured on other code or another load."""
    from launch.program.graph import SINGLE_THREAD_ENV  # pylint: disable=import-outside-toplevel
    from quarl.runtimes.auto import CACHE_ENV  # pylint: disable=import-outside-toplevel

    cache = tempfile.mkdtemp(prefix=prefix)
    try:
        yield {**SINGLE_THREAD_ENV, CACHE_ENV: cache}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
