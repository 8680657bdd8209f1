"""Tests for quarl.envs.factory: specs, action canonicalisation, episode boundaries, seeding, input checks."""
from __future__ import annotations

import dm_env
import gymnasium
import numpy as np
import pytest
from dm_env import specs

from quarl.envs import factory as envs
from quarl.envs.gym import GymWrapper
from quarl.envs.spec import environment_spec
from quarl.envs.wrappers import CanonicalActionWrapper, SinglePrecisionWrapper


def _rollout(env: dm_env.Environment, actions: list) -> list[dm_env.TimeStep]:
    steps = [env.reset()]
    for a in actions:
        steps.append(env.step(a))
    return steps


def test_cartpole_balance_spec_and_steps():
    env = envs.make_environment("cartpole:balance", seed=1)
    spec = environment_spec(env)
    assert spec.obs_dim == 5  # position (3) + velocity (2)
    assert spec.action_dim == 1 and not spec.discrete and spec.num_actions == 0
    assert isinstance(spec.actions, specs.BoundedArray)
    np.testing.assert_array_equal(spec.actions.minimum, -1.0)
    np.testing.assert_array_equal(spec.actions.maximum, 1.0)
    assert spec.action_spec is spec.actions
    ts = env.reset()
    assert ts.first() and ts.observation.dtype == np.float32 and ts.observation.shape == (5,)
    for a in (-1.0, 0.3, 1.0):
        ts = env.step(np.array([a], np.float32))
        assert ts.mid()
        assert ts.observation.dtype == np.float32 and ts.observation.shape == (5,)
        assert isinstance(ts.reward, np.float32) and isinstance(ts.discount, np.float32)
        assert ts.discount == 1.0


def test_control_observation_is_sorted_key_concatenation():
    from dm_control import suite

    raw = suite.load("cartpole", "balance", task_kwargs={"random": 3})
    env = envs.make_environment("cartpole:balance", seed=3)
    raw_obs = raw.reset().observation
    expected = np.concatenate([np.asarray(raw_obs[k], np.float32).ravel() for k in sorted(raw_obs)])
    np.testing.assert_array_equal(env.reset().observation, expected)


def test_gym_cartpole_spec_and_steps():
    env = envs.make_environment("CartPole-v1", seed=0)
    spec = environment_spec(env)
    assert spec.obs_dim == 4 and spec.discrete and spec.num_actions == 2 and spec.action_dim == 0
    assert isinstance(spec.actions, specs.DiscreteArray) and spec.action_shape == ()
    ts = env.reset()
    assert ts.first() and ts.observation.dtype == np.float32
    ts = env.step(np.int32(1))
    assert ts.mid() and ts.reward == np.float32(1.0) and ts.discount == 1.0
    with pytest.raises(ValueError, match="outside"):
        env.step(5)
    with pytest.raises(ValueError, match="integer"):
        env.step(0.5)


class _RecordingEnv(dm_env.Environment):
    """A one-step-forever environment that records the actions it receives."""

    def __init__(self, low, high):
        self.received: list[np.ndarray] = []
        self._spec = specs.BoundedArray((2,), np.float64, low, high)

    def reset(self):
        return dm_env.restart(np.zeros(1))

    def step(self, action):
        self.received.append(np.asarray(action))
        return dm_env.transition(0.0, np.zeros(1))

    def observation_spec(self):
        return specs.Array((1,), np.float64)

    def action_spec(self):
        return self._spec


def test_action_canonicalisation_maps_unit_box_to_bounds():
    inner = _RecordingEnv(low=[0.0, -3.0], high=[10.0, 1.0])
    env = CanonicalActionWrapper(inner)
    assert env.action_spec().dtype == np.float32
    env.reset()
    for a in ([-1.0, -1.0], [1.0, 1.0], [0.0, 0.5], [7.0, -9.0]):
        env.step(np.array(a, np.float32))
    np.testing.assert_allclose(inner.received[0], [0.0, -3.0])
    np.testing.assert_allclose(inner.received[1], [10.0, 1.0])
    np.testing.assert_allclose(inner.received[2], [5.0, 0.0])
    np.testing.assert_allclose(inner.received[3], [10.0, -3.0])  # clipped to the box first
    assert inner.received[0].dtype == np.float64
    with pytest.raises(ValueError, match="non-finite"):
        env.step(np.array([np.nan, 0.0]))
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(3))


