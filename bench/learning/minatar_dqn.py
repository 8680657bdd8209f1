"""DQN on MinAtar Breakout and Space Invaders, set against the DQN results of MinAtar's authors.

    python -m bench.learning.minatar_dqn [--games Breakout,SpaceInvaders] [--seeds 0] [--frames 100000]
                                [--eval-every 25000] [--precision int8] [--out DIR] [--allow-busy]

Reference: Young & Tian (2019), "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible Reinforcement
Learning Experiments" (arXiv:1903.03176) and their repository github.com/kenjyoung/MinAtar (README "Results",
img/learning_curves.gif; examples/dqn.py holds their settings). Their DQN: one 3x3 conv of 16, fc 128, replay
100k, batch 32, one update per frame, RMSProp 2.5e-4, target copy every 1,000 updates, epsilon 1 -> 0.1 over the
first 100k frames, learning from 5,000 frames, 1-step targets, 5M frames, 30 seeds. Their figure gives the
moving average of the last 100 training (epsilon-greedy) returns; the values in `AUTHORS_DQN` are read off that
figure by eye (no table of numbers is published), so they are approximate to about +-1 (Breakout, Asterix) and
+-3 (Space Invaders, Freeway). Freeway's curve is flat at ~5.5 until ~250k frames, the length of its first 100
episodes (2,500 frames each, the moving average's window): no Freeway figure is taken below 300k frames.

This bench runs the same torso, replay size, batch, update ratio, target period and exploration schedule through
`launch.experiments.run_experiment.run_experiment` with int8 actors (the learner is fp32); it differs in the optimiser
(Adam, this project's learner) and in 3-step double-DQN targets (the project's default). Returns are the greedy
evaluation of the deployed (int8) policy, 10 episodes. A MinAtar "frame" is one env step (there is no frame skip),
so frames here are env steps. Returns do not depend on the machine's load (seeded); times do and are not reported.

Writes DIR/minatar_dqn.json (every evaluation, with frames and seeds) and DIR/minatar_dqn.md (default DIR:
results/bench; per-run logs under runs/bench/minatar_dqn/).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from agents.dqn.config import MINATAR_OVERRIDES
from bench.harness.learning_runs import run_one
from bench.harness.machine import add_allow_busy, bench_machine, describe_load, finish
from bench.harness.results_io import command_line, write_results
from bench.harness.rows import LearningRow
from quarl.quant.precision import precision_name_arg
from quarl.ops.machine import machine_fields

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "bench"
RUNS = REPO / "runs" / "bench" / "minatar_dqn"
GAMES = ("Breakout", "SpaceInvaders")

# The authors' settings (examples/dqn.py) in this project's DQNConfig: the agent's MinAtar preset.
AUTHORS_SETTINGS: dict[str, Any] = dict(MINATAR_OVERRIDES)

# Authors' DQN (with replay), mean of 30 seeds, moving average of 100 training returns, read off their figure at
# these frame counts (see the module docstring for the precision).
AUTHORS_DQN: dict[str, dict[int, float]] = {
    "Breakout": {100_000: 4.5, 200_000: 6.0, 500_000: 8.5, 1_000_000: 9.5, 5_000_000: 10.0},
    "SpaceInvaders": {100_000: 20.0, 200_000: 22.0, 500_000: 28.0, 1_000_000: 32.0, 5_000_000: 43.0},
    "Freeway": {300_000: 17.0, 500_000: 38.0, 1_000_000: 48.0, 5_000_000: 50.0},
    "Asterix": {500_000: 1.0, 1_000_000: 8.5, 2_000_000: 14.0, 5_000_000: 17.0},
}


def authors_at(game: str, frames: int) -> tuple[int, float]:
    """The authors' figure at the largest listed frame count <= `frames` (the first one if none is)."""
    points = AUTHORS_DQN[game]
    below = [f for f in points if f <= frames]
    f = max(below) if below else min(points)
    return f, points[f]


