"""summary.json of an ActorQ run: outcome, throughput, payload sizes, the actors' runtime breakdown, energy."""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from quarl.carbon import EnergyReport, combine


def sum_energy(parts: Mapping[str, Any]) -> dict[str, Any]:
    """Per-node energy reports (quarl.carbon) and their totals via `quarl.carbon.combine` (attributed parts
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


def make_summary(config: Any, status: str, error: str | None, results: Mapping[str, Any],
                 stats: Mapping[str, Any], wall_clock_s: float) -> dict[str, Any]:
    """summary.json: outcome, throughput, payload sizes, per-actor runtime breakdown, energy."""
    counts = stats.get("counts", {})
    q = {**stats.get("weights", {}), **((results.get("learner") or {}).get("publish") or {})}
    learner = results.get("learner", {}) or {}
    evaluator = results.get("evaluator", {}) or {}
    actor_results = [results[k] for k in sorted(results) if k.startswith("actor_")]
    actors = []
    for name in sorted(k for k in results if k.startswith("actor_")):
        r = dict(results[name] or {})
        r.setdefault("actor_id", int(name.split("_")[1]))
        r["starts"] = int(counts.get(f"{name}_starts", 0))
        r["total_steps"] = int(counts.get(f"{name}_steps", 0))
        actors.append(r)
    eval_rows = read_evals(Path(config.logdir) / "evaluator.csv")
    evals = [r["return"] for r in eval_rows]
    target = getattr(config, "target_return", None)
    hit = solved_at(eval_rows, target, getattr(config, "target_streak", 1))
    final = (evaluator.get("final") or {}).get("return") if isinstance(evaluator, Mapping) else None
    if final is None and evals:
        final = evals[-1]
    run_s = float(counts.get("wall_clock_s", wall_clock_s))
    actor_steps = int(counts.get("actor_steps", 0))
    learner_steps = int(counts.get("learner_steps", 0))
    payload_bytes, fp32_bytes = int(q.get("payload_bytes", 0)), int(q.get("fp32_payload_bytes", 0))
    breakdown = _breakdown([a.get("times", {}) for a in actor_results if isinstance(a, Mapping)])
    # The learner's side of each weight update, under the same stage name the single-process runner uses.
    publish = (learner.get("publish") or {}) if isinstance(learner, Mapping) else {}
    breakdown["summed_s"]["quantize_encode_s"] = float(publish.get("quantize_encode_s", 0.0))
    energy = sum_energy({name: (r or {}).get("energy") for name, r in results.items() if isinstance(r, Mapping)})
    return {
        "status": status,
        "error": error,
        "agent": config.agent,
        "task": config.task,
        "precision": config.precision,
        "backend": sorted({str(a.get("backend")) for a in actors if a.get("backend")}) or [config.backend],
        # The actors' integer kernel forms (per-actor self-check details under actors[i].kernel).
        "kernel_form": sorted({str(a["kernel"]["form"]) for a in actors if (a.get("kernel") or {}).get("form")}),
        "kernel_fallback": any(bool((a.get("kernel") or {}).get("fallback")) for a in actors),
        "num_actors": config.num_actors,
        "seed": config.seed,
        "experiment": config.to_dict(),  # the whole ExperimentConfig, as the single-process runner writes it
        "logdir": str(Path(config.logdir).absolute()),
        "final_eval_return": final,
        "best_eval_return": max(evals) if evals else None,
        "evaluations": len(evals),
        "target_return": target,
        "time_to_target_s": None if hit is None else hit["wall_clock_s"],
        "actor_steps_to_target": None if hit is None else int(hit["actor_steps"]),
        # When the run was solved: the evaluation that ended the first streak of `target_streak` evaluations at
        # or above the target (None: not solved).
        "solved": None if hit is None else {"target_return": target, "streak": getattr(config, "target_streak", 1),
                                            "return": hit["return"],
                                            "actor_steps": int(hit["actor_steps"]),
                                            "learner_steps": None if math.isnan(hit["learner_steps"])
                                            else int(hit["learner_steps"]),
                                            "wall_clock_s": hit["wall_clock_s"]},
        "wall_clock_s": round(wall_clock_s, 3),
        "run_wall_clock_s": round(run_s, 3),
        "actor_steps": actor_steps,
        "learner_steps": learner_steps,
        "episodes": int(counts.get("episodes", 0)),
        # All actors together, each over its own acting loop (start-up and resumed time excluded).
        "actor_steps_per_s": round(sum(float(a.get("steps_per_s", 0.0)) for a in actors), 2),
        "learner_steps_per_s": round(learner.get("steps_per_s", 0.0), 2) if isinstance(learner, Mapping) else None,
        "payload": {"precision": config.precision, "bytes": payload_bytes, "fp32_bytes": fp32_bytes,
                    "compression": round(fp32_bytes / payload_bytes, 3) if payload_bytes else None,
                    **{k: v for k, v in q.items() if k not in ("payload_bytes", "fp32_payload_bytes")}},
        "payload_bytes": payload_bytes,
        "payload_bytes_fp32": fp32_bytes,
        "runtime": breakdown,
        # Weight payloads actors refused (corrupted, stale, wrong spec/precision) and kept their policy.
        "payloads_rejected": int(sum(int(a.get("payloads_rejected") or 0) for a in actors)),
        "actors": actors,
        "learner": learner,
        "replay": {k: v for k, v in stats.get("replay", {}).items() if isinstance(v, (int, float, str))},
        "energy": energy,
    }


def _breakdown(times: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The paper's runtime breakdown over all actors: seconds summed, and per weight update."""
    keys = ("env_step_s", "policy_s", "pull_s", "deserialize_s", "load_s", "insert_s")
    total = {k: float(sum(t.get(k, 0.0) for t in times)) for k in keys}
    updates = int(sum(t.get("updates", 0) for t in times))
    pulls = int(sum(t.get("pulls", 0) for t in times))
    per_update = {f"{k[:-2]}_ms": (1e3 * total[k] / updates if updates else None)
                  for k in ("pull_s", "deserialize_s", "load_s")}
    per_update["update_ms"] = (sum(v for v in per_update.values() if v is not None) if updates else None)
    return {"summed_s": total, "updates": updates, "pulls": pulls, "per_update": per_update}


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
