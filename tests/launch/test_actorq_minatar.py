"""ActorQ on pixels: the distributed program (threads runner: the same nodes, payloads and stages as on Ray)
with int8 conv actors on MinAtar; the summary reports the static kernel form and both payload sizes."""
from __future__ import annotations

from launch.distributed.supervisor import run_program
from launch.program.local_runner import LocalRunner
from tests.launch.tiny import tiny_config

TINY_MINATAR = {"min_replay_size": 100, "batch_size": 32, "samples_per_insert": 8.0}


def test_actorq_runs_minatar_with_int8_conv_actors(tmp_path):
    config = tiny_config(tmp_path, task="MinAtar/Breakout", overrides=dict(TINY_MINATAR), max_actor_steps=400)
    summary, code = run_program(config, LocalRunner())
    assert code == 0 and summary["status"] == "completed", summary["error"]
    assert summary["actor_steps"] >= 400 and summary["learner_steps"] > 0 and summary["payloads_rejected"] == 0
    for actor in summary["actors"]:
        assert actor["actor_steps"] > 0 and actor["backend"] == "onnx"
        assert actor["kernel"]["form"] in ("u8s8", "u8u8") and actor["kernel"]["checks"][-1]["ok"]
    payload = summary["payload"]
    # int8 codes (1 byte a weight) against fp32 (4): the MinAtar net's weights are ~135k of its ~530k bytes.
    assert payload["precision"] == "int8" and payload["fp32_bytes"] > 3.5 * payload["bytes"] > 0
    assert summary["payload_bytes"] == payload["bytes"] and summary["payload_bytes_fp32"] == payload["fp32_bytes"]
