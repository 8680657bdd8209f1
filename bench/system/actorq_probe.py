"""Parts 1 and 2 of bench.system.actorq, the actor's side: an `ActorProbe` in a Ray actor placed like an ActorQ actor
(one core, one compute thread) times env steps per second with fp32, int8 and int4 policies taking turns, and one
weight update (pull, deserialize, load) through the actors' own client; `bench_actor` drives it against the real
WeightServer nodes, this process playing the learner. Also the benchmark's settings (`Budget`, the task, the
paper's policy, the precisions and the one-actor target), which its runs and its report share.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Any

import numpy as np

from bench.harness.machine import measuring_actor_env, pin_to_one_core
from quarl.envs.vector import env_implementation

TASK = "cartpole:balance"
PAPER_POLICY = (2048, 2048, 2048)
CHUNK = 50  # env steps per turn when the precisions' actors alternate
PRECISIONS = ("fp32", "int8", "int4")  # fp32 first: the baseline every ratio divides by
TARGET_RATIO = 4.0  # issue 9: one actor, 2048x3, K=1, env steps/s vs fp32


@dataclasses.dataclass(frozen=True)
class Budget:
    block_steps: int  # env steps per precision per throughput round
    rounds: int
    update_rounds: int
    e2e_target: float
    e2e_max_steps: int


FULL = Budget(block_steps=500, rounds=8, update_rounds=8, e2e_target=800.0, e2e_max_steps=60_000)
QUICK = Budget(block_steps=200, rounds=3, update_rounds=3, e2e_target=500.0, e2e_max_steps=30_000)


# --------------------------------------------------------------------------------------------- probe


class ActorProbe:
    """Runs inside a Ray actor placed like an ActorQ actor (num_cpus=1, one compute thread)."""

    def __init__(self, servers: dict[str, Any], seed: int = 0, pin: bool = False):
        # pin: confine this actor (its runtimes' threads and envpool's worker included) to one core, as the
        # benchmark's "one actor at the limit of one core" requires; before anything starts a thread.
        self.core = pin_to_one_core() if pin else None
        import agents  # pylint: disable=import-outside-toplevel
        from launch.experiments.agent_spec import AgentSpec  # pylint: disable=import-outside-toplevel

        self._spec = AgentSpec("d4pg", TASK, {"policy_layer_sizes": PAPER_POLICY})
        self._builder = agents.get_builder("d4pg", policy_layer_sizes=PAPER_POLICY)
        self._env_spec = self._spec.env_spec()
        self._servers = servers  # precision -> RayNodeHandle of a WeightServer node
        self._seed = seed
        self._actors: dict[str, Any] = {}
        self._clients: dict[str, Any] = {}
        self._envs: dict[str, Any] = {}
        self._timesteps: dict[str, Any] = {}

    def _client(self, precision: str) -> Any:
        from launch.experiments.stages import StageTimes  # pylint: disable=import-outside-toplevel
        from launch.distributed.nodes.weights_client import PolicyClient  # pylint: disable=import-outside-toplevel

        if precision not in self._clients:
            self._clients[precision] = PolicyClient(self._servers[precision], StageTimes())
        return self._clients[precision]

    def update_cost(self, precision: str) -> dict[str, float]:
        """One weight update as an actor does it (`PolicyClient.fetch`: pull -> deserialize -> load, timed
        by the client itself). Seconds per stage."""
        client = self._client(precision)
        before = dataclasses.replace(client.times)

        def apply(payload: Any) -> None:
            actor = self._actors.get(precision)
            if actor is None:
                self._actors[precision] = self._builder.make_actor(self._env_spec, payload.params, seed=self._seed,
                                                                   backend="auto")
            else:
                actor.update(payload.params)

        if client.fetch(apply=apply) is None:
            raise RuntimeError(f"no new {precision} weights to pull ({client.last_rejection or 'none published'})")
        after = client.times
        return {"pull_s": after.pull_s - before.pull_s, "deserialize_s": after.deserialize_s - before.deserialize_s,
                "load_s": after.load_s - before.load_s, "bytes": after.payload_bytes - before.payload_bytes,
                "backend": self._actors[precision].backend}

    def throughput(self, precisions: list[str], steps: int, chunk: int) -> dict[str, dict[str, float]]:
        """`steps` env steps per precision, the precisions taking turns every `chunk` steps (so a burst of
        load from other processes hits both alike); env and policy time accumulated separately.

        Both precisions step the same environment state sequence: their environments (the ones a real actor
        runs, `quarl.envs.vector`) are seeded alike and take the same recorded random actions, while each
        policy runs on every observation. So env time differs only by noise, and precision alone moves the
        policy time."""
        from quarl.envs.vector import make_vector_environment  # pylint: disable=import-outside-toplevel

        if not self._envs:
            self._envs = {p: make_vector_environment(TASK, self._seed, 1) for p in precisions}
            self._timesteps = {p: self._envs[p].reset()[0] for p in precisions}
            self._rng = np.random.default_rng(self._seed)
        env_s = dict.fromkeys(precisions, 0.0)
        policy_s = dict.fromkeys(precisions, 0.0)
        for k in range(max(1, steps // chunk)):
            actions = self._rng.uniform(-1.0, 1.0, (chunk, self._env_spec.action_dim)).astype(np.float32)
            for precision in (precisions if k % 2 == 0 else precisions[::-1]):
                actor, env = self._actors[precision], self._envs[precision]
                timestep = self._timesteps[precision]
                for action in actions:
                    t0 = time.perf_counter()
                    actor.act(np.asarray(timestep.observation)[None])
                    t1 = time.perf_counter()
                    timestep = env.step([action])[0]
                    if timestep.last():
                        timestep = env.reset_one(0)
                    t2 = time.perf_counter()
                    policy_s[precision] += t1 - t0
                    env_s[precision] += t2 - t1
                self._timesteps[precision] = timestep
        n = max(1, steps // chunk) * chunk
        return {p: {"steps_per_s": n / (env_s[p] + policy_s[p]), "env_us": 1e6 * env_s[p] / n,
                    "policy_us": 1e6 * policy_s[p] / n} for p in precisions}

    def auto_choices(self) -> dict[str, dict[str, Any]]:
        """What `backend="auto"` measured for each precision's actor in this process: the backend it chose and
        every candidate's microseconds per call (so a reader sees the fp32 baseline was the fastest fp32)."""
        from quarl.runtimes import auto_decisions  # pylint: disable=import-outside-toplevel
        from quarl.runtimes.auto import parse_decision_key  # pylint: disable=import-outside-toplevel

        out = {}
        for key, entry in auto_decisions().items():
            precision = parse_decision_key(key)["precision"]
            if precision in self._actors:
                out[precision] = {"backend": entry["backend"], "us_per_call": entry.get("us_per_call"),
                                  "source": entry.get("source")}
        return out

    def threads(self) -> dict[str, Any]:
        return {**{k: os.environ.get(k, "") for k in ("OMP_NUM_THREADS", "XLA_FLAGS")}, "pinned_core": self.core,
                "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}


def median(values: list[float]) -> float:
    """The median as a plain float (what the result JSON records)."""
    return float(statistics.median(values))


def bench_actor(budget: Budget, seed: int) -> dict[str, Any]:
    """Parts 1 and 2 (throughput and update cost), with the real WeightServer nodes on Ray; this process
    plays the learner (quantize + encode + put once per version)."""
    import ray  # pylint: disable=import-outside-toplevel

    import agents  # pylint: disable=import-outside-toplevel
    from launch.distributed.nodes.services import WeightServer  # pylint: disable=import-outside-toplevel
    from launch.distributed.nodes.shared_blob import Blob  # pylint: disable=import-outside-toplevel
    from quarl.quant.payload import encode_payload  # pylint: disable=import-outside-toplevel
    from quarl.quant.quantization import quantize_params  # pylint: disable=import-outside-toplevel
    from launch.experiments.agent_spec import AgentSpec  # pylint: disable=import-outside-toplevel
    from launch.program.ray_runner import RayNodeHandle  # pylint: disable=import-outside-toplevel

    spec = AgentSpec("d4pg", TASK, {"policy_layer_sizes": PAPER_POLICY})
    builder = agents.get_builder("d4pg", policy_layer_sizes=PAPER_POLICY)
    env_spec = spec.env_spec()
    spec_hash = builder.policy_spec(env_spec).digest()
    learner = builder.make_learner(env_spec, seed)
    params = learner.policy_params()
    namespace = f"bench-actorq-{os.getpid()}"
    precisions = list(PRECISIONS)
    servers = {}
    for p in precisions:
        servers[p] = ray.remote(WeightServer).options(name=f"weights_{p}", namespace=namespace,
                                                      max_concurrency=4).remote(p)
    handles = {p: RayNodeHandle(f"weights_{p}", namespace) for p in precisions}
    quantize_s: dict[str, list[float]] = {p: [] for p in precisions}
    with measuring_actor_env("quarl-bench-auto-") as env_vars:  # removed when the actors are gone
        probe = ray.remote(ActorProbe).options(num_cpus=1, runtime_env={"env_vars": env_vars}).remote(
            handles, seed, pin=True)
        try:
            rng = np.random.default_rng(seed)
            updates: dict[str, list[dict[str, float]]] = {p: [] for p in precisions}
            for r in range(budget.update_rounds + 1):  # round 0 builds the executors (not a refresh): dropped
                version = r + 1
                noisy = _perturb(params, rng)
                for p in precisions:  # the learner's side: quantize + encode once, put once, publish the reference
                    t0 = time.perf_counter()
                    data = encode_payload(quantize_params(noisy, p), version=version, spec_hash=spec_hash)
                    quantize_s[p].append(time.perf_counter() - t0)
                    ray.get(servers[p].publish.remote(version, Blob.put(data)))
                for p in (precisions if r % 2 == 0 else precisions[::-1]):
                    cost = ray.get(probe.update_cost.remote(p))
                    if r > 0:
                        updates[p].append(cost)
            blocks: dict[str, list[dict[str, float]]] = {p: [] for p in precisions}
            ray.get(probe.throughput.remote(precisions, 2 * CHUNK, CHUNK))  # warm-up (first-call costs)
            for _ in range(budget.rounds):
                for p, row in ray.get(probe.throughput.remote(precisions, budget.block_steps, CHUNK)).items():
                    blocks[p].append(row)
            threads = ray.get(probe.threads.remote())
            auto_choices = ray.get(probe.auto_choices.remote())
        finally:
            for actor in (probe, *servers.values()):
                ray.kill(actor)
    throughput = {p: {k: median([b[k] for b in blocks[p]]) for k in ("steps_per_s", "env_us", "policy_us")}
                  for p in precisions}
    ratios = throughput_ratios(blocks)
    update = {}
    for p in precisions:
        rows = updates[p]
        stage = {k: 1e3 * median([u[k] for u in rows]) for k in ("pull_s", "deserialize_s", "load_s")}
        stage = {k.replace("_s", "_ms"): v for k, v in stage.items()}
        stage["total_ms"] = 1e3 * median([u["pull_s"] + u["deserialize_s"] + u["load_s"] for u in rows])
        stage["payload_bytes"] = rows[0]["bytes"]
        stage["backend"] = rows[0]["backend"]
        stage["quantize_ms_per_version"] = 1e3 * median(quantize_s[p])
        update[p] = stage
    return {
        "policy": list(PAPER_POLICY),
        "threads": threads,
        "auto": auto_choices,
        "throughput": throughput,
        "throughput_blocks": blocks,
        **ratios,
        # int8's, under the names earlier results used
        "throughput_ratio_int8_vs_fp32": ratios["throughput_ratio_vs_fp32"]["int8"],
        "throughput_round_ratios": ratios["throughput_round_ratios_vs_fp32"]["int8"],
        "throughput_ratio_env_matched": ratios["throughput_ratio_env_matched_vs_fp32"]["int8"],
        "env_implementation": env_implementation(TASK),
        "update": update,
        "update_ratio_fp32_vs": {p: update["fp32"]["total_ms"] / update[p]["total_ms"] for p in precisions[1:]},
        "payload_ratio_fp32_vs": {p: update["fp32"]["payload_bytes"] / update[p]["payload_bytes"]
                                  for p in precisions[1:]},
        "update_ratio_fp32_vs_int8": update["fp32"]["total_ms"] / update["int8"]["total_ms"],
        "payload_ratio_fp32_vs_int8": update["fp32"]["payload_bytes"] / update["int8"]["payload_bytes"],
    }


def throughput_ratios(blocks: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """Each non-fp32 precision vs fp32 from the per-round rows of `ActorProbe.throughput`: the median of each
    round's steps/s ratio (rounds compare time-matched measurements; the median resists load bursts), and the
    same with both charged the pair's mean env time (same env states: only the policy moves that ratio)."""
    base = blocks["fp32"]
    rounds, matched = {}, {}
    for p, rows in blocks.items():
        if p == "fp32":
            continue
        rounds[p] = [x["steps_per_s"] / f["steps_per_s"] for x, f in zip(rows, base)]
        matched[p] = [(0.5 * (x["env_us"] + f["env_us"]) + f["policy_us"])
                      / (0.5 * (x["env_us"] + f["env_us"]) + x["policy_us"]) for x, f in zip(rows, base)]
    return {"throughput_ratio_vs_fp32": {p: median(r) for p, r in rounds.items()},
            "throughput_round_ratios_vs_fp32": rounds,
            "throughput_ratio_env_matched_vs_fp32": {p: median(r) for p, r in matched.items()}}


def _perturb(params: dict, rng: np.random.Generator) -> dict:
    """A new weights version (a small step of every leaf), so each round really transfers new weights."""
    if isinstance(params, dict):
        return {k: _perturb(v, rng) for k, v in params.items()}
    arr = np.asarray(params, np.float32)
    return (arr + rng.normal(0.0, 1e-3, arr.shape).astype(np.float32)).astype(np.float32)
