"""The GPU machine's install: the carry pack holds what that machine lacks (and nothing it has), at the 3.12
lock's versions; setup.py admits Python 3.12 with jax 0.11; and (slow) a Python 3.12 venv holding only the
machine's packages, plus the pack, runs a tiny end to end (`bench/gpu/smoke.sh`)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIPPED = 77  # smoke.sh's exit code for "cannot run here" (no Python 3.12, no package index)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        name, _, version = line.strip().partition("==")
        if name and not name.startswith("#"):
            out[_norm(name)] = version
    return out


def _pack_lists() -> tuple[list[str], list[str]]:
    text = (REPO / "bench/gpu/pack.sh").read_text()
    wheels = re.search(r'^WHEELS="([^"]*)"', text, re.M).group(1).split()
    trimmed = re.search(r'^TRIMMED="([^"]*)"', text, re.M).group(1).split()
    return wheels, trimmed


def test_the_pack_carries_only_what_the_gpu_machine_lacks_at_the_312_lock_versions():
    lock, machine = _names(REPO / "requirements-py312.lock"), _names(REPO / "bench/gpu/machine-packages.txt")
    lock.update(_names(REPO / "requirements-nodeps.lock"))  # gymnax: installed --no-deps (launch.anakin)
    wheels, trimmed = _pack_lists()
    assert "gymnax" in {_norm(n) for n in wheels}
    for name in wheels + trimmed:
        assert _norm(name) in lock, f"{name} is not pinned in requirements-py312.lock or requirements-nodeps.lock"
        assert _norm(name) not in machine, f"{name} is on the GPU machine already"
    assert {"ray", "mujoco", "dm-control"} <= {_norm(n) for n in trimmed}
    assert {"dm-haiku", "rlax", "distrax", "aqtp", "tensorboardx", "jsonschema"} <= {_norm(n) for n in wheels}
    assert machine["jax"] == lock["jax"] == "0.11.2" and "envpool" not in lock


def test_setup_admits_python_312_with_jax_011_and_311_with_jax_010():
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    text = (REPO / "setup.py").read_text()
    assert {"3.11", "3.12"} <= {v for v in ("3.10", "3.11", "3.12", "3.13")
                                if v in SpecifierSet(re.search(r'python_requires="([^"]+)"', text).group(1))}
    reqs = [Requirement(r) for r in re.findall(r'"([^"]+)"', text[text.index("install_requires"):
                                                                  text.index("extras_require")])]
    for python, jax in (("3.11", "0.10.2"), ("3.12", "0.11.2")):
        pins = {str(r.specifier) for r in reqs if r.name in ("jax", "jaxlib")
                and (r.marker is None or r.marker.evaluate({"python_version": python}))}
        assert pins == {f"=={jax}"}, (python, pins)
    lock311 = _names(REPO / "requirements.lock")
    assert lock311["jax"] == "0.10.2"


@pytest.mark.slow
def test_python_312_machine_venv_with_the_pack_runs_a_tiny_end_to_end(tmp_path):
    proc = subprocess.run(["bash", "bench/gpu/smoke.sh", str(tmp_path / "out")], cwd=REPO, capture_output=True,
                          text=True, timeout=3600, check=False)
    if proc.returncode == SKIPPED:
        pytest.skip(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "smoke.sh: passed: Python 3.12" in proc.stdout
    assert (tmp_path / "out" / "e2e.md").exists()
