"""`backend="auto"` decides once per machine: processes starting together (a run's actors) share one decision,
measured by one of them under the cache directory's lock (`quarl.runtimes.auto`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROCESSES = 4

# One "actor": builds an auto executor for the same small policy as its peers, once every peer is ready.
# Its timings are noise (a random ranking per process), the worst case of a busy machine: processes that
# decided alone would disagree; with the lock they cannot.
CHILD = r"""
import json, os, random, sys, time
from pathlib import Path
import numpy as np
from quarl.policy.spec import LayerNorm, Linear, layer_norm_mlp_policy
from quarl.runtimes import auto, make_executor_from_params

def noisy(executors, obs):
    time.sleep(0.3)  # a measurement takes time: the peers arrive while it runs
    rng = random.Random(os.getpid())
    return {name: rng.uniform(1.0, 100.0) for name in executors}

auto._time_interleaved = noisy
spec = layer_norm_mlp_policy(4, [8, 8], [-1.0, -1.0], [1.0, 1.0])
rng = np.random.default_rng(0)
params, width = {}, spec.input_dim
for layer in spec.layers:
    if isinstance(layer, Linear):
        params[layer.name] = {"w": rng.standard_normal((width, layer.out)).astype(np.float32),
                              "b": np.zeros(layer.out, np.float32)}
        width = layer.out
    elif isinstance(layer, LayerNorm):
        params[layer.name] = {"scale": np.ones(width, np.float32), "offset": np.zeros(width, np.float32)}
run = Path(sys.argv[1])
(run / f"ready_{sys.argv[2]}").touch()
while not (run / "go").exists():
    time.sleep(0.01)
ex = make_executor_from_params(spec, params, "fp32", "auto")
(decision,) = auto.auto_decisions().values()
print(json.dumps({"backend": ex.backend, "source": decision["source"], "pid": os.getpid()}))
"""


def test_processes_starting_together_share_one_auto_decision_measured_once(tmp_path):
    cache, run = tmp_path / "cache", tmp_path / "run"
    run.mkdir()
    env = {**os.environ, "QUARL_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(run), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=REPO) for i in range(PROCESSES)]
    try:
        deadline = time.monotonic() + 240
        while len(list(run.glob("ready_*"))) < PROCESSES:
            assert time.monotonic() < deadline, "the processes did not start"
            assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs if p.poll()]
            time.sleep(0.05)
        (run / "go").touch()
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert len({r["backend"] for r in results}) == 1, results
    measured = [r for r in results if r["source"] == "measured"]
    assert len(measured) == 1, results
    (stored,) = json.loads((cache / "auto_backend.json").read_text())["decisions"].values()
    assert stored["measured_by_pid"] == measured[0]["pid"] and stored["backend"] == results[0]["backend"]


def test_threads_with_their_own_cache_reads_wait_for_the_one_that_measures(tmp_path, monkeypatch):
    """Threads of one process exclude each other through the lock as processes do (flock is per open file)."""
    from quarl.runtimes import auto

    monkeypatch.setenv("QUARL_CACHE_DIR", str(tmp_path))
    calls: list[int] = []
    decided: list[str] = []

    def decide(i: int) -> None:
        with auto._machine_lock() as locked:  # pylint: disable=protected-access
            assert locked
            if not (tmp_path / "decided").exists():
                calls.append(i)
                time.sleep(0.2)
                (tmp_path / "decided").write_text(str(i))
            decided.append((tmp_path / "decided").read_text())

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(calls) == 1 and decided == [str(calls[0])] * 4


def test_an_unwritable_cache_directory_decides_alone_with_a_warning(tmp_path, monkeypatch):
    from quarl.runtimes import auto

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("QUARL_CACHE_DIR", str(blocker / "sub"))  # a directory under a file: cannot exist
    with pytest.warns(UserWarning, match="decides alone"):
        with auto._machine_lock() as locked:  # pylint: disable=protected-access
            assert locked is False


def test_interleaved_samples_takes_turns_and_drops_each_blocks_first_call():
    import numpy as np

    from quarl.runtimes import auto

    calls = []
    executors = {name: (lambda obs, name=name: calls.append(name)) for name in ("a", "b")}
    samples = auto.interleaved_samples(executors, np.zeros(1), rounds=2, block={"a": 2, "b": 3})
    assert calls == ["a"] * 3 + ["b"] * 4 + ["a"] * 3 + ["b"] * 4
    assert [len(samples["a"]), len(samples["b"])] == [4, 6] and min(samples["a"] + samples["b"]) >= 0.0
    assert {k: len(v) for k, v in auto.interleaved_samples(executors, np.zeros(1), 1, 2).items()} == {"a": 2, "b": 2}
