"""summary.json of an ActorQ run, one layout for both runners (`launch.experiments.run_experiment` in one process,
`launch.distributed.supervisor` distributed): outcome, throughput, payload sizes, the actors' runtime breakdown
(`launch.experiments.stages`), energy."""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence, cast

from analysis.execution import run_execution
from analysis.schema import (
    ACTOR_KEYS, LEARNER_KEYS, PAYLOAD_KEYS, PUBLISH_KEYS, RUNNER_FACTS, SUMMARY_KEYS, ActorSection, AtTarget,
    EnergySection, FinalPolicy, LearnerSection, PayloadSection, PublishSection, RuntimeSection, Summary, keyed,
    read_evals, solved_at, sum_energy,
)
from launch.experiments.acting import EvalRow
from launch.experiments.stages import runtime_section
from quarl.ops.io import JSONValue

if TYPE_CHECKING:
    from launch.experiments.config import ExperimentConfig

__all__ = ["FinalPolicy", "Summary", "build_summary", "final_policy_record", "make_summary"]
# What a node or the single-process loop reports of itself, keyed into a summary.json section by `keyed`.
Record = Mapping[str, object]
EvalRecord = EvalRow | Mapping[str, float]  # an evaluator.csv row (`read_evals` reads it back as floats)


def build_summary(config: "ExperimentConfig", *, runner: str, status: str, error: str | None, wall_clock_s: float,
                  run_wall_clock_s: float, counts: Mapping[str, float], evals: Sequence[EvalRecord],
                  final_eval_return: float | None, actors: Sequence[Record], learner: Record, runtime: RuntimeSection,
                  payload: Record, replay: Record, energy: EnergySection,
                  agent_config: Mapping[str, JSONValue] | None = None, num_actors: int = 1,
                  **runner_facts: object) -> Summary:
    """summary.json of either runner (the single-process one is one actor and one learner in one process).

    `config` is the run's `launch.experiments.config.ExperimentConfig` (written whole under "experiment");
    `num_actors` the actors the run had (the distributed runner's configured count);
    `counts` holds actor_steps, learner_steps and episodes; `evals` the evaluator rows (return, actor_steps, wall_clock_s, learner_steps);
    `runner_facts` are among RUNNER_FACTS (None when not given)."""
    unknown = sorted(set(runner_facts) - set(RUNNER_FACTS))
    if unknown:
        raise ValueError(f"not a runner fact of summary.json: {', '.join(unknown)}")
    # The records keyed into their sections: every key of the layout present (None where a runner has none).
    actor_sections = [cast(ActorSection, keyed(a, ACTOR_KEYS)) for a in actors]
    learner_section = cast(LearnerSection, keyed(learner, LEARNER_KEYS))
    learner_section["publish"] = cast(PublishSection, keyed(cast(Record, learner_section["publish"]), PUBLISH_KEYS))
    payload_section = cast(PayloadSection, keyed(payload, PAYLOAD_KEYS))
    returns = [float(r["return"]) for r in evals]
    target = getattr(config, "target_return", None)
    streak = getattr(config, "target_streak", 1)
    hit = solved_at(evals, target, streak)
    first = solved_at(evals, target, 1)  # the first evaluation at or above the target (a streak may need more)
    if final_eval_return is None and returns:
        final_eval_return = returns[-1]
    actor_steps, learner_steps = int(counts.get("actor_steps", 0)), int(counts.get("learner_steps", 0))
    learner_steps_per_s = learner_section["steps_per_s"]
    precision = str(config.precision)  # its name
    summary: dict[str, object] = {
        "status": status,
        "error": error,
        "runner": runner,
        "agent": config.agent,
        "task": config.task,
        "precision": precision,
        "backend": sorted({str(a["backend"]) for a in actor_sections if a["backend"]}) or [config.backend],
        # The actors' integer kernel forms (per-actor self-check details under actors[i].kernel).
        "kernel_form": sorted({str(form) for a in actor_sections if (form := (a["kernel"] or {}).get("form"))}),
        "kernel_fallback": any(bool((a["kernel"] or {}).get("fallback")) for a in actor_sections),
        # What the actors executed, in words ("int8 weights, fp32 compute (dequantized)"), the executor `auto`
        # would name (onnx-dequantized ...) and the CPU class: with the seed, what fixes the run's numerics.
        **run_execution({"precision": precision, "actors": actor_sections}),
        "num_actors": int(num_actors),
        "envs_per_actor": _envs_per_actor(actor_sections, getattr(config, "envs_per_actor", 1)),
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
        "actor_steps_per_s": round(sum(float(a["steps_per_s"] or 0.0) for a in actor_sections), 2),
        "learner_steps_per_s": None if learner_steps_per_s is None else round(float(learner_steps_per_s), 2),
        "weight_updates": int(runtime.get("updates", 0)),
        "weights_version": learner_section["weights_version"],  # the learner step of the last published weights
        "payload": payload_section,
        "payload_bytes": payload_section["bytes"],
        "payload_bytes_fp32": payload_section["fp32_bytes"],
        # Weight payloads actors refused (corrupted, stale, wrong spec/precision) and kept their policy.
        "payloads_rejected": int(sum(int(a["payloads_rejected"] or 0) for a in actor_sections)),
        "runtime": dict(runtime),
        "actors": actor_sections,
        "learner": learner_section,
        "replay": {k: v for k, v in replay.items() if isinstance(v, (int, float, str))},
        "energy": dict(energy),
        "lost_nodes": [], "placement": {}, "lost_hosts": [],
        # Where the learner's JAX ran (launch.program.devices.device_report, read in the learner's process).
        "learner_device": None,
        **{k: runner_facts.get(k) for k in RUNNER_FACTS},
    }
    if summary["policy_file"] is None:
        summary["policy_file"] = learner_section["policy_file"]
    return cast(Summary, {k: summary[k] for k in SUMMARY_KEYS})


