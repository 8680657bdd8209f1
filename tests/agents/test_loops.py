"""agents.loops: the learner's SGD loops as a scan or unrolled. Every form trains to the same parameters, the form
asked for is the one compiled, and a run's summary.json records which form ran and why (no timing here: the
speed of each form is `bench.micro.conv_update`'s)."""
from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from agents.dqn.config import DQNConfig
from agents.dqn.learning import DQNLearner
from agents.dqn.networks import make_q_spec
from agents.loops import LOOP_FORMS, check_loop_form, loop_form, loop_form_record, use_loop_form
from agents.ppo.config import PIXEL_PPO_OVERRIDES, PPOConfig
from agents.ppo.learning import PPOLearner
from agents.ppo.networks import make_networks

OBS_SHAPE, ACTIONS, B, K = (6, 6, 2), 3, 8, 3
OBS_DIM = int(np.prod(OBS_SHAPE))


@pytest.fixture(autouse=True)
def _default_form():
    yield
    use_loop_form("auto")


def _ppo() -> PPOLearner:
    config = dataclasses.replace(PPOConfig(), **{**PIXEL_PPO_OVERRIDES, "num_envs": 2, "num_steps": 8,
                                                 "update_epochs": 2, "num_minibatches": 2})
    return PPOLearner(make_networks(config, OBS_DIM, ACTIONS, OBS_SHAPE), config, seed=0, total_updates=10)


def _rollout(rng: np.random.Generator, t: int = 8, n: int = 2) -> dict[str, np.ndarray]:
    obs = rng.integers(0, 2, (t, n, OBS_DIM)).astype(np.float32)
    return {"observation": obs, "next_observation": np.roll(obs, 1, axis=0),
            "action": rng.integers(0, ACTIONS, (t, n)).astype(np.int32),
            "reward": rng.normal(size=(t, n)).astype(np.float32),
            "discount": np.full((t, n), 0.99, np.float32), "last": np.zeros((t, n), np.float32),
            "behaviour_logp": np.full((t, n), -1.1, np.float32)}


def _dqn() -> DQNLearner:
    config = DQNConfig(batch_size=B, min_replay_size=B, target_update_period=2)
    return DQNLearner(make_q_spec(OBS_DIM, ACTIONS, config.hidden_sizes, OBS_SHAPE), config, seed=0)


def _batches(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    return [{"observation": rng.integers(0, 2, (B, OBS_DIM)).astype(np.float32),
             "action": rng.integers(0, ACTIONS, B).astype(np.int32), "reward": rng.normal(size=B).astype(np.float32),
             "discount": np.full(B, 0.99, np.float32),
             "next_observation": rng.integers(0, 2, (B, OBS_DIM)).astype(np.float32)} for _ in range(K)]


def _same(a, b) -> None:
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6), a, b)


def test_every_form_trains_to_the_same_parameters():
    """PPO's epochs x minibatches, and a DQN block of K steps (scan, unrolled, and K single calls: the per-call
    form), on conv torsos."""
    states = {}
    for form in ("scan", "unroll"):
        use_loop_form(form)
        ppo, dqn = _ppo(), _dqn()
        rng = np.random.default_rng(1)
        for _ in range(2):
            ppo.step(_rollout(rng))
        dqn.run_block(dqn.prepare(_batches(np.random.default_rng(2))))
        states[form] = (ppo.get_state(), dqn.get_state())
    per_call = _dqn()
    for batch in _batches(np.random.default_rng(2)):
        per_call.step(batch)
    _same(states["scan"], states["unroll"])
    _same(states["scan"][1], per_call.get_state())
    assert int(per_call.get_state()["steps"]) == K


@pytest.mark.parametrize("form, loops", [("scan", True), ("unroll", False), ("auto", True)])
def test_the_form_asked_for_is_the_one_compiled(form, loops):
    use_loop_form(form)
    learner = _dqn()
    block = learner.prepare(_batches(np.random.default_rng(0)))
    text = learner._scan.lower(*learner._split(), block.batches).compile().as_text()  # pylint: disable=protected-access
    assert ("while" in text) is loops
    assert loop_form() == ("unroll" if form == "unroll" else "scan")


def test_bad_form_is_one_line_and_changes_nothing():
    use_loop_form("unroll")
    with pytest.raises(ValueError, match="not a learner loop form; valid: auto, scan, unroll"):
        use_loop_form("fast")
    assert loop_form() == "unroll" and check_loop_form("scan") == "scan" and LOOP_FORMS[0] == "auto"


def test_summary_records_the_form_that_ran_and_why(tmp_path):
    from launch import train  # pylint: disable=import-outside-toplevel

    argv = ["--agent", "ppo", "--task", "MinAtar/Breakout", "--steps", "64", "--logdir", str(tmp_path / "run"),
            "--eval-every", "64", "--eval-episodes", "1", "--no-progress", "--learner-loop", "unroll",
            "--set", "num_envs=2", "--set", "num_steps=16", "--set", "update_epochs=1", "--set", "num_minibatches=2"]
    assert train.main(argv) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["learner"]["loop_form"] == {"form": "unroll", "requested": "unroll",
                                               "why": "forced by --learner-loop"}
    assert summary["experiment"]["learner_loop"] == "unroll"
    use_loop_form("auto")
    assert loop_form_record()["why"].startswith("auto: conv gradients are canonical")
