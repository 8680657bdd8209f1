"""Why int8 costs one discrete policy reward and not another: the greedy action's margin against int8's output error.

    python -m bench.learning.ptq_margins [--runs runs/bench/ptq_study] [--out results/bench] [--precision int8]

For every discrete-action cell that `bench.learning.ptq_study` trained (its completed run folders under --runs), the
fp32 greedy policy plays the cell's first evaluation episode (the environment seed bench.learning.ptq_study
evaluates first) and, on the states it visits, both the fp32 and the --precision policy (per-channel weights, the
integer kernel, as in the study) compute their outputs. Reported per cell: the median margin between the best and
second-best output (a Q-value gap for DQN, a logit gap for PPO/A2C), the median of int8's largest output error per
state, the share of states whose error exceeds the margin, and the share where the quantized policy picks another
action. An argmax over outputs whose gaps are small next to the quantization error flips, whatever the bit width's
weight error looks like in decibels; that is what the study's reward changes follow. Where the error comes from: the
same median with only the weights rounded (per channel, fp32 activations: `quarl.policy.reference`), and with only
the output layer's weights rounded.

Writes OUT/ptq_margins.md and OUT/ptq_margins.csv. Cells whose run folders are not under --runs (trained in another
session or on another machine) keep their rows from OUT/ptq_margins.csv at the same precision, so a session that
retrains some cells updates those and loses none. No timing; the machine is recorded.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bench.harness.machine import bench_machine
from bench.harness.results_io import write_csv, write_text
from bench.learning.ptq_study import EVAL_SEED_BASE, REPO, has_policy
from quarl.policy.reference import reference_apply
from quarl.policy.spec import ParamTree, PolicySpec
from quarl.quant.precision import precision_name_arg
from quarl.quant.quantization import fake_quantize_params
from quarl.ops.machine import machine_fields

FIELDS = ("algo", "task", "seed", "precision", "states", "median_margin", "median_error", "error_over_margin",
          "flipped", "weights_error", "head_error")


def cell_margins(logdir: Path, seed: int, precision: str, max_states: int = 500) -> dict[str, Any] | None:
    """The margins of one run folder's policy on the states of its first evaluation episode (None: continuous)."""
    from dm_env import specs  # pylint: disable=import-outside-toplevel
    from launch.ptq_policy import (GridPoint, calibration_observations,  # pylint: disable=import-outside-toplevel
                                   load_trained_policy, make_row_policy)
    from quarl.envs.factory import make_environment  # pylint: disable=import-outside-toplevel

    policy = load_trained_policy(logdir)
    env = make_environment(policy.task, EVAL_SEED_BASE + 1000 * seed)
    try:
        if not isinstance(env.action_spec(), specs.DiscreteArray):
            return None
        fp32, _ = make_row_policy(GridPoint("fp32"), policy, env.action_spec(), "jax")
        quant, _ = make_row_policy(GridPoint(precision, "per-channel"), policy, env.action_spec(), "jax",
                                   calibration_observations(policy))  # conv policies: calibrated as in the study
        observations, timestep = [], env.reset()
        while not timestep.last() and len(observations) < max_states:
            observations.append(np.asarray(timestep.observation, np.float32).ravel())
            timestep = env.step(fp32(np.asarray(timestep.observation)[None])[0])  # the policy acts on batches
    finally:
        env.close()
    obs = np.stack(observations)
    ref = np.concatenate([fp32.executor(o[None]) for o in obs])
    out = np.concatenate([quant.executor(o[None]) for o in obs])
    top2 = np.sort(ref, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    error = np.abs(out - ref).max(axis=1)
    weights_error, head_error = weight_errors(policy.spec, policy.params, obs, precision)
    return {"algo": policy.agent, "task": policy.task, "seed": seed, "precision": precision, "states": len(obs),
            "median_margin": float(np.median(margin)), "median_error": float(np.median(error)),
            "error_over_margin": float(np.mean(error > margin)),
            "flipped": float(np.mean(ref.argmax(axis=1) != out.argmax(axis=1))),
            "weights_error": weights_error, "head_error": head_error}


def weight_errors(spec: PolicySpec, params: ParamTree, obs: np.ndarray, precision: str) -> tuple[float, float]:
    """Median over states of the largest output error when only the weights are rounded to `precision` (per
    channel; activations fp32), and when only the output layer's are: how much of the kernel's error is weight
    rounding, and how much of that the output layer alone makes."""
    ref = reference_apply(spec, params, obs, dtype=np.float32)
    rounded = fake_quantize_params(params, precision)
    head = spec.linear_layers[-1].name
    errors = []
    for tree in (rounded, {**params, head: rounded[head]}):
        errors.append(float(np.median(np.abs(reference_apply(spec, tree, obs, dtype=np.float32) - ref).max(axis=1))))
    return errors[0], errors[1]


def kept_rows(path: Path, precision: str, fresh: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of an earlier OUT/ptq_margins.csv at `precision` for cells not among `fresh` (files from before the
    precision column were int8's)."""
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        old = list(csv.DictReader(f))
    done = {(r["algo"], r["task"], r["seed"]) for r in fresh}
    kept = []
    for r in old:
        row: dict[str, Any] = {**r, "seed": int(r["seed"]), "states": int(r["states"]),
                               "precision": r.get("precision") or "int8"}
        for k in ("median_margin", "median_error", "error_over_margin", "flipped"):
            row[k] = float(r[k])
        for k in ("weights_error", "head_error"):  # files from before these columns: not measured
            row[k] = float(r[k]) if r.get(k) else None
        if row["precision"] == precision and (row["algo"], row["task"], row["seed"]) not in done:
            kept.append(row)
    return kept


def markdown(rows: Sequence[dict[str, Any]], precision: str, machine: dict[str, Any]) -> str:
    lines = [f"# Greedy-action margins against {precision} output error (discrete cells of bench.learning.ptq_study)",
             "",
             f"`python -m bench.learning.ptq_margins --precision {precision}` on "
             f"{machine_fields(machine)['cpu_model']}. States: the fp32 "
             "policy's first evaluation episode of each cell (at most 500). Margin: best minus second-best output; "
             f"error: the largest |{precision} - fp32| output difference of a state; the last two columns round only "
             "the weights (per channel, fp32 activations), all of them or only the output layer's. Cells whose run "
             "folders were not at hand keep their rows from the run before (— : measured before those columns).",
             "",
             "| algorithm | task | seed | states | median margin | median error | states with error > margin | "
             "greedy action changed | error, weights only | error, output layer's weights only |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        split = " | ".join("—" if r.get(k) is None else f"{r[k]:.3g}" for k in ("weights_error", "head_error"))
        lines.append(f"| {r['algo']} | {r['task']} | {r['seed']} | {r['states']} | {r['median_margin']:.3g} | "
                     f"{r['median_error']:.3g} | {100 * r['error_over_margin']:.1f}% | {100 * r['flipped']:.1f}% | "
                     f"{split} |")
    by_algo: dict[str, list[float]] = {}
    for r in rows:
        by_algo.setdefault(f"{r['algo']} / {r['task']}", []).append(r["flipped"])
    lines += ["", "Median share of greedy actions changed: " + "; ".join(
        f"{k} {100 * statistics.median(v):.1f}%" for k, v in by_algo.items()) + ".", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.learning.ptq_margins", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "bench" / "ptq_study")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bench")
    parser.add_argument("--precision", default="int8", type=precision_name_arg("kernel"))
    args = parser.parse_args(argv)
    # The fp32 runs ("s<seed>"): QAT runs beside them ("s<seed>-qat<B>") are evaluated at their own width, not PTQ'd.
    # Only completed runs: a stopped or failed one leaves a policy too, not the cell's (as bench.learning.ptq_study).
    folders = sorted(p.parent for p in args.runs.glob("*/*/s*/policy_fp32.qrlp")
                     if p.parent.name[1:].isdigit() and has_policy(p.parent))
    if not folders:
        parser.exit(2, f"{parser.prog}: error: no trained runs under {args.runs} "
                       "(bench.learning.ptq_study run makes them)\n")
    rows = [r for d in folders if (r := cell_margins(d, int(d.name[1:]), args.precision)) is not None]
    rows = sorted(rows + kept_rows(args.out / "ptq_margins.csv", args.precision, rows),
                  key=lambda r: (r["algo"], r["task"], r["seed"]))
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "ptq_margins.csv", rows, FIELDS)
    text = markdown(rows, args.precision, bench_machine(True))
    write_text(args.out / "ptq_margins.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
