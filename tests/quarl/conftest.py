"""Fixtures of the emulated-CPU tests: each skips where its emulator cannot run, and fails instead in CI
(`tests.quarl.helpers.skip_or_fail`). Session-scoped: the probe (a private mount for Arm) runs once."""
from __future__ import annotations

import pytest

from bench.harness.emulation import arm_unavailable, x86_unavailable
from tests.quarl.helpers import skip_or_fail


@pytest.fixture(scope="session")
def x86_emulation() -> None:
    """Another x86 CPU under qemu-x86_64 (`bench.harness.emulation.run_under_x86`)."""
    skip_or_fail(x86_unavailable())


@pytest.fixture(scope="session")
def arm_emulation() -> None:
    """An Arm CPU under qemu-aarch64 with the Arm sysroot (`bench.harness.emulation.run_under_arm`)."""
    skip_or_fail(arm_unavailable())
