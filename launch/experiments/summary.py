"""summary.json of an ActorQ run, one layout for both runners (`launch.experiments.run_experiment` in one process,
`launch.distributed.supervisor` distributed): outcome, throughput, payload sizes, the actors' runtime breakdown
(`launch.experiments.stages`), energy."""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence, TypeAlias

from analysis.execution import run_execution
from analysis.schema import (
    ACTOR_KEYS, LEARNER_KEYS, PAYLOAD_KEYS, PUBLISH_KEYS, RUNNER_FACTS, SUMMARY_KEYS, keyed, read_evals, solved_at,
    sum_energy,
)
from launch.experiments.stages import runtime_section
from quarl.ops.io import JSONValue

if TYPE_CHECKING:
    from launch.experiments.config import ExperimentConfig

# summary.json as a record: its keys are `analysis.schema.SUMMARY_KEYS`, its values plain JSON.
Summary: TypeAlias = dict[str, JSONValue]


def build_summary(config: "ExperimentConfig", *, runner: str, status: str, error: str | None, wall_clock_s: float,
                  run_wall_clock_s: float, counts: Mapping[str, JSONValue], evals: Sequence[Mapping[str, JSONValue]],
                  final_eval_return: float | None, actors: Sequence[Mapping[str, JSONValue]],
                  learner: Mapping[str, JSONValue], runtime: Mapping[str, JSONValue], payload: Mapping[str, JSONValue],
                  replay: Mapping[str, JSONValue], energy: Mapping[str, JSONValue],
                  agent_config: Mapping[str, JSONValue] | None = None,
                  **runner_facts: JSONValue) -> Summary:
    """summary.json of either runner (the single-process one is one actor and one learner in one process).

    `config` is the run's `launch.experiments.config.ExperimentConfig` (written whole under "experiment");
    `counts` holds actor_steps, learner_steps and episodes; `evals` the evaluator rows (return, actor_steps, wall_clock_s, learner_steps);
    `runner_facts` are among RUNNER_FACTS (None when not given)."""
    unknown = sorted(set(runner_facts) - set(RUNNER_FACTS))
    if unknown:
        raise ValueError(f"not a runner fact of summary.json: {', '.join(unknown)}")
    actors = [keyed(a, ACTOR_KEYS) for a in actors]
    learner = keyed(learner, LEARNER_KEYS)
    learner["publish"] = keyed(learner["publish"], PUBLISH_KEYS)
    payload = keyed(payload, PAYLOAD_KEYS)
    returns = [float(r["return"]) for r in evals]
    target = getattr(config, "target_return", None)
    streak = getattr(config, "target_streak", 1)
    hit = solved_at(evals, target, streak)
    first = solved_at(evals, target, 1)  # the first evaluation at or above the target (a streak may need more)
    if final_eval_return is None and returns:
        final_eval_return = returns[-1]
    actor_steps, learner_steps = int(counts.get("actor_steps", 0)), int(counts.get("learner_steps", 0))
    learner_steps_per_s = learner.get("steps_per_s")
    summary = {
        "status": status,
        "error": error,
        "runner": runner,
        "agent": config.agent,
        "task": config.task,
        "precision": config.precision.name,
        "backend": sorted({str(a["backend"]) for a in actors if a.get("backend")}) or [config.backend],
        # The actors' integer kernel forms (per-actor self-check details under actors[i].kernel).
        "kernel_form": sorted({str(a["kernel"]["form"]) for a in actors if (a.get("kernel") or {}).get("form")}),
        "kernel_fallback": any(bool((a.get("kernel") or {}).get("fallback")) for a in actors),
        # What the actors executed, in words ("int8 weights, fp32 compute (dequantized)"), the executor `auto`
        # would name (onnx-dequantized ...) and the CPU class: with the seed, what fixes the run's numerics.
        **run_execution({"precision": config.precision.name, "actors": actors}),
        "num_actors": 1 if runner == "single" else config.distributed.num_actors,  # ExperimentConfig.distributed
        "envs_per_actor": _envs_per_actor(actors, getattr(config, "envs_per_actor", 1)),
        "seed": config.seed,
        "experiment": config.to_dict(),
        "config": None if agent_config is None else dict(agent_config),  # the agent's config, every field
        "logdir": str(Path(config.logdir).absolute()),
        "final_eval_return": final_eval_return,
        "best_eval_return": max(returns) if returns else None,
        "evaluations": len(returns),
        "eval_episodes": getattr(config, "eval_episodes", None),
        "target_return": target,
        "time_to_target_s": None if hit is None else hit["wall_clock_s"],
        "actor_steps_to_target": None if hit is None else int(hit["actor_steps"]),
        # The first evaluation at or above the target, and the stable solve: the evaluation that ended the first
        # streak of `target_streak` of them (the same one when the streak is 1; None: none reached it). Their
        # wall_clock_s is the run clock (run_wall_clock_s), evaluator.csv's.
        "first_at_target": _at_target(first, target),
        "solved": None if hit is None else _at_target(hit, target, streak=streak),
        # The clocks (analysis.schema): the launcher's around the whole run, start-up and shutdown included; the
        # run's own from its start (one process: its first env step; distributed: the counter node's start) to
        # its stop, evaluator.csv's clock.
        "wall_clock_s": round(wall_clock_s, 3),
        "run_wall_clock_s": round(run_wall_clock_s, 3),
        "actor_steps": actor_steps,
        "learner_steps": learner_steps,
        "episodes": int(counts.get("episodes", 0)),
        # All actors together, each over its own acting loop (start-up and resumed time excluded).
        "actor_steps_per_s": round(sum(float(a.get("steps_per_s") or 0.0) for a in actors), 2),
        "learner_steps_per_s": None if learner_steps_per_s is None else round(float(learner_steps_per_s), 2),
        "weight_updates": int(runtime.get("updates", 0)),
        "weights_version": learner.get("weights_version"),  # the learner step of the last published weights
        "payload": payload,
        "payload_bytes": payload["bytes"],
        "payload_bytes_fp32": payload["fp32_bytes"],
        # Weight payloads actors refused (corrupted, stale, wrong spec/precision) and kept their policy.
        "payloads_rejected": int(sum(int(a.get("payloads_rejected") or 0) for a in actors)),
        "runtime": dict(runtime),
        "actors": actors,
        "learner": learner,
        "replay": {k: v for k, v in replay.items() if isinstance(v, (int, float, str))},
        "energy": dict(energy),
        "lost_nodes": [], "placement": {}, "lost_hosts": [],
        # Where the learner's JAX ran (launch.program.devices.device_report, read in the learner's process).
        "learner_device": None,
        **{k: runner_facts.get(k) for k in RUNNER_FACTS},
    }
    if summary["policy_file"] is None:
        summary["policy_file"] = learner.get("policy_file")
    return {k: summary[k] for k in SUMMARY_KEYS}