def _at_target(row: EvalRecord | None, target: float | None, **extra: int) -> AtTarget | None:
    """summary.json's record of an evaluation at or above the target: its return, its actor and learner steps and
    the run clock at its start (None: no such evaluation)."""
    if row is None:
        return None
    record = {"target_return": target, **extra, "return": row["return"], "actor_steps": int(row["actor_steps"]),
              "learner_steps": _int_or_none(row.get("learner_steps")), "wall_clock_s": row["wall_clock_s"]}
    return cast(AtTarget, record)


def _envs_per_actor(actors: Sequence[ActorSection], asked: int) -> int:
    """The environments each actor stepped, as the actors report it: an on-policy agent's rollouts step its
    config's `num_envs` when --envs-per-actor is 1, so the flag's value alone can be wrong (`asked`: when no
    actor reported, or they differ)."""
    ran = {int(n) for a in actors if (n := a["envs_per_actor"])}
    return ran.pop() if len(ran) == 1 else int(asked)


def _int_or_none(value: float | None) -> int | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


def make_summary(config: "ExperimentConfig", status: str, error: str | None, results: Mapping[str, object],
                 stats: Mapping[str, object], wall_clock_s: float,
                 agent_config: Mapping[str, JSONValue] | None = None, *, num_actors: int) -> Summary:
    """The distributed runner's summary.json, from its nodes' results (`run()`'s records by node name) and the
    services' final stats ({"counts", "weights", "replay"}); `num_actors`: the actors its program had."""
    counts = {k: float(v) for k, v in _record(stats.get("counts")).items() if isinstance(v, (int, float))}
    learner = _record(results.get("learner"))
    final_policy = learner.pop("final_policy", None)  # a summary.json section of its own, as one process writes it
    publish = _record(learner.get("publish"))
    q = {**_record(stats.get("weights")), **publish}
    evaluator = _record(results.get("evaluator"))
    actors = []
    for name in sorted(k for k in results if k.startswith("actor_")):
        r = _record(results[name])
        r.setdefault("actor_id", int(name.split("_")[1]))
        r["starts"] = int(counts.get(f"{name}_starts", 0))
        r["total_steps"] = int(counts.get(f"{name}_steps", 0))
        actors.append(r)
    payload_bytes, fp32_bytes = int(_number(q.get("payload_bytes"))), int(_number(q.get("fp32_payload_bytes")))
    payload = {"precision": str(config.precision), "bytes": payload_bytes, "fp32_bytes": fp32_bytes,
               "compression": round(fp32_bytes / payload_bytes, 3) if payload_bytes else None,
               **{k: v for k, v in q.items() if k not in ("payload_bytes", "fp32_payload_bytes")}}
    runtime = runtime_section([_record(a.get("times")) for a in actors], _number(publish.get("quantize_encode_s")),
                              int(_number(publish.get("versions"))))
    energy = sum_energy({name: r.get("energy") for name, r in results.items() if isinstance(r, Mapping)})
    final = _record(evaluator.get("final")).get("return")
    period = None if agent_config is None else agent_config.get("actor_update_period")
    run_clock = counts.get("wall_clock_s", wall_clock_s)
    return build_summary(
        config, runner="actorq", status=status, error=error, wall_clock_s=wall_clock_s,
        run_wall_clock_s=run_clock, train_clock_s=round(run_clock, 3), counts=counts,
        evals=read_evals(Path(config.logdir) / "evaluator.csv"),
        final_eval_return=float(final) if isinstance(final, (int, float)) else None, actors=actors,
        learner=learner, runtime=runtime, payload=payload, replay=_record(stats.get("replay")), energy=energy,
        agent_config=agent_config, final_policy=final_policy, actor_update_period=period, num_actors=num_actors)


def _record(value: object) -> dict[str, object]:
    """A node's record (a mapping) as a dict of its own; {} for a node that reported nothing (None)."""
    return dict(value) if isinstance(value, Mapping) else {}


def _number(value: object) -> float:
    """A recorded count or duration; 0 where a record has none."""
    return float(value) if isinstance(value, (int, float)) else 0.0


def final_policy_record(version: int, trained_to: int, solved: int | None) -> FinalPolicy:
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
