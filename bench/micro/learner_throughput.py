"""D4PG learner throughput: SGD steps per second of the fp32 learner update on whatever JAX runs on here.

    python -m bench.micro.learner_throughput [--quick] [--no-paper] [--out DIR]

The learner is the ActorQ bottleneck once int8 makes actors cheap, so its update rate bounds how fast any
fleet can learn. Times `agents.d4pg.learning.make_update_fn` (the same pure step `D4PGLearner` jits) on the
walker shapes (obs 24, action 6) three ways:

- `scan`: one `jax.jit` of `lax.scan` over K device-resident batches: K SGD steps per call, no host
  round trip between steps (the learner's compute alone; what a device-resident replay would allow);
- `loop`: the jitted step called K times on device-resident batches, waiting only after the K-th
  (asynchronous dispatch, no per-step host round trip; the per-call dispatch overhead remains);
- `learner.step`: `D4PGLearner.step` as `launch.experiments.run_experiment` drives it: a NumPy batch in (checked and copied
  to the device) and the metrics kept on device, as the learner node runs it; a block waits for its last step.

Configurations: D4PG with 256x3 policy and 256x3 critic at batch 256 (the issue's setting), and, unless
--no-paper, the ActorQ paper's 2048x3 policy with the same critic (its learner cost is dominated by the
policy's forward/backward). Each mode runs `rounds` timed blocks after a compile/warm-up call; the table
reports the median block, and the spread (min..max) shows how much the machine's load moved it.
Writes DIR/learner_throughput.json and DIR/learner_throughput.md (DIR defaults to results/bench; --quick
writes to runs/bench/learner-throughput-quick so it never overwrites committed results).
XLA keeps its default CPU threading (all cores), as the learner process has it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from bench.harness.learner_timing import learner_machine, measure
from bench.harness.machine import add_allow_busy, finish, refuse_if_busy
from quarl.ops.machine import machine_fields
from bench.harness.results_io import write_report

REPO = Path(__file__).resolve().parents[2]


def markdown(result: dict[str, Any], command: str) -> str:
    m = machine_fields(result["machine"])
    lines = [
        f"# D4PG learner throughput ({m['jax_backend'].upper()})",
        "",
        f"`{command}`, {m['date'][:10]}. fp32 learner SGD steps per second: one step = critic and policy losses, "
        "both gradients, both Adam updates (global-norm clipping 40) and the periodic target copy "
        "(`agents.d4pg.learning.make_update_fn`, the step `D4PGLearner` jits). Walker shapes: obs 24, action 6; "
        f"51 atoms. Raw data: `learner_throughput.json`.",
        "",
        "## Machine",
        "",
        f"{m['cpu_model']}, {m['cores']} logical cores, {m['platform']}, Python {m['python']}, "
        f"jax {m['versions'].get('jax', '?')} "
        f"({m['jax_backend']}: {', '.join(m.get('jax_devices') or ['?'])}), XLA_FLAGS `{m['xla_flags'] or '(unset: default threading, all cores)'}`. "
        f"**Shared machine**: load average {m['load_start'][0]:.1f} at the start and "
        f"{m['load_end'][0]:.1f} at the end (1-min). "
        f"Absolute rates are therefore below what this CPU gives an idle learner; "
        "the min..max spread over timed blocks shows how much the load moved them.",
        "",
        "## Steps per second (median over timed blocks; min..max in brackets)",
        "",
        "| policy | critic | batch | params (policy / critic) | scan (K steps per jit call) | "
        "loop (jitted step, async) | learner.step (host batch in, metrics on device) | ms/step (scan) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["configs"]:
        cells = []
        for mode in ("scan", "loop", "learner.step"):
            d = r["modes"].get(mode)
            cells.append("—" if d is None else
                         f"**{d['median_steps_per_s']:.1f}** ({d['min_steps_per_s']:.1f}..{d['max_steps_per_s']:.1f})")
        scan = r["modes"].get("scan")
        lines.append(
            f"| {'x'.join(map(str, r['policy_layer_sizes']))} | {'x'.join(map(str, r['critic_layer_sizes']))} | "
            f"{r['batch_size']} | {r['n_params']['policy']:,} / {r['n_params']['critic']:,} | "
            + " | ".join(cells) + " | " + ("—" if scan is None else f"{scan['ms_per_step']:.1f}") + " |")
    lines += [
        "",
        "Modes: **scan** jits `lax.scan` over K device-resident batches (K = steps per block), so the K steps run "
        "with no host round trip between them: the learner's compute alone. **loop** calls the jitted step K "
        "times on device-resident batches and waits once at the end (asynchronous dispatch; per-call dispatch "
        "cost remains). **learner.step** is what `launch.experiments.run_experiment` runs: a NumPy batch is validated and copied "
        "in every step, the metrics stay on device and each timed block waits for its last step.",
        "",
        *[f"learner.step with the policy trees donated too, {'x'.join(map(str, r['policy_layer_sizes']))} policy: "
          f"**{r['modes']['learner.step, all donated']['median_steps_per_s']:.1f}** steps/s (kept out of the "
          f"donation, as D4PGLearner runs: {r['modes']['learner.step']['median_steps_per_s']:.1f})."
          for r in result["configs"] if "learner.step, all donated" in r["modes"]],
        "",
        "First-call seconds (compile + one step): "
        + "; ".join(f"{'x'.join(map(str, r['policy_layer_sizes']))} policy: "
                    + ", ".join(f"{k} {v['first_call_s']:.1f} s" for k, v in r["modes"].items())
                    for r in result["configs"]) + ".",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.micro.learner_throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few steps, one round per mode (a smoke run)")
    p.add_argument("--no-paper", action="store_true", help="skip the 2048x3 policy")
    p.add_argument("--out", default=None)
    p.add_argument("--donation", action="store_true",
                   help="also time learner.step with the policy trees donated too (what keeping them costs)")
    add_allow_busy(p)
    args = p.parse_args(argv)
    refuse_if_busy(p, args.allow_busy)
    outdir = Path(args.out) if args.out else (REPO / "runs" / "bench" / "learner-throughput-quick" if args.quick
                                              else REPO / "results" / "bench")
    result: dict[str, Any] = {"machine": learner_machine(args.allow_busy), "quick": args.quick, "configs": []}
    modes = ("scan", "loop", "learner.step") + (("learner.step, all donated",) if args.donation else ())
    plan = [((256, 256, 256), (256, 256, 256), 256, (10, 2) if args.quick else (50, 5))]
    if not args.no_paper:
        plan.append(((2048, 2048, 2048), (256, 256, 256), 256, (2, 1) if args.quick else (5, 3)))
    for policy, critic, batch, (steps, rounds) in plan:
        r = measure(policy, critic, batch, steps=steps, rounds=rounds, modes=modes)
        result["configs"].append(r)
        print(f"policy {policy} critic {critic} batch {batch}: "
              + ", ".join(f"{k} {v['median_steps_per_s']:.1f} steps/s" for k, v in r["modes"].items()), flush=True)
    finish(result["machine"])
    write_report(outdir, "bench.micro.learner_throughput", argv, result, markdown, newline=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
