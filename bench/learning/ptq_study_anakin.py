"""The PTQ study's cells trained by the jitted trainer (`launch.anakin`, docs/anakin.md): one call per cell and arm
(the fp32 run, or one QAT width) trains every seed that lacks a policy together, vmapped, and writes an ordinary run
folder per seed that the study sweeps as it sweeps a `launch.train` run. Classic control and MinAtar rows use it
(`StudyRow.trainer`); the tasks without a JAX port (DM Control) keep `launch.train`.

Layout: RUNS/anakin/<algo>/<task>/<arm>/seed<k>, arm `fp32` or `qat<B>`. A call writes into `<arm>.call` (the trainer
wants a new or empty folder) and its finished seed folders then move under `<arm>`, so a session stopped mid-call
trains those seeds again and never mixes a stopped call's seeds with finished ones.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Sequence

from analysis.runs import is_finished, read_summary
from bench.learning.ptq_study_grid import StudyRow, row_overrides

ANAKIN_TASKS = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MinAtar/Breakout", "MinAtar/SpaceInvaders",
                "MinAtar/Asterix", "MinAtar/Freeway")  # the tasks with a gymnax port (launch.anakin --list-tasks)
RUN_TIMEOUT_S = 12 * 3600.0  # a MinAtar cell: 10 seeds x 5M frames in one call


def arm_dir(runs: Path, algo: str, task: str, qat_bits: int | None = None) -> Path:
    """The folder of one cell's arm: its seeds are seed<k> under it."""
    arm = f"qat{qat_bits}" if qat_bits else "fp32"
    return runs / "anakin" / algo / task.replace("/", "_").replace(":", "_") / arm


def seed_dir(runs: Path, algo: str, task: str, seed: int, qat_bits: int | None = None) -> Path:
    """One seed's run folder, as `launch.anakin --out ARM` writes it."""
    return arm_dir(runs, algo, task, qat_bits) / f"seed{seed}"


def seed_spec(seeds: Sequence[int]) -> str:
    """launch.anakin's --seeds for these seeds: "0-9" for a run of consecutive ones, else "0,3,5"."""
    s = sorted(set(seeds))
    return f"{s[0]}-{s[-1]}" if len(s) > 1 and s[-1] - s[0] == len(s) - 1 else ",".join(map(str, s))


def anakin_command(row: StudyRow, seeds: Sequence[int], out: Path, quick: bool,
                   qat_bits: int | None = None) -> list[str]:
    """`launch.anakin` for one cell's arm (a subprocess of this checkout): fp32 actors, or int-B actors trained
    with `--qat-bits B`; it stops once every seed has the row's streak of evaluations at its reference (the
    trainer's rule for vmapped seeds), else at the budget."""
    precision, target, sets = run_flags(row, quick, qat_bits)
    return [sys.executable, "-m", "launch.anakin", "--agent", row.algo, "--task", row.task, "--seeds",
            seed_spec(seeds), *precision, "--steps", str(row.steps), "--eval-every", str(row.eval_every),
            "--eval-episodes", str(row.eval_episodes), *target, "--out", str(out), "--no-progress", *sets]


def run_flags(row: StudyRow, quick: bool, qat_bits: int | None) -> tuple[list[str], list[str], list[str]]:
    """The flags both trainers take alike for a cell's arm: (precision and QAT, the stopping target, --set
    overrides). No target with --quick (no reference within reach) or a streak of 0 (trained to the budget)."""
    sets = []
    for key, value in row_overrides(row, quick).items():
        text = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
        sets += ["--set", f"{key}={text}"]
    precision = ["--precision", f"int{qat_bits}", "--qat-bits", str(qat_bits)] if qat_bits else ["--precision", "fp32"]
    stops = row.reference is not None and not quick and row.target_streak > 0
    target = ["--target-return", str(row.reference), "--target-streak", str(row.target_streak)] if stops else []
    return precision, target, sets


def needs_training(runs: Path, row: StudyRow, seed: int, qat_bits: int | None = None) -> bool:
    """Whether the seed's arm has no finished run (absent, or stopped part-way)."""
    return not is_finished(read_summary(seed_dir(runs, row.algo, row.task, seed, qat_bits)))


def train_arm(row: StudyRow, seeds: Sequence[int], runs: Path, quick: bool, repo: Path,
              qat_bits: int | None = None) -> None:
    """Trains `seeds` of the cell's arm in one vmapped call, then moves each seed's folder under the arm."""
    from bench.harness.learning_runs import empty_run_dir  # pylint: disable=import-outside-toplevel
    from bench.harness.subprocess_runs import run_subprocess  # pylint: disable=import-outside-toplevel

    arm = arm_dir(runs, row.algo, row.task, qat_bits)
    call = empty_run_dir(arm.with_name(arm.name + ".call"))
    call.parent.mkdir(parents=True, exist_ok=True)
    log = arm.with_name(f"{arm.name}-{seed_spec(seeds).replace(',', '_')}.log")
    code, _, _ = run_subprocess(anakin_command(row, seeds, call, quick, qat_bits), log, RUN_TIMEOUT_S, repo)
    finished = [s for s in seeds if is_finished(read_summary(call / f"seed{s}"))]
    arm.mkdir(parents=True, exist_ok=True)
    for seed in finished:
        shutil.rmtree(arm / f"seed{seed}", ignore_errors=True)
        (call / f"seed{seed}").rename(arm / f"seed{seed}")
    if code != 0 or len(finished) != len(seeds):
        raise RuntimeError(f"{row.algo} {row.task} seeds {seed_spec(seeds)}: launch.anakin failed (exit {code}; "
                           f"{len(finished)} of {len(seeds)} seeds finished); see {log}")
    shutil.rmtree(call, ignore_errors=True)
