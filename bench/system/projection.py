"""The paper's scale on paper: a projection from this repository's measured parts (no new measurement).

    python -m bench.system.projection [--results results/bench] [--out results/bench/projection.md]

On 2 shared cores the learner sets the pace of every run, so the paper's regime (one fast learner fed by many
actors on their own cores) cannot be run here. This script derives what that regime gives from committed
measurements only, and shows the arithmetic:

- learner SGD steps/s `L` (results/bench/learner_throughput.json, `learner.step` mode: what a run executes;
  its device is the one recorded there, CPU unless a GPU run was committed);
- one actor's env steps/s on one core, `A_p`, per precision p: measured directly for the 2048x3 policy
  (results/bench/actorq.json, one actor on cartpole:balance), and for other sizes derived as
  1e6 / (env step us + policy call us) from the same actor run's env step time and the `auto` runtime's
  batch-1 policy call (results/bench/inference.json);
- the learner consumes batch / samples_per_insert env steps per SGD step (256 / 32 = 8), so
  `cores to saturate = L * 8 / A_p`, and with the paper's 4 actors the run collects
  `min(4 * A_p, L * 8)` env steps/s (the rate limiter holds the faster side back);
- the end-to-end ratio int8 / fp32 is the ratio of those rates (wall clock to a fixed number of env steps),
  to set beside the paper's 1.5-5.41x (time to target return, which also needs equal sample efficiency, as
  results/bench/learning_d4pg.md found within seed noise).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from bench.harness.results_io import write_text
from quarl.ops.machine import machine_fields

REPO = Path(__file__).resolve().parents[2]
BATCH, SAMPLES_PER_INSERT, PAPER_ACTORS = 256, 32.0, 4
PAPER_RANGE = (1.5, 5.41)
PRECISIONS = ("fp32", "int8", "int4")
INPUTS = ("learner_throughput.json", "actorq.json", "inference.json")
GPU_LEARNER = "gpu/learner_throughput.json"  # bench/gpu/run.sh's result, once committed


def learner_rates(learner: Mapping[str, Any]) -> tuple[dict[int, float], str]:
    """Policy width -> learner SGD steps/s (`learner.step`, else `loop`, else `scan`), and the device."""
    rates = {}
    for cfg in learner["configs"]:
        modes = cfg["modes"]
        mode = next(m for m in ("learner.step", "loop", "scan") if m in modes)
        rates[int(cfg["policy_layer_sizes"][0])] = float(modes[mode]["median_steps_per_s"])
    m = machine_fields(learner.get("machine"))
    devices = m.get("jax_devices") or []
    device = f"{m.get('jax_backend', '?')}" + (f" ({devices[0]})" if devices else f" ({m.get('cpu_model', '?')})")
    return rates, device


def policy_call_us(inference: Mapping[str, Any], hidden: int, precision: str) -> float | None:
    """The batch-1 policy call of the `auto` runtime (what actors run), else the fastest backend's."""
    rows = [r for r in inference["rows"] if r["hidden"] == hidden and r["batch"] == 1
            and r["precision"] == precision and not r.get("simulated")]
    auto = [r for r in rows if r["backend"] == "auto"]
    pick = auto or rows
    return min(float(r["us_per_call"]) for r in pick) if pick else None


def actor_rates(actorq: Mapping[str, Any], inference: Mapping[str, Any],
                widths: Sequence[int]) -> dict[int, dict[str, dict[str, Any]]]:
    """Width -> precision -> {"steps_per_s", "how"}: measured for the actor bench's policy, derived otherwise."""
    actor = actorq["actor"]
    measured_width = int(actor["policy"][0])
    env_us = statistics.mean(float(v["env_us"]) for v in actor["throughput"].values())
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for width in widths:
        out[width] = {}
        for p in PRECISIONS:
            if width == measured_width and p in actor["throughput"]:
                out[width][p] = {"steps_per_s": float(actor["throughput"][p]["steps_per_s"]),
                                 "how": "measured (actorq.json)"}
                continue
            us = policy_call_us(inference, width, p)
            if us is not None:
                out[width][p] = {"steps_per_s": 1e6 / (env_us + us),
                                 "how": f"1e6 / ({env_us:.0f} env + {us:.0f} policy us)"}
    return out


