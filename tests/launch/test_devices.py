"""Where JAX runs in an ActorQ program (`launch.program.devices`): only the learner may see a GPU; the driver never
starts one; the learner's environment follows --learner-device; the auto runtime never picks JAX on a GPU."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from launch.distributed.actorq_graph import build_actorq_program
from launch.distributed.nodes.base import NodeBase
from launch.program import devices
from launch.program.graph import Program
from quarl.ops.checks import ConfigError
from tests.launch.tiny import tiny_config

REPO = Path(__file__).resolve().parents[2]
NON_LEARNERS = ("counter", "replay", "weights", "actor_0", "evaluator")


def test_every_node_but_the_learner_is_cpu_only_and_the_learner_follows_its_device(tmp_path):
    for device, platforms, accelerator in (("cpu", "cpu", "none"), ("auto", "", "auto"),
                                           ("gpu", "cuda,cpu", "required")):
        program = build_actorq_program(tiny_config(tmp_path, num_actors=1, learner_device=device))
        for name in NON_LEARNERS:
            node = program.node(name)
            assert node.env_vars["JAX_PLATFORMS"] == "cpu" and node.env_vars["CUDA_VISIBLE_DEVICES"] == ""
            assert node.accelerator == "none"
        learner = program.node("learner")
        assert learner.env_vars["JAX_PLATFORMS"] == platforms and learner.accelerator == accelerator
        if device == "cpu":
            assert learner.env_vars["CUDA_VISIBLE_DEVICES"] == ""
        else:  # a GPU learner takes what it uses, not 75% of the device; Ray sets its CUDA_VISIBLE_DEVICES
            assert learner.env_vars["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
            assert "CUDA_VISIBLE_DEVICES" not in learner.env_vars


def test_learner_device_is_validated_in_the_config_and_on_the_command_line(tmp_path):
    with pytest.raises(ConfigError, match="learner_device must be one of auto, cpu, gpu"):
        tiny_config(tmp_path, learner_device="tpu")
    assert tiny_config(tmp_path, learner_device="gpu").to_dict()["learner_device"] == "gpu"
    for flags, message in ((["--learner-device", "tpu"], "invalid choice: 'tpu'"),
                           (["--learner-device", "gpu", "--runner", "local"], "needs --runner ray")):
        proc = subprocess.run([sys.executable, "-m", "launch.actorq", *flags, "--logdir", str(tmp_path / "x")],
                              capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "x").exists()


def test_the_driver_pins_jax_to_the_cpu_before_jax_starts():
    """A fresh interpreter: the driver's pin leaves JAX on the CPU even where a shell asked for a GPU."""
    code = ("import os; from launch.program.devices import pin_driver_to_cpu; assert pin_driver_to_cpu(); "
            "import jax; print(jax.default_backend(), os.environ['JAX_PLATFORMS'])")
    env = {**os.environ, "JAX_PLATFORMS": "cuda", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout.split()
    assert out == ["cpu", "cpu"]


def test_auto_never_measures_jax_where_jax_runs_on_a_gpu(monkeypatch):
    from quarl.runtimes import auto

    factories = {"jax": object, "onnx": object}
    monkeypatch.setattr(auto, "jax_platform", lambda: "gpu")
    assert set(auto.cpu_candidates(factories)) == {"onnx"}
    monkeypatch.setattr(auto, "jax_platform", lambda: "cpu")
    assert set(auto.cpu_candidates(factories)) == {"jax", "onnx"}


# ------------------------------------------------------------------------------ nodes as they run on Ray


class EnvProbe(NodeBase):
    """Stands in for every node class: builds nothing, reports where its process's JAX runs."""

    def __init__(self, **_kwargs):
        self._stop = threading.Event()

    def probe(self) -> dict:
        try:
            return self.device_report()
        except Exception as e:  # pylint: disable=broad-except  (a GPU learner on a machine without CUDA)
            return {"env": {k: os.environ.get(k) for k in devices.REPORTED_ENV}, "error": str(e).splitlines()[0]}

    def run(self) -> None:
        self._stop.wait()

    def stop(self, *_args) -> None:
        self._stop.set()


PROBES = types.SimpleNamespace(**{name: EnvProbe for name in (
    "Counter", "ReplayServer", "WeightServer", "LearnerNode", "ActorNode", "Evaluator")})


@pytest.fixture(scope="module")
def gpu_looking_ray():
    """A private Ray that declares two GPUs and whose processes would inherit CUDA_VISIBLE_DEVICES=0,1, as on a
    GPU machine where Ray 2.60 leaves the variable alone for workers that ask for no GPU (ray issue 54868)."""
    from launch.program.ray_runner import init_ray

    saved = dict(os.environ)
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
    os.environ.pop("JAX_PLATFORMS", None)
    init_ray(None, num_cpus=10, num_gpus=2)
    import ray

    yield ray
    ray.shutdown()
    os.environ.clear()
    os.environ.update(saved)


def _program_with_a_learner_per_device(tmp_path: Path) -> Program:
    """The ActorQ graph's nodes as `build_actorq_program` makes them, with one learner per --learner-device
    (learner_cpu, learner_auto, learner_gpu): one launch checks all three environments."""
    program = Program("devices")
    for device in devices.LEARNER_DEVICES:
        built = build_actorq_program(tiny_config(tmp_path, num_actors=1, learner_device=device), PROBES)
        if not program.nodes:
            for name in NON_LEARNERS:
                program.add(dataclasses.replace(built.node(name), kwargs={}))
        program.add(dataclasses.replace(built.node("learner"), name=f"learner_{device}", kwargs={}))
    return program


@pytest.mark.slow  # a Ray program; the graph's placement is checked above
def test_on_ray_only_the_learner_sees_a_gpu_and_its_environment_follows_learner_device(gpu_looking_ray, tmp_path):
    from launch.program.ray_runner import RayRunner

    program = _program_with_a_learner_per_device(tmp_path)
    launch = RayRunner().launch(program)
    try:
        launch.wait_ready(timeout=300)
        futures = {name: launch.handles[name].submit("probe") for name in program.names()}
        reports = {name: f.result(timeout=300) for name, f in futures.items()}
    finally:
        launch.shutdown()
    for name in NON_LEARNERS:
        r = reports[name]
        assert r["env"]["JAX_PLATFORMS"] == "cpu" and r["env"]["CUDA_VISIBLE_DEVICES"] == "", (name, r)
        assert r["jax_backend"] == "cpu" and r["platform"] == "cpu", (name, r)
        assert r["env"]["XLA_PYTHON_CLIENT_PREALLOCATE"] is None
    cpu = reports["learner_cpu"]
    assert cpu["env"]["CUDA_VISIBLE_DEVICES"] == "" and cpu["env"]["JAX_PLATFORMS"] == "cpu"
    assert cpu["platform"] == "cpu" and devices.learner_device_error("cpu", cpu) is None
    for device, platforms in (("auto", ""), ("gpu", "cuda,cpu")):
        r = reports[f"learner_{device}"]
        # Ray gave this learner one of the cluster's GPUs; JAX may use it, and does not preallocate it.
        assert r["env"]["CUDA_VISIBLE_DEVICES"] in ("0", "1") and r["env"]["JAX_PLATFORMS"] == platforms
        assert r["env"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        assert r["platform"] == "cpu"  # no CUDA here: JAX found no GPU behind the id
    assert devices.learner_device_error("auto", reports["learner_auto"]) is None
    # --learner-device gpu on a learner whose JAX found no GPU: the supervisor refuses the run.
    assert "not on a GPU" in devices.learner_device_error("gpu", reports["learner_gpu"])
