"""bench.learning.ale_dqn at its smallest (--tiny): the whole path runs (Nature torso, frame-deduplicated replay, int8
actors, a full unclipped Pong evaluation) and the record has the machine, seed, time and every evaluation."""
from __future__ import annotations

import json

import pytest

from bench.learning import ale_dqn


@pytest.mark.slow
def test_tiny_pong_run_writes_time_return_and_machine(tmp_path):
    """One full Pong evaluation of an untrained policy, as test_dqn_ale (~10 s alone on the 2-core EPYC)."""
    assert ale_dqn.main(["--tiny", "--steps", "300", "--eval-every", "300", "--eval-episodes", "1",
                         "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "ale_dqn_Pong_s0.json").read_text())
    assert record["game"] == "Pong" and record["seed"] == 0 and record["actor_steps"] == 300
    assert record["machine"]["cpu_model"] and record["machine"]["load_end"] and "cpu_flags" in record["machine"]
    import jax

    assert record["learner_device"] == jax.devices()[0].platform  # where it ran (auto), read in the learner
    assert record["train_s"] > 0 and record["curve"]
    returns = [c["return"] for c in record["curve"]]
    assert record["final_return"] == returns[-1] and record["best_return"] == max(returns)
    # One full game of Pong, scored as the game scores it: whole points, and a game only ends when a side reaches 21,
    # so the score is never 0; an untrained policy loses it (a random policy averages -20.7).
    assert float(record["final_return"]).is_integer() and -21 <= record["final_return"] <= -1
    assert (record["steps_to_target"] is None) == (record["best_return"] < record["target"])
    assert record["target"] == -15.0 and "Pong" in (tmp_path / "ale_dqn_Pong_s0.md").read_text()


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        ale_dqn.main(["--steps", "0"])
    assert exit_info.value.code == 2 and "--steps" in capsys.readouterr().err
