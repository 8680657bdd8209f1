"""Rewrites summary.json files of the single-process runner's earlier layout into the one layout both runners
write now (`analysis.schema.SUMMARY_KEYS`), so `analysis.runs` reads one schema.

    python -m analysis.upgrade_summaries DIR

Every summary.json under DIR in the old layout (no "runner" key, a flat "runtime" section) is rewritten in place;
summaries in the new layout that predate the execution record (`executed`, `executor`, `cpu_class`) get it
(`fill_execution`), others are left alone, and anything else is reported and left alone. Where the actors' kernel
form was not recorded it is marked "unknown" for integer precisions (it cannot be known afterwards: `auto` may have
picked the integer graph or the dequantized fp32 one); float precisions have no kernel form ([]). Values are
carried over, renamed where the old layout named them otherwise (inference_s -> policy_s, adder_insert_s ->
insert_s, table -> replay, env_steps_per_s -> actor_steps_per_s); the old "pull_s" was the learner's quantize +
encode, so it becomes quantize_encode_s. Nothing is invented: a field the old layout lacks is None, except
what holds for every single-process run by construction (status "completed": the old runner wrote a summary
only when it finished; one actor; no lost nodes).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping

from analysis.execution import UNKNOWN, run_execution
from analysis.schema import ACTOR_KEYS, LEARNER_KEYS, PAYLOAD_KEYS, PUBLISH_KEYS, SUMMARY_KEYS
from quarl.ops.io import write_json_atomic
from quarl.quant.precision import is_int_name


def is_old_single_process(summary: Mapping[str, Any]) -> bool:
    """The single-process runner's earlier layout: no runner, no status, a flat runtime dict."""
    runtime = summary.get("runtime")
    return ("runner" not in summary and "status" not in summary and isinstance(runtime, Mapping)
            and "summed_s" not in runtime)


def _div(a: Any, b: Any, scale: float) -> float | None:
    return None if a is None or not b else scale * float(a) / float(b)


def upgrade(old: Mapping[str, Any]) -> dict[str, Any]:
    """One old single-process summary in the new layout (see the module docstring)."""
    if not is_old_single_process(old):
        raise ValueError("not a summary.json of the earlier single-process layout")
    rt = dict(old["runtime"])
    g = rt.get
    renamed = "quantize_encode_s" in rt  # pull_s is a real pull once quantize_encode_s has its own key
    qe_s, pull_s = (g("quantize_encode_s"), g("pull_s")) if renamed else (g("pull_s"), None)
    qe_ms = g("quantize_encode_ms_per_update") if renamed else g("pull_ms_per_update")
    summed = {"env_step_s": g("env_step_s"), "policy_s": g("policy_s", g("inference_s")),
              "insert_s": g("insert_s", g("adder_insert_s")), "pull_s": pull_s,
              "deserialize_s": g("deserialize_s"), "load_s": g("load_s"), "quantize_encode_s": qe_s}
    updates = g("updates", old.get("weight_updates"))
    per_update = {"quantize_encode_ms": qe_ms, "pull_ms": g("pull_ms_per_update") if renamed else None,
                  "deserialize_ms": g("deserialize_ms_per_update"), "load_ms": g("load_ms_per_update"),
                  "update_ms": None}
    per_step = {"env_step_us": g("env_step_us_per_step"), "policy_us": g("policy_us_per_step",
                                                                          g("inference_us_per_step")),
                "insert_us": None}
    runtime = {"summed_s": summed, "env_steps": g("env_steps", old.get("actor_steps")), "pulls": None,
               "updates": updates, "versions": updates, "per_update": per_update, "per_step": per_step}
    kernel = old.get("kernel")
    table = old.get("table") or {}
    times = {**summed, "env_steps": runtime["env_steps"], "pulls": None,
             "updates": updates, "payload_bytes": None,
             **{f"{k[:-3]}_ms_per_update": v for k, v in per_update.items() if k != "update_ms"},
             "update_ms": None, **{f"{k[:-3]}_us_per_step": v for k, v in per_step.items()}}
    actor = {k: None for k in ACTOR_KEYS}
    actor.update(actor_id=0, attempt=1, starts=1, actor_steps=old.get("actor_steps"),
                 total_steps=old.get("actor_steps"), episodes=old.get("episodes"),
                 envs_per_actor=old.get("envs_per_actor"), steps_per_s=old.get("env_steps_per_s"),
                 backend=old.get("backend"), kernel=kernel, weights_version=old.get("weights_version"),
                 transitions_inserted=table.get("inserts"), build_s=g("actor_build_s"), times=times)
    publish = {k: None for k in PUBLISH_KEYS}
    publish.update(versions=updates, quantize_encode_s=qe_s, payload_bytes=old.get("payload_bytes"),
                   quantize_encode_ms_per_version=qe_ms)
    learner = {k: None for k in LEARNER_KEYS}
    learner.update(learner_steps=old.get("learner_steps"), steps_this_run=old.get("learner_steps"),
                   step_s=g("learner_s"), step_s_mean=_div(g("learner_s"), g("learner_steps"), 1.0),
                   sample_wait_s=g("sample_s"), weights_version=old.get("weights_version"),
                   policy_file=old.get("policy_file"), publish=publish)
    payload = {k: None for k in PAYLOAD_KEYS}
    payload.update(precision=old.get("precision"), bytes=old.get("payload_bytes"),
                   fp32_bytes=old.get("payload_bytes_fp32"), compression=old.get("payload_compression"),
                   versions=updates, quantize_encode_s=qe_s, quantize_encode_ms_per_version=qe_ms)
    new = {k: None for k in SUMMARY_KEYS}
    new.update({k: old[k] for k in SUMMARY_KEYS if k in old and k not in ("runtime", "energy", "backend")})
    new.update(
        status="completed", runner="single", num_actors=1,
        backend=None if old.get("backend") is None else [old["backend"]],
        kernel_form=None if "kernel" not in old else ([kernel["form"]] if kernel else []),
        kernel_fallback=None if "kernel" not in old else bool((kernel or {}).get("fallback")),
        run_wall_clock_s=old.get("wall_clock_s"),  # one process: the run's clock is the wall clock
        evaluation_s=g("evaluation_s"), actor_steps_per_s=old.get("env_steps_per_s"), payload=payload,
        payloads_rejected=None, runtime=runtime, actors=[actor], learner=learner, replay=table,
        energy=_energy(old.get("energy")), lost_nodes=[], placement={}, lost_hosts=[])
    return fill_execution(new)


