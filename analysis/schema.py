"""The one summary.json layout, which both runners write (`launch.experiments.summary`) and every reader of run
folders reads (`analysis.runs`, `analysis.upgrade_summaries`, the notebooks): its keys, the energy section's layout,
and the evaluation record (`evaluator.csv` rows, the rule for when a run is solved). It lives here, below `launch`,
so analysis reads runs without importing the code that made them.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from quarl.ops.carbon import EnergyReport, combine


def sum_energy(parts: Mapping[str, Any]) -> dict[str, Any]:
    """Per-node energy reports (quarl.ops.carbon) and their totals via `quarl.ops.carbon.combine` (attributed parts
    add up; a RAPL package reading is counted once per host, never per node). Totals are None when nothing was
    measured; emissions are None when any node's grid intensity was unavailable."""
    nodes = {k: dict(v) for k, v in parts.items() if isinstance(v, Mapping)}
    reports = []
    for value in nodes.values():
        try:
            reports.append(EnergyReport.from_dict(value))
        except TypeError:  # a node report without the fields of an EnergyReport: not summed
            continue
    untracked = sorted(k for k, v in parts.items() if not isinstance(v, Mapping))
    if not reports:
        return {"nodes": nodes, "total_kwh": None, "total_emissions_kg": None, "untracked_nodes": untracked,
                "method": "unavailable: no energy tracker reported"}
    total = combine(reports)
    methods = sorted({r.method for r in reports})
    return {"nodes": nodes, "total_kwh": total.energy_kwh, "total_emissions_kg": total.emissions_kg_co2eq,
            "measured_kwh": total.measured_kwh, "modelled_kwh": total.modelled_kwh,
            "ram_model_share": total.ram_model_share, "package_kwh": total.package_kwh,
            "untracked_nodes": untracked, "method": "; ".join(methods)}


# The one summary.json layout (both runners): top-level keys, and the keys of each actors[] entry, of the learner
# section and of the payload section. A key a runner has no value for is present with None (see
# docs/ARCHITECTURE.md, "summary.json"); `runtime` is `launch.experiments.stages.runtime_section`.
# The clocks (seconds), one meaning each in both runners: wall_clock_s, the launcher's around the whole run
# (start-up and shutdown included); run_wall_clock_s, the run's own from its start to its stop (evaluator.csv's
# wall_clock_s, and that of first_at_target and solved, is on it); train_clock_s, the run clock less the time
# training stood still for evaluations. first_at_target: the first evaluation at or above target_return; solved:
# the one that ended the first streak of target_streak such evaluations (time_to_target_s and
# actor_steps_to_target are solved's).
SUMMARY_KEYS = (
    "status", "error", "runner", "agent", "task", "precision", "backend", "kernel_form", "kernel_fallback",
    "executed", "executor", "cpu_class", "num_actors", "envs_per_actor", "seed", "experiment", "config", "logdir",
    "final_eval_return", "final_eval_return_fp32", "best_eval_return", "evaluations", "eval_episodes", "target_return",
    "time_to_target_s", "actor_steps_to_target", "first_at_target", "solved", "wall_clock_s", "run_wall_clock_s",
    "train_clock_s", "evaluation_s", "sync_learner", "actor_steps", "learner_steps", "episodes", "actor_steps_per_s",
    "learner_steps_per_s", "actor_update_period", "weight_updates", "weights_version", "payload", "payload_bytes",
    "payload_bytes_fp32", "payloads_rejected", "runtime", "actors", "learner", "replay", "energy", "policy_file",
    "best_policy_file", "final_policy", "lost_nodes", "placement", "lost_hosts", "learner_device")


ACTOR_KEYS = ("actor_id", "attempt", "starts", "actor_steps", "total_steps", "episodes", "envs_per_actor",
              "pinned_core", "elapsed_s", "steps_per_s", "backend", "kernel", "weights_version",
              "first_weights_version", "transitions_inserted", "payloads_rejected", "last_payload_rejection",
              "build_s", "times", "learner_wait_s", "energy")
# learner_wait_s: seconds an on-policy actor stood still for its learner (distributed: the long poll for the
# weights after a rollout, and waiting for room in its outbox; one process: the updates it waited through), kept
# out of `times`' stages; None for a replay actor, whose wait is the rate limiter's (replay.insert_blocked_s).


LEARNER_KEYS = ("learner_steps", "steps_this_run", "training_s", "steps_per_s", "step_s", "step_s_mean",
                "sample_wait_s", "weights_version", "resumed_from", "policy_file", "publish", "energy", "steps_per_call",
                "publish_handoff", "loop_form")


# ready_wait_*: the distributed learner's publisher thread waiting for the offered params to be computed, kept out
# of quantize_encode_* (None in one process: no publisher thread there).
PUBLISH_KEYS = ("versions", "quantize_encode_s", "put_s", "payload_bytes", "quantize_encode_ms_per_version",
                "put_ms_per_version", "ready_wait_s", "ready_wait_ms_per_version")


PAYLOAD_KEYS = ("precision", "bytes", "fp32_bytes", "compression", "versions", "published", "requests",
                "payloads_served", "not_modified", "quantize_encode_s", "put_s", "quantize_encode_ms_per_version",
                "put_ms_per_version", "ready_wait_s", "ready_wait_ms_per_version")


# Facts each runner passes itself (None where it has none): the single-process loop's switches, and the clocks
# the runners measure differently (train_clock_s: the run clock less the time training stood still for
# evaluations; the distributed evaluator runs beside training, so there it is the run clock).
RUNNER_FACTS = ("train_clock_s", "evaluation_s", "sync_learner", "final_eval_return_fp32", "actor_update_period",
                "policy_file", "best_policy_file", "final_policy")
# best_policy_file: policy_best_<precision>.qrlp (one process). final_policy: which weights version policy_file and
# the final evaluation are ({"weights_version", "learner_steps", "why"}): a distributed run its evaluations solved
# ends on the solving version, though its learner trained on while the stop went round.


def keyed(entry: Mapping[str, Any] | None, keys: Sequence[str]) -> dict[str, Any]:
    """`entry` with every key of `keys` (None where absent) first, then whatever else it holds."""
    entry = dict(entry or {})
    return {**{k: entry.pop(k, None) for k in keys}, **entry}


def solved_at(evals: Sequence[Mapping[str, Any]], target: float | None, streak: int = 1) -> Mapping[str, Any] | None:
    """The evaluation that solved the run: the first that ends `streak` evaluations in a row whose mean return
    is at or above `target` (None: not solved, or no target). One rule for stopping and for summary.json."""
    if target is None:
        return None
    run = 0
    for row in evals:
        run = run + 1 if row["return"] >= target else 0
        if run >= max(1, int(streak)):
            return row
    return None


def read_evals(path: Path) -> list[dict[str, float]]:
    """evaluator.csv rows (actor_steps, wall_clock_s, return, and learner_steps: NaN where absent) with finite
    values, in file order."""
    if not path.exists():
        return []
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            try:
                parsed = {k: float(row[k]) for k in ("actor_steps", "wall_clock_s", "return")}
            except (KeyError, ValueError):
                continue
            if all(math.isfinite(v) for v in parsed.values()):
                try:
                    parsed["learner_steps"] = float(row.get("learner_steps") or "nan")
                except ValueError:
                    parsed["learner_steps"] = math.nan
                out.append(parsed)
    return out