def project(learner: Mapping[str, Any], actorq: Mapping[str, Any], inference: Mapping[str, Any]) -> dict[str, Any]:
    """Every number of the table, from the three result records."""
    l_rates, device = learner_rates(learner)
    a_rates = actor_rates(actorq, inference, sorted(l_rates))
    per_step = BATCH / SAMPLES_PER_INSERT
    rows = []
    for width in sorted(l_rates):
        need = l_rates[width] * per_step  # env steps/s that keep the learner busy
        rates = {}
        for p, a in a_rates[width].items():
            rates[p] = {**a, "cores_to_saturate": need / a["steps_per_s"],
                        "paper_fleet_env_steps_per_s": min(PAPER_ACTORS * a["steps_per_s"], need)}
        ratio = {p: rates[p]["paper_fleet_env_steps_per_s"] / rates["fp32"]["paper_fleet_env_steps_per_s"]
                 for p in rates if p != "fp32" and "fp32" in rates}
        # The learner speed at which the paper's fleet stops keeping up, per precision: above the fp32 one int8
        # starts to pay; at the int8 one it pays its whole per-actor speed-up.
        fleet_limit = {p: PAPER_ACTORS * a["steps_per_s"] / per_step for p, a in a_rates[width].items()}
        rows.append({"policy": width, "learner_steps_per_s": l_rates[width], "env_steps_to_saturate": need,
                     "actors": rates, "e2e_ratio_vs_fp32": ratio, "learner_steps_per_s_fleet_limit": fleet_limit})
    return {"device": device, "batch": BATCH, "samples_per_insert": SAMPLES_PER_INSERT,
            "paper_actors": PAPER_ACTORS, "rows": rows}


def markdown(proj: Mapping[str, Any], inputs: Mapping[str, str], heading: bool = True,
             machines: Mapping[str, str | None] | None = None) -> str:
    per_step = proj["batch"] / proj["samples_per_insert"]
    n = proj["paper_actors"]
    machines = machines or {}
    lines = [
        "# Projection: the paper's regime from measured parts" if heading else f"## Learner on {proj['device']}",
        "",
        "**A projection, not a measurement**: every input below is a committed measurement "
        + ", ".join(f"([`{k}`]({v}){', ' + machines[k] if machines.get(k) else ''})" for k, v in inputs.items())
        + f"; the arithmetic is shown. Learner device: {proj['device']}. Each actor on its own core, the "
        f"learner on its own device; batch {proj['batch']}, {proj['samples_per_insert']:g} samples per insert, "
        f"so one SGD step consumes {per_step:g} env steps. Regenerate with `python -m bench.system.projection`.",
        "",
        "| policy | learner SGD steps/s L | env steps/s to saturate (L x "
        f"{per_step:g}) | precision | one actor, env steps/s per core A | how A was obtained | "
        f"actor cores to saturate (L x {per_step:g} / A) | {n} actors: min({n} A, L x {per_step:g}) | "
        "end to end vs fp32 |",
        "|---|---:|---:|---|---:|---|---:|---:|---:|",
    ]
    for r in proj["rows"]:
        for p, a in r["actors"].items():
            ratio = r["e2e_ratio_vs_fp32"].get(p)
            lines.append(
                f"| {r['policy']}x3 | {r['learner_steps_per_s']:.1f} | {r['env_steps_to_saturate']:.0f} | {p} | "
                f"{a['steps_per_s']:.0f} | {a['how']} | {a['cores_to_saturate']:.3g} | "
                f"{a['paper_fleet_env_steps_per_s']:.0f} | {'1 (reference)' if p == 'fp32' else f'{ratio:.2f}x'} |")
    lo, hi = PAPER_RANGE
    lines += ["", f"Where int8 would start to pay: the learner rate at which {n} actors of a precision no longer keep "
              f"up is {n} x A / {per_step:g} SGD steps/s.", ""]
    for r in proj["rows"]:
        limits = r["learner_steps_per_s_fleet_limit"]
        lines.append(f"- {r['policy']}x3: " + "; ".join(
            f"{p} {v:.0f} steps/s ({v / r['learner_steps_per_s']:.3g}x the measured learner)"
            for p, v in limits.items()) + ".")
    lines += [
        "",
        f"The paper reports int8 actors speeding up training {lo}-{hi}x end to end. Here, whenever fewer than "
        f"{n} actor cores saturate the learner at fp32 already, int8 has nothing left to win (ratio 1): the "
        "learner is the bottleneck, as on this 2-core machine's CPU learner. The paper's gains need a learner "
        "fast enough (an accelerator) that fp32 actors cannot keep up: rerun with a GPU row in "
        "`learner_throughput.json` (bench/gpu/) to see where that starts.",
        "",
    ]
    return "\n".join(lines)


