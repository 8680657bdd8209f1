"""launch.ptq on a conv policy: int rows calibrate their activation scales on observations the fp32 policy meets
(seeded apart from the evaluation episodes) and run the static int8 conv graph."""
from __future__ import annotations

import csv

import numpy as np

from launch import ptq
from quarl.acting.evaluation import rollout_observations
from quarl.envs.factory import make_environment
from quarl.policy.spec import minatar_q_network
from quarl.quant.policy_io import load_policy, save_policy
from tests.quarl.helpers import random_params


def test_ptq_sweeps_a_minatar_conv_policy(tmp_path):
    spec = minatar_q_network((10, 10, 4), 6)
    save_policy(tmp_path, spec, random_params(spec, 0), task="MinAtar/Breakout", agent="dqn", steps=100)
    assert ptq.main(["--checkpoint", str(tmp_path), "--bits", "8", "--episodes", "2", "--backend", "onnx",
                     "--no-progress"]) == 0
    with open(tmp_path / "ptq" / "ptq.csv", newline="", encoding="utf-8") as f:
        rows = {(r["precision"], r["granularity"]): r for r in csv.DictReader(f)}
    assert rows[("int8", "per-channel")]["execution"] == "int-kernel"
    assert all(np.isfinite(float(r["mean_return"])) for r in rows.values())
    obs = ptq.calibration_observations(load_policy(tmp_path))
    assert obs.shape == (256, 10, 10, 4) and obs.dtype == np.uint8


def test_rollout_observations_restarts_episodes():
    env = make_environment("MinAtar/Breakout", 0)
    obs = rollout_observations(env, lambda o: np.zeros(len(o), np.int32), steps=300)  # loses the ball, restarts
    assert obs.shape == (300, 10, 10, 4)
