"""Tests for quarl.envs.minatar: specs, determinism under a seed, episode boundaries, input checks."""
from __future__ import annotations

import numpy as np
import pytest
from dm_env import specs

from quarl.envs import factory as envs
from quarl.envs.minatar import MINATAR_TASKS, MinAtarEnvironment
from quarl.envs.spec import environment_spec


def _rollout(env, actions):
    steps = [env.reset()]
    steps += [env.step(np.int32(a)) for a in actions]
    return steps


@pytest.mark.parametrize("task, channels", [("MinAtar/Breakout", 4), ("MinAtar/SpaceInvaders", 6)])
def test_specs_and_uint8_image_observations(task, channels):
    env = envs.make_environment(task, seed=0)
    spec = environment_spec(env)
    assert spec.discrete and spec.num_actions == 6 and spec.action_dim == 0
    assert spec.obs_shape == (10, 10, channels) and spec.observation_shape == (10, 10, channels)
    assert spec.obs_dtype == np.uint8 and spec.obs_dim == 100 * channels
    assert isinstance(env.action_spec(), specs.DiscreteArray)
    ts = env.reset()
    assert ts.first() and ts.observation.dtype == np.uint8 and ts.observation.shape == (10, 10, channels)
    assert set(np.unique(ts.observation)) <= {0, 1} and ts.observation.any()
    ts = env.step(np.int32(0))
    assert ts.mid() and isinstance(ts.reward, np.float32) and ts.discount == np.float32(1.0)


def test_listed_and_vector_tasks_keep_their_flat_spec():
    assert set(MINATAR_TASKS) <= set(envs.list_tasks())
    spec = environment_spec(envs.make_environment("CartPole-v1", seed=0))
    assert spec.obs_shape == () and spec.observation_shape == (4,) and spec.obs_dtype == np.float32


def test_same_seed_same_episodes_other_seed_differs():
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 6, size=400)
    a = _rollout(envs.make_environment("MinAtar/Breakout", seed=3), actions)
    b = _rollout(envs.make_environment("MinAtar/Breakout", seed=3), actions)
    c = _rollout(envs.make_environment("MinAtar/Breakout", seed=4), actions)
    for x, y in zip(a, b):
        assert x.step_type == y.step_type and x.reward == y.reward
        np.testing.assert_array_equal(x.observation, y.observation)
    assert any(not np.array_equal(x.observation, z.observation) for x, z in zip(a, c))


def test_episode_ends_in_termination_then_restarts():
    env = envs.make_environment("MinAtar/Breakout", seed=1)
    ts = env.reset()
    for _ in range(5000):  # a random Breakout episode loses the ball within a few dozen steps
        ts = env.step(np.int32(0))
        if ts.last():
            break
    assert ts.last() and ts.discount == 0.0
    assert env.step(np.int32(0)).first()


def test_time_limit_truncates_with_discount_one():
    env = MinAtarEnvironment("MinAtar/Freeway", seed=0, max_episode_steps=5)
    steps = _rollout(env, [1] * 5)
    assert steps[-1].last() and steps[-1].discount == 1.0 and all(s.mid() for s in steps[1:-1])


def test_bad_inputs_raise():
    env = envs.make_environment("MinAtar/Breakout", seed=0)
    env.reset()
    with pytest.raises(ValueError, match="outside"):
        env.step(6)
    with pytest.raises(ValueError, match="integer"):
        env.step(0.5)
    with pytest.raises(ValueError, match="unknown MinAtar task"):
        MinAtarEnvironment("MinAtar/Pong", seed=0)
    with pytest.raises(ValueError, match="seed"):
        MinAtarEnvironment("MinAtar/Breakout", seed=-1)


def test_adder_keeps_uint8_observations():
    from quarl.replay.adders import NStepTransitionAdder

    env = envs.make_environment("MinAtar/Breakout", seed=0)
    adder = NStepTransitionAdder(1, 0.99)
    adder.add_first(env.reset())
    (t,) = adder.add(np.int32(1), env.step(np.int32(1)))
    assert t.observation.dtype == np.uint8 and t.next_observation.shape == (10, 10, 4)