def input_cpu(record: Mapping[str, Any]) -> str | None:
    """The CPU model an input was measured on (`machine_fields` reads every record format)."""
    m = record.get("machine") if isinstance(record.get("machine"), Mapping) else record
    value = machine_fields(m).get("cpu_model")
    return str(value) if value else None


def mixed_machines(data: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> dict[str, str | None]:
    """{input: its CPU} when the named inputs were measured on more than one CPU model, else {}."""
    cpus = {name: input_cpu(data[name]) for name in names}
    return cpus if len({c for c in cpus.values()}) > 1 else {}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.system.projection", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=str(REPO / "results" / "bench"), help="folder with the input JSONs")
    p.add_argument("--learner", default=INPUTS[0], help="learner input, relative to RESULTS (default: %(default)s)")
    p.add_argument("--actor", default=INPUTS[1], help="actor input, relative to RESULTS (default: %(default)s)")
    p.add_argument("--inference", default=INPUTS[2],
                   help="policy-call input, relative to RESULTS (default: %(default)s)")
    p.add_argument("--allow-mixed", action="store_true",
                   help="project from CPU-side inputs measured on different CPUs (the table then says so)")
    p.add_argument("--out", default=None, help="markdown file (default: RESULTS/projection.md)")
    args = p.parse_args(argv)
    results = Path(args.results)
    # One table per learner device: this machine's CPU, and the GPU machine's when it has been measured.
    learners = [args.learner] + ([GPU_LEARNER] if (results / GPU_LEARNER).exists() else [])
    data = {}
    for name in (*learners, args.actor, args.inference):
        try:
            data[name] = json.loads((results / name).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            p.exit(2, f"bench.system.projection: error: cannot read {results / name}: {e}\n")
    # The CPU learner, the actor and the policy calls must come from one machine, or the projection mixes them.
    mixed = mixed_machines(data, (args.learner, args.actor, args.inference))
    if mixed and not args.allow_mixed:
        p.exit(2, "bench.system.projection: error: the inputs come from different CPUs ("
               + "; ".join(f"{k}: {v}" for k, v in mixed.items())
               + "); pass files measured on one machine, or --allow-mixed\n")
    parts = []
    for name in learners:
        try:
            proj = project(data[name], data[args.actor], data[args.inference])
        except (KeyError, TypeError, ValueError, StopIteration) as e:
            p.exit(2, f"bench.system.projection: error: an input lacks a field the projection needs: {e!r}\n")
        if not all(math.isfinite(r["learner_steps_per_s"]) and r["learner_steps_per_s"] > 0 for r in proj["rows"]):
            p.exit(2, f"bench.system.projection: error: a learner rate in {name} is not a positive number\n")
        parts.append(markdown(proj, {n: n for n in (name, args.actor, args.inference)}, heading=name == learners[0],
                              machines={n: input_cpu(data[n]) for n in (name, args.actor, args.inference)}))
    out = Path(args.out) if args.out else results / "projection.md"
    write_text(out, "\n".join(parts))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
