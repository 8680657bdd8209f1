"""The on-policy ActorQ benchmarks' own logic, on made-up records (the runs themselves are benchmarks, not tests):
bench.learning.onpolicy_corrections pairs int8 with fp32 by seed and says which way a difference goes;
bench.peers.rllib_onpolicy reads RLlib's output and measures time to target from each system's first training step."""
from __future__ import annotations

import pytest

from bench.learning.onpolicy_corrections import markdown, summarize
from bench.peers.rllib_onpolicy import _metrics, parse_rllib_log

MACHINE = {"cpu": "test CPU", "cpu_class": "x86-avx2", "cores": 2, "load_start": [0.5, 0.5, 0.5],
           "load_end": [0.6, 0.6, 0.6], "allow_busy": False}


def _record(arm: str, precision: str, seed: int, final: float) -> dict:
    return {"task": "CartPole-v1", "arm": arm, "precision": precision, "seed": seed, "final_return": final,
            "mean_return": final / 2, "curve": [[4000, final / 2], [8000, final]], "kl": 1e-5, "ratio_std": 0.01,
            "truncated_frac": 0.0, "lag_mean": 0.0, "stale_dropped": 0}


def test_int8_is_paired_with_fp32_by_seed_and_a_gap_in_int8s_favour_is_named_as_such():
    records = [_record("sync-none", "fp32", s, 300.0 + s) for s in range(5)]
    records += [_record("sync-none", "int8", s, 480.0 + 2 * s) for s in range(5)]  # clearly higher
    records += [_record("async-tis", "fp32", s, 400.0 + 10 * (-1) ** s) for s in range(5)]
    records += [_record("async-tis", "int8", s, 400.0 - 10 * (-1) ** s) for s in range(5)]  # no consistent gap
    records.append({"task": "CartPole-v1", "arm": "async-tis", "precision": "int8", "seed": 9, "failed": "boom"})
    summary = summarize(records)
    cells = {(c["arm"], c["precision"]): c for c in summary["cells"]}
    assert cells[("sync-none", "int8")]["seeds"] == 5 and cells[("sync-none", "int8")]["final_return"] == 484.0
    pairs = {p["arm"]: p for p in summary["int8_vs_fp32"]}
    assert pairs["sync-none"]["final_return"]["diff_mean"] == 182.0
    assert not pairs["sync-none"]["final_return"]["within_noise"]
    assert pairs["async-tis"]["final_return"]["within_noise"] and len(summary["failed"]) == 1
    page = markdown({"machine": MACHINE, "num_actors": 2, "steps": {"CartPole-v1": 8000}, "seeds": [0, 1, 2, 3, 4],
                     "summary": summary}, "python -m bench.learning.onpolicy_corrections")
    assert "| CartPole-v1 | sync-none | 5 |" in page and "no: int8 higher" in page
    assert "| CartPole-v1 | async-tis | 5 |" in page and "Failed runs: CartPole-v1 async-tis int8 seed 9" in page


RLLIB_OUTPUT = """# ray 2.60.0 torch 2.13.0+cpu gymnasium 1.2.2 algo ppo env_runners 2 seed 5
# build 10.2s
iter env_steps wall_clock_s iter_env_steps_per_s train_return_mean eval_return_mean
1 4000.0 7.1 561 20.9
2 8000.0 18.7 345 27.4 214.9
3 12000.0 25.2 623 38.3
4 16000.0 38.9 291 52.5 480.5
5 20000.0 45.1 639 86.2
6 24000.0 60.4 263 132.8 426.2
# done: iters 6 env_steps 24000.0 wall 60.4s
"""


def test_rllib_output_is_read_and_time_to_target_runs_from_the_first_training_step():
    parsed = parse_rllib_log(RLLIB_OUTPUT)
    assert parsed["build_s"] == 10.2 and parsed["env_steps"] == 24_000 and parsed["train_s"] == 60.4
    assert [e["return"] for e in parsed["evals"]] == [214.9, 480.5, 426.2]
    m = _metrics(parsed["evals"], 0.0, parsed["env_steps"], parsed["train_s"])
    assert m["s_to_target"] == 38.9 and m["steps_to_target"] == 16_000 and m["stay_fraction"] == 0.0
    # Ours: the run clock minus the moment the first weights version went out.
    ours = _metrics([{"env_steps": 4000, "wall_clock_s": 12.0, "return": 100.0},
                     {"env_steps": 8000, "wall_clock_s": 14.5, "return": 500.0}], 10.0, 8000, 5.0)
    assert ours["s_to_target"] == 4.5 and ours["env_steps_per_s"] == 1600.0


def _wide_summary(precision: str, policy_s: float, insert_s: float) -> dict:
    """A made-up summary.json of a 2-actor 2048x3 run: each actor 1,000 env steps."""
    times = {"env_steps": 1000, "env_step_s": 0.5, "policy_s": policy_s, "pull_s": 0.2, "deserialize_s": 0.1,
             "load_s": 0.2, "insert_s": insert_s, "policy_us_per_step": 1e3 * policy_s, "update_ms": 50.0}
    return {"status": "completed", "executed": f"{precision} weights", "actor_steps": 2000,
            "actor_steps_per_s": 2000 / (1.0 + policy_s + insert_s), "payload_bytes": 100,
            "actors": [{"times": times}, {"times": times}],
            "learner": {"on_policy": {"wait_frac": 0.5, "lag_mean": 2.0, "stale_dropped": 1, "rollouts_trained": 9}}}


def test_wide_actor_rates_leave_out_the_wait_for_the_learner_and_int8_is_compared_with_fp32():
    from bench.system.onpolicy_actors import markdown as wide_markdown, read_run, summarize as wide_summarize

    fp32 = read_run(_wide_summary("fp32", policy_s=9.0, insert_s=1.0))
    int8 = read_run(_wide_summary("int8", policy_s=3.0, insert_s=7.0))  # faster policy, more waiting
    # Acting time per actor: env 0.5 + policy + pull 0.2 + deserialize 0.1 + load 0.2; two actors add up.
    assert fp32["acting_env_steps_per_s"] == pytest.approx(2 * 1000 / 10.0)
    assert int8["acting_env_steps_per_s"] == pytest.approx(2 * 1000 / 4.0)
    assert fp32["env_steps_per_s"] == int8["env_steps_per_s"]  # the learner set the pace of both
    records = [{"precision": "fp32", "seed": 0, "process_wall_s": 30.0, **fp32},
               {"precision": "int8", "seed": 0, "process_wall_s": 30.0, **int8},
               {"precision": "int8", "seed": 1, "failed": "exit 1: boom"}]
    summary = wide_summarize(records)
    assert summary["cells"]["int8"]["runs"] == 1 and summary["failed"] == ["int8 seed 1"]
    assert summary["ratios"]["acting_env_steps_per_s"] == pytest.approx(2.5)
    assert summary["ratios"]["env_steps_per_s"] == 1.0 and summary["ratios"]["policy_time"] == 3.0
    page = wide_markdown({"machine": MACHINE, "steps": 2000, "rounds": 1, "num_actors": 2, "summary": summary},
                         "python -m bench.system.onpolicy_actors")
    assert "acting env steps/s 2.50x" in page and "Failed runs: int8 seed 1" in page
