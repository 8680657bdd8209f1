"""The DeepMind Control Suite, imported with rendering off."""
from __future__ import annotations

import os
from types import ModuleType


def suite() -> ModuleType:
    """Import dm_control's suite lazily, with rendering disabled unless the user chose a GL backend.

    No rendering is needed, and EGL/GLFW are unavailable on these machines: without MUJOCO_GL dm_control
    probes GLFW and warns about a missing display on every import.
    """
    os.environ.setdefault("MUJOCO_GL", "disable")
    from dm_control import suite  # pylint: disable=import-outside-toplevel

    return suite

