"""bench.learning.ptq_margins on saved policies: discrete cells get margin/error/flip shares, continuous ones and QAT
runs and runs stopped part-way are left out, cells run elsewhere keep their earlier rows."""
from __future__ import annotations

import csv
import json

import pytest

import agents
from bench.learning import ptq_margins
from quarl.envs.factory import make_environment
from quarl.envs.spec import environment_spec
from quarl.quant.policy_io import save_policy
from tests.quarl.helpers import random_params
from tests.quarl.test_evaluation import cartpole_q_network


def test_margins_of_discrete_cells(tmp_path):
    runs = tmp_path / "runs"
    spec, params = cartpole_q_network()
    save_policy(runs / "dqn" / "CartPole-v1" / "s0", spec, params, task="CartPole-v1", agent="dqn")
    # A run stopped part-way leaves a policy too; only completed runs are the study's cells.
    save_policy(runs / "dqn" / "CartPole-v1" / "s1", spec, params, task="CartPole-v1", agent="dqn")
    (runs / "dqn" / "CartPole-v1" / "s1" / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    # A QAT run beside it is evaluated at its own width by the study, not post-training quantized: left out.
    save_policy(runs / "dqn" / "CartPole-v1" / "s0-qat4", spec, params, task="CartPole-v1", agent="dqn")
    env = make_environment("cartpole:balance", 0)
    d4pg = agents.get_builder("d4pg", policy_layer_sizes=(8,)).policy_spec(environment_spec(env))
    env.close()
    save_policy(runs / "d4pg" / "cartpole_balance" / "s0", d4pg, random_params(d4pg), task="cartpole:balance",
                agent="d4pg")
    for run in (runs / "dqn" / "CartPole-v1" / "s0", runs / "d4pg" / "cartpole_balance" / "s0"):
        (run / "summary.json").write_text(json.dumps({"status": "completed"}))
    assert ptq_margins.main(["--runs", str(runs), "--out", str(tmp_path / "out"), "--precision", "int2"]) == 0
    with open(tmp_path / "out" / "ptq_margins.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["algo"], r["seed"]) for r in rows] == [("dqn", "0")]  # the continuous cell has no argmax
    row = rows[0]
    assert int(row["states"]) == 500  # the hand-made controller balances for the whole episode
    assert float(row["median_margin"]) > 0 and float(row["median_error"]) > 0
    assert 0.0 <= float(row["flipped"]) <= 1.0 and 0.0 <= float(row["error_over_margin"]) <= 1.0
    # int2 weights alone already move the outputs; the output layer is one of the three rounded.
    assert 0.0 < float(row["head_error"]) and 0.0 < float(row["weights_error"])
    assert "| dqn | CartPole-v1 | 0 | 500 |" in (tmp_path / "out" / "ptq_margins.md").read_text()

    # Run again: a cell whose run folder is elsewhere keeps its row at the same precision; the cell at hand is
    # computed again; rows at another precision are not this table's.
    elsewhere = {**row, "algo": "ppo", "task": "Acrobot-v1", "seed": "2", "flipped": "0.25"}
    other_precision = {**row, "algo": "a2c", "precision": "int8"}
    with open(tmp_path / "out" / "ptq_margins.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        writer.writeheader()
        writer.writerows([{**row, "flipped": "0.99"}, elsewhere, other_precision])
    assert ptq_margins.main(["--runs", str(runs), "--out", str(tmp_path / "out"), "--precision", "int2"]) == 0
    with open(tmp_path / "out" / "ptq_margins.csv", newline="", encoding="utf-8") as f:
        again = {(r["algo"], r["seed"]): r for r in csv.DictReader(f)}
    assert set(again) == {("dqn", "0"), ("ppo", "2")}
    assert again[("dqn", "0")]["flipped"] == row["flipped"] and again[("ppo", "2")]["flipped"] == "0.25"


def test_no_runs_is_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        ptq_margins.main(["--runs", str(tmp_path), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and "no trained runs" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
