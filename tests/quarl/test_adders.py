"""Tests for quarl.replay.adders: hand-computed n-step windows, episode ends, batching into a replay table."""
from __future__ import annotations

import dm_env
import numpy as np
import pytest

from quarl.replay import adders

from quarl.envs import factory as envs
from quarl.envs.spec import environment_spec

from quarl import replay
from quarl.replay.items import Transition


def _obs(i: int) -> np.ndarray:
    return np.full(2, float(i), np.float32)


def _episode(adder, rewards, last_discount, mid_discounts=None):
    """Feeds obs 0..len(rewards); action t is t*10. Returns every emitted transition."""
    adder.add_first(dm_env.restart(_obs(0)))
    out = []
    for t, r in enumerate(rewards):
        obs = _obs(t + 1)
        if t == len(rewards) - 1:
            ts = dm_env.TimeStep(dm_env.StepType.LAST, np.float32(r), np.float32(last_discount), obs)
        else:
            d = 1.0 if mid_discounts is None else mid_discounts[t]
            ts = dm_env.transition(np.float32(r), obs, np.float32(d))
        out.append(adder.add(np.int32(t * 10), ts))
    return out


def _check(tr, obs, action, reward, discount, next_obs):
    assert isinstance(tr, Transition)
    np.testing.assert_array_equal(tr.observation, _obs(obs))
    assert int(tr.action) == action
    assert tr.reward == pytest.approx(reward) and tr.reward.dtype == np.float32
    assert tr.discount == pytest.approx(discount) and tr.discount.dtype == np.float32
    np.testing.assert_array_equal(tr.next_observation, _obs(next_obs))


def test_three_step_with_termination():
    adder = adders.NStepTransitionAdder(n_step=3, discount=0.5)
    emitted = _episode(adder, rewards=[1.0, 2.0, 3.0, 4.0], last_discount=0.0)
    assert [len(e) for e in emitted] == [0, 0, 1, 3]
    _check(emitted[2][0], 0, 0, 1 + 0.5 * 2 + 0.25 * 3, 0.125, 3)
    t1, t2, t3 = emitted[3]
    _check(t1, 1, 10, 2 + 0.5 * 3 + 0.25 * 4, 0.0, 4)  # termination inside the window: no bootstrap
    _check(t2, 2, 20, 3 + 0.5 * 4, 0.0, 4)
    _check(t3, 3, 30, 4, 0.0, 4)


def test_three_step_with_truncation_keeps_bootstrapping():
    adder = adders.NStepTransitionAdder(n_step=3, discount=0.5)
    emitted = _episode(adder, rewards=[1.0, 2.0, 3.0, 4.0], last_discount=1.0)
    t1, t2, t3 = emitted[3]
    _check(t1, 1, 10, 4.5, 0.125, 4)
    _check(t2, 2, 20, 5.0, 0.25, 4)  # shorter windows: gamma^k with k the window length
    _check(t3, 3, 30, 4.0, 0.5, 4)


def test_env_discounts_weight_later_rewards():
    adder = adders.NStepTransitionAdder(n_step=2, discount=0.9)
    emitted = _episode(adder, rewards=[1.0, 2.0, 3.0], last_discount=1.0, mid_discounts=[0.5, 0.8])
    first = emitted[1][0]
    _check(first, 0, 0, 1 + 0.9 * 0.5 * 2, 0.9 * 0.5 * 0.9 * 0.8, 2)


def test_one_step_and_episode_too_short_for_window():
    one = adders.NStepTransitionAdder(n_step=1, discount=0.99)
    emitted = _episode(one, rewards=[1.0, 2.0], last_discount=0.0)
    _check(emitted[0][0], 0, 0, 1.0, 0.99, 1)
    _check(emitted[1][0], 1, 10, 2.0, 0.0, 2)
    five = adders.NStepTransitionAdder(n_step=5, discount=0.5)
    emitted = _episode(five, rewards=[1.0, 2.0], last_discount=1.0)
    assert [len(e) for e in emitted] == [0, 2]
    _check(emitted[1][0], 0, 0, 2.0, 0.25, 2)
    _check(emitted[1][1], 1, 10, 2.0, 0.5, 2)


def test_adder_errors_and_reset():
    adder = adders.NStepTransitionAdder(n_step=2, discount=0.9)
    with pytest.raises(ValueError, match="add_first"):
        adder.add(0, dm_env.transition(1.0, _obs(1)))
    with pytest.raises(ValueError, match="FIRST"):
        adder.add_first(dm_env.transition(1.0, _obs(1)))
    adder.add_first(dm_env.restart(_obs(0)))
    with pytest.raises(ValueError, match="non-finite"):
        adder.add(0, dm_env.transition(np.nan, _obs(1)))
    assert adder.add(0, dm_env.transition(1.0, _obs(1))) == []
    adder.reset()  # the partial window is dropped
    with pytest.raises(ValueError, match="add_first"):
        adder.add(0, dm_env.transition(1.0, _obs(2)))
    adder.add_first(dm_env.restart(_obs(5)))
    assert adder.add(0, dm_env.transition(1.0, _obs(6))) == []
    out = adder.add(1, dm_env.termination(1.0, _obs(7)))
    np.testing.assert_array_equal(out[0].observation, _obs(5))
    with pytest.raises(ValueError, match="n_step"):
        adders.NStepTransitionAdder(n_step=0, discount=0.9)
    with pytest.raises(ValueError, match="discount"):
        adders.NStepTransitionAdder(n_step=1, discount=1.5)


