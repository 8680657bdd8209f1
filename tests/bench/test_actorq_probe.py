"""bench.system.actorq's weight-update probe (bench.system.actorq_probe) times an update through the actors' own client
(`PolicyClient.fetch`); its report (bench.system.actorq_report) names each precision."""
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
    from bench.system import actorq_probe as actorq
    from launch.experiments.agent_spec import AgentSpec
    from launch.distributed.nodes.services import WeightServer
    from launch.distributed.nodes.shared_blob import Blob
    from quarl.quant.payload import encode_payload
    from quarl.quant.quantization import quantize_params
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


def test_throughput_steps_every_precision_on_its_auto_backend(monkeypatch, tmp_path):
    """Part 1's probe runs fp32, int8 and int4 actors (each built by the update path on backend="auto",
    fp32 included: the fastest fp32 executor auto measures) on the same recorded env state sequence."""
    import agents
    from bench.system import actorq_probe as actorq
    from launch.experiments.agent_spec import AgentSpec
    from launch.distributed.nodes.services import WeightServer
    from launch.distributed.nodes.shared_blob import Blob
    from quarl.quant.payload import encode_payload
    from quarl.quant.quantization import quantize_params
    from quarl.runtimes import auto

    monkeypatch.setenv(auto.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(actorq, "PAPER_POLICY", (16,))
    builder = agents.get_builder("d4pg", policy_layer_sizes=(16,))
    env_spec = AgentSpec("d4pg", actorq.TASK, {"policy_layer_sizes": (16,)}).env_spec()
    params = builder.make_learner(env_spec, 0).policy_params()
    servers = {p: WeightServer(p) for p in actorq.PRECISIONS}
    probe = actorq.ActorProbe({p: LocalHandle(s) for p, s in servers.items()})
    for p, server in servers.items():
        server.publish(1, Blob.put(encode_payload(quantize_params(params, p), version=1,
                                                  spec_hash=builder.policy_spec(env_spec).digest())))
        assert probe.update_cost(p)["backend"]
    rows = probe.throughput(list(actorq.PRECISIONS), steps=20, chunk=10)
    assert set(rows) == {"fp32", "int8", "int4"}
    assert all(r["steps_per_s"] > 0 and r["env_us"] > 0 and r["policy_us"] > 0 for r in rows.values())
    # the same recorded actions drove every precision's environment into the same state
    states = {p: probe._timesteps[p].observation for p in rows}
    assert all((states[p] == states["fp32"]).all() for p in rows)
    # auto's choice per precision, with every candidate it timed (the chosen one among them)
    choices = probe.auto_choices()
    assert set(choices) == set(actorq.PRECISIONS)
    for p, choice in choices.items():
        timed = choice["us_per_call"]
        assert len(timed) >= 2 and timed[choice["backend"]] == min(timed.values())
        assert choice["backend"].startswith(probe._actors[p].backend)  # "onnx-dequantized" runs on onnx


def _block(fp32_policy: float, policy: dict[str, float], env_us: float = 200.0) -> dict[str, dict[str, float]]:
    out = {"fp32": {"policy_us": fp32_policy, "env_us": env_us}}
    out.update({p: {"policy_us": us, "env_us": env_us} for p, us in policy.items()})
    for row in out.values():
        row["steps_per_s"] = 1e6 / (row["policy_us"] + row["env_us"])
    return out


def test_ratios_table_and_target_verdict_name_each_precision(tmp_path):
    """Each precision's ratio vs fp32 is the median over rounds; the table has a column per precision and the
    verdict says which precision meets the 4x target on the CPU class given."""
    from bench.system import actorq_probe, actorq_report

    rounds = [_block(1800, {"int8": 800, "int4": 300}), _block(1800, {"int8": 600, "int4": 200}),
              _block(1800, {"int8": 300, "int4": 100})]
    blocks = {p: [r[p] for r in rounds] for p in actorq_probe.PRECISIONS}
    ratios = actorq_probe.throughput_ratios(blocks)
    assert ratios["throughput_ratio_vs_fp32"]["int8"] == pytest.approx(2000 / 800)  # the middle round
    assert ratios["throughput_ratio_vs_fp32"]["int4"] == pytest.approx(2000 / 400)
    assert ratios["throughput_ratio_env_matched_vs_fp32"]["int4"] == pytest.approx(5.0)  # same env time here
    update = {p: {"pull_ms": 1.0, "deserialize_ms": 1.0, "load_ms": 1.0, "total_ms": t, "payload_bytes": b,
                  "quantize_ms_per_version": 1.0, "backend": be}
              for p, t, b, be in (("fp32", 30.0, 400, "onnx"), ("int8", 10.0, 100, "onnx"),
                                  ("int4", 6.0, 50, "onnx-nbits"))}
    a = {"throughput": {p: blocks[p][1] for p in blocks}, "update": update, "env_implementation": "envpool",
         "update_ratio_fp32_vs": {"int8": 3.0, "int4": 5.0}, "payload_ratio_fp32_vs": {"int8": 4.0, "int4": 8.0},
         **ratios}
    table = actorq_report.actor_table(a)
    assert table[0] == "| | fp32 | int8 | int4 | int8 vs fp32 | int4 vs fp32 | target |"
    assert all(line.count("|") == table[0].count("|") for line in table)  # every row has every column
    assert "| backend (auto) | onnx | onnx | onnx-nbits |" in table[-1]
    a["auto"] = {"fp32": {"backend": "jax", "us_per_call": {"onnx": 3100.0, "jax": 2500.4}},
                 "int8": {"backend": "onnx", "us_per_call": {"onnx": 550.0, "jax": 4000.0, "onnx-dequantized": 3000.0}}}
    with_auto = actorq_report.actor_table(a)
    assert with_auto[-1].startswith("| auto's candidates, us/call at batch 1 | **jax 2500**, onnx 3100 | "
                                    "**onnx 550**, onnx-dequantized 3000, jax 4000 |  |")
    assert with_auto[-1].count("|") == table[0].count("|")
    verdict = "\n".join(actorq_report.target_lines(a, "x86-vnni"))
    assert "int8: **2.50x** fp32 env steps/s, misses" in verdict
    assert "int4: **5.00x** fp32 env steps/s, meets the >= 4x target on this CPU (x86-vnni)" in verdict
    text = actorq_report.markdown({"actor": a, "cpu_flags": ["x86-vnni", "avx2"],
                            "machine": {"cpu": "Xeon", "cores": 2, "load_start": [0.1], "load_end": [0.2]}})
    assert table[0] in text and "meets the >= 4x target on this CPU (x86-vnni, avx2)" in text
    actorq_report.plot({"actor": a}, tmp_path / "actorq.png")  # one bar per precision in both panels
    assert (tmp_path / "actorq.png").stat().st_size > 0