def needs_execution(summary: Mapping[str, Any]) -> bool:
    """A summary of the current layout written before runs recorded what their actors executed."""
    return "runner" in summary and any(summary.get(k) is None for k in ("executed", "executor")) \
        or "runner" in summary and summary.get("kernel_form") is None


def fill_execution(summary: Mapping[str, Any]) -> dict[str, Any]:
    """`summary` with kernel_form, executed, executor and cpu_class filled where they were not recorded: what
    the actors' records tell, "unknown" for an integer run's kernel form they do not tell; in SUMMARY_KEYS order."""
    out = dict(summary)
    if out.get("kernel_form") is None:
        forms = sorted({str(a["kernel"]["form"]) for a in out.get("actors") or []
                        if isinstance(a, Mapping) and isinstance(a.get("kernel"), Mapping)
                        and a["kernel"].get("form")})
        is_int = is_int_name(out.get("precision"))
        out["kernel_form"] = forms or ([UNKNOWN] if is_int else [])
    out.update(run_execution(out))
    return {**{k: out.get(k) for k in SUMMARY_KEYS}, **{k: v for k, v in out.items() if k not in SUMMARY_KEYS}}


def _energy(report: Any) -> dict[str, Any]:
    """The run's one energy report as `analysis.schema.sum_energy` lays out nodes and totals."""
    if not isinstance(report, Mapping):
        return {"nodes": {}, "total_kwh": None, "total_emissions_kg": None, "untracked_nodes": ["run"],
                "method": "unavailable: no energy tracker reported"}
    return {"nodes": {str(report.get("name", "run")): dict(report)}, "total_kwh": report.get("energy_kwh"),
            "total_emissions_kg": report.get("emissions_kg_co2eq"), "measured_kwh": report.get("measured_kwh"),
            "modelled_kwh": report.get("modelled_kwh"), "ram_model_share": report.get("ram_model_share"),
            "package_kwh": report.get("package_kwh"), "untracked_nodes": [], "method": report.get("method")}


def upgrade_tree(root: Path) -> dict[str, list[Path]]:
    """Upgrades every old summary.json under `root`; returns the paths upgraded, already new, and skipped."""
    done: dict[str, list[Path]] = {"upgraded": [], "filled": [], "current": [], "skipped": []}
    for path in sorted(root.rglob("summary.json")):
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            done["skipped"].append(path)
            continue
        if isinstance(summary, dict) and is_old_single_process(summary):
            write_json_atomic(path, upgrade(summary))
            done["upgraded"].append(path)
        elif isinstance(summary, dict) and needs_execution(summary):
            write_json_atomic(path, fill_execution(summary))
            done["filled"].append(path)
        elif isinstance(summary, dict) and "runner" in summary:
            done["current"].append(path)
        else:
            done["skipped"].append(path)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="analysis.upgrade_summaries", description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", help="folder searched for summary.json files (recursively)")
    args = parser.parse_args(argv)
    root = Path(args.dir)
    if not root.is_dir():
        print(f"analysis.upgrade_summaries: error: {args.dir!r} is not a folder", file=sys.stderr)
        return 2
    done = upgrade_tree(root)
    for path in done["skipped"]:
        print(f"skipped (unreadable or not the earlier single-process layout): {path}", file=sys.stderr)
    print(f"{len(done['upgraded'])} upgraded, {len(done['filled'])} given their execution record, "
          f"{len(done['current'])} already current, "
          f"{len(done['skipped'])} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
