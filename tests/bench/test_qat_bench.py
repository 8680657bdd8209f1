"""bench.learning.qat: checkpoints are picked by return at the deployed precision on held-out selection episodes, the same
criterion for QAT and the like-for-like PTQ arm, and the verdict says which arm is ahead (either way)."""
from __future__ import annotations

import numpy as np
import pytest

from bench.learning import qat


def test_selector_picks_per_precision_by_return_at_that_precision():
    # Selection return of each checkpoint deployed at each precision (as the selection episodes would give).
    table = {"a": {"fp32": 500.0, "int4": 30.0}, "b": {"fp32": 480.0, "int4": 410.0},
             "c": {"fp32": 200.0, "int4": 410.0}}
    calls = []

    def score(params, precision):
        calls.append((params, precision))
        return table[params][precision]

    selector = qat.CheckpointSelector(["fp32", "int4"], score)
    for step, name in ((1000, "a"), (2000, "b"), (3000, "c")):
        selector.observe(step, name)
    assert (selector.best["fp32"]["params"], selector.best["fp32"]["actor_steps"]) == ("a", 1000)
    # int4 picks by int4 return, not by fp32 return; a tie keeps the earlier checkpoint.
    assert (selector.best["int4"]["params"], selector.best["int4"]["return"]) == ("b", 410.0)
    assert len(calls) == 6 and {p for _, p in calls} == {"fp32", "int4"}


def test_selection_episodes_are_disjoint_from_the_reported_ones():
    select, test = set(qat.selection_seeds()), set(qat.eval_seeds(10_000))
    assert len(select) == qat.SELECT_EPISODES and not select & test
    with pytest.raises(ValueError, match="overlap"):
        qat.eval_seeds(qat.TEST_SEED_BASE)


def _stats(seed_means):
    return {"mean": float(np.mean(seed_means)), "seed_means": list(seed_means)}


def test_verdict_names_the_arm_ahead_in_both_directions():
    qat_wins = qat.verdict(_stats([400, 420, 410, 390, 405]), _stats([100, 120, 90, 110, 95]))
    assert qat_wins["better"] == "qat" and qat_wins["qat_minus_ptq"] == pytest.approx(302.0)
    ptq_wins = qat.verdict(_stats([380, 390, 385, 370, 400]), _stats([470, 480, 490, 475, 500]))
    assert ptq_wins["better"] == "ptq"
    assert qat.verdict(_stats([300, 500, 100, 450, 200]), _stats([320, 480, 150, 400, 250]))["better"] == "neither"
    assert qat.verdict(_stats([300]), _stats([100]))["better"] is None  # one seed: no verdict
    table = [{"bits": 2, "k": qat_wins}, {"bits": 4, "k": ptq_wins}]
    assert qat.outcome(table, "k") == {"qat": ["int2"], "ptq": ["int4"], "neither": []}


def test_default_plan_has_five_seeds_and_refuses_bad_flags(capsys):
    plan = qat.parse_args(["--allow-busy"])
    assert plan.seeds >= 5 and plan.bits == (2, 3, 4)
    for bad in (["--seeds", "0"], ["--bits", "1,4"], ["--episodes", "20000"]):
        with pytest.raises(SystemExit) as info:
            qat.parse_args([*bad, "--allow-busy"])
        assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 3
