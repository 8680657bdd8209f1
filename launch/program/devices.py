"""Where JAX runs in an ActorQ program: the learner on `--learner-device`, every other process on the CPU.

Why each process is told explicitly: on a GPU machine every JAX process that is not told otherwise starts CUDA
and, by default, preallocates 75% of the GPU's memory. Ray 2.60 no longer hides the GPU from workers that ask
for 0 GPUs (ray issue 54868: it leaves CUDA_VISIBLE_DEVICES alone), so actors, the evaluator and the services
carry `CPU_ONLY_ENV` (JAX on its CPU backend, CUDA hidden); the driver pins its own JAX to the CPU
(`pin_driver_to_cpu`) without hiding the GPU from the Ray it starts (Ray counts GPUs through it). The
learner gets `learner_env(device)`: on `cpu` the same CPU-only environment, otherwise JAX's platforms named
explicitly (a JAX_PLATFORMS=cpu inherited from a shell or a driver must not reach it) and no preallocation.
What the learner really runs on is read back from its process (`device_report`) and written to summary.json.
Plain data and lazy imports: the CLIs import this before JAX.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping, TypedDict

LEARNER_DEVICES = ("auto", "cpu", "gpu")
# Every process except the learner: JAX on its CPU backend, and no CUDA device visible to any library.
CPU_ONLY_ENV: dict[str, str] = {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
# A GPU learner allocates what it uses instead of 75% of the device at start.
NO_PREALLOCATE_ENV: dict[str, str] = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
# JAX's platform list per device: "" lets JAX choose (a GPU when one is visible, else the CPU); "cuda,cpu"
# fails loudly when CUDA is there but cannot start (with no NVIDIA GPU visible at all JAX skips it: the
# supervisor then refuses the run, `learner_device_error`, rather than train on the CPU unnoticed).
_PLATFORMS = {"auto": "", "gpu": "cuda,cpu"}
# What a node reports of its environment (tests and summary.json).
REPORTED_ENV = ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_PREALLOCATE",
                "XLA_PYTHON_CLIENT_MEM_FRACTION")
# A Node's GPU request (launch.program.graph.Node.accelerator): never, one when the cluster has one, or one always.
ACCELERATOR_BY_DEVICE = {"cpu": "none", "auto": "auto", "gpu": "required"}


def check_learner_device(device: object) -> str:
    """`device` if it is one of LEARNER_DEVICES, else ValueError (one line)."""
    if device not in LEARNER_DEVICES:
        raise ValueError(f"{device!r} is not a learner device; valid: {', '.join(LEARNER_DEVICES)}")
    return str(device)


def learner_env(device: str) -> dict[str, str]:
    """The learner process's environment for `device` (see the module docstring)."""
    if check_learner_device(device) == "cpu":
        return dict(CPU_ONLY_ENV)
    return {"JAX_PLATFORMS": _PLATFORMS[device], **NO_PREALLOCATE_ENV}


def cpu_only(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` plus CPU_ONLY_ENV: the environment of a node that must never touch the GPU."""
    return {**dict(env or {}), **CPU_ONLY_ENV}


def pin_driver_to_cpu() -> bool:
    """Keep this process's JAX on the CPU (a driver: it only builds specs and reads results).

    Before JAX is imported, through the environment (JAX reads JAX_PLATFORMS at import; importing it here
    would cost a CLI its fast failure on a bad flag). A local Ray started later inherits the variable, which
    is harmless: every node of a program names its own platforms. After the import, through `jax.config`.
    False, with nothing changed, when JAX's backends were initialised already (too late: the caller chose)."""
    if "jax" not in sys.modules:
        os.environ["JAX_PLATFORMS"] = "cpu"
        return True
    import jax  # pylint: disable=import-outside-toplevel
    from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel

    if xla_bridge.backends_are_initialized():
        return False
    jax.config.update("jax_platforms", "cpu")
    return True


def use_learner_device(device: str) -> None:
    """A single-process run (learner and actor in this process): `cpu` pins JAX to the CPU, `gpu` requires
    JAX's default device to be a GPU, `auto` leaves JAX's own choice. RuntimeError (one line) when it cannot."""
    import jax  # pylint: disable=import-outside-toplevel

    if check_learner_device(device) == "cpu":
        if not pin_driver_to_cpu() and jax.default_backend() != "cpu":
            raise RuntimeError("--learner-device cpu: JAX already runs on "
                               f"{jax.default_backend()!r} in this process")
    elif device == "gpu" and jax.default_backend() != "gpu":
        raise RuntimeError(f"--learner-device gpu: JAX sees no GPU here (its backend is {jax.default_backend()!r})")


class DeviceReport(TypedDict):
    """Where a process's JAX runs (summary.json's `learner_device`)."""

    platform: str | None
    device_kind: str | None
    device_count: int
    jax_backend: str
    jax: str
    pid: int
    env: dict[str, str | None]  # REPORTED_ENV, None where unset


def device_report() -> DeviceReport:
    """Where JAX runs in this process, as the process sees it: platform, device kind and count, and the
    environment variables that decide it (REPORTED_ENV; None where unset)."""
    import jax  # pylint: disable=import-outside-toplevel

    devices = jax.devices()
    return {"platform": devices[0].platform if devices else None,
            "device_kind": devices[0].device_kind if devices else None,
            "device_count": len(devices), "jax_backend": jax.default_backend(), "jax": jax.__version__,
            "pid": os.getpid(), "env": {k: os.environ.get(k) for k in REPORTED_ENV}}


def learner_device_error(wanted: str, report: Mapping[str, object]) -> str | None:
    """Why the learner's `report` does not honour `--learner-device wanted` (None when it does)."""
    platform = report.get("platform")
    if wanted == "gpu" and platform != "gpu":
        return f"--learner-device gpu: the learner's JAX runs on {platform!r}, not on a GPU"
    if wanted == "cpu" and platform != "cpu":
        return f"--learner-device cpu: the learner's JAX runs on {platform!r}"
    return None


__all__ = ["ACCELERATOR_BY_DEVICE", "CPU_ONLY_ENV", "DeviceReport", "LEARNER_DEVICES", "NO_PREALLOCATE_ENV",
           "REPORTED_ENV", "check_learner_device", "cpu_only", "device_report", "learner_device_error",
           "learner_env", "pin_driver_to_cpu", "use_learner_device"]