def test_pendulum_actions_are_canonical():
    env = envs.make_environment("Pendulum-v1", seed=0)
    spec = environment_spec(env)
    assert not spec.discrete and spec.action_dim == 1
    np.testing.assert_array_equal(spec.actions.maximum, 1.0)
    wrapper = env.environment
    assert isinstance(wrapper, CanonicalActionWrapper)
    np.testing.assert_allclose(wrapper.to_env_action(np.array([1.0])), [2.0])
    np.testing.assert_allclose(wrapper.to_env_action(np.array([-1.0])), [-2.0])


def test_termination_has_zero_discount_and_next_step_restarts():
    env = envs.make_environment("CartPole-v1", seed=0)
    env.reset()
    ts = env.step(0)
    n = 1
    while not ts.last():
        ts = env.step(0)  # always pushing left topples the pole within a few dozen steps
        n += 1
        assert n < 200
    assert ts.discount == 0.0 and ts.reward == 1.0
    assert env.step(0).first()


def test_truncation_keeps_discount_one():
    env = SinglePrecisionWrapper(GymWrapper(gymnasium.make("CartPole-v1", max_episode_steps=3), seed=0))
    steps = _rollout(env, [0, 1, 0])
    assert [s.step_type for s in steps] == [dm_env.StepType.FIRST, dm_env.StepType.MID,
                                            dm_env.StepType.MID, dm_env.StepType.LAST]
    assert steps[-1].discount == np.float32(1.0)
    assert isinstance(steps[-1].discount, np.float32)


def test_mountaincar_time_limit_is_truncation():
    env = envs.make_environment("MountainCar-v0", seed=0)
    env.reset()
    steps = [env.step(1) for _ in range(200)]
    assert all(s.mid() for s in steps[:-1]) and steps[-1].last()
    assert steps[-1].discount == 1.0


def test_unknown_task_names_the_closest_valid_ids():
    with pytest.raises(ValueError) as err:
        envs.make_environment("cartpole:nope")
    message = str(err.value)
    assert "\n" not in message
    assert "closest valid ids: cartpole:" in message and "cartpole:balance" in message
    assert "humanoid:walk" not in message  # the closest few, not all of them on one line
    assert f"of {len(envs.list_tasks())}" in message
    with pytest.raises(ValueError, match="seed"):
        envs.make_environment("CartPole-v1", seed=-1)


def test_list_tasks_contains_required_tasks():
    tasks = envs.list_tasks()
    for name in ("cartpole:balance", "walker:stand", "cheetah:run", "hopper:stand", "reacher:hard",
                 "finger:spin", "humanoid:stand", "humanoid:walk", "CartPole-v1", "MountainCar-v0"):
        assert name in tasks


@pytest.mark.parametrize("task, action", [("walker:stand", np.full(6, 0.2, np.float32)), ("Acrobot-v1", 2)])
def test_same_seed_same_trajectory(task, action):
    def observations(seed):
        env = envs.make_environment(task, seed=seed)
        return np.stack([ts.observation for ts in _rollout(env, [action] * 5)])

    np.testing.assert_array_equal(observations(7), observations(7))
    assert not np.array_equal(observations(7), observations(8))


class _NanEnv(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.array([np.nan, 0.0], np.float32), 0.0, False, False, {}


def test_non_finite_observation_raises():
    env = GymWrapper(_NanEnv(), seed=0)
    env.reset()
    with pytest.raises(ValueError, match="non-finite"):
        env.step(0)
