"""bench.actorq's weight-update probe times an update through the actors' own client (`PolicyClient.fetch`)."""
from __future__ import annotations

from typing import Any

import pytest


class LocalHandle:
    """A WeightServer called in this process, the way a node handle calls it."""

    def __init__(self, server: Any):
        self.server = server

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.server, method)(*args)


def test_update_cost_reports_each_stage_of_one_fetch(monkeypatch, tmp_path):
    import agents
    from bench import actorq
    from launch.agent_spec import AgentSpec
    from launch.services import WeightServer
    from launch.shared_blob import Blob
    from quarl.payload import encode_payload
    from quarl.quantization import quantize_params
    from quarl.runtimes import auto

    monkeypatch.setenv(auto.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(actorq, "PAPER_POLICY", (16,))
    builder = agents.get_builder("d4pg", policy_layer_sizes=(16,))
    env_spec = AgentSpec("d4pg", actorq.TASK, {"policy_layer_sizes": (16,)}).env_spec()
    params = builder.make_learner(env_spec, 0).policy_params()
    server = WeightServer("int8")
    probe = actorq.ActorProbe({"int8": LocalHandle(server)})

    with pytest.raises(RuntimeError, match="no new int8 weights"):
        probe.update_cost("int8")
    sizes = []
    for version in (1, 2):  # the first builds the actor, the second refreshes it
        data = encode_payload(quantize_params(params, "int8"), version=version,
                              spec_hash=builder.policy_spec(env_spec).digest())
        sizes.append(len(data))
        server.publish(version, Blob.put(data))
        cost = probe.update_cost("int8")
        assert cost["bytes"] == len(data)  # this update's bytes, not the running total
        assert all(cost[k] >= 0.0 for k in ("pull_s", "deserialize_s", "load_s"))
        assert cost["backend"]
    client = probe._client("int8")
    assert client.version == 2 and client.times.updates == 2 and client.times.payload_bytes == sum(sizes)
