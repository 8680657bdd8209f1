"""quarl.ops.affinity: actors claim distinct cores, a claim pins only the claiming thread (and what it starts), and a
claim ends with its process."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from quarl.ops import affinity

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")


def _claim_in_thread(lock_dir, out: list) -> None:
    def work() -> None:
        core = affinity.claim_core(lock_dir)
        child: list = []
        t = threading.Thread(target=lambda: child.append(os.sched_getaffinity(0)))
        t.start()
        t.join()
        out.append((core, os.sched_getaffinity(0), child[0]))
    t = threading.Thread(target=work)
    t.start()
    t.join()


def test_claims_are_distinct_cores_and_pin_only_the_claiming_threads(tmp_path):
    allowed = os.sched_getaffinity(0)
    held = list(affinity._held)
    try:
        claims: list = []
        for _ in range(len(allowed) + 1):
            _claim_in_thread(tmp_path, claims)
        cores = [c for c, _, _ in claims]
        assert sorted(cores[:-1]) == sorted(allowed) and cores[-1] is None  # all taken: the last one is unpinned
        assert cores[0] == max(allowed)  # highest first: CPU 0 carries the system's interrupts
        for core, mask, child_mask in claims[:-1]:
            assert mask == child_mask == {core}  # threads started after the claim inherit the pin
        assert claims[-1][1] == allowed
        assert os.sched_getaffinity(0) == allowed  # the test's own thread was never pinned
    finally:
        for fd in affinity._held[len(held):]:
            os.close(fd)
        del affinity._held[len(held):]


def test_a_claim_ends_with_its_process(tmp_path):
    code = ("import sys; from quarl.ops import affinity; "
            f"print(affinity.claim_core({str(tmp_path)!r}))")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert first.stdout.strip() == again.stdout.strip() == str(max(os.sched_getaffinity(0)))


def test_pinning_to_a_cpu_this_thread_may_not_use_is_refused():
    out: list = []
    t = threading.Thread(target=lambda: out.append(pytest.raises(ValueError, affinity.pin_thread, 10_000)))
    t.start()
    t.join()
    assert "is not one this thread may run on" in str(out[0].value)