def markdown(results: list[dict[str, Any]], machine: dict[str, Any], command: str, episodes: int) -> str:
    machine = machine_fields(machine)
    lines = ["# DQN on MinAtar vs the MinAtar authors' DQN", "",
             f"Command: `{command}`", "",
             f"Machine: {machine['cpu_model']}, {machine['cores']} logical cores; "
             f"{'report written from the run logs, ' if machine.get('from_runs') else ''}{describe_load(machine)} "
             "(returns are seeded and do not depend on load; no times are reported).", "",
             "Ours: int8 actors, fp32 learner, the authors' torso/replay/batch/update ratio/target period/exploration, "
             "Adam and 3-step double-DQN targets (see `bench/learning/minatar_dqn.py`); each return is one greedy "
             "evaluation "
             f"of {episodes} episodes of the deployed int8 policy. Authors: Young & Tian (2019), arXiv:1903.03176 and "
             "github.com/kenjyoung/MinAtar README figure (DQN with replay, 30 seeds, moving average of 100 training "
             "returns at epsilon 0.1, read off the plot: approximate).", "",
             "| game | seed | frames | our return (best eval) | our return (last eval) "
             "| authors' DQN at that many frames "
             "| authors' DQN at 5M | short of authors at same frames |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        f_ref, ref = authors_at(r["game"], r["frames"])
        short = ref - r["final_return"]
        lines.append(f"| {r['game']} | {r['seed']} | {r['frames']:,} | {r['best_return']:.1f} | "
                     f"{r['final_return']:.1f} | {ref:.1f} (at {f_ref:,}) | {AUTHORS_DQN[r['game']][5_000_000]:.1f} | "
                     f"{'none (at or above)' if short <= 0 else f'{short:.1f} ({100 * short / ref:.0f}%)'} |")
    lines += ["", "Every evaluation (frames, return):", ""]
    for r in results:
        curve = ", ".join(f"{c['actor_steps']:,}: {c['return']:.1f}" for c in r["curve"])
        lines.append(f"- {r['game']} seed {r['seed']}: {curve}")
    return "\n".join(lines) + "\n"


def results_from_runs(run_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """Result rows rebuilt from run directories (`<game>_<precision>_s<seed>/evaluator.csv`), e.g. of runs started
    in separate processes or stopped before their budget: frames are those of the last evaluation written."""
    results = []
    for run in run_dirs:
        game, precision, seed = Path(run).name.rsplit("_", 2)
        with open(Path(run) / "evaluator.csv", newline="", encoding="utf-8") as f:
            curve = [{"actor_steps": int(r["actor_steps"]), "return": float(r["return"])} for r in csv.DictReader(f)]
        if game not in AUTHORS_DQN or not curve:
            raise ValueError(f"{run}: not a MinAtar run directory with evaluations")
        results.append({"game": game, "seed": int(seed.lstrip("s")), "frames": curve[-1]["actor_steps"],
                        "precision": precision, "final_return": curve[-1]["return"],
                        "best_return": max(c["return"] for c in curve), "curve": curve})
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.learning.minatar_dqn", description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", default=",".join(GAMES), help="comma-separated MinAtar games")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--frames", type=int, default=100_000, help="env steps (= MinAtar frames) per run")
    parser.add_argument("--eval-every", type=int, default=25_000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--precision", default="int8", type=precision_name_arg("actor"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one of the authors' settings (JSON value), e.g. --set min_replay_size=500")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--from-runs", nargs="+", default=None, metavar="RUN_DIR",
                        help="write the report from these run directories' evaluations instead of training")
    add_allow_busy(parser)  # accepted for symmetry: returns do not depend on load, so a busy machine is allowed
    args = parser.parse_args(argv)
    games = [g for g in args.games.split(",") if g]
    bad = [g for g in games if g not in AUTHORS_DQN]
    if bad:
        parser.exit(2, f"{parser.prog}: error: unknown game(s) {', '.join(bad)}; valid: {', '.join(AUTHORS_DQN)}\n")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
        overrides = dict(AUTHORS_SETTINGS)
        for item in args.set:
            key, value = item.split("=", 1)
            overrides[key] = json.loads(value)
    except ValueError as err:
        parser.exit(2, f"{parser.prog}: error: bad --seeds or --set ({err})\n")
    if args.frames < 1 or args.eval_every < 1 or not seeds:
        parser.exit(2, f"{parser.prog}: error: --frames and --eval-every must be positive, --seeds non-empty\n")
    machine = bench_machine(allow_busy=True)
    if args.from_runs:
        machine["from_runs"] = True  # the load below is the report's, not the training runs'
        try:
            return _write(Path(args.out), results_from_runs([Path(r) for r in args.from_runs]), machine, overrides,
                          argv, args.eval_episodes)
        except (OSError, ValueError, KeyError) as err:
            parser.exit(2, f"{parser.prog}: error: {err}\n")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = []
    for seed in seeds:
        for game in games:
            row = LearningRow("dqn", f"MinAtar/{game}", float("inf"), args.frames, args.eval_every,
                              args.eval_episodes, overrides)
            logdir = RUNS / stamp / f"{game}_{args.precision}_s{seed}"
            try:
                result, curve = run_one(row, args.precision, seed, logdir=logdir, stop_at_target=False)
            except ValueError as err:
                parser.exit(2, f"{parser.prog}: error: {err}\n")
            results.append({"game": game, "seed": seed, "frames": result["actor_steps"],
                            "precision": result["precision"], "final_return": result["final_return"],
                            "best_return": result["best_return"], "learner_steps": result["learner_steps"],
                            "curve": [{"actor_steps": c["actor_steps"], "return": c["return"]} for c in curve]})
            print(f"{game} seed {seed}: {result['actor_steps']} frames, last eval {result['final_return']:.1f}, "
                  f"best {result['best_return']:.1f}", flush=True)
    return _write(Path(args.out), results, machine, overrides, argv, args.eval_episodes)


def _write(out: Path, results: list[dict[str, Any]], machine: dict[str, Any], overrides: dict[str, Any],
           argv: Sequence[str] | None, episodes: int) -> int:
    finish(machine)
    text = markdown(results, machine, command_line("bench.learning.minatar_dqn", argv), episodes)
    write_results(out, "minatar_dqn", {"machine": machine, "settings": overrides, "authors_dqn": AUTHORS_DQN,
                                       "results": results}, text, newline=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
