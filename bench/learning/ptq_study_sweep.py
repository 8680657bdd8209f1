"""bench.learning.ptq_study's sweep of one trained policy: every precision row of the cell evaluated greedily on the
project's own environment (not a trainer's port), on the same environment seeds for every row, whichever trainer
made the policy (`launch.train` or `launch.anakin`), so the table's meaning does not depend on the trainer."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

EVAL_SEED_BASE = 500_000  # PTQ evaluation seeds: apart from training (seed) and its evaluator (seed + 10,000)


def policy_bytes(policy: Any, precision: str, observations: Any, head_bits: int | None = None) -> int:
    """Bytes of the payload an actor pulls for this policy at `precision` (per-channel int scales; `head_bits`: the
    output layer kept at that width)."""
    from launch.ptq_policy import output_layer  # pylint: disable=import-outside-toplevel
    from quarl.quant.calibration import quantize_for_actors  # pylint: disable=import-outside-toplevel
    from quarl.quant.payload import encode_payload  # pylint: disable=import-outside-toplevel

    layer_bits = {output_layer(policy.spec): head_bits} if head_bits else None
    qparams = quantize_for_actors(policy.spec, policy.params, precision, observations, True, layer_bits)
    return len(encode_payload(qparams, version=policy.steps, spec_hash=policy.spec.digest()))


def sweep_cell(logdir: Path, seed: int, precisions: Sequence[str], episodes: int, backend: str,
               cpu: str, reference: float | None = None, label: str = "",
               trainer: str = "train") -> list[dict[str, Any]]:
    """Every precision row in `precisions` ("int8", "fp16", "int8-head16") of the cell's final policy (fp32
    weights): `episodes` greedy episodes each, on env seeds EVAL_SEED_BASE + 1000 * seed + i (the same for every
    row). Rows are named `label + row` ("qat-int4" for a QAT run's policy) and say which `trainer` made it."""
    from launch.ptq_policy import (calibration_observations,  # pylint: disable=import-outside-toplevel
                                   load_trained_policy, make_row_policy, parse_row_name)
    from quarl.envs.factory import make_environment  # pylint: disable=import-outside-toplevel
    from quarl.acting.evaluation import evaluate_seeds  # pylint: disable=import-outside-toplevel

    policy = load_trained_policy(logdir)
    summary = json.loads((logdir / "summary.json").read_text(encoding="utf-8"))
    env = make_environment(policy.task, 0)
    action_spec = env.action_spec()
    env.close()
    observations = calibration_observations(policy)
    seeds = [EVAL_SEED_BASE + 1000 * seed + i for i in range(episodes)]
    out = []
    for precision in precisions:
        point = parse_row_name(precision)
        greedy, execution = make_row_policy(point, policy, action_spec, backend, observations)
        stats = evaluate_seeds(policy.task, greedy, seeds)
        out.append({"algo": policy.agent, "task": policy.task, "seed": seed, "train_steps": summary["actor_steps"],
                    "precision": label + point.name, "bits": point.bits, "granularity": point.granularity,
                    "execution": execution, "backend": greedy.backend, "episodes": episodes,
                    "mean_return": stats.mean, "std_return": stats.std,
                    "policy_bytes": policy_bytes(policy, point.precision, observations, point.head_bits),
                    "train_final_eval": summary.get("final_eval_return"), "reference": reference, "cpu": cpu,
                    "train_eval_episodes": summary.get("eval_episodes"),
                    "train_target_streak": train_streak(summary), "trainer": trainer})
    return out


def train_streak(summary: dict[str, Any]) -> int:
    """The stopping rule a run's summary records: its target streak, 0 for a run without a target (its budget)."""
    experiment = summary.get("experiment", {})
    return 0 if experiment.get("target_return") is None else int(experiment.get("target_streak", 1))