def test_actions_are_copied():
    adder = adders.NStepTransitionAdder(n_step=1, discount=0.9)
    adder.add_first(dm_env.restart(_obs(0)))
    action = np.array([0.5], np.float32)
    (tr,) = adder.add(action, dm_env.transition(1.0, _obs(1)))
    action[0] = 9.0
    assert tr.action[0] == np.float32(0.5)


def test_env_rollout_into_table_one_transition_per_step():
    env = envs.make_environment("CartPole-v1", seed=0)
    spec = environment_spec(env)
    sig = adders.transition_signature(spec.obs_dim, spec.action_shape, spec.action_dtype)
    table = replay.Table("replay", 1000, sig, seed=0)
    adder = adders.NStepTransitionAdder(n_step=3, discount=0.99)
    buffer = adders.TransitionBuffer(batch_size=16, signature=sig)
    steps = 0
    rng = np.random.default_rng(0)
    for _ in range(3):
        ts = env.reset()
        adder.add_first(ts)
        while not ts.last():
            action = np.int32(rng.integers(2))
            ts = env.step(action)
            steps += 1
            for batch in buffer.extend(adder.add(action, ts)):
                assert isinstance(batch, Transition) and all(v.shape[0] == 16 for v in batch)
                table.insert(batch)
    rest = buffer.flush()
    assert rest is not None and len(buffer) == 0 and buffer.flush() is None
    table.insert(rest)
    assert table.size == steps
    data = table.state_dict()["data"]
    assert np.sum(data["discount"] == 0.0) == 3 * 3  # the last 3 windows of each terminated episode
    np.testing.assert_allclose(data["discount"][data["discount"] > 0], 0.99 ** 3, rtol=1e-6)


def test_transition_buffer_validates():
    sig = adders.transition_signature(2, (), np.int32)
    buffer = adders.TransitionBuffer(batch_size=2, signature=sig)
    with pytest.raises(ValueError, match="takes Transitions"):
        buffer.add({"observation": _obs(0)})
    with pytest.raises(ValueError, match="not a transition's"):
        adders.TransitionBuffer(batch_size=2, signature={"observation": ((2,), np.float32)})
    good = Transition(_obs(0), np.asarray(1), np.asarray(1.0), np.asarray(0.5), _obs(1))
    assert buffer.add(good) is None
    batch = buffer.add(good)
    assert batch.action.dtype == np.int32 and batch.reward.dtype == np.float32
    assert batch.observation.shape == (2, 2)
    buffer.add(good._replace(observation=np.zeros(3, np.float32)))
    with pytest.raises(ValueError, match="shape"):
        buffer.add(good)
    with pytest.raises(ValueError, match="obs_dim"):
        adders.transition_signature(0, (), np.int32)


def test_flush_mid_episode_emits_one_truncated_transition_per_open_step():
    adder = adders.NStepTransitionAdder(n_step=3, discount=0.5)
    adder.add_first(dm_env.restart(_obs(0)))
    emitted = []
    for t, r in enumerate([1.0, 2.0, 4.0, 8.0]):
        emitted += adder.add(np.int32(t * 10), dm_env.transition(np.float32(r), _obs(t + 1)))
    assert len(emitted) == 2 and adder.pending == 2
    rest = adder.flush()
    # Windows starting at steps 2 and 3, bootstrapping from the latest observation (4) like a truncation.
    _check(rest[0], obs=2, action=20, reward=4.0 + 0.5 * 8.0, discount=0.25, next_obs=4)
    _check(rest[1], obs=3, action=30, reward=8.0, discount=0.5, next_obs=4)
    assert adder.pending == 0 and adder.flush() == []
    with pytest.raises(ValueError, match="add_first"):
        adder.add(np.int32(0), dm_env.transition(np.float32(0.0), _obs(5)))


def test_flush_with_start_transitions_does_not_repeat_the_window_from_the_first_observation():
    adder = adders.NStepTransitionAdder(n_step=3, discount=0.5, start_transitions=True)
    adder.add_first(dm_env.restart(_obs(0)))
    emitted = []
    for t, r in enumerate([1.0, 2.0]):  # two steps: still no window of 3
        emitted += adder.add(np.int32(t * 10), dm_env.transition(np.float32(r), _obs(t + 1)))
    assert [int(tr.next_observation[0]) for tr in emitted] == [1, 2]  # s0->s1, s0->s2
    rest = adder.flush()
    assert len(rest) == 1  # s0->s2 was emitted already; only s1->s2 is left
    _check(rest[0], obs=1, action=10, reward=2.0, discount=0.5, next_obs=2)
