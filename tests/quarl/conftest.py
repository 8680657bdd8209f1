"""Fixtures of the emulated-CPU tests: each skips where its emulator cannot run, and fails instead in CI
(`tests.quarl.helpers.skip_or_fail`). Session-scoped: the probe (a private mount for Arm) runs once, and so does
each CPU model's emulated interpreter (`tests.quarl.emulated.driver_results`, cached)."""
from __future__ import annotations

import pytest

from bench.harness.emulation import arm_unavailable, x86_unavailable
from tests.quarl.emulated import driver_results
from tests.quarl.helpers import skip_or_fail


@pytest.fixture(scope="session")
def x86_emulation() -> None:
    """Another x86 CPU under qemu-x86_64 (`bench.harness.emulation.run_under_x86`)."""
    skip_or_fail(x86_unavailable())


@pytest.fixture(scope="session")
def arm_emulation() -> None:
    """An Arm CPU under qemu-aarch64 with the Arm sysroot (`bench.harness.emulation.run_under_arm`)."""
    skip_or_fail(arm_unavailable())


@pytest.fixture(scope="session")
def haswell_run(x86_emulation) -> dict:  # pylint: disable=redefined-outer-name,unused-argument
    """The emulated driver's results on Haswell (AVX2, no VNNI), shared by the AVX2 tests of several modules."""
    return driver_results("Haswell")


@pytest.fixture
def arm_run(arm_emulation, cpu: str) -> dict:  # pylint: disable=redefined-outer-name,unused-argument
    """The emulated driver's results on the Arm model `cpu` (the test's parameter): one launch per model."""
    return driver_results(cpu)
