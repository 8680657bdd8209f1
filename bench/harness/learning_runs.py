"""One training run as the learning benchmarks run it, and what they read back from it.

`run_one` is `launch.experiments.run_experiment.run_experiment` on a `LearningRow` (bench.harness.rows) with a
stop at the first evaluation that reaches the row's target (and, optionally, a wall-clock budget); it returns the
result line and the evaluation curve every learning benchmark records. `eval_metrics` turns a run's evaluations
into time to solve and whether the policy stayed solved (bench.peers reports SB3's runs with it too, so both sides
are judged alike); `read_our_evals` reads those evaluations from a run's evaluator.csv. `paired_test` is the
seed-paired t-test the reports quote, `empty_run_dir` the fresh folder every run starts in, and `relative_path`
how a results file names a run folder.
"""
from __future__ import annotations

import csv
import shutil
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # bench.harness.rows imports the agents: a run needs them, reading its evaluations does not
    from bench.harness.rows import LearningRow

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "bench"
RUNS = REPO / "runs" / "bench"


def empty_run_dir(logdir: Path) -> Path:
    """Removes a benchmark run's folder left by an earlier sitting, so its run starts empty: run logs are
    append-only (a resumed run continues them), and a rerun into the old folder would read the old run's
    evaluations ahead of its own."""

    if Path(logdir).exists():
        shutil.rmtree(logdir)
    return Path(logdir)


def relative_path(path: Path) -> str:
    """Paths inside the repository are recorded relative to it (results files travel between machines)."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def run_one(row: LearningRow, precision: str, seed: int, *, logdir: Path, stop_at_target: bool = True,
            backend: str = "auto", learner_device: str = "auto",
            max_train_s: float | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One training run; returns its result line and its evaluation curve. With `max_train_s` the run also ends at
    its first evaluation at or past that many training seconds (a wall-clock budget that still ends on an
    evaluation, so the result has its last return).

    The run starts in an empty `logdir`: a benchmark's earlier run there is removed first. Its logs are append-only
    (a resumed run continues them), so a rerun into the same folder would otherwise read the old run's evaluations
    ahead of its own (first solve from one run, last evaluations from the other)."""
    from launch.experiments.run_experiment import run_experiment  # pylint: disable=import-outside-toplevel
    from launch.experiments.config import ExperimentConfig  # pylint: disable=import-outside-toplevel

    reached: dict[str, Any] = {}

    def on_eval(ev: dict[str, Any]) -> bool:
        if not reached and ev["return"] >= row.target:
            reached.update(ev)
        over_budget = max_train_s is not None and ev["train_clock_s"] >= max_train_s
        return (stop_at_target and bool(reached)) or over_budget

    empty_run_dir(logdir)
    config = ExperimentConfig(agent=row.agent, task=row.task, precision=precision, backend=backend,
                              max_actor_steps=row.max_actor_steps, seed=seed, logdir=str(logdir),
                              eval_every=row.eval_every, eval_episodes=row.eval_episodes,
                              overrides=dict(row.overrides), learner_device=learner_device)
    s = run_experiment(config, progress=False, energy=False, on_eval=on_eval)
    rt = s["runtime"]
    result = {
        "agent": row.agent, "task": row.task, "precision": s["precision"], "backend": s["actors"][0]["backend"],
        "seed": seed,
        "target": row.target, "solved": bool(reached),
        "steps_to_target": reached.get("actor_steps"), "train_s_to_target": reached.get("train_clock_s"),
        "final_return": s["final_eval_return"], "best_return": s["best_eval_return"],
        "actor_steps": s["actor_steps"], "learner_steps": s["learner_steps"], "train_s": s["train_clock_s"],
        "env_steps_per_s": round(s["actor_steps"] / max(s["train_clock_s"], 1e-9), 1),
        "learner_device": (s.get("learner_device") or {}).get("platform"),  # where it ran, read in its process
        "payload_bytes": s["payload_bytes"], "payload_bytes_fp32": s["payload_bytes_fp32"],
        # Column names kept from earlier results files: "pull" here is the learner's quantize + encode.
        "pull_ms_per_update": rt["per_update"]["quantize_encode_ms"],
        "load_ms_per_update": rt["per_update"]["load_ms"],
        "inference_us_per_step": rt["per_step"]["policy_us"], "logdir": relative_path(logdir),
    }
    with open(logdir / "evaluator.csv", newline="", encoding="utf-8") as f:
        curve = [{"agent": row.agent, "task": row.task, "precision": s["precision"], "seed": seed,
                  "actor_steps": int(r["actor_steps"]), "train_clock_s": float(r["train_clock_s"]),
                  "return": float(r["return"])} for r in csv.DictReader(f)]
    return result, curve


def median_or_none(values: Sequence[float | None]) -> float | None:
    """The median of the values that are there (None: a failed or unreached run), None if none is."""
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def paired_test(diffs: Sequence[float]) -> float | None:
    """Two-sided paired t-test p-value of per-seed differences (None below 2 pairs or with no spread)."""
    if len(diffs) < 2 or statistics.pstdev(diffs) == 0:
        return None
    from scipy import stats  # pylint: disable=import-outside-toplevel

    return float(stats.ttest_1samp(list(diffs), 0.0).pvalue)


def eval_metrics(evals: Sequence[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """What the report shows of one run's evaluations ({"env_steps", "wall_clock_s", "return"} rows, in order).

    Beside the first evaluation at or above `threshold` (time to solve), whether the policy STAYS solved: the
    mean of the last 3 evaluations (what a user keeps is the final policy) and the fraction of the evaluations
    after the first solve that are still >= `threshold` (None when the solve was the last evaluation)."""
    hit = next((i for i, e in enumerate(evals) if e["return"] >= threshold), None)
    after = evals[hit + 1:] if hit is not None else []
    last = [e["return"] for e in evals[-3:]]
    return {"solved": hit is not None,
            "steps_to_target": None if hit is None else evals[hit]["env_steps"],
            "wall_s_to_target": None if hit is None else evals[hit]["wall_clock_s"],
            "final_return": last[-1] if last else None,
            "last3_mean": statistics.fmean(last) if last else None,
            "stay_fraction": sum(e["return"] >= threshold for e in after) / len(after) if after else None,
            "eval_returns": [e["return"] for e in evals]}


def read_our_evals(evaluator_csv: Path) -> list[dict[str, Any]]:
    """Our evaluator.csv as `eval_metrics` rows (wall clock with evaluation included, as SB3's)."""
    with open(evaluator_csv, newline="", encoding="utf-8") as f:
        return [{"env_steps": int(r["actor_steps"]), "wall_clock_s": float(r["wall_clock_s"]),
                 "return": float(r["return"])} for r in csv.DictReader(f)]
