"""Shared fixtures for the launch tests."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def ray_session():
    """One private local Ray per test module (started as the runner starts it); the environment is restored."""
    from launch.program.ray_runner import init_ray  # pylint: disable=import-outside-toplevel

    saved = dict(os.environ)
    init_ray(None, num_cpus=8)
    import ray  # pylint: disable=import-outside-toplevel

    yield ray
    ray.shutdown()
    os.environ.clear()
    os.environ.update(saved)
