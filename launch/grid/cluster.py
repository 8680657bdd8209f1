"""The reproduction grid's runs as Ray tasks on a cluster (`launch.reproduce --ray-address ADDR`).

Each run is one task that asks for `cpus_per_run` CPUs, so Ray runs as many at once as the cluster has room for
and queues the rest. A task runs `launch.grid.runs.run_single` in a scratch folder on whichever machine Ray picks
and returns the finished run folder as a tar archive (bytes); the driver unpacks it into the grid's usual
place. So nodes need the project's code but no shared filesystem, and only finished runs ever appear in the
results folder (an interrupted grid resumes exactly as on one machine).

Runs that share a machine share its memory bandwidth and caches: wall clocks of a packed machine are slower
than those of a run alone, which the report's notes say (`cpus_per_run` sets how tightly runs are packed).
"""
from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from launch.program.devices import CPU_ONLY_ENV
from launch.program.graph import SINGLE_THREAD_ENV
from launch.program.ray_runner import init_ray

if TYPE_CHECKING:
    from analysis.schema import Summary
    from launch.grid.runs import PlannedRun

_SLICE_S = 0.2  # longest uninterruptible wait in the driver (Ctrl-C)


def _run_packed(run: PlannedRun, backend: str) -> bytes:
    """One grid run in a scratch folder on this node; its folder as a tar.gz archive."""
    from launch.grid.runs import run_single  # pylint: disable=import-outside-toplevel
    from analysis.runs import is_finished  # pylint: disable=import-outside-toplevel

    with tempfile.TemporaryDirectory(prefix="quarl-grid-") as tmp:
        run_dir = Path(tmp) / "run"
        summary = run_single(run, run_dir, backend)
        if not is_finished(summary):
            raise RuntimeError(f"run ended with status {summary.get('status')!r}: {summary.get('error')}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(run_dir, arcname=".")
        return buf.getvalue()


def unpack(data: bytes, run_dir: Path) -> None:
    """A run folder archive into `run_dir` (tarfile's "data" filter: no absolute paths, links out or devices);
    unpacked beside it first, then renamed, so a half-written run folder never exists."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=run_dir.parent, prefix=".unpack-"))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(tmp, filter="data")
        if run_dir.exists():
            shutil.rmtree(run_dir)
        os.replace(tmp, run_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def run_on_cluster(runs: Sequence[PlannedRun], root: Path, backend: str, address: str, cpus_per_run: float,
                   on_done: Callable[[PlannedRun, Summary | None, str | None, float], None]) -> None:
    """Runs `runs` as Ray tasks on the cluster at `address`; calls `on_done(run, summary, error, seconds)` for
    each as it finishes (summary None and a one-line error when it failed). Ctrl-C cancels what is left."""
    import ray  # pylint: disable=import-outside-toplevel

    from analysis.runs import read_summary  # pylint: disable=import-outside-toplevel

    init_ray(address)
    # Grid runs ask Ray for no GPU, so none may start one (launch.program.devices): on a GPU machine each would take 75%
    # of its memory. One core per run: no library may spread over more either.
    env = dict(SINGLE_THREAD_ENV) if cpus_per_run <= 1 else dict(CPU_ONLY_ENV)
    options: dict[str, object] = {"num_cpus": cpus_per_run, "max_retries": 0, "runtime_env": {"env_vars": env}}
    task = ray.remote(_run_packed).options(**options)
    started = time.monotonic()
    pending = {task.remote(run, backend): run for run in runs}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=_SLICE_S)
            for ref in ready:
                run = pending.pop(ref)
                try:
                    unpack(ray.get(ref), run.run_dir(root))
                except Exception as e:  # pylint: disable=broad-except
                    lines = [ln for ln in str(e).splitlines() if ln.strip()]
                    on_done(run, None, f"{type(e).__name__}: {lines[-1] if lines else ''}",
                            time.monotonic() - started)
                else:
                    on_done(run, read_summary(run.run_dir(root)), None, time.monotonic() - started)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        ray.shutdown()
        sys.stderr.flush()