def _at_target(row: Mapping[str, JSONValue] | None, target: float | None, **extra: int) -> dict[str, JSONValue] | None:
    """summary.json's record of an evaluation at or above the target: its return, its actor and learner steps and
    the run clock at its start (None: no such evaluation)."""
    if row is None:
        return None
    return {"target_return": target, **extra, "return": row["return"], "actor_steps": int(row["actor_steps"]),
            "learner_steps": _int_or_none(row.get("learner_steps")), "wall_clock_s": row["wall_clock_s"]}


def _envs_per_actor(actors: Sequence[Mapping[str, JSONValue]], asked: int) -> int:
    """The environments each actor stepped, as the actors report it: an on-policy agent's rollouts step its
    config's `num_envs` when --envs-per-actor is 1, so the flag's value alone can be wrong (`asked`: when no
    actor reported, or they differ)."""
    ran = {int(a["envs_per_actor"]) for a in actors if a.get("envs_per_actor")}
    return ran.pop() if len(ran) == 1 else int(asked)


def _int_or_none(value: float | None) -> int | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


def make_summary(config: "ExperimentConfig", status: str, error: str | None, results: Mapping[str, JSONValue],
                 stats: Mapping[str, JSONValue], wall_clock_s: float,
                 agent_config: Mapping[str, JSONValue] | None = None) -> Summary:
    """The distributed runner's summary.json, from its nodes' results and the services' final stats."""
    counts = stats.get("counts") or {}
    learner = results.get("learner", {}) or {}
    learner = dict(learner) if isinstance(learner, Mapping) else {}
    final_policy = learner.pop("final_policy", None)  # a summary.json section of its own, as one process writes it
    publish = learner.get("publish") or {}
    q = {**(stats.get("weights") or {}), **publish}
    evaluator = results.get("evaluator", {}) or {}
    actors = []
    for name in sorted(k for k in results if k.startswith("actor_")):
        r = dict(results[name] or {})
        r.setdefault("actor_id", int(name.split("_")[1]))
        r["starts"] = int(counts.get(f"{name}_starts", 0))
        r["total_steps"] = int(counts.get(f"{name}_steps", 0))
        actors.append(r)
    payload_bytes, fp32_bytes = int(q.get("payload_bytes", 0)), int(q.get("fp32_payload_bytes", 0))
    payload = {"precision": config.precision.name, "bytes": payload_bytes, "fp32_bytes": fp32_bytes,
               "compression": round(fp32_bytes / payload_bytes, 3) if payload_bytes else None,
               **{k: v for k, v in q.items() if k not in ("payload_bytes", "fp32_payload_bytes")}}
    runtime = runtime_section([a.get("times") or {} for a in actors],
                              float(publish.get("quantize_encode_s", 0.0)), int(publish.get("versions", 0)))
    energy = sum_energy({name: (r or {}).get("energy") for name, r in results.items() if isinstance(r, Mapping)})
    final = (evaluator.get("final") or {}).get("return") if isinstance(evaluator, Mapping) else None
    run_clock = float(counts.get("wall_clock_s", wall_clock_s))
    return build_summary(
        config, runner="actorq", status=status, error=error, wall_clock_s=wall_clock_s,
        run_wall_clock_s=run_clock, train_clock_s=round(run_clock, 3), counts=counts,
        evals=read_evals(Path(config.logdir) / "evaluator.csv"), final_eval_return=final, actors=actors,
        learner=learner, runtime=runtime, payload=payload, replay=stats.get("replay") or {}, energy=energy,
        agent_config=agent_config, final_policy=final_policy,
        actor_update_period=None if agent_config is None else agent_config.get("actor_update_period"))


def final_policy_record(version: int, trained_to: int, solved: int | None) -> dict[str, object]:
    """summary.json's `final_policy` (both runners): the weights version the policy file and the final evaluation
    are, and why. `solved`: the version whose evaluations solved a distributed run (None: not stopped by solving; one
    process stops right after the evaluation that solved it, so its newest weights are the evaluated ones)."""
    if solved is not None and version == solved:
        why = f"the version whose evaluations solved the run (the learner had trained to step {trained_to})"
    elif solved is not None:
        why = f"the learner's newest weights (the solving version {solved} was no longer held)"
    else:
        why = "the learner's newest weights"
    return {"weights_version": int(version), "learner_steps": int(trained_to), "why": why}
